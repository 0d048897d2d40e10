//===- AdjacencyUpdate.cpp - moe.adjacency_update -> fast CPU kernel ------===//
//
// Part of the MoE-MLIR project.
//
// The portable lowering builds the [T, E] indicator and an i32 matmul
// (T·E² multiply-adds). Here every token adds one to C[j, m] for each pair of
// its distinct in-range experts (T·k² increments): each token's slots are
// first deduplicated in a k-entry scratch list, so a repeated index counts
// once. Integer counts are exact in any order. The O(E²) tail (row/column
// normalization, moving average) is the portable one.
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
    k.forLoop(c0, eVal, c1, [&](Value r) {
      k.forLoop(c0, eVal, c1, [&](Value col) {
        k.store(k.cI32(0), c, {r, col});
      });
    });
    Value list = k.alloc(MemRefType::get({kDyn}, b.getIndexType()), {slots});
    k.forLoop(c0, tokens, c1, [&](Value t) {
      // The distinct in-range experts of token t, in slot order.
      Value n = k.forLoop(
          c0, slots, c1, ValueRange{c0},
          [&](Value s, ValueRange it) -> SmallVector<Value> {
            Value v = k.load(idx, {t, s});
            Value ok = k.andI(k.cmpi(arith::CmpIPredicate::sge, v, zeroI),
                              k.cmpi(arith::CmpIPredicate::slt, v, eI));
            Value vi = k.castInt(v, b.getIndexType());
            Value seen =
                k.forLoop(c0, it[0], c1, ValueRange{k.cBool(false)},
                          [&](Value q, ValueRange f) -> SmallVector<Value> {
                            return {k.orI(f[0], k.cmpi(arith::CmpIPredicate::eq,
                                                       k.load(list, {q}), vi))};
                          })[0];
            Value add = k.andI(ok, k.notI1(seen));
            k.ifThen(add, [&] { k.store(vi, list, {it[0]}); });
            return {k.select(add, k.add(it[0], c1), it[0])};
          })[0];
      k.forLoop(c0, n, c1, [&](Value p) {
        Value j = k.load(list, {p});
        k.forLoop(c0, n, c1, [&](Value q) {
          Value m = k.load(list, {q});
          k.store(k.add(k.load(c, {j, m}), k.cI32(1)), c, {j, m});
        });
      });
    });
    (void)opts; // T·k² increments: sequential is far below the memory traffic.

    lowering::finishAdjacencyUpdate(rw, op, aT, k.tensor(c), eSize);
    return success();
  }
};
} // namespace

void mlir::moe::cpu::populateAdjacencyUpdateKernel(RewritePatternSet &p,
                                                   const KernelOptions &o) {
  p.add<AdjacencyUpdateKernel>(p.getContext(), o);
}
