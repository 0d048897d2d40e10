//===- Patterns.h - The per-op moe -> linalg patterns -----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// One lowering function per op, each defined in the file named after the op.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOLINALG_PATTERNS_H
#define MOE_LIB_CONVERSION_MOETOLINALG_PATTERNS_H

#include "MoE/IR/MoEOps.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "mlir/IR/PatternMatch.h"

namespace mlir {
class RewritePatternSet;
namespace moe::lowering {
/// The ops lowered here, X(Name) each:
/// `lower<Name>(<Name>Op, PatternRewriter &)`
/// is defined in <Name>.cpp and registered by populateMoEToLinalgPatterns.
#define MOE_LINALG_LOWERED_OPS(X)                                              \
  X(TopkRenorm) X(SimilarityInform) X(AttentionPosterior) X(MadDispersion)     \
  X(AdjacencyUpdate) X(HyperRouter) X(Route) X(RouteGrad) X(DispatchPlan)      \
  X(SimilarityInformGrad) X(TopkRenormGrad) X(HyperRouterGrad)                 \
  X(AttentionPosteriorGrad) X(SimilarityInformFwd) X(BiasUpdate)             \
  X(RouterStats) X(RouterStatsGrad) X(LoadBalancingLoss) X(RouterZLoss)        \
  X(RouterZLossGrad) X(SequenceBalanceLoss) X(SequenceBalanceLossGrad)

#define MOE_DECLARE_LOWERING(Name)                                             \
  LogicalResult lower##Name(Name##Op op, PatternRewriter &rw);
MOE_LINALG_LOWERED_OPS(MOE_DECLARE_LOWERING)
#undef MOE_DECLARE_LOWERING

// Shared by similarity_inform and its backward (SimilarityInform.cpp).

/// q[b,i,:] = u[b,i,:] · ws (f32 operands).
Value projectQueries(OpBuilder &b, Location loc, Value u, Value ws);
/// The logits [B, N] of key `j` against every query row: <q_i, u_j> / tau,
/// -inf where the key is masked (mask [B, N] i1, optional) or, with
/// `causal`, after the row; written into `scratch` [B, N].
Value similarityKeyLogits(OpBuilder &b, Location loc, Value q, Value u,
                          Value mask, bool causal, float tau, Value j,
                          Value scratch);

/// The streaming softmax of similarity_inform over every key (streamKeys):
/// logits similarityKeyLogits, values the rows of `e` [B, N, K].
OnlineSoftmaxState streamSimilarity(OpBuilder &b, Location loc, Value q,
                                    Value u, Value e, Value mask, bool causal,
                                    float tau);

/// The row log-sum-exp [B, N] of a finished streaming softmax: m + log(l),
/// `none` (a constant f32) for a row without keys (m = -inf).
Value rowLogSumExp(OpBuilder &b, Location loc, const OnlineSoftmaxState &s,
                   double none);
/// `lse` [B, N] with -inf (a row without keys) replaced by `none`.
Value replaceNegInf(OpBuilder &b, Location loc, Value lse, double none);

// Shared by hyper_router and its backward (HyperRouter.cpp).

/// matrix · vector + bias (then ReLU when `relu`), accumulated in f32 (f32
/// operands; linalg.matvec and a generic).
Value hyperRouterAffine(OpBuilder &b, Location loc, Value matrix, Value vector,
                        Value bias, bool relu);

} // namespace moe::lowering
} // namespace mlir

#endif // MOE_LIB_CONVERSION_MOETOLINALG_PATTERNS_H
