//===- Route.cpp - moe.route -> linalg + scf ------------------------------===//
//
// Part of the MoE-MLIR project.
//
// The steps of the op description, each a linalg.generic over [T, E] (or
// [T, G, E/G], [T, k]): scores, choice scores (+ bias), group scores and the
// kept-group mask, the masked top-k, the gather and scoring of the weights,
// renormalization and scaling. The elementwise maths of each step (scores,
// choice values, group scores, weights) is MoE/Kernels/Route.h's, which the
// CPU and GPU kernels share; the order of every top-k is TopK.h's
// (ranksBefore). A top-k is k rounds (scf.for) of one argmax
// generic each; round j takes the best allowed element that ranks strictly
// after round j-1's pick in the dialect's total order (NaN first, larger
// values, lower index), so no "taken" mask is needed.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Route.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

namespace {
using kernels::KernelBuilder;
using kernels::RouteSpec;
using utils::IteratorType;

Value mapRows(OpBuilder &b, Location loc, ValueRange ins,
              ArrayRef<AffineMap> inMaps, Value like, GenericBody body) {
  RowMaps rows(like);
  Value init =
      tensor::EmptyOp::create(b, loc, sizesOf(b, loc, like), b.getF32Type());
  SmallVector<AffineMap> maps(inMaps);
  maps.push_back(rows.all);
  return generic(b, loc, ins, init, maps, rows.parallel, body).front();
}

/// Reduces the last dimension of `x` with `combine(acc, element)` from `init`.
Value reduceRows(OpBuilder &b, Location loc, Value x, Value init,
                 function_ref<Value(OpBuilder &, Location, Value, Value)>
                     combine) {
  SmallVector<OpFoldResult> lead = sizesOf(b, loc, x);
  lead.pop_back();
  RowMaps rows(x);
  return generic(b, loc, x, filled(b, loc, lead, init), {rows.all, rows.lead},
                 rows.reduce,
                 [&](OpBuilder &gb, Location gl, ValueRange a) {
                   return SmallVector<Value>{combine(gb, gl, a[1], a[0])};
                 })
      .front();
}

Value rowSum(OpBuilder &b, Location loc, Value x) {
  return reduceRows(b, loc, x, f32Const(b, loc, 0.0),
                    [](OpBuilder &gb, Location gl, Value acc, Value v) {
                      return arith::AddFOp::create(gb, gl, acc, v).getResult();
                    });
}

/// `fn` of the kernels' builder on each element of `ins` (same shape as
/// `like`): the maths of MoE/Kernels (a custom score region, sigmoid, the
/// softmax's terms) inlined in a linalg.generic.
Value mapWithKernelBuilder(
    OpBuilder &b, Location loc, ValueRange ins, ArrayRef<AffineMap> inMaps,
    Value like, function_ref<Value(KernelBuilder &, ValueRange)> fn) {
  return mapRows(b, loc, ins, inMaps, like,
                 [&](OpBuilder &gb, Location gl, ValueRange a) {
                   ImplicitLocOpBuilder ib(gl, gb);
                   KernelBuilder kb(ib);
                   return SmallVector<Value>{fn(kb, a)};
                 });
}

/// softmax over the last dimension with RowSoftmax.h's terms and scores: 0
/// for a row whose max is -inf, NaN rows stay NaN (the max propagates NaN).
Value softmaxRows(OpBuilder &b, Location loc, Value x) {
  RowMaps rows(x);
  Value max = reduceRows(b, loc, x, negInf(b, loc),
                         [](OpBuilder &gb, Location gl, Value acc, Value v) {
                           return arith::MaximumFOp::create(gb, gl, acc, v)
                               .getResult();
                         });
  Value e = mapWithKernelBuilder(
      b, loc, {x, max}, {rows.all, rows.lead}, x,
      [](KernelBuilder &kb, ValueRange a) {
        return kernels::softmaxTerm(kb, a[0], a[1]);
      });
  Value sum = rowSum(b, loc, e);
  return mapWithKernelBuilder(
      b, loc, {e, max, sum}, {rows.all, rows.lead, rows.lead}, x,
      [](KernelBuilder &kb, ValueRange a) {
        return kernels::softmaxScore(kb, a[0], a[1], a[2]);
      });
}

/// The scoring function applied to `x` (rows in the last dimension): the
/// kernels' (MoE/Kernels/Route.h), elementwise or the row's softmax.
Value score(OpBuilder &b, Location loc, const RouteSpec &spec, Value x) {
  if (spec.scoring == RouteSpec::Scoring::None)
    return x;
  if (spec.scoring == RouteSpec::Scoring::Softmax)
    return softmaxRows(b, loc, x);
  RowMaps rows(x);
  return mapWithKernelBuilder(b, loc, x, rows.all, x,
                              [&](KernelBuilder &kb, ValueRange a) {
                                return kernels::routeElementwiseScore(kb, spec,
                                                                      a[0]);
                              });
}

/// The top `k` of the last dimension of `x` (f32), restricted to the entries
/// where `allowed` (i1, same shape; absent = all) is true, which must number
/// at least k per row. Returns the values and i32 indices [..., k].
std::pair<Value, Value> maskedTopK(OpBuilder &b, Location loc, Value x,
                                   Value allowed, int64_t k) {
  int64_t rank = cast<RankedTensorType>(x.getType()).getRank();
  int64_t last = rank - 1;
  RowMaps rows(b.getContext(), rank);
  SmallVector<OpFoldResult> lead = sizesOf(b, loc, x);
  Value width = indexTo(
      b, loc, getValueOrCreateConstantIndexOp(b, loc, lead.pop_back_val()),
      b.getI32Type());
  SmallVector<OpFoldResult> outShape(lead);
  outShape.push_back(b.getIndexAttr(k));
  Value vals0 = tensor::EmptyOp::create(b, loc, outShape, b.getF32Type());
  Value idxs0 = tensor::EmptyOp::create(b, loc, outShape, b.getI32Type());

  SmallVector<Value> ins = {x};
  SmallVector<AffineMap> maps = {rows.all};
  if (allowed) {
    ins.push_back(allowed);
    maps.push_back(rows.all);
  }
  maps.append(4, rows.lead); // previous pick (value, index), best so far

  Value c0 = indexConst(b, loc, 0), c1 = indexConst(b, loc, 1);
  auto loop = scf::ForOp::create(
      b, loc, c0, indexConst(b, loc, k), c1, ValueRange{vals0, idxs0},
      [&](OpBuilder &lb, Location ll, Value j, ValueRange iter) {
        Value first =
            arith::CmpIOp::create(lb, ll, arith::CmpIPredicate::eq, j, c0);
        Value prev = arith::SelectOp::create(
            lb, ll, first, c0, arith::SubIOp::create(lb, ll, j, c1));
        SmallVector<Value> roundIns(ins);
        roundIns.push_back(sliceAlong(lb, ll, iter[0], last, prev));
        roundIns.push_back(sliceAlong(lb, ll, iter[1], last, prev));
        // "Nothing yet" ranks after every element (index = width).
        Value bestVal = filled(lb, ll, lead, negInf(lb, ll));
        Value bestIdx = filled(lb, ll, lead, width);
        SmallVector<Value> best = generic(
            lb, ll, roundIns, ValueRange{bestVal, bestIdx}, maps, rows.reduce,
            [&](OpBuilder &gb, Location gl, ValueRange a) {
              unsigned n = a.size();
              Value v = a[0], pv = a[n - 4], pi = a[n - 3], cv = a[n - 2],
                    ci = a[n - 1];
              Value i = indexTo(gb, gl, loopIndex(gb, gl, last),
                                gb.getI32Type());
              Value eligible = arith::OrIOp::create(
                  gb, gl, first, ranksBefore(gb, gl, pv, pi, v, i));
              if (allowed)
                eligible = arith::AndIOp::create(gb, gl, eligible, a[1]);
              Value take = arith::AndIOp::create(
                  gb, gl, eligible, ranksBefore(gb, gl, v, i, cv, ci));
              return SmallVector<Value>{
                  arith::SelectOp::create(gb, gl, take, v, cv),
                  arith::SelectOp::create(gb, gl, take, i, ci)};
            });
        scf::YieldOp::create(
            lb, ll,
            ValueRange{insertAlong(lb, ll, best[0], iter[0], last, j),
                       insertAlong(lb, ll, best[1], iter[1], last, j)});
      });
  return {loop.getResult(0), loop.getResult(1)};
}

/// The [T, E] mask of the experts in the `topk_group` best groups of `c`.
Value keptExperts(OpBuilder &b, Location loc, const RouteSpec &spec, Value c) {
  MLIRContext *ctx = b.getContext();
  int64_t groups = spec.groups;
  SmallVector<OpFoldResult> sizes = sizesOf(b, loc, c); // T, E
  Value numExperts = getValueOrCreateConstantIndexOp(b, loc, sizes[1]);
  Value groupSize = arith::DivUIOp::create(b, loc, numExperts,
                                           indexConst(b, loc, groups));
  auto cType = cast<RankedTensorType>(c.getType());
  int64_t staticSize = cType.isDynamicDim(1) ? ShapedType::kDynamic
                                             : cType.getDimSize(1) / groups;
  SmallVector<OpFoldResult> grouped = {
      sizes[0], b.getIndexAttr(groups),
      cType.isDynamicDim(1) ? OpFoldResult(groupSize)
                            : OpFoldResult(b.getIndexAttr(staticSize))};
  auto groupedType = RankedTensorType::get(
      {cType.getDimSize(0), groups, staticSize}, b.getF32Type());
  Value cg = tensor::ExpandShapeOp::create(
      b, loc, groupedType, c, SmallVector<ReassociationIndices>{{0}, {1, 2}},
      grouped);

  // Group score (kernels::routeGroupScore): the sum of the group's top two,
  // or its top one.
  Value top = maskedTopK(b, loc, cg, Value(), spec.top2 ? 2 : 1).first;
  Value best = sliceAlong(b, loc, top, 2, b.getIndexAttr(0));
  Value groupScore = best;
  if (spec.top2) {
    Value second = sliceAlong(b, loc, top, 2, b.getIndexAttr(1));
    RowMaps rows(best);
    groupScore = mapWithKernelBuilder(
        b, loc, {best, second}, {rows.all, rows.all}, best,
        [&](KernelBuilder &kb, ValueRange a) {
          return kernels::routeGroupScore(kb, spec, a[0], a[1]);
        });
  }
  Value keptGroups =
      maskedTopK(b, loc, groupScore, Value(), spec.topkGroup).second;

  // kept[t, e] = OR_j (keptGroups[t, j] == e / groupSize).
  Value init = filled(b, loc, sizes,
                      arith::ConstantOp::create(b, loc, b.getBoolAttr(false)));
  return generic(
             b, loc, keptGroups, init,
             {dimsMap(ctx, 3, {0, 2}), dimsMap(ctx, 3, {0, 1})},
             {IteratorType::parallel, IteratorType::parallel,
              IteratorType::reduction},
             [&](OpBuilder &gb, Location gl, ValueRange a) {
               Value g = arith::DivUIOp::create(gb, gl, loopIndex(gb, gl, 1),
                                                groupSize);
               Value same = arith::CmpIOp::create(
                   gb, gl, arith::CmpIPredicate::eq, toIndex(gb, gl, a[0]), g);
               return SmallVector<Value>{
                   arith::OrIOp::create(gb, gl, a[1], same)};
             })
      .front();
}

} // namespace

