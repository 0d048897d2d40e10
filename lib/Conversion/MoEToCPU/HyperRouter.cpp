//===- HyperRouter.cpp - moe.hyper_router -> fast CPU kernel --------------===//
//
// Part of the MoE-MLIR project.
//
// Two matrix-vector products y = W x + bias (then ReLU for the hidden layer):
// row blocks go to the workers, each row a dot product on vectors of the
// target's width (vector<16> AVX-512, vector<8> AVX2) over its contiguous
// columns (masked tail), eight rows interleaved. The op is memory-bound on w2
// ([E·(D+1), Dh]). The split of the output into w and b is the portable one.
//
// Measured (AMD EPYC, 2 threads, execution API, Dh = 256): 8 interleaved rows
// instead of 4 and blocks of 64 rows instead of 16 took w2 at D = 1024 from
// about 10-16 to 17-22 GB/s; a matrix of at most 1 MiB (the decode case
// D = 64, E = 8: 0.5 MiB) as at most four blocks, which the workers run on
// the calling thread, went from 6-7 to 55 GB/s (it is in cache; waking the
// pool cost more than the product).
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "../MoEToLinalg/Patterns.h"

#include "MoE/IR/MoEOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu;

namespace {
constexpr int64_t kDyn = ShapedType::kDynamic;
constexpr int64_t kRowsPerItem = 64;
constexpr int64_t kRowGroup = 8;
/// Matrices of at most this many elements (1 MiB of f32) run on the calling
/// thread: as at most CK::kInlineItems items, which CK::workers inlines.
constexpr int64_t kInlineElements = 1 << 18;

struct HyperRouterKernel : KernelPattern<HyperRouterOp> {
  using KernelPattern::KernelPattern;

  /// y = m · x + bias (ReLU when `relu`): [rows] f32.
  Value affine(CK &k, Value m, Value x, Value bias, bool relu) const {
    Value c0 = k.idx(0), c1 = k.idx(1);
    Value rows = k.dim(m, 0), cols = k.dim(m, 1);
    int64_t staticRows = cast<MemRefType>(m.getType()).getDimSize(0);
    Value y = staticRows == kDyn
                  ? k.alloc(MemRefType::get({kDyn}, k.f32()), {rows})
                  : k.alloc(MemRefType::get({staticRows}, k.f32()), {});
    int64_t lanes = k.lanes();
    Value full = k.divu(cols, k.idx(lanes));
    Value tail = k.sub(cols, k.mul(full, k.idx(lanes)));
    Value zeros = k.constLike(k.vf32(), 0.0);
    Value small = k.cmpi(arith::CmpIPredicate::ule, k.mul(rows, cols),
                         k.idx(kInlineElements));
    Value rowsPerItem =
        k.select(small,
                 k.maxs(k.ceilDiv(rows, k.idx(CK::kInlineItems)), c1),
                 k.idx(kRowsPerItem));
    k.workers(
        opts, k.ceilDiv(rows, rowsPerItem), [&](Value item, Value) {
          Value r0 = k.mul(item, rowsPerItem);
          Value r1 = k.mins(k.add(r0, rowsPerItem), rows);
          // kRowGroup rows at a time: independent FMA chains share the x loads
          // (one chain per row is latency-bound). Rows past r1 repeat the last
          // row and are not stored.
          k.forLoop(r0, r1, k.idx(kRowGroup), [&](Value rb) {
            SmallVector<Value> ri;
            for (int64_t q = 0; q < kRowGroup; ++q)
              ri.push_back(k.mins(k.add(rb, k.idx(q)), k.sub(r1, c1)));
            SmallVector<Value> init(kRowGroup, zeros);
            SmallVector<Value> acc = k.forLoop(
                c0, full, c1, init,
                [&](Value c, ValueRange a) -> SmallVector<Value> {
                  Value col = k.mul(c, k.idx(lanes));
                  Value xv = k.vload(x, {col});
                  SmallVector<Value> next;
                  for (int64_t q = 0; q < kRowGroup; ++q)
                    next.push_back(k.fma(k.vload(m, {ri[q], col}), xv, a[q]));
                  return next;
                });
            SmallVector<Type> types(kRowGroup, k.vf32());
            acc = k.ifElse(
                k.cmpi(arith::CmpIPredicate::ne, tail, c0), types,
                [&]() -> SmallVector<Value> {
                  Value col = k.mul(full, k.idx(lanes));
                  Value xv = k.vloadMasked(x, {col}, tail, 0.0);
                  SmallVector<Value> next;
                  for (int64_t q = 0; q < kRowGroup; ++q)
                    next.push_back(k.fma(
                        k.vloadMasked(m, {ri[q], col}, tail, 0.0), xv, acc[q]));
                  return next;
                },
                [&]() -> SmallVector<Value> { return acc; });
            for (int64_t q = 0; q < kRowGroup; ++q) {
              Value r = k.add(rb, k.idx(q));
              k.ifThen(k.cmpi(arith::CmpIPredicate::ult, r, r1), [&] {
                Value v = k.fadd(k.sum(acc[q]), k.loadF(bias, {r}));
                if (relu)
                  v = k.fmax(v, k.cF32(0.0));
                k.store(v, y, {r});
              });
            }
          });
        });
    return y;
  }

  LogicalResult matchAndRewrite(HyperRouterOp op,
                                PatternRewriter &rw) const override {
    ImplicitLocOpBuilder b(op.getLoc(), rw);
    CK k(b, opts);
    Value hidden = affine(k, k.buffer(op.getW1()), k.buffer(op.getEmb()),
                          k.buffer(op.getB1()), /*relu=*/true);
    Value out = affine(k, k.buffer(op.getW2()), hidden, k.buffer(op.getB2()),
                       /*relu=*/false);
    lowering::finishHyperRouter(rw, op, k.tensor(out));
    return success();
  }
};
} // namespace

void mlir::moe::cpu::populateHyperRouterKernel(RewritePatternSet &p,
                                               const KernelOptions &o) {
  p.add<HyperRouterKernel>(p.getContext(), o);
}
