//===- RoutingOps.cpp - Verifiers and type inference of the routing ops ---===//
//
// Part of the MoE-MLIR project.
//
// moe.route, moe.dispatch_plan and moe.bias_update (MoERoutingOps.td). As for the other ops,
// type inference never fails on a malformed op (it answers dynamic sizes) and
// leaves the diagnostics, which name the operand and the rule, to the
// verifiers.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"
#include "MoE/IR/ScoreRegion.h"
#include "Verifiers.h"

#include <cmath>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::detail;

namespace {
constexpr int64_t kDynamic = ShapedType::kDynamic;

/// a·b, a+b, ⌈a/b⌉ on static sizes; dynamic when an operand is.
int64_t mulSize(int64_t a, int64_t b) {
  return ShapedType::isDynamic(a) || ShapedType::isDynamic(b) ? kDynamic
                                                               : a * b;
}
int64_t addSize(int64_t a, int64_t b) {
  return ShapedType::isDynamic(a) || ShapedType::isDynamic(b) ? kDynamic
                                                               : a + b;
}
} // namespace

//===----------------------------------------------------------------------===//
// RouteOp
//===----------------------------------------------------------------------===//

LogicalResult RouteOp::inferReturnTypes(MLIRContext *ctx,
                                        std::optional<Location>,
                                        Adaptor adaptor,
                                        SmallVectorImpl<Type> &inferred) {
  int64_t k = adaptor.getK() >= 1 ? adaptor.getK() : kDynamic;
  SmallVector<int64_t, 2> shape = {dimOf(adaptor.getLogits(), 2, 0), k};
  inferred.push_back(f32Tensor(ctx, shape));
  inferred.push_back(i32Tensor(ctx, shape));
  return success();
}

LogicalResult RouteOp::verify() {
  OperandChecker check(*this);
  Value bias = getBias();
  if (failed(check.rank(getLogits(), "logits", 2, "[T, E]")) ||
      (bias &&
       (failed(check.rank(bias, "bias", 1, "[E]")) ||
        failed(check.sameDim(bias, "bias", 0, getLogits(), "logits", 1, "E")))))
    return failure();
  if (Value replay = getReplay())
    if (failed(check.rank(replay, "replay", 2, "[T, k]")) ||
        failed(check.sameDim(replay, "replay", 0, getLogits(), "logits", 0,
                             "T")) ||
        failed(check.dimEquals(replay, "'replay'", 1, getK(), "'k'")))
      return failure();
  int64_t numExperts =
      cast<RankedTensorType>(getLogits().getType()).getDimSize(1);
  bool staticE = !ShapedType::isDynamic(numExperts);
  int64_t k = getK(), groups = getNGroup(), keptGroups = getTopkGroup();
  if (k < 1 || (staticE && k > numExperts)) {
    InFlightDiagnostic diag = emitOpError() << "'k' (" << k << ") must be in [1, ";
    if (staticE)
      diag << numExperts << "] (the size of the last dimension of 'logits')";
    else
      diag << "E]";
    return diag;
  }
  if (groups < 1)
    return emitOpError() << "'n_group' (" << groups << ") must be >= 1";
  if (staticE && numExperts % groups != 0)
    return emitOpError() << "'n_group' (" << groups
                         << ") must divide the number of experts E = "
                         << numExperts;
  if (keptGroups < 1 || keptGroups > groups)
    return emitOpError() << "'topk_group' (" << keptGroups
                         << ") must be in [1, n_group = " << groups << "]";
  if (staticE) {
    int64_t groupSize = numExperts / groups;
    if (k > keptGroups * groupSize)
      return emitOpError() << "'k' (" << k
                           << ") must be <= topk_group * E / n_group = "
                           << keptGroups << " * " << groupSize << " = "
                           << keptGroups * groupSize
                           << " (the experts of the kept groups)";
    if (groups > 1 && getGroupScore() == GroupScore::top2_sum &&
        groupSize < 2)
      return emitOpError() << "'group_score' top2_sum needs groups of at least "
                              "2 experts, but E / n_group = "
                           << groupSize;
  }
  double scale = getRoutedScalingFactor().convertToDouble();
  if (!std::isfinite(scale) || scale <= 0.0)
    return emitOpError() << "'routed_scaling_factor' (" << formatFloat(scale)
                         << ") must be finite and > 0";
  return success();
}


//===----------------------------------------------------------------------===//
// The score region of RouteOp and RouteGradOp
//===----------------------------------------------------------------------===//

