//===- TopkRenorm.cpp - moe.topk_renorm -> linalg + scf -------------------===//
//
// Part of the MoE-MLIR project.
//
// The rows of `scores` are viewed as [R, K]. Selection is k rounds (scf.for)
// of one linalg.generic argmax each: round j picks the best element that ranks
// strictly after round j-1's pick in the dialect's total order (NaN first,
// then larger values, then lower index). Because that order is strict and
// total, "after the previous pick" excludes exactly the elements already
// taken, so no selection mask is kept. The weights are then one or two
// linalg.generic ops per mode.
//
//===----------------------------------------------------------------------===//

#include "Patterns.h"
#include "Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <numeric>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::lowering;

namespace {
using utils::IteratorType;
constexpr IteratorType kPar = IteratorType::parallel;
constexpr IteratorType kRed = IteratorType::reduction;

/// `scores` as a 2-D [R, K] tensor (rank 1 gets a unit row dimension, rank > 2
/// collapses the leading dimensions).
Value viewAsRows(OpBuilder &b, Location loc, Value scores) {
  auto type = cast<RankedTensorType>(scores.getType());
  int64_t rank = type.getRank();
  if (rank == 2)
    return scores;
  if (rank == 1) {
    auto rowsType = RankedTensorType::get({1, type.getDimSize(0)},
                                          type.getElementType());
    return tensor::ExpandShapeOp::create(
        b, loc, rowsType, scores, {{0, 1}},
        {b.getIndexAttr(1), tensor::getMixedSize(b, loc, scores, 0)});
  }
  ReassociationIndices lead(rank - 1);
  std::iota(lead.begin(), lead.end(), 0);
  return tensor::CollapseShapeOp::create(
      b, loc, scores, ArrayRef<ReassociationIndices>{lead, {rank - 1}});
}

/// The inverse of viewAsRows for a [R, k] result, cast to `resultType`.
Value viewAsResult(OpBuilder &b, Location loc, Value rows, Value scores,
                   RankedTensorType resultType) {
  auto scoresType = cast<RankedTensorType>(scores.getType());
  int64_t rank = scoresType.getRank();
  auto rowsType = cast<RankedTensorType>(rows.getType());
  Value result = rows;
  if (rank == 1) {
    result = tensor::CollapseShapeOp::create(
        b, loc, rows, ArrayRef<ReassociationIndices>{{0, 1}});
  } else if (rank > 2) {
    SmallVector<OpFoldResult> shape = sizesOf(b, loc, scores);
    shape.back() = tensor::getMixedSize(b, loc, rows, 1);
    SmallVector<int64_t> staticShape(scoresType.getShape());
    staticShape.back() = rowsType.getDimSize(1);
    ReassociationIndices lead(rank - 1);
    std::iota(lead.begin(), lead.end(), 0);
    result = tensor::ExpandShapeOp::create(
        b, loc, RankedTensorType::get(staticShape, rowsType.getElementType()),
        rows, {lead, {rank - 1}}, shape);
  }
  return castTo(b, loc, result, resultType);
}

struct TopkRenormLowering : OpRewritePattern<TopkRenormOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(TopkRenormOp op,
                                PatternRewriter &rw) const override {
    Location loc = op.getLoc();
    int64_t k = op.getK();
    Type i32 = rw.getI32Type();

    Value rows = promoteToF32(rw, loc, viewAsRows(rw, loc, op.getScores()));
    OpFoldResult numRows = tensor::getMixedSize(rw, loc, rows, 0);
    OpFoldResult numExperts = tensor::getMixedSize(rw, loc, rows, 1);
    Value numExpertsI32 = indexTo(
        rw, loc, getValueOrCreateConstantIndexOp(rw, loc, numExperts), i32);

    auto [vals, idxs] = selectTopK(rw, loc, rows, numRows, k, numExpertsI32);
    Value weights = computeWeights(rw, loc, op, rows, vals);

    auto weightsType = cast<RankedTensorType>(op.getWeights().getType());
    auto indicesType = cast<RankedTensorType>(op.getIndices().getType());
    rw.replaceOp(op, {viewAsResult(rw, loc, weights, op.getScores(), weightsType),
                      viewAsResult(rw, loc, idxs, op.getScores(), indicesType)});
    return success();
  }

private:
  /// k argmax rounds; returns the selected values [R, k] (f32, descending in
  /// the selection order) and their indices [R, k] (i32).
  static std::pair<Value, Value> selectTopK(OpBuilder &b, Location loc,
                                            Value rows, OpFoldResult numRows,
                                            int64_t k, Value numExpertsI32) {
    MLIRContext *ctx = b.getContext();
    Type f32 = b.getF32Type(), i32 = b.getI32Type();
    SmallVector<OpFoldResult> outShape = {numRows, b.getIndexAttr(k)};
    Value vals0 = tensor::EmptyOp::create(b, loc, outShape, f32);
    Value idxs0 = tensor::EmptyOp::create(b, loc, outShape, i32);

    Value c0 = indexConst(b, loc, 0), c1 = indexConst(b, loc, 1);
    auto loop = scf::ForOp::create(
        b, loc, c0, indexConst(b, loc, k), c1, ValueRange{vals0, idxs0},
        [&](OpBuilder &lb, Location ll, Value j, ValueRange iter) {
          Value vals = iter[0], idxs = iter[1];
          // The previous round's pick (column max(j-1, 0); ignored at j = 0).
          Value first = arith::CmpIOp::create(lb, ll, arith::CmpIPredicate::eq,
                                              j, c0);
          Value prevCol = arith::SelectOp::create(
              lb, ll, first, c0, arith::SubIOp::create(lb, ll, j, c1));
          Value prevVal = sliceAlong(lb, ll, vals, 1, prevCol);
          Value prevIdx = sliceAlong(lb, ll, idxs, 1, prevCol);

          // The "nothing yet" candidate ranks after every real element.
          Value bestVal = filled(lb, ll, {numRows}, negInf(lb, ll));
          Value bestIdx = filled(lb, ll, {numRows}, numExpertsI32);
          AffineMap rc = dimsMap(ctx, 2, {0, 1}), r = dimsMap(ctx, 2, {0});
          SmallVector<Value> best = generic(
              lb, ll, ValueRange{rows, prevVal, prevIdx},
              ValueRange{bestVal, bestIdx}, {rc, r, r, r, r}, {kPar, kRed},
              [&](OpBuilder &gb, Location gl, ValueRange a) {
                Value x = a[0], pv = a[1], pi = a[2], cv = a[3], ci = a[4];
                Value c = indexTo(gb, gl, loopIndex(gb, gl, 1), i32);
                Value eligible = arith::OrIOp::create(
                    gb, gl, first, ranksBefore(gb, gl, pv, pi, x, c));
                Value take = arith::AndIOp::create(
                    gb, gl, eligible, ranksBefore(gb, gl, x, c, cv, ci));
                return SmallVector<Value>{
                    arith::SelectOp::create(gb, gl, take, x, cv),
                    arith::SelectOp::create(gb, gl, take, c, ci)};
              });
          Value newVals = insertAlong(lb, ll, best[0], vals, 1, j);
          Value newIdxs = insertAlong(lb, ll, best[1], idxs, 1, j);
          scf::YieldOp::create(lb, ll, ValueRange{newVals, newIdxs});
        });
    return {loop.getResult(0), loop.getResult(1)};
  }

