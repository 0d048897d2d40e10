//===- Route.cpp - moe.route's scoring and weights, once ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/Route.h"
#include "MoE/Kernels/ScoreRegion.h"
#include "MoE/Kernels/TopK.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::kernels;

Value mlir::moe::kernels::sigmoid(KernelBuilder &kb, Value x) {
  Type t = x.getType();
  Value one = kb.constLike(t, 1.0);
  return kb.fdiv(one, kb.fadd(one, kb.exp(kb.fsub(kb.constLike(t, 0.0), x))));
}

Value mlir::moe::kernels::routeElementwiseScore(KernelBuilder &kb,
                                                const RouteSpec &spec,
                                                Value x) {
  if (spec.scoring == RouteSpec::Scoring::Custom)
    return emitScoreBody(kb, *spec.scoreBody, x);
  return sigmoid(kb, x);
}

std::pair<Value, Value>
mlir::moe::kernels::routeScoreAndDerivative(KernelBuilder &kb,
                                            const RouteSpec &spec, Value x) {
  Type t = x.getType();
  switch (spec.scoring) {
  case RouteSpec::Scoring::Custom:
    return emitScoreAndDerivative(kb, *spec.scoreBody, x);
  case RouteSpec::Scoring::Sigmoid: {
    Value s = sigmoid(kb, x);
    return {s, kb.fmul(s, kb.fsub(kb.constLike(t, 1.0), s))};
  }
  case RouteSpec::Scoring::None:
    return {x, kb.constLike(t, 1.0)};
  case RouteSpec::Scoring::Softmax:
    break;
  }
  llvm_unreachable("route_grad: softmax is not elementwise");
}

Value mlir::moe::kernels::routeGradOfLogit(KernelBuilder &kb,
                                           const RouteSpec &spec, Value g,
                                           Value dScore, Value sSum,
                                           Value cSum) {
  Type t = g.getType();
  Value coef = g;
  if (spec.renormalize)
    coef = kb.fdiv(kb.fsub(g, kb.fdiv(cSum, sSum)), sSum);
  if (spec.scale != 1.0)
    coef = kb.fmul(coef, kb.constLike(t, spec.scale));
  Value d = kb.fmul(coef, dScore);
  if (!spec.renormalize)
    return d;
  // A zero sum (a fully masked row) has constant zero weights: no gradient,
  // even where f' is not finite there (sqrt(softplus(x)) at -inf).
  Value zero = kb.constLike(t, 0.0);
  return kb.select(kb.cmpf(arith::CmpFPredicate::OEQ, sSum, zero), zero, d);
}

RouteReplayPick mlir::moe::kernels::routeReplayPick(KernelBuilder &kb,
                                                   Value given,
                                                   Value numExperts) {
  Value wide = kb.castInt(given, kb.i64());
  Value zero = kb.cI64(0);
  Value atLeastZero = kb.cmpi(arith::CmpIPredicate::sge, wide, zero);
  Value belowE = kb.lt(wide, numExperts);
  Value ok = kb.andI(atLeastZero, belowE);
  return {wide, ok, kb.trunc(kb.select(ok, wide, zero), kb.i32())};
}

RouteGradPick mlir::moe::kernels::routeGradReadPick(KernelBuilder &kb, Value x,
                                                    Value idx, Value r, Value l,
                                                    Value numExperts) {
  Value c0 = kb.idx(0);
  Value j = kb.castInt(kb.load(idx, {r, l}), kb.index());
  Value ok = kb.andI(kb.cmpi(arith::CmpIPredicate::sge, j, c0),
                     kb.cmpi(arith::CmpIPredicate::slt, j, numExperts));
  return {j, ok, kb.loadF(x, {r, kb.select(ok, j, c0)})};
}

void mlir::moe::kernels::routeGradAddAt(KernelBuilder &kb,
                                        const RouteGradPick &p, Value v,
                                        Value out, Value r) {
  kb.ifThen(p.inRange, [&] {
    kb.store(kb.fadd(kb.load(out, {r, p.expert}), v), out, {r, p.expert});
  });
}

