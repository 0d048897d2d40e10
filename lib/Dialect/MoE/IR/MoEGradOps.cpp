//===- MoEGradOps.cpp - Verifiers and type inference of the backward ops --===//
//
// Part of the MoE-MLIR project.
//
// The backward ops (MoEGradOps.td) check their forward operands with the
// forward op's rules (Verifiers.h), then the cotangents against the forward
// result shapes. Inference is lenient like the forward ops' (dynamic sizes
// where an operand is malformed; the verifier names the rule).
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"
#include "Verifiers.h"

#include "mlir/IR/BuiltinTypes.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::detail;

/// The result types of a backward op whose gradients each have the shape of
/// one operand of `operands` (in result order), in f32; fails on an unranked
/// operand.
static LogicalResult inferShapesOfOperands(MLIRContext *ctx,
                                           ArrayRef<Value> operands,
                                           SmallVectorImpl<Type> &inferred) {
  for (Value v : operands) {
    auto type = dyn_cast<RankedTensorType>(v.getType());
    if (!type)
      return failure();
    inferred.push_back(f32Tensor(ctx, type.getShape()));
  }
  return success();
}

//===----------------------------------------------------------------------===//
// SimilarityInformGradOp
//===----------------------------------------------------------------------===//

LogicalResult SimilarityInformGradOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  SmallVector<int64_t, 3> rows = similarityRows(adaptor.getU(), adaptor.getE());
  int64_t depth = dimOf(adaptor.getU(), 3, 2);
  inferred.push_back(f32Tensor(ctx, {rows[0], rows[1], depth}));
  inferred.push_back(
      f32Tensor(ctx, {rows[0], rows[1], dimOf(adaptor.getE(), 3, 2)}));
  if (adaptor.getWs())
    inferred.push_back(f32Tensor(ctx, {depth, depth}));
  return success();
}

LogicalResult SimilarityInformGradOp::verify() {
  if (failed(detail::verifySimilarityInform(*this, getU(), getE(), getWs(),
                                            getKeyMask(),
                                            getTau().convertToFloat())))
    return failure();
  // dp is the cotangent of p: p's shape [B, N, K], which is e's.
  OperandChecker check(*this);
  auto e = cast<RankedTensorType>(getE().getType());
  if (failed(check.rank(getDp(), "dp", 3,
                        "[B, N, K], the shape of the forward result p")))
    return failure();
  for (int64_t d = 0; d < 3; ++d)
    if (failed(check.dimEquals(getDp(), "'dp'", d, e.getDimSize(d),
                               "dimension " + Twine(d) + " of 'e'",
                               ": 'dp' is the cotangent of p [B, N, K]")))
      return failure();
  if (static_cast<bool>(getDws()) != static_cast<bool>(getWs()))
    return emitOpError() << (getWs() ? "'ws' is present, so the result 'dws' "
                                       "must be too"
                                     : "the result 'dws' needs the operand "
                                       "'ws'");
  if (static_cast<bool>(getP()) != static_cast<bool>(getLse()))
    return emitOpError() << "'saved' takes both the forward's 'p' and 'lse'";
  if (getP()) {
    // p has the shape of e, lse the [B, N] of its rows.
    auto p = cast<RankedTensorType>(getP().getType());
    auto lse = cast<RankedTensorType>(getLse().getType());
    if (p.getRank() != 3 || lse.getRank() != 2)
      return emitOpError() << "saved 'p' must have rank 3 ([B, N, K]) and "
                              "'lse' rank 2 ([B, N]), but they have types "
                           << p << " and " << lse;
    for (int64_t d = 0; d < 3; ++d)
      if (failed(check.dimEquals(getP(), "saved 'p'", d, e.getDimSize(d),
                                 "dimension " + Twine(d) + " of 'e'")))
        return failure();
    for (int64_t d = 0; d < 2; ++d)
      if (failed(check.dimEquals(getLse(), "saved 'lse'", d, e.getDimSize(d),
                                 "dimension " + Twine(d) + " of 'e'",
                                 ": 'lse' is per row [B, N]")))
        return failure();
  }
  return success();
}

//===----------------------------------------------------------------------===//
// SimilarityInformFwdOp
//===----------------------------------------------------------------------===//

LogicalResult SimilarityInformFwdOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  SmallVector<int64_t, 3> rows = similarityRows(adaptor.getU(), adaptor.getE());
  inferred.push_back(
      f32Tensor(ctx, {rows[0], rows[1], dimOf(adaptor.getE(), 3, 2)}));
  inferred.push_back(f32Tensor(ctx, {rows[0], rows[1]}));
  return success();
}

LogicalResult SimilarityInformFwdOp::verify() {
  return detail::verifySimilarityInform(*this, getU(), getE(), getWs(),
                                        getKeyMask(),
                                        getTau().convertToFloat());
}

//===----------------------------------------------------------------------===//
// TopkRenormGradOp
//===----------------------------------------------------------------------===//

LogicalResult TopkRenormGradOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  // dscores has the shape of scores.
  return inferShapesOfOperands(ctx, {adaptor.getScores()}, inferred);
}