/// The rules of the `score` region (MoERoutingOps.td, "Custom scores"): present
/// if and only if scoring(custom); one block of one f32 argument ending in
/// moe.yield; only ScoreRegion.h's ops, on scalar f32 (i1 for a comparison).
/// `differentiate`: moe.route_grad's, which also rejects the step functions.
static LogicalResult verifyScoreRegion(Operation *op, Region &region,
                                       RouteScoring scoring,
                                       bool differentiate) {
  bool custom = scoring == RouteScoring::custom;
  if (custom && region.empty())
    return op->emitOpError()
           << "scoring(custom) needs a 'score' region (one f32 argument, the "
              "logit, yielding the f32 score)";
  if (!custom && !region.empty())
    return op->emitOpError()
           << "a 'score' region needs scoring(custom), but scoring is '"
           << stringifyRouteScoring(scoring) << "'";
  if (region.empty())
    return success();
  Block &body = region.front();
  Type f32 = Float32Type::get(op->getContext());
  if (body.getNumArguments() != 1 || body.getArgument(0).getType() != f32) {
    InFlightDiagnostic diag =
        op->emitOpError() << "the 'score' region must have one f32 argument "
                             "(the logit), but has "
                          << body.getNumArguments() << " argument(s)";
    if (body.getNumArguments() != 0) {
      diag << " of type(s) ";
      for (auto [n, type] : llvm::enumerate(body.getArgumentTypes()))
        diag << (n ? ", " : "") << type;
    }
    return diag;
  }
  if (body.empty() || !isa<YieldOp>(body.back()))
    return op->emitOpError()
           << "the 'score' region must end in moe.yield of the f32 score";
  for (Operation &inner : body.without_terminator()) {
    StringRef name = inner.getName().getStringRef();
    ScoreOpKind kind = classifyScoreOp(&inner);
    if (kind == ScoreOpKind::Rejected)
      return op->emitOpError()
             << "'" << name
             << "' is not allowed in the 'score' region: it holds elementwise "
                "scalar f32 arith/math ops only (constant, addf, subf, mulf, "
                "divf, negf, maximumf, minimumf, cmpf, select, exp, exp2, log, "
                "log1p, sqrt, rsqrt, tanh, absf, powf, erf, floor, ceil, "
                "round)";
    auto isCondition = [&](Value v, bool result) {
      return result ? isa<arith::CmpFOp>(inner)
                    : isa<arith::SelectOp>(inner) && v == inner.getOperand(0);
    };
    for (auto [values, result] :
         {std::pair<ValueRange, bool>{inner.getOperands(), false},
          {inner.getResults(), true}})
      for (Value v : values) {
        Type want = isCondition(v, result)
                        ? Type(IntegerType::get(op->getContext(), 1))
                        : f32;
        if (v.getType() != want)
          return op->emitOpError()
                 << "'" << name << "' in the 'score' region has "
                 << (result ? "a result" : "an operand") << " of type "
                 << v.getType() << ": the region is elementwise on scalar "
                 << want;
      }
    if (differentiate && kind == ScoreOpKind::Step)
      return op->emitOpError()
             << "cannot differentiate '" << name
             << "' in the 'score' region: its derivative is zero almost "
                "everywhere (a step function), so no gradient would reach the "
                "logits";
  }
  return success();
}

LogicalResult RouteOp::verifyRegions() {
  return verifyScoreRegion(*this, getScore(), getScoring(),
                           /*differentiate=*/false);
}

//===----------------------------------------------------------------------===//
// RouteGradOp
//===----------------------------------------------------------------------===//

LogicalResult RouteGradOp::inferReturnTypes(MLIRContext *ctx,
                                            std::optional<Location>,
                                            Adaptor adaptor,
                                            SmallVectorImpl<Type> &inferred) {
  inferred.push_back(f32Tensor(ctx, {dimOf(adaptor.getLogits(), 2, 0),
                                     dimOf(adaptor.getLogits(), 2, 1)}));
  return success();
}

LogicalResult RouteGradOp::verify() {
  OperandChecker check(*this);
  if (failed(check.rank(getLogits(), "logits", 2, "[T, E]")) ||
      failed(check.rank(getIndices(), "indices", 2, "[T, k]")) ||
      failed(check.rank(getDw(), "dw", 2, "[T, k]")) ||
      failed(check.sameDim(getIndices(), "indices", 0, getLogits(), "logits",
                           0, "T")) ||
      failed(check.sameDim(getDw(), "dw", 0, getLogits(), "logits", 0, "T")) ||
      failed(check.sameDim(getDw(), "dw", 1, getIndices(), "indices", 1, "k")))
    return failure();
  if (getScoring() == RouteScoring::softmax)
    return emitOpError()
           << "scoring(softmax) is not elementwise: moe.route_grad "
              "differentiates the sigmoid, none and custom scores";
  double scale = getRoutedScalingFactor().convertToDouble();
  if (!std::isfinite(scale) || scale <= 0.0)
    return emitOpError() << "'routed_scaling_factor' (" << formatFloat(scale)
                         << ") must be finite and > 0";
  return success();
}

