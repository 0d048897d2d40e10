//===- HyperRouter.cpp - moe.hyper_router -> fast CPU kernel --------------===//
//
// Part of the MoE-MLIR project.
//
// Two matrix-vector products y = W x + bias (then ReLU for the hidden layer):
// row blocks go to the workers, each row the shared row dot of
// MoE/Kernels/Gemv.h (four accumulators, masked tail; also the GPU kernel's)
// with a chunk of the row one vector of the target's width (vector<16>
// AVX-512, vector<8> AVX2), rows in memory order, one a step on AVX-512 and
// two on AVX2 (rowsPerStep; a row's bits are the same either way). The op is
// memory-bound on w2 ([E·(D+1), Dh]). The split of the output into w and b
// is the portable one. The GEMV (hyperAffine) is also the backward kernel's
// recomputation of the hidden layer (HyperRouterGrad.cpp).
//
// Rows in memory order (one sequential stream) because interleaved rows read
// w2 at less than half the bandwidth (docs/CPU.md, "Measurements"). A matrix
// of at most 1 MiB (the decode case D = 64, E = 8: 0.5 MiB) runs as at most
// four blocks, which the workers run on the calling thread (it is in cache;
// waking the pool cost more than the product).
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Gemv.h"

namespace mlir::moe::cpu_lowering {

namespace {
constexpr int64_t kRowsPerItem = 64;

/// Rows a worker reads together (kernels::gemvRowsDot). One row a step
/// reads w2 at 93% of the STREAM triad with AVX-512 but 80% with AVX2
/// (E = 256, 2 threads, Xeon): the same bytes take twice the loads, FMAs and
/// loop steps, and a row's loop ends in a reduction every 1 KiB. Two rows a
/// step load each x chunk once for both and keep two lines of w2 in flight
/// per step: 0.83-0.87x the time on AVX2, the same as AVX-512's (E = 256,
/// interleaved in one process on a loaded machine); on AVX-512 two rows
/// gained nothing (1.00-1.01x).
int64_t rowsPerStep(const KernelOptions &opts) {
  return opts.vectorBits >= 512 ? 1 : 2;
}

} // namespace

template <>
LogicalResult CPUKernel<HyperRouterOp>::emit(HyperRouterOp op,
                                             CpuKernelBuilder &kb,
                                             PatternRewriter &rw) const {
  // The kernel computes the flat output vector [rows of w2] f32;
  // finishHyperRouter shapes it into the op's result.
  Value w2 = op.getW2();
  auto w2Type = cast<RankedTensorType>(w2.getType());
  KernelScope kernel(
      kb, {op.getW1(), op.getEmb(), op.getB1(), w2, op.getB2()},
      {{RankedTensorType::get({w2Type.getDimSize(0)}, kb.f32()),
        {kb.sizes(w2)[0]}}});
  Value hidden =
      hyperAffine(kb, opts, kb.buffer(op.getW1()), kb.buffer(op.getEmb()),
                  kb.buffer(op.getB1()), /*relu=*/true);
  hyperAffine(kb, opts, kb.buffer(w2), hidden, kb.buffer(op.getB2()),
              /*relu=*/false, kernel.out(0));
  linalg_lowering::finishHyperRouter(rw, op, kernel.finish()[0]);
  return success();
}

Value hyperAffine(CpuKernelBuilder &kb, const KernelOptions &opts, Value m,
                  Value x, Value bias, bool relu, Value y) {
  Value c1 = kb.idx(1);
  Value rows = kb.dim(m, 0), cols = kb.dim(m, 1);
  int64_t staticRows = cast<MemRefType>(m.getType()).getDimSize(0);
  if (!y)
    y = kb.alloc(MemRefType::get({staticRows}, kb.f32()),
                CpuKernelBuilder::dynamicSizes({staticRows}, {rows}));
  Value small = kb.cmpi(arith::CmpIPredicate::ule, kb.mul(rows, cols),
                       kb.idx(kHyperInlineElements));
  Value rowsPerItem = kb.select(
      small, kb.maxs(kb.ceilDiv(rows, kb.idx(CpuKernelBuilder::kInlineItems)), c1),
      kb.idx(kRowsPerItem));
  // A chunk of a row is one vector: loaded whole, or masked for the tail.
  kernels::GemvLayout layout;
  layout.span = kb.lanes();
  layout.share = kb.vf32();
  auto load = [&](Value memref, ValueRange indices, Value count) {
    return count ? kb.vloadMasked(memref, indices, count, 0.0)
                 : kb.vload(memref, indices);
  };
  auto reduce = [&](Value share) { return kb.sum(share); };
  layout.load = load;
  layout.reduce = reduce;
  int64_t step = rowsPerStep(opts);
  // `n` consecutive rows from r on.
  auto emitRows = [&](Value r, int64_t n) {
    SmallVector<Value> at;
    for (int64_t q = 0; q < n; ++q)
      at.push_back(q ? kb.add(r, kb.idx(q)) : r);
    SmallVector<Value> out =
        kernels::gemvRows(kb, layout, m, at, x, cols, bias, relu);
    for (auto [v, row] : llvm::zip(out, at))
      kb.store(v, y, {row});
  };
  kb.workers(opts, kb.ceilDiv(rows, rowsPerItem), [&](Value item, Value) {
    Value r0 = kb.mul(item, rowsPerItem);
    Value r1 = kb.mins(kb.add(r0, rowsPerItem), rows);
    // In memory order, `step` rows at a time: the hardware prefetchers see
    // `step` sequential streams per worker; the x vectors come from L1.
    if (step == 1) {
      kb.forLoop(r0, r1, c1, [&](Value r) { emitRows(r, 1); });
      return;
    }
    Value whole =
        kb.add(r0, kb.mul(kb.divu(kb.sub(r1, r0), kb.idx(step)), kb.idx(step)));
    kb.forLoop(r0, whole, kb.idx(step), [&](Value r) { emitRows(r, step); });
    kb.forLoop(whole, r1, c1, [&](Value r) { emitRows(r, 1); });
  });
  return y;
}

} // namespace mlir::moe::cpu_lowering
