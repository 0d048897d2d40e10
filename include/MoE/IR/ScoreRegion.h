//===- ScoreRegion.h - The ops of a moe.route score region ------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The one list of the ops accepted in the `score` region of moe.route and
// moe.route_grad (MoERoutingOps.td), read by the verifiers and by the
// kernels' emitter and differentiator (MoE/Kernels/ScoreRegion.h), which
// therefore never meet an op they do not know. Header-only: the kernels
// library does not link the dialect.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_SCOREREGION_H
#define MOE_IR_SCOREREGION_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"

namespace mlir::moe {

enum class ScoreOpKind {
  /// Not allowed in a score region.
  Rejected,
  /// Allowed, and the differentiator has its derivative.
  Differentiable,
  /// Allowed in the forward (math.floor/ceil/round); its derivative is zero
  /// almost everywhere, so moe.route_grad rejects it rather than silently
  /// stopping the gradient.
  Step,
};

/// What a score region may do with `op` (not its terminator).
inline ScoreOpKind classifyScoreOp(Operation *op) {
  if (isa<arith::ConstantOp, arith::AddFOp, arith::SubFOp, arith::MulFOp,
          arith::DivFOp, arith::NegFOp, arith::MaximumFOp, arith::MinimumFOp,
          arith::CmpFOp, arith::SelectOp, math::ExpOp, math::Exp2Op,
          math::LogOp, math::Log1pOp, math::SqrtOp, math::RsqrtOp,
          math::TanhOp, math::AbsFOp, math::PowFOp, math::ErfOp>(op))
    return ScoreOpKind::Differentiable;
  if (isa<math::FloorOp, math::CeilOp, math::RoundOp>(op))
    return ScoreOpKind::Step;
  return ScoreOpKind::Rejected;
}

} // namespace mlir::moe

#endif // MOE_IR_SCOREREGION_H