LogicalResult linalg_lowering::lowerRoute(RouteOp op, PatternRewriter &rw) {
  Location loc = op.getLoc();
  MLIRContext *ctx = rw.getContext();
  RowMaps rows(ctx, 2);
  Value x = promoteToF32(rw, loc, op.getLogits());
  bool scoreFirst = op.getOrder() == RouteOrder::score_then_topk;
  RouteSpec spec = kernels::routeSpecOf(op);
  Value s = scoreFirst ? score(rw, loc, spec, x) : x;

  Value idx;
  if (Value replay = op.getReplay()) {
    // The given choice (replay): each index checked against E (a run-time
    // error), and one outside [0, E) read as expert 0, never out of bounds.
    Value numExperts = tensor::DimOp::create(rw, loc, x, 1);
    if (failed(emitIndexCheck(rw, op, replay, numExperts,
                              kMoEErrorRouteReplay)))
      return rw.notifyMatchFailure(op, "needs an enclosing module to declare "
                                       "moeReportIndexError");
    Value init = tensor::EmptyOp::create(
        rw, loc, sizesOf(rw, loc, replay), rw.getI32Type());
    idx = generic(rw, loc, replay, init, {rows.all, rows.all}, rows.parallel,
                  [&](OpBuilder &gb, Location gl, ValueRange a) {
                    ImplicitLocOpBuilder ib(gl, gb);
                    KernelBuilder kb(ib);
                    Value e = kb.castInt(numExperts, kb.i64());
                    return SmallVector<Value>{
                        kernels::routeReplayPick(kb, a[0], e).expert};
                  })
              .front();
  } else {
    // Choice scores (kernels::routeChoice): s (or x) plus the bias, broadcast
    // over the tokens.
    Value c = s;
    if (Value bias = op.getBias())
      c = mapWithKernelBuilder(rw, loc, {s, promoteToF32(rw, loc, bias)},
                               {rows.all, dimsMap(ctx, 2, {1})}, s,
                               [](KernelBuilder &kb, ValueRange a) {
                                 return kernels::routeChoice(kb, a[0], a[1]);
                               });
    Value kept = spec.groups > 1 ? keptExperts(rw, loc, spec, c) : Value();
    idx = maskedTopK(rw, loc, c, kept, op.getK()).second;
  }

  // Weights: s (or x) read at the selection, then scored (topk_then_score).
  Value w = mapRows(rw, loc, idx, rows.all, idx,
                    [&](OpBuilder &gb, Location gl, ValueRange a) {
                      Value t = loopIndex(gb, gl, 0);
                      return SmallVector<Value>{tensor::ExtractOp::create(
                          gb, gl, s, ValueRange{t, toIndex(gb, gl, a[0])})};
                    });
  if (!scoreFirst)
    w = score(rw, loc, spec, w);
  // Renormalization and scaling (kernels::routeWeight), in one generic.
  if (spec.renormalize || spec.scale != 1.0) {
    SmallVector<Value> ins = {w};
    SmallVector<AffineMap> maps = {rows.all};
    if (spec.renormalize) {
      ins.push_back(rowSum(rw, loc, w));
      maps.push_back(rows.lead);
    }
    w = mapWithKernelBuilder(
        rw, loc, ins, maps, w, [&](KernelBuilder &kb, ValueRange a) {
          return kernels::routeWeight(kb, spec, a[0],
                                      spec.renormalize ? a[1] : Value());
        });
  }
  replaceWithCasts(rw, op, {w, idx});
  return success();
}