  /// The gate weights [R, k] of the selected values `vals` per mode.
  static Value computeWeights(OpBuilder &b, Location loc, TopkRenormOp op,
                              Value rows, Value vals) {
    MLIRContext *ctx = b.getContext();
    bool renormalize = op.getRenormalize();
    if (op.getMode() == TopkMode::probs && !renormalize)
      return vals;

    OpFoldResult numRows = tensor::getMixedSize(b, loc, rows, 0);
    SmallVector<OpFoldResult> outShape = sizesOf(b, loc, vals);
    Value zero = f32Const(b, loc, 0.0);
    AffineMap rc = dimsMap(ctx, 2, {0, 1}), r = dimsMap(ctx, 2, {0});
    Value init = tensor::EmptyOp::create(b, loc, outShape, b.getF32Type());

    if (op.getMode() == TopkMode::probs) {
      // w = v / Σ v over the selection; a zero sum gives zero weights.
      Value sum = generic(b, loc, vals, filled(b, loc, {numRows}, zero),
                          {rc, r}, {kPar, kRed},
                          [](OpBuilder &gb, Location gl, ValueRange a) {
                            return SmallVector<Value>{
                                arith::AddFOp::create(gb, gl, a[1], a[0])};
                          })
                      .front();
      return generic(b, loc, ValueRange{vals, sum}, init, {rc, r, rc},
                     {kPar, kPar},
                     [](OpBuilder &gb, Location gl, ValueRange a) {
                       Value isZero = arith::CmpFOp::create(
                           gb, gl, arith::CmpFPredicate::OEQ, a[1],
                           f32Const(gb, gl, 0.0));
                       Value w = arith::DivFOp::create(gb, gl, a[0], a[1]);
                       return SmallVector<Value>{arith::SelectOp::create(
                           gb, gl, isZero, f32Const(gb, gl, 0.0), w)};
                     })
          .front();
    }

    // Logits: a softmax either over the k selected values (renormalize) or
    // over all K logits read at the selection. Its max is the first selected
    // value in the first case (NaN included) and a NaN-propagating max of the
    // row in the second. A row whose max is -inf is fully masked: zeros.
    Value source = renormalize ? vals : rows;
    Value max;
    if (renormalize) {
      max = sliceAlong(b, loc, vals, 1, b.getIndexAttr(0));
    } else {
      max = generic(b, loc, rows, filled(b, loc, {numRows}, negInf(b, loc)),
                    {rc, r}, {kPar, kRed},
                    [](OpBuilder &gb, Location gl, ValueRange a) {
                      return SmallVector<Value>{
                          arith::MaximumFOp::create(gb, gl, a[1], a[0])};
                    })
                .front();
    }
    Value sum =
        generic(b, loc, ValueRange{source, max},
                filled(b, loc, {numRows}, zero), {rc, r, r}, {kPar, kRed},
                [](OpBuilder &gb, Location gl, ValueRange a) {
                  Value e = math::ExpOp::create(
                      gb, gl, arith::SubFOp::create(gb, gl, a[0], a[1]));
                  return SmallVector<Value>{
                      arith::AddFOp::create(gb, gl, a[2], e)};
                })
            .front();
    return generic(
               b, loc, ValueRange{vals, max, sum}, init, {rc, r, r, rc},
               {kPar, kPar},
               [](OpBuilder &gb, Location gl, ValueRange a) {
                 Value masked = arith::CmpFOp::create(
                     gb, gl, arith::CmpFPredicate::OEQ, a[1], negInf(gb, gl));
                 Value e = math::ExpOp::create(
                     gb, gl, arith::SubFOp::create(gb, gl, a[0], a[1]));
                 Value w = arith::DivFOp::create(gb, gl, e, a[2]);
                 return SmallVector<Value>{arith::SelectOp::create(
                     gb, gl, masked, f32Const(gb, gl, 0.0), w)};
               })
        .front();
  }
};
} // namespace

void mlir::moe::lowering::populateTopkRenormPattern(
    RewritePatternSet &patterns) {
  patterns.add<TopkRenormLowering>(patterns.getContext());
}
