//===- BalanceOps.cpp - Verifiers and type inference of the balance ops ---===//
//
// Part of the MoE-MLIR project.
//
// The load-balancing statistics and losses (MoEBalanceOps.td). As for the
// other ops, type inference never fails on a malformed op (it answers
// dynamic sizes); the verifiers name the operand and the rule.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"
#include "Verifiers.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::detail;

namespace {
/// The gradient of `logits` ([T, E]): f32 of its shape (dynamic sizes where
/// it is not of rank 2).
RankedTensorType logitsGradType(MLIRContext *ctx, Value logits) {
  return f32Tensor(ctx, {dimOf(logits, 2, 0), dimOf(logits, 2, 1)});
}

bool known(int64_t s) { return !ShapedType::isDynamic(s); }

/// logits [T, E] and the optional token_mask [T] of the router statistics.
LogicalResult verifyRouterLogits(Operation *op, Value logits, Value mask) {
  OperandChecker check(op);
  if (failed(check.rank(logits, "logits", 2, "[T, E]")))
    return failure();
  if (!mask)
    return success();
  if (failed(check.rank(mask, "token_mask", 1, "[T]")))
    return failure();
  return check.dimEquals(mask, "'token_mask'", 0, dimOf(logits, 2, 0),
                         "the token count T of 'logits'");
}

/// scores [B, S, E] and indices [B, S, k] of the sequence-wise loss.
LogicalResult verifySequenceOperands(Operation *op, Value scores,
                                     Value indices) {
  OperandChecker check(op);
  if (failed(check.rank(scores, "scores", 3, "[B, S, E]")) ||
      failed(check.rank(indices, "indices", 3, "[B, S, k]")) ||
      failed(check.dimEquals(indices, "'indices'", 0, dimOf(scores, 3, 0),
                             "the batch size B of 'scores'")) ||
      failed(check.dimEquals(indices, "'indices'", 1, dimOf(scores, 3, 1),
                             "the sequence length S of 'scores'")))
    return failure();
  int64_t k = dimOf(indices, 3, 2), e = dimOf(scores, 3, 2);
  if (k == 0 || (known(k) && known(e) && k > e))
    return op->emitOpError()
           << "the number of selections k (dimension 2 of 'indices', " << k
           << ") must be in [1, " << (known(e) ? std::to_string(e) : "E")
           << "] (the expert count of 'scores')";
  return success();
}

/// A rank-0 f32 operand (a saved scalar or a cotangent).
LogicalResult verifyScalar(Operation *op, Value v, StringRef name) {
  return OperandChecker(op).rank(v, name, 0, "a scalar");
}
} // namespace

//===----------------------------------------------------------------------===//
// router_stats
//===----------------------------------------------------------------------===//

LogicalResult RouterStatsOp::inferReturnTypes(MLIRContext *ctx,
                                              std::optional<Location>,
                                              Adaptor adaptor,
                                              SmallVectorImpl<Type> &inferred) {
  int64_t e = dimOf(adaptor.getLogits(), 2, 1);
  inferred.push_back(f32Tensor(ctx, {e}));
  inferred.push_back(f32Tensor(ctx, {e}));
  inferred.push_back(f32Tensor(ctx, {}));
  return success();
}

