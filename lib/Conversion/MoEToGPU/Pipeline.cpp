//===- Pipeline.cpp - The moe-lower-to-nvvm pipeline ----------------------===//
//
// Part of the MoE-MLIR project.
//
// The fusion of mixing ops with their top-k gate (the fused kernels select the
// experts in their epilogue), our conversion and one-shot bufferization, the
// host code of each function on one stream (optionally results as out-params
// and no wait at the end: the torch ops' CUDA kernels), then
// the passes of upstream
// gpu-lower-to-nvvm-pipeline (mlir/lib/Dialect/GPU/Pipelines) with two
// additions: C-interface wrappers for the host functions (the AOT library and
// ctypes call `_mlir_ciface_*`) and the CUDA toolkit path for ptxas.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"
#include "MoE/Conversion/Passes.h"
#include "MoE/Pipelines/Bufferize.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/Transforms/RequestCWrappers.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

/// topk-rounds=auto: redux where the chip has redux.sync (sm_80 and later;
/// checked against the butterfly on an H200: 1.5-1.9x faster at 65536 tokens),
/// else butterfly.
static std::string
resolveTopkRounds(const moe::MoELowerToNVVMOptions &options) {
  if (options.topkRounds != "auto")
    return options.topkRounds;
  unsigned sm = 0;
  StringRef chip(options.chip);
  if (chip.consume_front("sm_"))
    chip.take_while([](char c) { return c >= '0' && c <= '9'; })
        .getAsInteger(10, sm);
  return sm >= 80 ? "redux" : "butterfly";
}

void mlir::moe::buildMoELowerToNVVMPipeline(
    OpPassManager &pm, const MoELowerToNVVMOptions &options) {
  // similarity_inform/attention_posterior + their probs-mode gate -> one fused
  // op, so that p [B, N, K] never goes to device memory.
  pm.addPass(createMoEFuseRouting());
  pm.addPass(createMoELegalizeShapes()); // size limits, zero-sized ops
  // moe ops -> host code + kernels, on tensors; then buffers across the
  // function boundaries (identity layouts: plain device memrefs for callers).
  ConvertMoEToGPUOptions convert;
  convert.sharedMemoryBytes = options.sharedMemoryBytes;
  convert.topkRounds = resolveTopkRounds(options);
  pm.addPass(createConvertMoEToGPU(convert));
  pm.addPass(createCanonicalizerPass());
  moe::addOneShotBufferizeAcrossFunctions(pm);
  pm.addPass(createCanonicalizerPass());
  if (options.resultsToOutParams)
    pm.addPass(createMoEGPUResultsToOutParams());
  // The ops of a function on one stream; one host wait at its end, or none.
  MoEGPUHostStreamOptions stream;
  stream.waitAtReturn = options.waitAtReturn;
  pm.addNestedPass<func::FuncOp>(createMoEGPUHostStream(stream));
  pm.addNestedPass<func::FuncOp>(LLVM::createLLVMRequestCWrappersPass());

  // Common part (upstream buildCommonPassPipeline).
  pm.addPass(createConvertNVGPUToNVVMPass());
  pm.addPass(createGpuKernelOutliningPass());
  pm.addPass(createConvertVectorToSCFPass());
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createConvertNVVMToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  GpuNVVMAttachTargetOptions target;
  target.chip = options.chip;
  target.features = options.features.empty() ? "+ptx80" : options.features;
  target.optLevel = options.optLevel;
  pm.addPass(createGpuNVVMAttachTarget(target));
  pm.addPass(createLowerAffinePass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());

  // Kernels -> NVVM.
  pm.addNestedPass<gpu::GPUModuleOp>(createStripDebugInfoPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createConvertGpuOpsToNVVMOps());
  pm.addNestedPass<gpu::GPUModuleOp>(LLVM::createNVVMOptimizeForTargetPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createCanonicalizerPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createCSEPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createReconcileUnrealizedCastsPass());

  // Host code -> LLVM with the mgpu* calls; kernels -> gpu.binary.
  pm.addPass(createGpuToLLVMConversionPass());
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = options.format;
  binary.toolkitPath = options.toolkit;
  pm.addPass(createGpuModuleToBinaryPass(binary));
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

namespace {
struct LowerToNVVMPipelineOptions
    : public PassPipelineOptions<LowerToNVVMPipelineOptions> {
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
  PassOptions::Option<int64_t> sharedMemoryBytes{
      *this, "shared-memory-bytes",
      llvm::cl::desc("shared memory per block the kernels may use (bytes)"),
      llvm::cl::init(48 * 1024)};
  PassOptions::Option<std::string> topkRounds{
      *this, "topk-rounds",
      llvm::cl::desc("rounds of topk_renorm's register top-k: butterfly, "
                     "redux (sm_80+) or auto (redux where the chip has it; "
                     "convert-moe-to-gpu)"),
      llvm::cl::init("auto")};
};
} // namespace

void mlir::moe::registerMoEGPUPipelines() {
  PassPipelineRegistration<LowerToNVVMPipelineOptions>(
      "moe-lower-to-nvvm",
      "Lower tensor functions holding moe ops to host LLVM IR launching fused "
      "CUDA kernels (gpu.binary: PTX, cubin or fatbin)",
      [](OpPassManager &pm, const LowerToNVVMPipelineOptions &o) {
        moe::MoELowerToNVVMOptions options;
        options.chip = o.chip;
        options.features = o.features;
        options.format = o.format;
        options.toolkit = o.toolkit;
        options.optLevel = o.optLevel;
        options.resultsToOutParams = o.resultsToOutParams;
        options.waitAtReturn = o.waitAtReturn;
        options.sharedMemoryBytes = o.sharedMemoryBytes;
        options.topkRounds = o.topkRounds;
        buildMoELowerToNVVMPipeline(pm, options);
      });
}
