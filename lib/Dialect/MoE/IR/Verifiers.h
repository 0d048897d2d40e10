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

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Operation.h"
#include "llvm/ADT/APFloat.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <string>

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
/// The result types that type inference answers: f32 and i32 tensors.
RankedTensorType f32Tensor(MLIRContext *ctx, ArrayRef<int64_t> shape);
RankedTensorType i32Tensor(MLIRContext *ctx, ArrayRef<int64_t> shape);
/// A float attribute as a user wrote it: `0.5`, `-1`, `inf`, `nan`.
std::string formatFloat(double value);

/// Verification helpers bound to one op, so that each rule is one line in the
/// op verifiers and every op words the same rule the same way.
class OperandChecker {
public:
  explicit OperandChecker(Operation *op) : op(op) {}

  /// `name` must be a tensor of rank `rank`, laid out as `layout`.
  LogicalResult rank(Value v, StringRef name, int64_t rank, StringRef layout);
  /// Dimension `ai` of `a` and dimension `bi` of `b` are the same size `sym`.
  LogicalResult sameDim(Value a, StringRef aName, int64_t ai, Value b,
                        StringRef bName, int64_t bi, StringRef sym);
  /// Dimension `d` of `v` is `expected` unless either is dynamic: "dimension
  /// d of `noun` (size) must equal `what` (expected)`why`", `noun` as
  /// written ("'dp'", "saved 'p'").
  LogicalResult dimEquals(Value v, const Twine &noun, int64_t d,
                          int64_t expected, const Twine &what,
                          StringRef why = "");
  /// A float attribute that must be finite and strictly positive.
  LogicalResult positive(StringRef name, float value);
  /// A float attribute that must be finite and >= 0; `why` ends the message.
  LogicalResult nonNegative(StringRef name, double value, StringRef why = "");
  /// A float attribute that must be finite and in [lo, hi].
  LogicalResult inRange(StringRef name, float value, float lo, float hi);
  /// An integer attribute that must be at least `lo`.
  LogicalResult atLeast(StringRef name, int64_t value, int64_t lo);
  /// `num_experts` in [1, 2^31 - 1]: expert indices and counts are i32.
  LogicalResult expertCount(int64_t value);

private:
  Operation *op;
};
} // namespace mlir::moe::detail

#endif // MOE_LIB_DIALECT_MOE_IR_VERIFIERS_H