std::pair<Value, Value> mlir::moe::kernels::routeGradRowSums(
    KernelBuilder &kb, const RouteSpec &spec, Value x, Value idx, Value dw,
    Value r, Value numExperts, Value sel) {
  if (!spec.renormalize)
    return {Value(), Value()};
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  SmallVector<Value> sums = kb.forLoop(
      c0, sel, c1, ValueRange{kb.cF32(0.0), kb.cF32(0.0)},
      [&](Value l, ValueRange acc) -> SmallVector<Value> {
        RouteGradPick p = routeGradReadPick(kb, x, idx, r, l, numExperts);
        Value s = routeScoreAndDerivative(kb, spec, p.logit).first;
        Value g = kb.load(dw, {r, l});
        return {kb.fadd(acc[0], s), kb.fadd(acc[1], kb.fmul(g, s))};
      });
  return {sums[0], sums[1]};
}

void mlir::moe::kernels::routeGradRowAdds(KernelBuilder &kb,
                                          const RouteSpec &spec, Value x,
                                          Value idx, Value dw, Value out,
                                          Value r, Value numExperts, Value sel,
                                          Value sSum, Value cSum) {
  kb.forLoop(kb.idx(0), sel, kb.idx(1), [&](Value l) {
    RouteGradPick p = routeGradReadPick(kb, x, idx, r, l, numExperts);
    Value ds = routeScoreAndDerivative(kb, spec, p.logit).second;
    Value g = kb.load(dw, {r, l});
    routeGradAddAt(kb, p, routeGradOfLogit(kb, spec, g, ds, sSum, cSum), out,
                   r);
  });
}

Value mlir::moe::kernels::routeScore(KernelBuilder &kb, const RouteSpec &spec,
                                     Value x, Value rowMax, Value rowSum) {
  if (spec.fromLogits())
    return x;
  if (spec.scoring != RouteSpec::Scoring::Softmax)
    return routeElementwiseScore(kb, spec, x);
  return softmaxScore(kb, softmaxTerm(kb, x, rowMax), rowMax, rowSum);
}

Value mlir::moe::kernels::routeChoice(KernelBuilder &kb, Value score,
                                      Value bias) {
  return bias ? kb.fadd(score, bias) : score;
}

Value mlir::moe::kernels::routeGroupScore(KernelBuilder &kb,
                                          const RouteSpec &spec, Value best,
                                          Value second) {
  return spec.top2 ? kb.fadd(best, second) : best;
}

Value mlir::moe::kernels::routeGroupCandidate(
    KernelBuilder &kb, const RouteSpec &spec, Value group,
    function_ref<Value(Value prev)> bestMemberBelow) {
  Value first = bestMemberBelow(Value());
  Value best = keyToFloat(kb, candidateKey(kb, first));
  Value second;
  if (spec.top2)
    second = keyToFloat(kb, candidateKey(kb, bestMemberBelow(first)));
  return packCandidate(
      kb, orderedKey(kb, routeGroupScore(kb, spec, best, second)), group);
}

SmallVector<Value> mlir::moe::kernels::routeKeepGroups(
    KernelBuilder &kb, const RouteSpec &spec, ValueRange state,
    function_ref<Value(Value prev)> bestGroupBelow,
    function_ref<SmallVector<Value>(Value best, ValueRange state)> keep) {
  SmallVector<Value> init = {kb.cI64(std::numeric_limits<int64_t>::max())};
  llvm::append_range(init, state);
  SmallVector<Value> done = kb.forLoop(
      kb.idx(0), kb.idx(spec.topkGroup), kb.idx(1), init,
      [&](Value, ValueRange it) -> SmallVector<Value> {
        Value best = bestGroupBelow(it[0]);
        SmallVector<Value> next = {best};
        llvm::append_range(next, keep(best, it.drop_front()));
        return next;
      });
  return SmallVector<Value>(ArrayRef<Value>(done).drop_front());
}

Value mlir::moe::kernels::routeSelectedScore(KernelBuilder &kb,
                                             const RouteSpec &spec, Value v,
                                             Value selMax, Value selSum) {
  if (spec.scoreFirst)
    return v;
  switch (spec.scoring) {
  case RouteSpec::Scoring::Softmax:
    // With a bias the first pick need not hold the largest logit: selMax is
    // the selection's own max.
    return softmaxScore(kb, softmaxTerm(kb, v, selMax), selMax, selSum);
  case RouteSpec::Scoring::Sigmoid:
  case RouteSpec::Scoring::Custom:
    return routeElementwiseScore(kb, spec, v);
  case RouteSpec::Scoring::None:
    return v;
  }
  llvm_unreachable("route scoring");
}

