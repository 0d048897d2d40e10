//===- Verifiers.h - Verifier rules shared by forward and backward ops -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The backward ops (MoEGradOps.cpp) check their forward operands with the
// forward op's own rules (MoEOps.cpp), so both report the same messages.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_DIALECT_MOE_IR_VERIFIERS_H
#define MOE_LIB_DIALECT_MOE_IR_VERIFIERS_H

#include "mlir/IR/Operation.h"
#include "llvm/ADT/APFloat.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>

namespace mlir::moe::detail {
/// The scores [..., K] of top-k gating: rank >= 1.
LogicalResult verifyTopkScores(Operation *op, Value scores);
/// The operands and `tau` of Similarity-Inform mixing.
LogicalResult verifySimilarityInform(Operation *op, Value u, Value e, Value ws,
                                     Value mask, float tau);
/// The operands of HyperRouter generation, `d` the router's feature count D
/// (dynamic when unknown), named `dName` in the diagnostics.
LogicalResult verifyHyperRouter(Operation *op, Value emb, Value w1, Value b1,
                                Value w2, Value b2, int64_t numExperts,
                                int64_t d, StringRef dName);
/// The operands, `sigma` and `head_scale` of Attention-Inform mixing.
LogicalResult verifyAttentionPosterior(Operation *op, Value scores, Value u,
                                       Value v, Value wo, Value e, float sigma,
                                       std::optional<APFloat> headScale);
/// [B, N] of Attention-Inform mixing, from every operand that carries them.
SmallVector<int64_t, 3> posteriorRows(Value scores, Value u, Value v, Value e);
/// [B, N] of Similarity-Inform mixing, from `u` [B, N, D] and `e` [B, N, K]
/// (dynamic where neither is static or an operand has the wrong rank).
SmallVector<int64_t, 3> similarityRows(Value u, Value e);
/// Size `i` of `v` when `v` is a ranked tensor of rank `rank`, else dynamic.
int64_t dimOf(Value v, int64_t rank, int64_t i);
} // namespace mlir::moe::detail

#endif // MOE_LIB_DIALECT_MOE_IR_VERIFIERS_H
