//===- Route.h - moe.route's steps, once ------------------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// moe.route (MoERoutingOps.td) in five steps, shared by the CPU kernel
// (vector lanes, lib/Conversion/MoEToCPU/Route.cpp) and the GPU kernel (a
// group of lanes per token, lib/Conversion/MoEToGPU/Route.cpp):
//
//   1. scores: routeScore (softmax with RowSoftmax.h's statistics, sigmoid,
//      a custom score region inlined by ScoreRegion.h, or the logits);
//   2. candidates of the choice values: routeChoice (score + bias), packed in
//      TopK.h's order;
//   3. groups: routeGroupCandidate (a group's score) and routeKeepGroups (the
//      topk_group rounds);
//   4. routeRounds: k rounds of the best candidate below the previous pick;
//   5. routeWeights: scoring after the selection, renormalization, scaling.
//
// The steps take the target's part as callbacks: how it finds a best
// candidate (a vector max over chunks, a warp butterfly), reduces across the
// row's holders, and where it keeps values (scratch, registers). The order
// of the emitted operations is the one each kernel had (its code is
// byte-identical).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_ROUTE_H
#define MOE_KERNELS_ROUTE_H

#include "MoE/Kernels/RowSoftmax.h"

namespace mlir::moe::kernels {

/// moe.route's modes, without the dialect (the conversions fill it from the
/// op's attributes).
struct RouteSpec {
  enum class Scoring { Softmax, Sigmoid, None, Custom };
  int64_t k = 1;
  Scoring scoring = Scoring::Softmax;
  /// scoring(custom): the block of the op's score region (ScoreRegion.h).
  Block *scoreBody = nullptr;
  /// order(score_then_topk); false for topk_then_score.
  bool scoreFirst = true;
  int64_t groups = 1;
  int64_t topkGroup = 1;
  /// group_score(top2_sum); false for max.
  bool top2 = true;
  bool renormalize = false;
  double scale = 1.0;

  /// The choice scores and the weights' sources are the logits themselves
  /// (no scoring before the top-k).
  bool fromLogits() const { return !scoreFirst || scoring == Scoring::None; }

