//===- Lowerings.h - The per-op moe -> linalg patterns ----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// One populate function per op, generated from the lowering table
// (include/MoE/Conversion/Lowerings.td) with the op's LinalgLowering pattern,
// and the helpers the op files share.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOLINALG_LOWERINGS_H
#define MOE_LIB_CONVERSION_MOETOLINALG_LOWERINGS_H

#include "MoE/Conversion/MoEToLinalg/Utils.h"
#include "MoE/IR/MoEOps.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/DialectConversion.h"

namespace mlir::moe::linalg_lowering {

/// An op file's `lower<Name>(<Name>Op, PatternRewriter &)` (declared from the
/// lowering table) as the op's conversion pattern, which the generated
/// populate<Name>Lowering adds. The
/// lowerings change no types, so they read the op's operands rather than an
/// adaptor's.
template <typename OpTy, LogicalResult (*Lower)(OpTy, PatternRewriter &)>
struct LinalgLowering final : OpConversionPattern<OpTy> {
  using OpConversionPattern<OpTy>::OpConversionPattern;
  LogicalResult
  matchAndRewrite(OpTy op, typename OpTy::Adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    return Lower(op, rewriter);
  }
};

} // namespace mlir::moe::linalg_lowering

// populate<Name>Lowering and lower<Name> of each op that Lowerings.td lowers
// with Portable, and populateLowerings (every one of them).
#include "Lowerings.h.inc"

namespace mlir {
namespace moe::linalg_lowering {
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

} // namespace moe::linalg_lowering
} // namespace mlir

#endif // MOE_LIB_CONVERSION_MOETOLINALG_LOWERINGS_H