/// moe.route_grad (MoERoutingOps.td): the picks' logits gathered [T, k], their
/// scores and derivatives, the row sums S and C, the gradient of each pick
/// (kernels::routeGradOfLogit), and its scatter to [T, E] as a reduction over
/// the picks (a repeated index accumulates, an out-of-range one matches no
/// expert).
LogicalResult linalg_lowering::lowerRouteGrad(RouteGradOp op,
                                              PatternRewriter &rw) {
  Location loc = op.getLoc();
  MLIRContext *ctx = rw.getContext();
  RowMaps rows(ctx, 2);
  RouteSpec spec = kernels::routeGradSpecOf(op);
  Value x = promoteToF32(rw, loc, op.getLogits());
  Value idx = op.getIndices(), dw = op.getDw();
  Value numExperts = tensor::DimOp::create(rw, loc, x, 1);
  Value sel = mapRows(
      rw, loc, idx, rows.all, idx,
      [&](OpBuilder &gb, Location gl, ValueRange a) {
        Value j = toIndex(gb, gl, a[0]);
        Value zero = indexConst(gb, gl, 0);
        Value ok = arith::AndIOp::create(
            gb, gl,
            arith::CmpIOp::create(gb, gl, arith::CmpIPredicate::sge, j, zero),
            arith::CmpIOp::create(gb, gl, arith::CmpIPredicate::slt, j,
                                  numExperts));
        Value at = arith::SelectOp::create(gb, gl, ok, j, zero);
        return SmallVector<Value>{tensor::ExtractOp::create(
            gb, gl, x, ValueRange{loopIndex(gb, gl, 0), at})};
      });
  auto scoreOf = [&](bool derivative) {
    return mapWithKernelBuilder(
        rw, loc, sel, rows.all, sel, [&](KernelBuilder &kb, ValueRange a) {
          auto [f, df] = kernels::routeScoreAndDerivative(kb, spec, a[0]);
          return derivative ? df : f;
        });
  };
  Value ds = scoreOf(/*derivative=*/true);
  SmallVector<Value> ins = {dw, ds};
  SmallVector<AffineMap> maps = {rows.all, rows.all};
  if (spec.renormalize) {
    Value s = scoreOf(/*derivative=*/false);
    Value gs = mapRows(rw, loc, {dw, s}, {rows.all, rows.all}, s,
                       [](OpBuilder &gb, Location gl, ValueRange a) {
                         return SmallVector<Value>{
                             arith::MulFOp::create(gb, gl, a[0], a[1])};
                       });
    ins.append({rowSum(rw, loc, s), rowSum(rw, loc, gs)});
    maps.append({rows.lead, rows.lead});
  }
  Value d = mapWithKernelBuilder(
      rw, loc, ins, maps, dw, [&](KernelBuilder &kb, ValueRange a) {
        return kernels::routeGradOfLogit(
            kb, spec, a[0], a[1], spec.renormalize ? a[2] : Value(),
            spec.renormalize ? a[3] : Value());
      });
  Value init = filled(rw, loc, sizesOf(rw, loc, x), f32Const(rw, loc, 0.0));
  Value out =
      generic(rw, loc, {idx, d}, init,
              {dimsMap(ctx, 3, {0, 2}), dimsMap(ctx, 3, {0, 2}),
               dimsMap(ctx, 3, {0, 1})},
              {IteratorType::parallel, IteratorType::parallel,
               IteratorType::reduction},
              [&](OpBuilder &gb, Location gl, ValueRange a) {
                Value same = arith::CmpIOp::create(
                    gb, gl, arith::CmpIPredicate::eq, toIndex(gb, gl, a[0]),
                    loopIndex(gb, gl, 1));
                Value sum = arith::AddFOp::create(gb, gl, a[2], a[1]);
                return SmallVector<Value>{
                    arith::SelectOp::create(gb, gl, same, sum, a[2])};
              })
          .front();
  replaceWithCasts(rw, op, {out});
  return success();
}
