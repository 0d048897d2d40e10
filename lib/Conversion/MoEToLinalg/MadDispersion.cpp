//===- MadDispersion.cpp - moe.mad_dispersion -> linalg -------------------===//
//
// Part of the MoE-MLIR project.
//
// The per-cluster statistics are linalg.generic reductions over the tokens
// with the cluster as a parallel dimension: sums[k,q] = Σ_t [assign[t] = k]
// x[t,q]. That is E times the work of a scatter but has no data-dependent
// writes, so it never writes out of bounds and it sums in a fixed order (t
// ascending), which makes the result deterministic. An `assign` value outside
// [0, E) matches no cluster, so the token is skipped; a separate loop reports
// it through moeReportIndexError.
//
// Two passes (mean, then the deviations from it), then W = 1/(s+eps), the
// clip against the mean of W, and the mean-1 rescale, where statistics cover
// the "included" clusters: all of them for empty = raw, those with >= 2
// tokens for empty = identity (the others get W = 1).
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

namespace {
using utils::IteratorType;

/// sums[k,q] / counts[k] per cluster, 0 for an empty cluster (the authors'
/// index_reduce leaves it at 0), then `post` on each element when given.
Value clusterMean(PatternRewriter &rw, Location loc, Value sums, Value counts,
                  function_ref<Value(OpBuilder &, Location, Value)> post =
                      nullptr) {
  MLIRContext *ctx = rw.getContext();
  AffineMap kq = dimsMap(ctx, 2, {0, 1}), k = dimsMap(ctx, 2, {0});
  SmallVector<OpFoldResult> shape = tensor::getMixedSizes(rw, loc, sums);
  return generic(
             rw, loc, ValueRange{sums, counts},
             Value(tensor::EmptyOp::create(rw, loc, shape, rw.getF32Type())),
             {kq, k, kq}, {kPar, kPar},
             [&](OpBuilder &gb, Location gl, ValueRange a) {
               Value isEmpty = arith::CmpIOp::create(
                   gb, gl, arith::CmpIPredicate::eq, a[1], i32Const(gb, gl, 0));
               Value n =
                   arith::SIToFPOp::create(gb, gl, gb.getF32Type(), a[1]);
               Value mean = arith::SelectOp::create(
                   gb, gl, isEmpty, f32Const(gb, gl, 0.0),
                   arith::DivFOp::create(gb, gl, a[0], n));
               return SmallVector<Value>{post ? post(gb, gl, mean) : mean};
             })
      .front();
}

} // namespace

void mlir::moe::linalg_lowering::finishMadDispersion(PatternRewriter &rw,
                                                     MadDispersionOp op,
                                                     Value counts,
                                                     Value deviation) {
  Location loc = op.getLoc();
  MLIRContext *ctx = rw.getContext();
  OpFoldResult e = rw.getIndexAttr(op.getNumExperts());
  OpFoldResult d = tensor::getMixedSize(rw, loc, deviation, 1);
  Value zero = f32Const(rw, loc, 0.0);
  bool identity = op.getEmpty() == EmptyCluster::identity;
  AffineMap kq = dimsMap(ctx, 2, {0, 1}), k = dimsMap(ctx, 2, {0}),
            q = dimsMap(ctx, 2, {1}), none = AffineMap::get(2, 0, ctx);

  float eps = op.getEps().convertToFloat();
  Value weights =
      clusterMean(rw, loc, deviation, counts, [&](OpBuilder &gb, Location gl, Value s) -> Value {
        return arith::DivFOp::create(
            gb, gl, f32Const(gb, gl, 1.0),
            arith::AddFOp::create(gb, gl, s, f32Const(gb, gl, eps)));
      });

  // Whether cluster k enters the statistics.
  auto included = [&](OpBuilder &gb, Location gl, Value count) -> Value {
    if (!identity)
      return arith::ConstantOp::create(gb, gl, gb.getBoolAttr(true));
    return arith::CmpIOp::create(gb, gl, arith::CmpIPredicate::sge, count,
                                 i32Const(gb, gl, 2));
  };
  // Mean of W over the included entries, reduced to the shape of `outMap`
  // ([] global, [D] per feature, [E] per expert).
  auto includedMean = [&](Value w, AffineMap outMap,
                          ArrayRef<OpFoldResult> outShape) {
    SmallVector<IteratorType> iters = {kPar, kPar};
    for (unsigned dim = 0; dim < 2; ++dim)
      if (!outMap.isFunctionOfDim(dim))
        iters[dim] = kRed;
    SmallVector<Value> sums = generic(
        rw, loc, ValueRange{w, counts},
        ValueRange{filled(rw, loc, outShape, zero),
                   filled(rw, loc, outShape, zero)},
        {kq, k, outMap, outMap}, iters,
        [&](OpBuilder &gb, Location gl, ValueRange a) {
          Value inc = included(gb, gl, a[1]);
          Value z = f32Const(gb, gl, 0.0);
          return SmallVector<Value>{
              arith::AddFOp::create(
                  gb, gl, a[2], arith::SelectOp::create(gb, gl, inc, a[0], z)),
              arith::AddFOp::create(
                  gb, gl, a[3],
                  arith::SelectOp::create(gb, gl, inc, f32Const(gb, gl, 1.0),
                                          z))};
        });
    AffineMap id = rw.getMultiDimIdentityMap(outShape.size());
    SmallVector<IteratorType> parIters(outShape.size(), kPar);
    return generic(rw, loc, ValueRange{sums[0], sums[1]},
                   Value(tensor::EmptyOp::create(rw, loc, outShape, rw.getF32Type())),
                   {id, id, id}, parIters,
                   [](OpBuilder &gb, Location gl, ValueRange a) {
                     return SmallVector<Value>{
                         arith::DivFOp::create(gb, gl, a[0], a[1])};
                   })
        .front();
  };

  float clip = op.getClip().convertToFloat();
  if (clip > 0.0f) {
    Value meanAll = includedMean(weights, none, {});
    weights = generic(rw, loc, meanAll, weights, {none, kq}, {kPar, kPar},
                      [&](OpBuilder &gb, Location gl, ValueRange a) {
                        Value cap = arith::MulFOp::create(
                            gb, gl, f32Const(gb, gl, clip), a[0]);
                        return SmallVector<Value>{
                            arith::MinimumFOp::create(gb, gl, a[1], cap)};
                      })
                  .front();
  }

  Value scale;
  AffineMap scaleMap;
  switch (op.getNormalize()) {
  case DispersionNormalize::feature:
    scale = includedMean(weights, q, {d});
    scaleMap = q;
    break;
  case DispersionNormalize::expert:
    // Row means over all D features (an excluded row is overwritten below).
    scale = includedMean(weights, k, {e});
    scaleMap = k;
    break;
  case DispersionNormalize::global:
    scale = includedMean(weights, none, {});
    scaleMap = none;
    break;
  }
  weights = generic(rw, loc, ValueRange{scale, counts}, weights,
                    {scaleMap, k, kq}, {kPar, kPar},
                    [&](OpBuilder &gb, Location gl, ValueRange a) {
                      Value w = arith::DivFOp::create(gb, gl, a[2], a[0]);
                      return SmallVector<Value>{arith::SelectOp::create(
                          gb, gl, included(gb, gl, a[1]), w,
                          f32Const(gb, gl, 1.0))};
                    })
                .front();

  replaceWithCasts(rw, op, {weights, counts});
}

