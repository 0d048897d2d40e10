//===- GPUPipeline.h - The moe-lower-to-nvvm pipeline -----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The GPU counterpart of moe-lower-to-llvm (Pipelines.h): tensor functions
// holding moe ops to host LLVM IR launching the kernels of convert-moe-to-gpu,
// embedded as a gpu.binary. It lives with the CPU pipelines, above the
// conversions it assembles: MLIRMoEPipelines links MLIRMoEToGPU, not the
// reverse.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_PIPELINES_GPUPIPELINE_H
#define MOE_PIPELINES_GPUPIPELINE_H

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"

#include "mlir/Pass/PassOptions.h"

#include <string>

namespace mlir {
class OpPassManager;

namespace moe {
// MoELowerToNVVMOptions, the options of moe-lower-to-nvvm (Pipelines.td): its
// own and convert-moe-to-gpu's (ConvertMoEToGPUOptions, MoEToGPU.h), which
// convertMoEToGPUOptions() hands to the pass.
#define GEN_PIPELINE_OPTIONS_MOELOWERTONVVM
#include "MoE/Pipelines/Pipelines.h.inc"

/// convert-moe-to-gpu, canonicalization, one-shot bufferization of the
/// function boundaries (device memrefs in, device memrefs out; results as
/// out-params with resultsToOutParams), one stream per function
/// (moe-gpu-host-stream), then the
/// upstream NVVM lowering of the kernels, gpu-to-llvm for the host code and
/// gpu-module-to-binary. Public functions get `_mlir_ciface_` wrappers.
void buildMoELowerToNVVMPipeline(OpPassManager &pm,
                                 const MoELowerToNVVMOptions &options);

/// Registers `moe-lower-to-nvvm` (MoELowerToNVVMOptions) with the pass
/// registry.
void registerMoEGPUPipelines();
} // namespace moe
} // namespace mlir

#endif // MOE_PIPELINES_GPUPIPELINE_H