LogicalResult TopkRenormGradOp::verify() {
  if (failed(detail::verifyTopkScores(*this, getScores())))
    return failure();
  OperandChecker check(*this);
  auto scores = cast<RankedTensorType>(getScores().getType());
  for (auto [name, v] : {std::pair<StringRef, Value>{"indices", getIndices()},
                         {"dw", getDw()}}) {
    auto type = cast<RankedTensorType>(v.getType());
    if (type.getRank() != scores.getRank())
      return emitOpError() << "'" << name << "' must have the rank of 'scores' ("
                           << scores.getRank() << ": [..., k]), but has type "
                           << type;
    for (int64_t d = 0; d + 1 < scores.getRank(); ++d)
      if (failed(check.dimEquals(v, "'" + name + "'", d, scores.getDimSize(d),
                                 "dimension " + Twine(d) + " of 'scores'")))
        return failure();
  }
  auto idx = cast<RankedTensorType>(getIndices().getType());
  auto dw = cast<RankedTensorType>(getDw().getType());
  int64_t k = idx.getShape().back(), kw = dw.getShape().back(),
          K = scores.getShape().back();
  if (!ShapedType::isDynamic(k) && !ShapedType::isDynamic(kw) && k != kw)
    return emitOpError() << "the last dimension of 'dw' (" << kw
                         << ") must equal that of 'indices' (k = " << k << ")";
  if (!ShapedType::isDynamic(k) &&
      (k < 1 || (!ShapedType::isDynamic(K) && k > K))) {
    InFlightDiagnostic diag = emitOpError()
                              << "the last dimension of 'indices' (k = " << k
                              << ") must be in [1, ";
    if (ShapedType::isDynamic(K))
      return diag << "K] (K = the last dimension of 'scores')";
    return diag << K << "] (K, the experts of 'scores')";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// HyperRouterGradOp
//===----------------------------------------------------------------------===//

LogicalResult HyperRouterGradOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  // Each gradient has the shape of its operand.
  return inferShapesOfOperands(ctx,
                               {adaptor.getEmb(), adaptor.getW1(),
                                adaptor.getB1(), adaptor.getW2(),
                                adaptor.getB2()},
                               inferred);
}

LogicalResult HyperRouterGradOp::verify() {
  // dw and db are the cotangents of the forward results w [E, D] and b [E].
  OperandChecker check(*this);
  if (failed(check.rank(getDw(), "dw", 2,
                        "[E, D], the shape of the forward result w")) ||
      failed(check.rank(getDb(), "db", 1,
                        "[E], the shape of the forward result b")))
    return failure();
  auto dw = cast<RankedTensorType>(getDw().getType());
  auto db = cast<RankedTensorType>(getDb().getType());
  if (failed(detail::verifyHyperRouter(*this, getEmb(), getW1(), getB1(),
                                       getW2(), getB2(), getNumExperts(),
                                       dw.getDimSize(1),
                                       "'dw' (the cotangent of w [E, D])")))
    return failure();
  int64_t numExperts = getNumExperts();
  for (auto [name, size] : {std::pair<StringRef, int64_t>{"dw", dw.getDimSize(0)},
                            {"db", db.getDimSize(0)}})
    if (!ShapedType::isDynamic(size) && size != numExperts)
      return emitOpError() << "dimension 0 of '" << name << "' (" << size
                           << ") must equal num_experts (E = " << numExperts
                           << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// AttentionPosteriorGradOp
//===----------------------------------------------------------------------===//

LogicalResult AttentionPosteriorGradOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  // Each gradient has the shape of its operand.
  return inferShapesOfOperands(ctx,
                               {adaptor.getScores(), adaptor.getU(),
                                adaptor.getV(), adaptor.getWo(),
                                adaptor.getE()},
                               inferred);
}

std::optional<double> AttentionPosteriorGradOp::getEffectiveHeadScale() {
  if (std::optional<APFloat> scale = getHeadScale())
    return scale->convertToDouble();
  int64_t numHeads =
      cast<RankedTensorType>(getScores().getType()).getDimSize(1);
  if (ShapedType::isDynamic(numHeads))
    return std::nullopt;
  return static_cast<double>(numHeads);
}

LogicalResult AttentionPosteriorGradOp::verify() {
  if (failed(detail::verifyAttentionPosterior(
          *this, getScores(), getU(), getV(), getWo(), getE(),
          getSigma().convertToFloat(), getHeadScale())))
    return failure();
  // dp is the cotangent of p [B, N, K].
  OperandChecker check(*this);
  if (failed(check.rank(getDp(), "dp", 3,
                        "[B, N, K], the shape of the forward result p")))
    return failure();
  SmallVector<int64_t, 3> shape =
      detail::posteriorRows(getScores(), getU(), getV(), getE());
  shape.push_back(dimOf(getE(), 3, 2));
  const char *names[] = {"B", "N", "K"};
  for (int64_t d = 0; d < 3; ++d)
    if (failed(check.dimEquals(getDp(), "'dp'", d, shape[d], names[d],
                               ": 'dp' is the cotangent of p [B, N, K]")))
      return failure();
  bool minEntropy = getHeadSelect() == HeadSelect::min_entropy;
  if (!getHead())
    return minEntropy ? emitOpError()
                            << "head_select = min_entropy needs the operand "
                               "'head' (the forward's chosen head h*, [B])"
                      : success();
  if (!minEntropy)
    return emitOpError() << "'head' must be absent for head_select = all (the "
                            "gradient mixes every head)";
  return failure(
      failed(
          check.rank(getHead(), "head", 1, "[B], the forward's chosen head")) ||
      failed(check.dimEquals(getHead(), "'head'", 0, shape[0], "B")));
}