LogicalResult linalg_lowering::lowerMadDispersion(MadDispersionOp op,
                                                  PatternRewriter &rw) {
  Location loc = op.getLoc();
  MLIRContext *ctx = rw.getContext();
  int64_t numExperts = op.getNumExperts();
  Value assign = op.getAssign();
  Type assignType = cast<RankedTensorType>(assign.getType()).getElementType();

  if (failed(emitIndexCheck(rw, op, assign, indexConst(rw, loc, numExperts),
                            kMoEErrorMadDispersionAssign)))
    return rw.notifyMatchFailure(op, "needs an enclosing module to declare "
                                     "moeReportIndexError");
  Value tokens = promoteToF32(rw, loc, op.getTokens());

  OpFoldResult e = rw.getIndexAttr(numExperts);
  OpFoldResult d = tensor::getMixedSize(rw, loc, tokens, 1);
  Value zero = f32Const(rw, loc, 0.0);
  bool variance = op.getMeasure() == DispersionMeasure::variance;

  // "Token t is in cluster k" inside a generic whose dim 0 is k.
  auto inCluster = [&](OpBuilder &gb, Location gl, Value a) {
    Value k = indexTo(gb, gl, loopIndex(gb, gl, 0), assignType);
    return arith::CmpIOp::create(gb, gl, arith::CmpIPredicate::eq, a, k);
  };

  // counts[k]
  Value counts =
      generic(rw, loc, assign, filled(rw, loc, {e}, i32Const(rw, loc, 0)),
              {dimsMap(ctx, 2, {1}), dimsMap(ctx, 2, {0})}, {kPar, kRed},
              [&](OpBuilder &gb, Location gl, ValueRange a) {
                Value one = arith::ExtUIOp::create(gb, gl, gb.getI32Type(),
                                                   inCluster(gb, gl, a[0]));
                return SmallVector<Value>{
                    arith::AddIOp::create(gb, gl, a[1], one)};
              })
          .front();

  // Σ over the cluster of f(x[t,q], stat[k,q]) in f32, t ascending.
  AffineMap kqt_t = dimsMap(ctx, 3, {2}), kqt_tq = dimsMap(ctx, 3, {2, 1}),
            kqt_kq = dimsMap(ctx, 3, {0, 1});
  auto clusterSum = [&](Value stat,
                        function_ref<Value(OpBuilder &, Location, Value, Value)>
                            term) {
    SmallVector<Value> ins = {assign, tokens};
    SmallVector<AffineMap> maps = {kqt_t, kqt_tq};
    if (stat) {
      ins.push_back(stat);
      maps.push_back(kqt_kq);
    }
    maps.push_back(kqt_kq);
    return generic(rw, loc, ins, filled(rw, loc, {e, d}, zero), maps,
                   {kPar, kPar, kRed},
                   [&](OpBuilder &gb, Location gl, ValueRange a) {
                     Value acc = a.back();
                     Value t = term(gb, gl, a[1], stat ? a[2] : Value());
                     // select, not a 0/1 product: NaN stays in its cluster.
                     return SmallVector<Value>{arith::SelectOp::create(
                         gb, gl, inCluster(gb, gl, a[0]),
                         arith::AddFOp::create(gb, gl, acc, t), acc)};
                   })
        .front();
  };
  Value mean = clusterMean(
      rw, loc,
      clusterSum(Value(), [](OpBuilder &, Location, Value x, Value) { return x; }),
      counts);
  Value deviation = clusterSum(
      mean, [&](OpBuilder &gb, Location gl, Value x, Value mu) -> Value {
        Value diff = arith::SubFOp::create(gb, gl, x, mu);
        if (variance)
          return arith::MulFOp::create(gb, gl, diff, diff);
        return math::AbsFOp::create(gb, gl, diff);
      });
  finishMadDispersion(rw, op, counts, deviation);
  return success();
}