LogicalResult RouteGradOp::verifyRegions() {
  return verifyScoreRegion(*this, getScore(), getScoring(),
                           /*differentiate=*/true);
}

//===----------------------------------------------------------------------===//
// DispatchPlanOp
//===----------------------------------------------------------------------===//

/// The static result sizes of moe.dispatch_plan, dynamic where they depend on
/// a dynamic size: counts, offsets, order/inverse, padded_order,
/// block_experts, num_padded.
static SmallVector<int64_t, 7> dispatchPlanSizes(Value indices,
                                                 int64_t numExperts,
                                                 int64_t blockSize) {
  int64_t e = numExperts >= 1 ? numExperts : kDynamic;
  int64_t b = blockSize >= 1 ? blockSize : kDynamic;
  int64_t n = mulSize(dimOf(indices, 2, 0), dimOf(indices, 2, 1));
  int64_t padded = addSize(n, mulSize(e, addSize(b, -1)));
  int64_t blocks = ShapedType::isDynamic(padded) || ShapedType::isDynamic(b)
                       ? kDynamic
                       : (padded + b - 1) / b;
  return {e, addSize(e, 1), n, n, padded, blocks, 1};
}

LogicalResult DispatchPlanOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  SmallVector<int64_t, 7> sizes = dispatchPlanSizes(
      adaptor.getIndices(), adaptor.getNumExperts(), adaptor.getBlockSize());
  for (int64_t size : sizes)
    inferred.push_back(i32Tensor(ctx, {size}));
  // With a capacity, `dropped` [E] follows the seven plan results.
  if (adaptor.getCapacity())
    inferred.push_back(i32Tensor(ctx, {sizes[0]}));
  return success();
}

LogicalResult DispatchPlanOp::verify() {
  OperandChecker check(*this);
  if (failed(check.rank(getIndices(), "indices", 2, "[T, k]")))
    return failure();
  // Signed: the attributes are i64 (a torch caller's -1 is -1).
  int64_t numExperts = getNumExperts(), blockSize = getBlockSize();
  if (numExperts < 1)
    return emitOpError() << "'num_experts' (" << numExperts << ") must be >= 1";
  if (blockSize < 1)
    return emitOpError() << "'block_size' (" << blockSize << ") must be >= 1";
  constexpr int64_t kI32Max = 2147483647;
  int64_t padded = dispatchPlanSizes(getIndices(), getNumExperts(),
                                     getBlockSize())[4];
  if (!ShapedType::isDynamic(padded) && padded > kI32Max)
    return emitOpError() << "the padded plan (T*k + num_experts*(block_size-1)"
                            " = "
                         << padded << ") must fit in i32";
  return verifyCapacity();
}

LogicalResult DispatchPlanOp::verifyCapacity() {
  std::optional<uint64_t> capacity = getCapacity();
  bool byProbability = getDrop() == CapacityDrop::probability;
  if (!capacity) {
    if (byProbability)
      return emitOpError() << "'drop' (probability) needs a 'capacity'";
    if (getWeights())
      return emitOpError()
             << "'weights' are only read by drop(probability) with a 'capacity'";
    return success();
  }
  if (static_cast<int64_t>(*capacity) < 0)
    return emitOpError() << "'capacity' (" << static_cast<int64_t>(*capacity)
                         << ") must be >= 0";
  Value weights = getWeights();
  if (!byProbability)
    return weights ? emitOpError() << "'weights' are only read by "
                                      "drop(probability), not drop(position)"
                   : success();
  if (!weights)
    return emitOpError() << "drop(probability) needs the gate 'weights' "
                            "([T, k], the priorities)";
  OperandChecker check(*this);
  if (failed(check.rank(weights, "weights", 2, "[T, k]")))
    return failure();
  auto indices = cast<RankedTensorType>(getIndices().getType());
  for (int64_t d = 0; d < 2; ++d)
    if (failed(check.dimEquals(weights, "'weights'", d, indices.getDimSize(d),
                               "dimension " + Twine(d) + " of 'indices'")))
      return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// BiasUpdateOp
//===----------------------------------------------------------------------===//

LogicalResult BiasUpdateOp::inferReturnTypes(MLIRContext *ctx,
                                             std::optional<Location>,
                                             Adaptor adaptor,
                                             SmallVectorImpl<Type> &inferred) {
  inferred.push_back(
      f32Tensor(ctx, {dimOf(adaptor.getBias(), 1, 0)}));
  return success();
}

LogicalResult BiasUpdateOp::verify() {
  OperandChecker check(*this);
  if (failed(check.rank(getBias(), "bias", 1, "[E]")) ||
      failed(check.rank(getCounts(), "counts", 1, "[E]")) ||
      failed(
          check.sameDim(getCounts(), "counts", 0, getBias(), "bias", 0, "E")) ||
      failed(check.nonNegative("rate", getRate().convertToDouble())))
    return failure();
  return success();
}
