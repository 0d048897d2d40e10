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
/// Options of the moe-lower-to-nvvm pipeline (its command-line options and
/// the C++ API's).
struct MoELowerToNVVMOptions
    : public ConvertMoEToGPUPipelineOptions<MoELowerToNVVMOptions> {
  PassOptions::Option<std::string> chip{
      *this, "chip", llvm::cl::desc("target chip: sm_80, sm_90, sm_90a, ..."),
      llvm::cl::init("sm_90")};
  PassOptions::Option<std::string> features{
      *this, "features",
      llvm::cl::desc("PTX features (default +ptx80, what sm_90 needs)"),
      llvm::cl::init("")};
  PassOptions::Option<std::string> format{
      *this, "format",
      llvm::cl::desc("gpu.binary format: isa (PTX), bin (cubin), fatbin"),
      llvm::cl::init("fatbin")};
  PassOptions::Option<std::string> toolkit{
      *this, "toolkit", llvm::cl::desc("CUDA toolkit with ptxas and fatbinary"),
      llvm::cl::init("/usr/local/cuda")};
  PassOptions::Option<unsigned> optLevel{
      *this, "opt-level", llvm::cl::desc("LLVM optimization level of kernels"),
      llvm::cl::init(3)};
  PassOptions::Option<bool> resultsToOutParams{
      *this, "results-to-out-params",
      llvm::cl::desc("memref results of public functions as out-params "
                     "appended to the arguments, allocated by the caller "
                     "(moe-gpu-results-to-out-params)"),
      llvm::cl::init(false)};
  PassOptions::Option<bool> waitAtReturn{
      *this, "wait-at-return",
      llvm::cl::desc("the host waits for the function's stream before "
                     "returning; false: the work stays in flight on the "
                     "ambient stream and index errors are left for "
                     "moeGpuPollErrors (moe-gpu-host-stream)"),
      llvm::cl::init(true)};
  // convert-moe-to-gpu's (Passes.td), handed to it as they are but
  // topk-rounds=auto, resolved for the chip first
  // (buildMoELowerToNVVMPipeline).
  ConvertOption<int64_t> sharedMemoryBytes{
      *this, "shared-memory-bytes", &ConvertMoEToGPUOptions::sharedMemoryBytes};
  ConvertOption<std::string> topkRounds{
      *this, "topk-rounds", &ConvertMoEToGPUOptions::topkRounds, "auto",
      "; here also `auto` (the default): list-redux for sm_80 and later, "
      "else butterfly"};
  ConvertOption<bool> flashMma{*this, "flash-mma",
                               &ConvertMoEToGPUOptions::flashMma};
  ConvertOption<bool> balanceKernels{*this, "balance-kernels",
                                     &ConvertMoEToGPUOptions::balanceKernels};
  ConvertOption<bool> flashMmaWideStaging{
      *this, "flash-mma-wide-staging",
      &ConvertMoEToGPUOptions::flashMmaWideStaging};
  ConvertOption<bool> flashMmaAsyncStaging{
      *this, "flash-mma-async-staging",
      &ConvertMoEToGPUOptions::flashMmaAsyncStaging};
  ConvertOption<bool> flashMmaTopk{*this, "flash-mma-topk",
                                   &ConvertMoEToGPUOptions::flashMmaTopk};
  ConvertOption<bool> flashMmaPosterior{
      *this, "flash-mma-posterior", &ConvertMoEToGPUOptions::flashMmaPosterior};
  ConvertOption<bool> flashMmaBase2{*this, "flash-mma-base2",
                                    &ConvertMoEToGPUOptions::flashMmaBase2};
  ConvertOption<bool> flashMmaSumMma{*this, "flash-mma-sum-mma",
                                     &ConvertMoEToGPUOptions::flashMmaSumMma};
  ConvertOption<int64_t> flashMmaBlockRows{
      *this, "flash-mma-block-rows",
      &ConvertMoEToGPUOptions::flashMmaBlockRows};
  ConvertOption<int64_t> flashMmaKeySplits{
      *this, "flash-mma-key-splits",
      &ConvertMoEToGPUOptions::flashMmaKeySplits};
  ConvertOption<bool> flashMmaLazyRescale{
      *this, "flash-mma-lazy-rescale",
      &ConvertMoEToGPUOptions::flashMmaLazyRescale};
  ConvertOption<int64_t> flashMmaStages{
      *this, "flash-mma-stages", &ConvertMoEToGPUOptions::flashMmaStages};
  ConvertOption<std::string> routeMap{*this, "route-map",
                                      &ConvertMoEToGPUOptions::routeMap};
};

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