  /// The weights are softmax scores renormalized over the k picks, in which
  /// the softmax's normaliser cancels: w_j = s_j / Σ_l s_l
  /// = exp(x_j - m) / Σ_l exp(x_l - m), m the row's max. A kernel weighs the
  /// picks from their k terms (routePickedSoftmaxTerm), and a given choice
  /// (replay: hash routing) needs nothing of the row but m: one pass of
  /// maxima over E and k exponentials, not E. Not the IR rewrite to
  /// order(topk_then_score) that weighs the same k logits: its softmax over
  /// the k only would drop the rules of the row (a NaN or +inf logit outside
  /// the picks makes the row's softmax, and so its weights, NaN; picks whose
  /// scores underflow in the row's softmax weigh 0), which m keeps.
  bool weighsPickedTerms() const {
    return scoreFirst && scoring == Scoring::Softmax && renormalize;
  }
};

/// `spec.scoring` and `spec.scoreBody` from a moe.route or moe.route_grad op
/// (the score region's block, custom scores only).
template <typename OpT>
void setRouteScoring(RouteSpec &spec, OpT op) {
  using Scoring = decltype(op.getScoring());
  spec.scoring = op.getScoring() == Scoring::softmax
                     ? RouteSpec::Scoring::Softmax
                 : op.getScoring() == Scoring::sigmoid
                     ? RouteSpec::Scoring::Sigmoid
                 : op.getScoring() == Scoring::custom
                     ? RouteSpec::Scoring::Custom
                     : RouteSpec::Scoring::None;
  if (!op.getScore().empty())
    spec.scoreBody = &op.getScore().front();
}

/// The spec of a moe.route op (a template so that this target-neutral library
/// does not depend on the dialect; `RouteOpT` is mlir::moe::RouteOp).
template <typename RouteOpT>
RouteSpec routeSpecOf(RouteOpT op) {
  using Order = decltype(op.getOrder());
  using Group = decltype(op.getGroupScore());
  RouteSpec spec;
  spec.k = op.getK();
  setRouteScoring(spec, op);
  spec.scoreFirst = op.getOrder() == Order::score_then_topk;
  spec.groups = op.getNGroup();
  spec.topkGroup = op.getTopkGroup();
  spec.top2 = op.getGroupScore() == Group::top2_sum;
  spec.renormalize = op.getRenormalize();
  spec.scale = op.getRoutedScalingFactor().convertToDouble();
  return spec;
}

/// The spec of a moe.route_grad op: its score, renormalization and scale
/// (the choice is the forward's indices).
template <typename RouteGradOpT>
RouteSpec routeGradSpecOf(RouteGradOpT op) {
  RouteSpec spec;
  setRouteScoring(spec, op);
  spec.renormalize = op.getRenormalize();
  spec.scale = op.getRoutedScalingFactor().convertToDouble();
  return spec;
}

/// sigmoid(x) = 1 / (1 + exp(-x)): -inf -> 0, +inf -> 1, NaN -> NaN.
Value sigmoid(KernelBuilder &kb, Value x);

/// The elementwise score of x: sigmoid, or the custom score region's body
/// inlined (ScoreRegion.h); on scalars or vectors.
Value routeElementwiseScore(KernelBuilder &kb, const RouteSpec &spec, Value x);

/// The elementwise score f(x) and its derivative f'(x) (moe.route_grad):
/// sigmoid (f' = f (1 - f)), none (1), or the custom region's symbolic
/// derivative (ScoreRegion.h).
std::pair<Value, Value> routeScoreAndDerivative(KernelBuilder &kb,
                                                const RouteSpec &spec, Value x);

/// The gradient of the selected scores' weights to their logits, given the
/// cotangent g of a pick's weight, its f'(x), and (renormalize) the sums
/// S = Σ f(x_l) and C = Σ g_l f(x_l) over the row's picks (splatted like g):
/// a (g - C/S) / S f'(x), 0 when S = 0; a g f'(x) without renormalization.
Value routeGradOfLogit(KernelBuilder &kb, const RouteSpec &spec, Value g,
                       Value dScore, Value sSum, Value cSum);

/// Pick j of a replayed choice (moe.route's `replay`): the given expert
/// `given` (i32 or i64) widened to i64, whether it lies in [0, E)
/// (`numExperts`: i64), and the i32 expert read in its place (0 outside).
/// The CPU, GPU and portable lowerings all read a replay through it.
struct RouteReplayPick {
  Value given, inRange, expert;
};
RouteReplayPick routeReplayPick(KernelBuilder &kb, Value given,
                                Value numExperts);

/// One pick of a moe.route_grad row read out-of-range-safe: expert index of
/// pick l (index), whether it is in [0, E), and the logit there (the row's
/// entry 0 when out of range).
struct RouteGradPick {
  Value expert, inRange, logit;
};
RouteGradPick routeGradReadPick(KernelBuilder &kb, Value x, Value idx, Value r,
                                Value l, Value numExperts);
/// out[r, expert] += v where the pick is in range (a repeated expert
/// accumulates; one out of range is never written).
void routeGradAddAt(KernelBuilder &kb, const RouteGradPick &p, Value v,
                    Value out, Value r);
/// moe.route_grad's row r in scalar loops over its `sel` picks, as the CPU
/// kernel (a dynamic or large k) and the GPU kernel (a thread a row) run it:
/// routeGradRowSums gives S = Σ f and C = Σ dw·f (null without
/// renormalization), routeGradRowAdds adds each pick's gradient
/// (routeGradOfLogit) to the row, which the target has zeroed in between.
std::pair<Value, Value> routeGradRowSums(KernelBuilder &kb,
                                         const RouteSpec &spec, Value x,
                                         Value idx, Value dw, Value r,
                                         Value numExperts, Value sel);
void routeGradRowAdds(KernelBuilder &kb, const RouteSpec &spec, Value x,
                      Value idx, Value dw, Value out, Value r, Value numExperts,
                      Value sel, Value sSum, Value cSum);

/// The score before the top-k (score_then_topk, scoring != none) of the
/// logit x given the row's max and Σ exp(x - max) (softmax only; null
/// otherwise).
Value routeScore(KernelBuilder &kb, const RouteSpec &spec, Value x,
                 Value rowMax, Value rowSum);

/// Step 2: the choice value of an expert, its score `score` (routeScore: the
/// weight's source) plus its bias `bias` (null: none). The bias steers the
/// selection only (DeepSeek-V3's e_score_correction_bias): the weights are
/// read from the unbiased score.
Value routeChoice(KernelBuilder &kb, Value score, Value bias);

/// Step 3: a group's score from the values of its best member `best` and its
/// second best `second`: their sum with group_score(top2_sum), else `best`
/// (`second` unused, may be null). The portable lowering applies it to the
/// group's top two of a tensor top-k.
Value routeGroupScore(KernelBuilder &kb, const RouteSpec &spec, Value best,
                      Value second);

/// Step 3: the packed candidate (TopK.h) of group `group` (i32): its score is
/// routeGroupScore of its best members' values; groups rank by TopK.h's order
/// (a higher score, then the lower group). `bestMemberBelow(prev)` is the
/// group's best member candidate ranking strictly below the packed `prev`
/// (null: the group's best), as the target finds it (a vector max over the
/// group's chunks, a butterfly over the lanes).
Value routeGroupCandidate(KernelBuilder &kb, const RouteSpec &spec, Value group,
                          function_ref<Value(Value prev)> bestMemberBelow);

/// Step 3: the topk_group kept groups, one a round: round t keeps the best
/// group candidate ranking strictly below round t-1's pick (no group is kept
/// twice; ties go to the lower group). `bestGroupBelow(prev)` is that best
/// over the target's group candidates (kernels::bestBelow folded from
/// noCandidate); `keep(best, state)` records candidateIndex(best) in the
/// loop-carried `state` (may be empty) and returns its next value. Returns
/// the final state.
SmallVector<Value>
routeKeepGroups(KernelBuilder &kb, const RouteSpec &spec, ValueRange state,
                function_ref<Value(Value prev)> bestGroupBelow,
                function_ref<SmallVector<Value>(Value best, ValueRange state)>
                    keep);

/// The weight of a selected value v before renormalization. topk_then_score:
/// softmax over the selection (from its max and Σ exp(v - selMax); 0 when
/// selMax is -inf) or sigmoid; otherwise v itself (already a score).
/// selMax/selSum are null unless topk_then_score with softmax.
Value routeSelectedScore(KernelBuilder &kb, const RouteSpec &spec, Value v,
                         Value selMax, Value selSum);

/// The softmax term exp(x - m) of a picked logit x (scalar or vector) whose
/// row has the max m (a scalar), under the row softmax's rules: 0 on a row of
/// -inf (m = -inf: no NaN), NaN on a row whose softmax is NaN (m NaN, or
/// m = +inf: Σ_e exp(x_e - m) holds inf - inf). routeWeight of the terms
/// over their sum gives the weights of RouteSpec::weighsPickedTerms (a sum of
/// 0, every pick underflowing, gives 0 as the row's scores would).
Value routePickedSoftmaxTerm(KernelBuilder &kb, Value x, Value rowMax);

/// The final weight of a selected score w given Σ w over the selection (null
/// without renormalization): w / Σ (0 for a zero sum), times the routed
/// scaling factor.
Value routeWeight(KernelBuilder &kb, const RouteSpec &spec, Value w,
                  Value wSum);

/// Step 4: the k rounds. Round j picks the best candidate ranking strictly
/// below round j - 1's pick (the first: the best; TopK.h's order, so no
/// expert is picked twice): `bestCandidateBelow(prev)` over the target's
/// candidates (a vector max over chunks, a warp butterfly); `onPick(j, pick)`
/// stores pick j's index and weight source.
void routeRounds(KernelBuilder &kb, const RouteSpec &spec,
                 function_ref<Value(Value prev)> bestCandidateBelow,
                 function_ref<void(Value j, Value pick)> onPick);

/// Whether the weights are the picks' weight sources as step 4 stored them
/// (no scoring after the selection, no renormalization, scale 1): a target
/// that stores the sources where the weights go has nothing left to do.
bool routeWeightsAreSources(const RouteSpec &spec);

/// Where a target holds the k picks' weight sources (step 4's values: the
/// scores, or the logits with topk_then_score) for routeWeights. This holder
/// has the picks j = first, first + step, ... < k (the CPU: all of them, one
/// by one; the GPU: those of its lane).
struct RoutePicks {
  Value first, step;
  /// Pick j's weight source.
  function_ref<Value(Value j)> load;
  /// Stores pick j's weight.
  function_ref<void(Value j, Value weight)> storeWeight;
  /// Overwrites pick j's source with its score after the selection (null:
  /// the target recomputes that score where it is needed).
  function_ref<void(Value j, Value score)> storeScore = nullptr;
  /// The row's max and Σ from this holder's partial (null: the holder has
  /// every pick).
  function_ref<Value(Value)> reduceMax = nullptr, reduceSum = nullptr;
  /// Runs the weight stores (null: as they are; the GPU: in the lanes of an
  /// active row only, after the reductions that every lane takes part in).
  function_ref<void(function_ref<void()>)> guardStores = nullptr;
};

/// Step 5: the weights of the k picks: the scoring after the selection
/// (routeSelectedScore; its softmax over the picks by RowSoftmax.h), the
/// renormalization over the picks and the scaling (routeWeight).
void routeWeights(KernelBuilder &kb, const RouteSpec &spec,
                  const RoutePicks &picks);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_ROUTE_H