Value mlir::moe::kernels::routePickedSoftmaxTerm(KernelBuilder &kb, Value x,
                                                 Value rowMax) {
  Type t = x.getType(), scalar = rowMax.getType();
  Value masked =
      kb.cmpf(arith::CmpFPredicate::OEQ, rowMax, kb.negInfLike(scalar));
  // UEQ: unordered (m NaN) or equal (m = +inf).
  Value undefined =
      kb.cmpf(arith::CmpFPredicate::UEQ, rowMax,
              kb.constLike(scalar, std::numeric_limits<double>::infinity()));
  Value term = kb.select(
      undefined, kb.constLike(t, std::numeric_limits<double>::quiet_NaN()),
      softmaxTerm(kb, x, rowMax));
  return kb.select(masked, kb.constLike(t, 0.0), term);
}

Value mlir::moe::kernels::routeWeight(KernelBuilder &kb, const RouteSpec &spec,
                                      Value w, Value wSum) {
  Type t = w.getType();
  if (spec.renormalize)
    w = kb.divOrZero(w, wSum);
  if (spec.scale != 1.0)
    w = kb.fmul(w, kb.constLike(t, spec.scale));
  return w;
}

void mlir::moe::kernels::routeRounds(
    KernelBuilder &kb, const RouteSpec &spec,
    function_ref<Value(Value prev)> bestCandidateBelow,
    function_ref<void(Value j, Value pick)> onPick) {
  kb.forLoop(kb.idx(0), kb.idx(spec.k), kb.idx(1),
             ValueRange{kb.cI64(std::numeric_limits<int64_t>::max())},
             [&](Value j, ValueRange prev) -> SmallVector<Value> {
               Value pick = bestCandidateBelow(prev[0]);
               onPick(j, pick);
               return {pick};
             });
}

bool mlir::moe::kernels::routeWeightsAreSources(const RouteSpec &spec) {
  bool postScore =
      !spec.scoreFirst && spec.scoring != RouteSpec::Scoring::None;
  return !postScore && !spec.renormalize && spec.scale == 1.0;
}

void mlir::moe::kernels::routeWeights(KernelBuilder &kb, const RouteSpec &spec,
                                      const RoutePicks &picks) {
  auto eachPick = [&](function_ref<void(Value j)> body) {
    kb.forLoop(picks.first, kb.idx(spec.k), picks.step, body);
  };
  Value selMax, selSum;
  if (!spec.scoreFirst && spec.scoring == RouteSpec::Scoring::Softmax) {
    RowSoftmaxStats stats = rowSoftmaxStatsLoop(
        kb, kb.f32(), picks.first, kb.idx(spec.k), picks.step, picks.load,
        picks.reduceMax, picks.reduceSum);
    selMax = stats.max;
    selSum = stats.sum;
  }
  auto score = [&](Value v) {
    return routeSelectedScore(kb, spec, v, selMax, selSum);
  };
  auto stored = [](Value v) { return v; };
  // The picks' scores after the selection: stored once, or recomputed.
  function_ref<Value(Value)> scored = score;
  if (picks.storeScore && !spec.scoreFirst) {
    eachPick([&](Value j) { picks.storeScore(j, score(picks.load(j))); });
    scored = stored;
  }
  Value wSum;
  if (spec.renormalize) {
    Value partial =
        kb.forLoop(picks.first, kb.idx(spec.k), picks.step,
                   ValueRange{kb.cF32(0.0)},
                   [&](Value j, ValueRange acc) -> SmallVector<Value> {
                     return {kb.fadd(acc[0], scored(picks.load(j)))};
                   })[0];
    wSum = picks.reduceSum ? picks.reduceSum(partial) : partial;
  }
  auto storeWeights = [&] {
    eachPick([&](Value j) {
      picks.storeWeight(j, routeWeight(kb, spec, scored(picks.load(j)), wSum));
    });
  };
  if (picks.guardStores)
    picks.guardStores(storeWeights);
  else
    storeWeights();
}
