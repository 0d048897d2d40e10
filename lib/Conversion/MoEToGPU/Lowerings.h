//===- Lowerings.h - One GPU lowering per moe op ----------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// Each function rewrites one tensor-level op into host code + kernels (see
// KernelUtils.h) and replaces its results; on failure it emits an error on
// the op and leaves the IR unchanged.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H
#define MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H

#include "MoE/IR/MoEOps.h"

#include "mlir/IR/BuiltinOps.h"

namespace mlir::moe::gpu_lowering {

struct LoweringOptions {
  /// Threads per block of the token-parallel kernels.
  int64_t blockSize = 128;
};

LogicalResult lowerTopkRenorm(TopkRenormOp op, ModuleOp module,
                              const LoweringOptions &options);
LogicalResult lowerSimilarityInform(Operation *op, ModuleOp module,
                                    const LoweringOptions &options);
LogicalResult lowerAttentionPosterior(Operation *op, ModuleOp module,
                                      const LoweringOptions &options);
LogicalResult lowerMadDispersion(MadDispersionOp op, ModuleOp module,
                                 const LoweringOptions &options);
LogicalResult lowerAdjacencyUpdate(AdjacencyUpdateOp op, ModuleOp module,
                                   const LoweringOptions &options);
LogicalResult lowerHyperRouter(HyperRouterOp op, ModuleOp module,
                               const LoweringOptions &options);

/// A memref of rank >= 1 viewed as 2-D [rows, last]: rank 1 gets a unit
/// leading dim, rank > 2 has its leading dims collapsed (identity layouts).
Value viewAs2D(ImplicitLocOpBuilder &b, Value memref);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H
