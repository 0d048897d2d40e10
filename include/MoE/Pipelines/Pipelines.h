//===- Pipelines.h - End-to-end lowering pipelines --------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_PIPELINES_PIPELINES_H
#define MOE_PIPELINES_PIPELINES_H

namespace mlir {
class OpPassManager;

namespace moe {
/// Tensor-level `func.func`s holding moe ops -> the LLVM dialect, for the CPU:
/// convert-moe-to-linalg, one-shot bufferization (function boundaries
/// included), loops, and the upstream conversions to LLVM. Every public
/// function gets a `_mlir_ciface_` wrapper for the ExecutionEngine.
void buildLowerToLLVMPipeline(OpPassManager &pm);

/// Registers `moe-lower-to-llvm` with the pass registry (moe-opt --help).
void registerMoEPipelines();
} // namespace moe
} // namespace mlir

#endif // MOE_PIPELINES_PIPELINES_H