LogicalResult RouterStatsOp::verify() {
  if (failed(verifyRouterLogits(*this, getLogits(), getTokenMask())))
    return failure();
  int64_t e = dimOf(getLogits(), 2, 1), k = getK();
  if (k < 1 || (known(e) && k > e)) {
    InFlightDiagnostic diag = emitOpError()
                              << "'k' (" << k << ") must be in [1, ";
    if (known(e))
      diag << e << "] (the size of the last dimension of 'logits')";
    else
      diag << "E]";
    return diag;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// router_stats_grad
//===----------------------------------------------------------------------===//

LogicalResult
RouterStatsGradOp::inferReturnTypes(MLIRContext *ctx, std::optional<Location>,
                                    Adaptor adaptor,
                                    SmallVectorImpl<Type> &inferred) {
  inferred.push_back(logitsGradType(ctx, adaptor.getLogits()));
  return success();
}

LogicalResult RouterStatsGradOp::verify() {
  OperandChecker check(*this);
  if (failed(verifyRouterLogits(*this, getLogits(), getTokenMask())) ||
      failed(verifyScalar(*this, getWeightSum(), "weight_sum")) ||
      failed(check.rank(getDmeanProbs(), "dmean_probs", 1, "[E]")))
    return failure();
  return check.dimEquals(getDmeanProbs(), "'dmean_probs'", 0,
                         dimOf(getLogits(), 2, 1),
                         "the expert count E of 'logits'");
}

//===----------------------------------------------------------------------===//
// load_balancing_loss
//===----------------------------------------------------------------------===//

LogicalResult
LoadBalancingLossOp::inferReturnTypes(MLIRContext *ctx, std::optional<Location>,
                                      Adaptor,
                                      SmallVectorImpl<Type> &inferred) {
  inferred.push_back(f32Tensor(ctx, {}));
  return success();
}

LogicalResult LoadBalancingLossOp::verify() {
  OperandChecker check(*this);
  if (failed(check.rank(getCounts(), "counts", 1, "[E]")) ||
      failed(check.rank(getMeanProbs(), "mean_probs", 1, "[E]")) ||
      failed(verifyScalar(*this, getWeightSum(), "weight_sum")))
    return failure();
  return check.dimEquals(getMeanProbs(), "'mean_probs'", 0,
                         dimOf(getCounts(), 1, 0),
                         "the expert count E of 'counts'");
}

//===----------------------------------------------------------------------===//
// router_z_loss, router_z_loss_grad
//===----------------------------------------------------------------------===//

LogicalResult RouterZLossOp::inferReturnTypes(MLIRContext *ctx,
                                              std::optional<Location>, Adaptor,
                                              SmallVectorImpl<Type> &inferred) {
  inferred.push_back(f32Tensor(ctx, {}));
  return success();
}

LogicalResult RouterZLossOp::verify() {
  return OperandChecker(*this).rank(getLogits(), "logits", 2, "[T, E]");
}

LogicalResult
RouterZLossGradOp::inferReturnTypes(MLIRContext *ctx, std::optional<Location>,
                                    Adaptor adaptor,
                                    SmallVectorImpl<Type> &inferred) {
  inferred.push_back(logitsGradType(ctx, adaptor.getLogits()));
  return success();
}

LogicalResult RouterZLossGradOp::verify() {
  if (failed(OperandChecker(*this).rank(getLogits(), "logits", 2, "[T, E]")))
    return failure();
  return verifyScalar(*this, getDloss(), "dloss");
}

//===----------------------------------------------------------------------===//
// sequence_balance_loss, sequence_balance_loss_grad
//===----------------------------------------------------------------------===//

LogicalResult
SequenceBalanceLossOp::inferReturnTypes(MLIRContext *ctx,
                                        std::optional<Location>, Adaptor,
                                        SmallVectorImpl<Type> &inferred) {
  inferred.push_back(f32Tensor(ctx, {}));
  return success();
}

LogicalResult SequenceBalanceLossOp::verify() {
  return verifySequenceOperands(*this, getScores(), getIndices());
}

LogicalResult SequenceBalanceLossGradOp::inferReturnTypes(
    MLIRContext *ctx, std::optional<Location>, Adaptor adaptor,
    SmallVectorImpl<Type> &inferred) {
  Value s = adaptor.getScores();
  inferred.push_back(
      f32Tensor(ctx, {dimOf(s, 3, 0), dimOf(s, 3, 1), dimOf(s, 3, 2)}));
  return success();
}

LogicalResult SequenceBalanceLossGradOp::verify() {
  if (failed(verifySequenceOperands(*this, getScores(), getIndices())))
    return failure();
  return verifyScalar(*this, getDloss(), "dloss");
}
