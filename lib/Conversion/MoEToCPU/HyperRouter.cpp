//===- HyperRouter.cpp - moe.hyper_router -> fast CPU kernel --------------===//
//
// Part of the MoE-MLIR project.
//
// Two matrix-vector products y = W x + bias (then ReLU for the hidden layer):
// row blocks go to the workers, each row a dot product on vectors of the
// target's width (vector<16> AVX-512, vector<8> AVX2) over its contiguous
// columns (four accumulators, masked tail), rows in memory order. The op is
// memory-bound on w2 ([E·(D+1), Dh]). The split of the output into w and b
// is the portable one. The GEMV (hyperAffine) is also the backward kernel's
// recomputation of the hidden layer (HyperRouterGrad.cpp).
//
// Measured (AMD EPYC, execution API, Dh = 256, D = 1024, E = 64: 67 MB of
// w2): eight rows interleaved (eight 1 KiB streams a step, one accumulator
// each) read 10.8 GB/s on one thread, 11-12 with software prefetch; row by
// row (one sequential stream) 28.7 GB/s, above torch's own x.sum() (24.5).
// A matrix of at most 1 MiB (the decode case D = 64, E = 8: 0.5 MiB) runs as
// at most four blocks, which the workers run on the calling thread (it is in
// cache; waking the pool cost more than the product).
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "../MoEToLinalg/Patterns.h"

#include "MoE/IR/MoEOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu;

namespace {
constexpr int64_t kRowsPerItem = 64;

struct HyperRouterKernel : KernelPattern<HyperRouterOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(HyperRouterOp op, CK &k,
                     PatternRewriter &rw) const override {
    // The kernel computes the flat output vector [rows of w2] f32;
    // finishHyperRouter shapes it into the op's result.
    Value w2 = op.getW2();
    auto w2Type = cast<RankedTensorType>(w2.getType());
    KernelScope kernel(
        k, {op.getW1(), op.getEmb(), op.getB1(), w2, op.getB2()},
        {{RankedTensorType::get({w2Type.getDimSize(0)}, k.f32()),
          {k.sizes(w2)[0]}}});
    Value hidden =
        hyperAffine(k, opts, k.buffer(op.getW1()), k.buffer(op.getEmb()),
                    k.buffer(op.getB1()), /*relu=*/true);
    hyperAffine(k, opts, k.buffer(w2), hidden, k.buffer(op.getB2()),
                /*relu=*/false, kernel.out(0));
    lowering::finishHyperRouter(rw, op, kernel.finish()[0]);
    return success();
  }
};
} // namespace

Value mlir::moe::cpu::hyperAffine(CK &k, const KernelOptions &opts, Value m,
                                  Value x, Value bias, bool relu, Value y) {
  Value c0 = k.idx(0), c1 = k.idx(1);
  Value rows = k.dim(m, 0), cols = k.dim(m, 1);
  int64_t staticRows = cast<MemRefType>(m.getType()).getDimSize(0);
  if (!y)
    y = k.alloc(MemRefType::get({staticRows}, k.f32()),
                CK::dynamicSizes({staticRows}, {rows}));
  int64_t lanes = k.lanes();
  Value full = k.divu(cols, k.idx(lanes));
  Value tail = k.sub(cols, k.mul(full, k.idx(lanes)));
  Value zeros = k.constLike(k.vf32(), 0.0);
  Value small = k.cmpi(arith::CmpIPredicate::ule, k.mul(rows, cols),
                       k.idx(kHyperInlineElements));
  Value rowsPerItem =
      k.select(small, k.maxs(k.ceilDiv(rows, k.idx(CK::kInlineItems)), c1),
               k.idx(kRowsPerItem));
  k.workers(opts, k.ceilDiv(rows, rowsPerItem), [&](Value item, Value) {
    Value r0 = k.mul(item, rowsPerItem);
    Value r1 = k.mins(k.add(r0, rowsPerItem), rows);
    // Row by row, in memory order: the hardware prefetchers see one
    // sequential stream per worker. U accumulators per row cover the
    // FMA latency; the x vectors come from L1.
    constexpr int64_t U = 4;
    Value full4 = k.mul(k.divu(full, k.idx(U)), k.idx(U));
    k.forLoop(r0, r1, c1, [&](Value r) {
      SmallVector<Value> init(U, zeros);
      SmallVector<Value> acc =
          k.forLoop(c0, full4, k.idx(U), init,
                    [&](Value c, ValueRange a) -> SmallVector<Value> {
                      SmallVector<Value> next;
                      for (int64_t u = 0; u < U; ++u) {
                        Value col = k.mul(k.add(c, k.idx(u)), k.idx(lanes));
                        next.push_back(k.fma(k.vload(m, {r, col}),
                                             k.vload(x, {col}), a[u]));
                      }
                      return next;
                    });
      Value a0 = k.forLoop(
          full4, full, c1, ValueRange{acc[0]},
          [&](Value c, ValueRange a) -> SmallVector<Value> {
            Value col = k.mul(c, k.idx(lanes));
            return {k.fma(k.vload(m, {r, col}), k.vload(x, {col}), a[0])};
          })[0];
      Value col = k.mul(full, k.idx(lanes));
      a0 = k.fma(k.vloadMasked(m, {r, col}, tail, 0.0),
                 k.vloadMasked(x, {col}, tail, 0.0), a0);
      Value t = k.fadd(k.fadd(a0, acc[1]), k.fadd(acc[2], acc[3]));
      Value v = k.fadd(k.sum(t), k.loadF(bias, {r}));
      if (relu)
        v = k.fmax(v, k.cF32(0.0));
      k.store(v, y, {r});
    });
  });
  return y;
}

MOE_CPU_KERNEL_POPULATE(populateHyperRouterKernel, HyperRouterKernel)
