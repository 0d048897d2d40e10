//===- Legality.h - The conversion target of the moe lowerings --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// convert-moe-to-linalg, convert-moe-to-cpu and convert-moe-to-gpu each add
// their patterns (populate<Family>Patterns) and run one partial conversion on
// this target; they differ only in whether a moe op may stay (it may on the
// CPU, where every kernel is optional, and on the GPU).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_LEGALITY_H
#define MOE_CONVERSION_LEGALITY_H

#include "MoE/IR/MoEDialect.h"
#include "MoE/IR/MoEOps.h"

#include "mlir/Transforms/DialectConversion.h"

namespace mlir::moe {

/// Whether a conversion must lower every moe op.
enum class MoEOpsAfter {
  /// Illegal: every op has a pattern (the portable lowering), so one that
  /// stays is a failure of the pass.
  Lowered,
  /// Of unknown legality: the driver tries every moe op, new ones included,
  /// and one whose pattern declines (a match failure, or an error the pattern
  /// reported at the op) stays, without a second "failed to legalize" error.
  MayStay,
};

/// Configures `target` for a moe conversion: the moe ops as `after` says,
/// moe.kernel and its terminator legal (the kernels the patterns build, on
/// buffers, for bufferization), every other op legal.
inline void configureMoEConversionTarget(ConversionTarget &target,
                                         MoEOpsAfter after) {
  target.markUnknownOpDynamicallyLegal(
      [](Operation *op) -> std::optional<bool> {
        if (isa_and_nonnull<MoEDialect>(op->getDialect()))
          return std::nullopt;
        return true;
      });
  target.addLegalOp<KernelOp, KernelEndOp>();
  if (after == MoEOpsAfter::Lowered)
    target.addIllegalDialect<MoEDialect>();
}

} // namespace mlir::moe

#endif // MOE_CONVERSION_LEGALITY_H
