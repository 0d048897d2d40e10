//===- GPUPipeline.cpp - The moe-lower-to-nvvm pipeline -------------------===//
//
// Part of the MoE-MLIR project.
//
// The fusion of mixing ops with their top-k gate (the fused kernels select the
// experts in their epilogue), our conversion and one-shot bufferization into
// device memory (moe-gpu-bufferize), the host code of each function on one
// stream (optionally results as out-params
// and no wait at the end: the torch ops' CUDA kernels), then
// the passes of upstream
// gpu-lower-to-nvvm-pipeline (mlir/lib/Dialect/GPU/Pipelines) with two
// additions: C-interface wrappers for the host functions (the AOT library and
// ctypes call `_mlir_ciface_*`) and the CUDA toolkit path for ptxas.
//
//===----------------------------------------------------------------------===//

#include "MoE/Pipelines/GPUPipeline.h"

#include "MoE/Conversion/Passes.h"
#include "MoE/Transforms/Passes.h"

// The conversions one by one: mlir/Conversion/Passes.h declares every
// upstream conversion (most of a compile's time).
#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/GPUCommon/GPUCommonPass.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/NVGPUToNVVM/NVGPUToNVVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Conversion/VectorToSCF/VectorToSCF.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/Transforms/RequestCWrappers.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

/// The compute capability of a chip name (sm_90a: 90), 0 if it names none.
static unsigned chipVersion(StringRef chip) {
  unsigned sm = 0;
  if (chip.consume_front("sm_"))
    chip.take_while([](char c) { return c >= '0' && c <= '9'; })
        .getAsInteger(10, sm);
  return sm;
}

/// topk-rounds=auto: list-redux where the chip has redux.sync (sm_80 and
/// later; on an H200, 2026-11-26, at 65536 tokens and k = 8 list took 23.7 us
/// against redux's 37.4 at K = 128, 41.7 against 61.9 at K = 256; at 64 tokens
/// redux 2.01 against list's 3.47), else butterfly.
static std::string
resolveTopkRounds(const moe::MoELowerToNVVMOptions &options) {
  if (options.topkRounds != "auto")
    return options.topkRounds;
  return chipVersion(options.chip) >= 80 ? "list-redux" : "butterfly";
}

/// The pipeline's canonicalizer: bottom-up (the greedy driver's worklist in
/// post-order), not upstream's default top-down. On the kernels
/// convert-moe-to-gpu emits (deep loop nests, unrolled fragments, thousands
/// of constants) top-down took up to 4x as long for the same PTX: the first
/// canonicalization of test/GPU/Inputs/ptxas-mma-cases.mlir 6.6 s against
/// 1.6 s; the whole pipeline on test/GPU/Inputs/sass-budget-cases.mlir 77.8 s
/// against 39.3 s, ptxas-mma-cases 26.3 against 21.7, gpu-cases 34.2 against
/// 31.5 (2-core EPYC). The kernels' PTX is byte-identical either way (every
/// lit input: scripts/emitted-code-dump.py); the host code may pick another
/// of two equal forms (a select on `ne` for one on `eq`, operands swapped).
static std::unique_ptr<Pass> createCanonicalizer() {
  GreedyRewriteConfig config;
  config.setUseTopDownTraversal(false);
  return createCanonicalizerPass(config);
}

/// dynamic-shared-memory-bytes=0: the chip's opt-in maximum of shared memory
/// a block (CUDA C Programming Guide, the compute capabilities' table), 0
/// for a chip not named there.
static int64_t
resolveDynamicSharedMemory(const moe::MoELowerToNVVMOptions &options) {
  if (options.dynamicSharedMemoryBytes != 0)
    return options.dynamicSharedMemoryBytes;
  const int64_t kib = 1024;
  switch (chipVersion(options.chip)) {
  case 70:
  case 72:
    return 96 * kib;
  case 75:
    return 64 * kib;
  case 80:
  case 87:
    return 163 * kib;
  case 86:
  case 89:
    return 99 * kib;
  case 90:
    return 227 * kib;
  default:
    return 0;
  }
}

/// convert-moe-to-gpu's options as the pipeline's, topk-rounds and the
/// dynamic shared memory limit resolved for the chip.
static moe::ConvertMoEToGPUOptions
convertOptionsOf(const moe::MoELowerToNVVMOptions &options) {
  moe::ConvertMoEToGPUOptions convert = options.convertMoEToGPUOptions();
  convert.topkRounds = resolveTopkRounds(options);
  convert.dynamicSharedMemoryBytes = resolveDynamicSharedMemory(options);
  return convert;
}

void mlir::moe::buildMoELowerToNVVMPipeline(
    OpPassManager &pm, const MoELowerToNVVMOptions &options) {
  // similarity_inform/attention_posterior + their probs-mode gate -> one fused
  // op, so that p [B, N, K] never goes to device memory.
  pm.addPass(createMoEFuseRouting());
  pm.addPass(createMoELegalizeShapes()); // size limits, zero-sized ops
  // moe ops -> moe.kernel ops holding host code + kernels, on tensors; then
  // device buffers across the function boundaries (identity layouts: plain
  // device memrefs for callers).
  const moe::ConvertMoEToGPUOptions convert = convertOptionsOf(options);
  pm.addPass(createConvertMoEToGPU(convert));
  pm.addPass(createCanonicalizer());
  pm.addPass(createMoEGPUBufferize());
  pm.addPass(createCanonicalizer());
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
  // PTX ISA 8.0, sm_90's.
  target.features =
      !options.features.empty() ? options.features.getValue() : "+ptx80";
  target.optLevel = options.optLevel;
  pm.addPass(createGpuNVVMAttachTarget(target));
  pm.addPass(createLowerAffinePass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createCanonicalizer());
  pm.addPass(createCSEPass());

  // Kernels -> NVVM.
  pm.addNestedPass<gpu::GPUModuleOp>(createStripDebugInfoPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createConvertGpuOpsToNVVMOps());
  pm.addNestedPass<gpu::GPUModuleOp>(LLVM::createNVVMOptimizeForTargetPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createCanonicalizer());
  pm.addNestedPass<gpu::GPUModuleOp>(createCSEPass());
  pm.addNestedPass<gpu::GPUModuleOp>(createReconcileUnrealizedCastsPass());

  // Host code -> LLVM with the mgpu* calls; kernels -> gpu.binary.
  pm.addPass(createGpuToLLVMConversionPass());
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = options.format;
  binary.toolkitPath = options.toolkit;
  pm.addPass(createGpuModuleToBinaryPass(binary));
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createCanonicalizer());
  pm.addPass(createCSEPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void mlir::moe::registerMoEGPUPipelines() {
  PassPipelineRegistration<MoELowerToNVVMOptions>(
      MoELowerToNVVMOptions::getArgument(), MoELowerToNVVMOptions::getSummary(),
      buildMoELowerToNVVMPipeline);
}
