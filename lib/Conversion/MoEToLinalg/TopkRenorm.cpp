//===- TopkRenorm.cpp - moe.topk_renorm -> linalg + scf -------------------===//
//
// Part of the MoE-MLIR project.
//
// Selection is k rounds (scf.for) of one linalg.generic argmax over the last
// dimension each (the leading dimensions, any number, stay parallel loops):
// round j picks the best element that ranks strictly after round j-1's pick
// in the dialect's total order (NaN first, then larger values, then lower
// index). Because that order is strict and
// total, "after the previous pick" excludes exactly the elements already
// taken, so no selection mask is kept. The weights are then one or two
// linalg.generic ops per mode.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

namespace {

/// k argmax rounds; returns the selected values [..., k] (f32, in selection
/// order) and their indices [..., k] (i32).
std::pair<Value, Value> selectTopK(OpBuilder &b, Location loc,
                                   Value scores,
                                   ArrayRef<OpFoldResult> lead,
                                   int64_t rank, int64_t k,
                                   Value numExpertsI32) {
  MLIRContext *ctx = b.getContext();
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  SmallVector<OpFoldResult> outShape(lead);
  outShape.push_back(b.getIndexAttr(k));
  Value vals0 = tensor::EmptyOp::create(b, loc, outShape, f32);
  Value idxs0 = tensor::EmptyOp::create(b, loc, outShape, i32);
  RowMaps maps(ctx, rank);
  int64_t last = rank - 1;

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
        Value prevVal = sliceAlong(lb, ll, vals, last, prevCol);
        Value prevIdx = sliceAlong(lb, ll, idxs, last, prevCol);

        // The "nothing yet" candidate ranks after every real element.
        Value bestVal = filled(lb, ll, lead, negInf(lb, ll));
        Value bestIdx = filled(lb, ll, lead, numExpertsI32);
        SmallVector<Value> best = generic(
            lb, ll, ValueRange{scores, prevVal, prevIdx},
            ValueRange{bestVal, bestIdx},
            {maps.all, maps.lead, maps.lead, maps.lead, maps.lead},
            maps.reduce,
            [&](OpBuilder &gb, Location gl, ValueRange a) {
              Value x = a[0], pv = a[1], pi = a[2], cv = a[3], ci = a[4];
              Value c = indexTo(gb, gl, loopIndex(gb, gl, last), i32);
              Value afterPrev = ranksBefore(gb, gl, pv, pi, x, c);
              Value eligible = arith::OrIOp::create(gb, gl, first, afterPrev);
              Value better = ranksBefore(gb, gl, x, c, cv, ci);
              Value take = arith::AndIOp::create(gb, gl, eligible, better);
              return SmallVector<Value>{
                  arith::SelectOp::create(gb, gl, take, x, cv),
                  arith::SelectOp::create(gb, gl, take, c, ci)};
            });
        Value newVals = insertAlong(lb, ll, best[0], vals, last, j);
        Value newIdxs = insertAlong(lb, ll, best[1], idxs, last, j);
        scf::YieldOp::create(lb, ll, ValueRange{newVals, newIdxs});
      });
  return {loop.getResult(0), loop.getResult(1)};
}

/// Σ over the last dimension of `f(x, stat)` where stat is broadcast from
/// the leading dims (or absent).
Value rowSum(OpBuilder &b, Location loc, Value x, Value stat,
             ArrayRef<OpFoldResult> lead, const RowMaps &maps,
             function_ref<Value(OpBuilder &, Location, Value, Value)>
                 term) {
  SmallVector<Value> ins = {x};
  SmallVector<AffineMap> indexing = {maps.all};
  if (stat) {
    ins.push_back(stat);
    indexing.push_back(maps.lead);
  }
  indexing.push_back(maps.lead);
  return generic(b, loc, ins, filled(b, loc, lead, f32Const(b, loc, 0.0)),
                 indexing, maps.reduce,
                 [&](OpBuilder &gb, Location gl, ValueRange a) {
                   Value t = term(gb, gl, a[0], stat ? a[1] : Value());
                   return SmallVector<Value>{
                       arith::AddFOp::create(gb, gl, a.back(), t)};
                 })
      .front();
}

/// The gate weights [..., k] of the selected values `vals` per mode.
Value computeWeights(OpBuilder &b, Location loc, TopkRenormOp op,
                     Value scores, ArrayRef<OpFoldResult> lead,
                     int64_t rank, Value vals) {
  bool renormalize = op.getRenormalize();
  if (op.getMode() == TopkMode::probs && !renormalize)
    return vals;

  RowMaps maps(b.getContext(), rank);
  Value init =
      tensor::EmptyOp::create(b, loc, sizesOf(b, loc, vals), b.getF32Type());

  if (op.getMode() == TopkMode::probs) {
    // w = v / Σ v over the selection; a zero sum gives zero weights.
    Value sum = rowSum(b, loc, vals, Value(), lead, maps,
                       [](OpBuilder &, Location, Value v, Value) { return v; });
    return generic(b, loc, ValueRange{vals, sum}, init,
                   {maps.all, maps.lead, maps.all}, maps.parallel,
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
  Value source = renormalize ? vals : scores;
  Value max;
  if (renormalize) {
    max = sliceAlong(b, loc, vals, rank - 1, b.getIndexAttr(0));
  } else {
    max = generic(b, loc, scores, filled(b, loc, lead, negInf(b, loc)),
                  {maps.all, maps.lead}, maps.reduce,
                  [](OpBuilder &gb, Location gl, ValueRange a) {
                    return SmallVector<Value>{
                        arith::MaximumFOp::create(gb, gl, a[1], a[0])};
                  })
              .front();
  }
  Value sum = rowSum(b, loc, source, max, lead, maps,
                     [](OpBuilder &gb, Location gl, Value x, Value m) {
                       return math::ExpOp::create(
                           gb, gl, arith::SubFOp::create(gb, gl, x, m));
                     });
  return generic(
             b, loc, ValueRange{vals, max, sum}, init,
             {maps.all, maps.lead, maps.lead, maps.all}, maps.parallel,
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
} // namespace

LogicalResult linalg_lowering::lowerTopkRenorm(TopkRenormOp op,
                                               PatternRewriter &rw) {
  Location loc = op.getLoc();
  // Any rank works as is: the leading dimensions are parallel loops of every
  // generic and the slices below drop the last dimension. (No collapse to
  // [R, K]: expanding R back into two dynamic sizes trips an LLVM 22
  // expand-strided-metadata crash when the result is later sliced.)
  Value scores = promoteToF32(rw, loc, op.getScores());
  int64_t rank = cast<RankedTensorType>(scores.getType()).getRank();
  SmallVector<OpFoldResult> lead = sizesOf(rw, loc, scores);
  OpFoldResult numExperts = lead.pop_back_val();
  Value numExpertsI32 =
      indexTo(rw, loc, getValueOrCreateConstantIndexOp(rw, loc, numExperts),
              rw.getI32Type());

  auto [vals, idxs] =
      selectTopK(rw, loc, scores, lead, rank, op.getK(), numExpertsI32);
  Value weights = computeWeights(rw, loc, op, scores, lead, rank, vals);
  replaceWithCasts(rw, op, {weights, idxs});
  return success();
}
