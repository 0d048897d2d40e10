//===- AdjacencyUpdate.cpp - moe.adjacency_update -> fast CPU kernel ------===//
//
// Part of the MoE-MLIR project.
//
// The portable lowering builds the [T, E] indicator and an i32 matmul
// (T·E² multiply-adds). Here every token adds one to C[j, m] for each pair of
// its distinct in-range experts (T·k² increments): each token's slots are
// first deduplicated (an expert stamped with the token already is skipped),
// so a repeated index counts once. Blocks of tokens go to the workers, each
// counting into its own [E, E] matrix; the matrices are summed at the end
// (integer counts are exact in any order, so the result does not depend on
// the thread count). The O(E²) tail (row/column normalization, moving
// average) is the portable one.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "../MoEToLinalg/Patterns.h"
#include "../MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu;

namespace {
constexpr int64_t kDyn = ShapedType::kDynamic;
/// Tokens per worker item.
constexpr int64_t kTokensPerItem = 512;
/// Largest E counted by several workers (each with its own E x E matrix).
constexpr int64_t kMaxParallelExperts = 1024;

struct AdjacencyUpdateKernel : KernelPattern<AdjacencyUpdateOp> {
  using KernelPattern::KernelPattern;

  LogicalResult matchAndRewrite(AdjacencyUpdateOp op,
                                PatternRewriter &rw) const override {
    Location loc = op.getLoc();
    Value aT = lowering::promoteToF32(rw, loc, op.getA());
    auto aType = cast<RankedTensorType>(aT.getType());
    OpFoldResult eSize = aType.isDynamicDim(0)
                             ? tensor::getMixedSize(rw, loc, aT, 1)
                             : tensor::getMixedSize(rw, loc, aT, 0);
    Value eVal = getValueOrCreateConstantIndexOp(rw, loc, eSize);
    if (failed(lowering::emitIndexCheck(rw, op, op.getIdx(), eVal,
                                        lowering::IndexErrorOp::AdjacencyIdx)))
      return rw.notifyMatchFailure(op, "needs an enclosing module to declare "
                                       "moeReportIndexError");
    ImplicitLocOpBuilder b(loc, rw);
    CK k(b);
    Type i32 = k.i32();
    Value c0 = k.idx(0), c1 = k.idx(1);
    Value idx = k.buffer(op.getIdx());
    Value tokens = k.dim(idx, 0), slots = k.dim(idx, 1);
    Type idxType = cast<MemRefType>(idx.getType()).getElementType();
    Value eI = k.castInt(eVal, idxType), zeroI = k.castInt(c0, idxType);

    int64_t eStatic = getConstantIntValue(eSize).value_or(kDyn);
    auto cType = MemRefType::get({eStatic, eStatic}, i32);
    SmallVector<Value> dyn;
    if (eStatic == kDyn)
      dyn = {eVal, eVal};
    Value c = k.alloc(cType, dyn);
    // Per worker: its own counts (integers: the sum over workers is exact in
    // any order), the token that last saw each expert, and the token's list
    // of distinct experts.
    // Per-worker matrices only while they are small (E <= 1024: 4 MiB each).
    KernelOptions o = opts;
    if (eStatic == kDyn || eStatic > kMaxParallelExperts)
      o.numThreads = 1;
    Value counts = k.scratch(o, cType, dyn);
    Value stamps = k.scratch(
        o, MemRefType::get({eStatic}, b.getIndexType()),
        eStatic == kDyn ? SmallVector<Value>{eVal} : SmallVector<Value>{});
    Value lists = k.scratch(o, MemRefType::get({kDyn}, b.getIndexType()),
                            {slots});
    Value numWorkers = k.idx(std::max<int64_t>(o.numThreads, 1));
    Value none = k.idx(-1);
    k.forLoop(c0, numWorkers, c1, [&](Value w) {
      k.forLoop(c0, eVal, c1, [&](Value r) {
        k.store(none, stamps, {w, r});
        k.forLoop(c0, eVal, c1, [&](Value col) {
          k.store(k.cI32(0), counts, {w, r, col});
        });
      });
    });
    Value numItems = k.ceilDiv(tokens, k.idx(kTokensPerItem));
    k.workers(o, numItems, [&](Value item, Value w) {
      Value cw = k.workerSlice(counts, w);
      Value seen = k.workerSlice(stamps, w);
      Value list = k.workerSlice(lists, w);
      Value t0 = k.mul(item, k.idx(kTokensPerItem));
      Value t1 = k.mins(k.add(t0, k.idx(kTokensPerItem)), tokens);
      k.forLoop(t0, t1, c1, [&](Value t) {
        // The distinct in-range experts of token t, in slot order: an expert
        // whose stamp is already t was listed by an earlier slot.
        Value n = k.forLoop(
            c0, slots, c1, ValueRange{c0},
            [&](Value s, ValueRange it) -> SmallVector<Value> {
              Value v = k.load(idx, {t, s});
              Value ok = k.andI(k.cmpi(arith::CmpIPredicate::sge, v, zeroI),
                                k.cmpi(arith::CmpIPredicate::slt, v, eI));
              // Out of range: read the stamp of expert 0, add nothing.
              Value vi = k.select(ok, k.castInt(v, b.getIndexType()), c0);
              Value fresh = k.cmpi(arith::CmpIPredicate::ne,
                                   k.load(seen, {vi}), t);
              Value add = k.andI(ok, fresh);
              k.ifThen(add, [&] {
                k.store(t, seen, {vi});
                k.store(vi, list, {it[0]});
              });
              return {k.select(add, k.add(it[0], c1), it[0])};
            })[0];
        k.forLoop(c0, n, c1, [&](Value p) {
          Value j = k.load(list, {p});
          k.forLoop(c0, n, c1, [&](Value q) {
            Value m = k.load(list, {q});
            k.store(k.add(k.load(cw, {j, m}), k.cI32(1)), cw, {j, m});
          });
        });
      });
    });
    // C = Σ over workers.
    k.forLoop(c0, eVal, c1, [&](Value r) {
      k.forLoop(c0, eVal, c1, [&](Value col) {
        Value sum = k.forLoop(c0, numWorkers, c1, ValueRange{k.cI32(0)},
                              [&](Value w, ValueRange acc) -> SmallVector<Value> {
                                return {k.add(acc[0], k.load(counts, {w, r, col}))};
                              })[0];
        k.store(sum, c, {r, col});
      });
    });

    lowering::finishAdjacencyUpdate(rw, op, aT, k.tensor(c), eSize);
    return success();
  }
};
} // namespace

void mlir::moe::cpu::populateAdjacencyUpdateKernel(RewritePatternSet &p,
                                                   const KernelOptions &o) {
  p.add<AdjacencyUpdateKernel>(p.getContext(), o);
}
