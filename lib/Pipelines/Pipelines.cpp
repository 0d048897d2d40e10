//===- Pipelines.cpp - End-to-end lowering pipelines ----------------------===//
//
// Part of the MoE-MLIR project.
//
// Only upstream passes after our own conversions: bufferization, loops,
// async (the parallel token loops), vector and the LLVM conversions are reused
// as they are.
//
// Parallelism: the fast kernels (convert-moe-to-cpu) emit one scf.parallel
// over `num-threads` workers per op. With num-threads > 1, async-parallel-for
// (one task per worker: num-workers = N, min-task-size = 1) runs N-1 workers
// on the async runtime's thread pool and one on the calling thread, then
// waits for all. We chose the async runtime over OpenMP because Debian's
// LLVM 22 ships libmlir_async_runtime.so but no libomp (the omp dialect
// lowers to __kmpc_* calls; that would need the package libomp5-22), and the
// ExecutionEngine loads the async runtime like any shared library. The pool
// has one thread per core, so N above the core count adds no parallelism.
//
// Dense ops (dense=true): what the kernels leave as linalg on tensors is
// tiled into scf.forall thread tiles, fused, tiled to register tiles and
// vectorized (moe-dense-tile-and-vectorize); after bufferization the forall
// becomes an scf.parallel that async-parallel-for puts on the same runtime as
// the kernels, and the vector ops are lowered to FMAs (moe-dense-lower-
// vectors). With blas=true, large f32 matmuls skip that and call cblas_sgemm
// (moe-linalg-to-blas). docs/Pipelines.md has the measurements behind it.
//
//===----------------------------------------------------------------------===//

#include "MoE/Pipelines/Pipelines.h"
#include "MoE/Conversion/MoEToCPU/MoEToCPU.h"
#include "MoE/Conversion/Passes.h"
#include "MoE/Pipelines/Bufferize.h"
#include "MoE/Pipelines/Passes.h"
#include "MoE/Transforms/Passes.h"

// The conversions one by one: mlir/Conversion/Passes.h declares every
// upstream conversion (36 s of a compile's 43 s on a 2-core EPYC).
#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/AsyncToLLVM/AsyncToLLVM.h"
#include "mlir/Conversion/BufferizationToMemRef/BufferizationToMemRef.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVMPass.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MathToLibm/MathToLibm.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVMPass.h"
#include "mlir/Conversion/VectorToSCF/VectorToSCF.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/Async/Passes.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/SCF/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Threading.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/TargetParser/X86TargetParser.h"

#include <cstdlib>

using namespace mlir;

namespace {
/// Requests C wrappers (`_mlir_ciface_*`) for the functions this module
/// defines, so that callers outside pass plain memref descriptors. Unlike
/// upstream `llvm-request-c-wrappers`, external declarations are left alone:
/// a call to `moeReportIndexError` or `printI64` must reach the C symbol of
/// that name, not a `_mlir_ciface_` wrapper no library defines.
struct RequestCWrappersForDefinitions
    : PassWrapper<RequestCWrappersForDefinitions,
                  OperationPass<func::FuncOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(RequestCWrappersForDefinitions)
  StringRef getArgument() const override {
    return "moe-request-c-wrappers-for-definitions";
  }
  void runOnOperation() override {
    func::FuncOp fn = getOperation();
    // Private definitions (the async runtime's outlined bodies) are only
    // called from inside the module.
    if (!fn.isExternal() && fn.isPublic())
      fn->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                  UnitAttr::get(&getContext()));
  }
};

/// The code-generation target of every function: target_cpu and
/// target_features on each llvm.func definition (translated to the LLVM
/// function attributes "target-cpu"/"target-features", which override the
/// JIT's host target machine and clang's -march per function). With
/// `checkOnly` it only reports an unknown CPU name (at the start of the
/// pipeline, before any work).
struct SetCpuTarget
    : PassWrapper<SetCpuTarget, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(SetCpuTarget)
  SetCpuTarget(std::string name, bool checkOnly)
      : name(std::move(name)), checkOnly(checkOnly) {}
  StringRef getArgument() const override { return "moe-set-cpu-target"; }
  void runOnOperation() override {
    moe::CpuTarget target;
    std::string error;
    if (!moe::resolveCpuTarget(name, target, error)) {
      // On the location only: the op's note would print the whole module.
      emitError(getOperation().getLoc()) << "moe-lower-to-llvm: " << error;
      return signalPassFailure();
    }
    if (checkOnly || target.native)
      return;
    MLIRContext *ctx = &getContext();
    auto cpu = StringAttr::get(ctx, target.cpu);
    SmallVector<StringRef> features(target.features.begin(),
                                    target.features.end());
    auto featureAttr = LLVM::TargetFeaturesAttr::get(ctx, features);
    getOperation().walk([&](LLVM::LLVMFuncOp fn) {
      if (fn.isExternal())
        return;
      fn.setTargetCpuAttr(cpu);
      fn.setTargetFeaturesAttr(featureAttr);
    });
  }
  std::string name;
  bool checkOnly;
};
} // namespace

static bool isNativeName(StringRef name) {
  return name.empty() || name == "native" || name == "host";
}

/// `cpu` with the enabled features of `features` ("+name", sorted) and the
/// vector width they allow.
static void setFeatures(moe::CpuTarget &target, StringRef cpu,
                        const llvm::StringMap<bool> &features) {
  target.cpu = cpu.str();
  for (const auto &f : features)
    if (f.getValue())
      target.features.push_back("+" + f.getKey().str());
  llvm::sort(target.features);
  target.vectorBits = features.lookup("avx512f") ? 512
                      : features.lookup("avx2")  ? 256
                                                 : 128;
}

bool mlir::moe::resolveCpuTarget(StringRef name, CpuTarget &target,
                                 std::string &error) {
  target = CpuTarget();
  if (isNativeName(name)) {
    setFeatures(target, llvm::sys::getHostCPUName(),
                llvm::sys::getHostCPUFeatures());
    return true;
  }
  if (llvm::X86::parseArchX86(name, /*Only64Bit=*/true) ==
      llvm::X86::CK_None) {
    error = ("unknown target-cpu '" + name +
             "': expected native or an x86-64 CPU name of LLVM (x86-64-v3 "
             "for AVX2, x86-64-v4 for AVX-512, znver3, skylake-avx512, ...)")
                .str();
    return false;
  }
  // The CPU's features and every feature they imply (avx512bw -> avx512f).
  SmallVector<StringRef> features;
  llvm::X86::getFeaturesForCPU(name, features, /*NeedPlus=*/false);
  llvm::StringMap<bool> all;
  for (StringRef f : features) {
    all[f] = true;
    llvm::X86::updateImpliedFeatures(f, /*Enabled=*/true, all);
  }
  setFeatures(target, name, all);
  target.native = false;
  return true;
}

std::vector<std::string> mlir::moe::missingHostFeatures(const CpuTarget &target) {
  std::vector<std::string> missing;
  if (target.native)
    return missing;
  llvm::StringMap<bool> host = llvm::sys::getHostCPUFeatures();
  for (const std::string &f : target.features) {
    StringRef name = StringRef(f).drop_front();
    auto it = host.find(name);
    if (it != host.end() && !it->getValue())
      missing.push_back(name.str());
  }
  return missing;
}

int64_t mlir::moe::defaultNumThreads() {
  for (const char *var : {"MOE_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const char *value = std::getenv(var)) {
      char *end = nullptr;
      long n = std::strtol(value, &end, 10);
      if (end != value && n >= 1)
        return n;
    }
  }
  return std::max<int64_t>(1, llvm::hardware_concurrency().compute_thread_count());
}

void mlir::moe::buildLowerToLLVMPipeline(OpPassManager &pm) {
  buildLowerToLLVMPipeline(pm, LowerToLLVMOptions());
}

void mlir::moe::buildLowerToLLVMPipeline(OpPassManager &pm,
                                         const LowerToLLVMOptions &options) {
  int64_t numThreads = options.numThreads;
  if (numThreads <= 0)
    numThreads = defaultNumThreads();
  // The target: its vector width for the kernels, its name on every function
  // at the end. An unknown name fails here, before any work.
  CpuTarget target;
  std::string targetError;
  bool targetOk = resolveCpuTarget(options.targetCpu, target, targetError);
  if (!targetOk)
    pm.addPass(std::make_unique<SetCpuTarget>(options.targetCpu,
                                              /*checkOnly=*/true));
  int64_t vectorBits = options.vectorBits > 0 ? int64_t(options.vectorBits)
                                              : target.vectorBits;
  // Size limits and zero-sized ops first, so every later pass sees only shapes the kernels support.
  pm.addPass(moe::createMoELegalizeShapes());
  if (options.cpuKernels)
    pm.addPass(moe::createConvertMoEToCPUPass(numThreads, vectorBits));
  pm.addPass(moe::createConvertMoEToLinalg());
  pm.addPass(createCanonicalizerPass());
  if (options.dense) {
    moe::DenseTileAndVectorizeOptions dense;
    dense.numThreads = numThreads;
    dense.tileM = options.tileM;
    dense.tileN = options.tileN;
    dense.blas = options.blas;
    dense.blasMinFlops = options.blasMinFlops;
    pm.addNestedPass<func::FuncOp>(moe::createDenseTileAndVectorize(dense));
    // No CSE here: a CSE pass at this point changed the results of the
    // attention_posterior kernel (test/Integration/CPU); not analysed further.
    pm.addPass(createCanonicalizerPass());
  }

  // Tensors -> buffers, across function boundaries so that the public
  // functions take plain strided memrefs the ExecutionEngine can pass.
  moe::addOneShotBufferizeAcrossFunctions(pm);
  if (options.resultsToOutParams) {
    // Destination-passing calls (the torch ops' kernels): the caller's buffers
    // replace the allocations the kernels return, so results are written in
    // place with no copy. Before the deallocation pipeline, which would
    // otherwise own (and clone) the returned buffers. Canonicalization first
    // folds the casts between a kernel's buffer and the returned type
    // (tensor.cast of a refined result), so that the allocation is returned.
    pm.addPass(createCanonicalizerPass());
    bufferization::BufferResultsToOutParamsPassOptions outParams;
    outParams.hoistStaticAllocs = true;
    outParams.hoistDynamicAllocs = true;
    outParams.modifyPublicFunctions = true;
    pm.addPass(bufferization::createBufferResultsToOutParamsPass(outParams));
  }
  bufferization::BufferDeallocationPipelineOptions dealloc;
  bufferization::buildBufferDeallocationPipeline(pm, dealloc);
  // A function that returns an argument or a folded constant keeps a
  // bufferization.clone for the caller to own; lower it to memref copies.
  pm.addPass(createConvertBufferizationToMemRefPass());

  if (options.dense) {
    pm.addNestedPass<func::FuncOp>(createForallToParallelLoopPass());
    pm.addNestedPass<func::FuncOp>(moe::createDenseLowerVectors());
  }
  if (options.blas) {
    moe::LinalgToBlasOptions blas;
    blas.minFlops = options.blasMinFlops;
    pm.addPass(moe::createLinalgToBlas(blas));
  }
  pm.addNestedPass<func::FuncOp>(createConvertLinalgToLoopsPass());
  pm.addPass(createCanonicalizerPass());
  if (numThreads > 1) {
    // One async task per worker of the kernels' scf.parallel loops.
    AsyncParallelForPassOptions parallel;
    parallel.asyncDispatch = true;
    parallel.numWorkerThreads = static_cast<int32_t>(numThreads);
    parallel.minTaskSize = 1;
    pm.addPass(createAsyncParallelForPass(parallel));
    pm.addPass(createAsyncToAsyncRuntimePass());
    pm.addPass(createAsyncRuntimeRefCountingPass());
    pm.addPass(createAsyncRuntimeRefCountingOptPass());
    pm.addPass(createCanonicalizerPass());
  }
  pm.addPass(memref::createExpandStridedMetadataPass());
  if (options.dense) {
    // n-D transfers of the register tiles -> unrolled 1-D ones.
    VectorTransferToSCFOptions toSCF;
    toSCF.enableFullUnroll();
    pm.addNestedPass<func::FuncOp>(createConvertVectorToSCFPass(toSCF));
  }
  pm.addPass(createLowerAffinePass());
  pm.addPass(arith::createArithExpandOpsPass());
  if (numThreads > 1)
    pm.addPass(createConvertAsyncToLLVMPass());
  pm.addPass(createSCFToControlFlowPass());

  pm.addNestedPass<func::FuncOp>(
      std::make_unique<RequestCWrappersForDefinitions>());
  // Vector exp/log/tanh/erf become polynomials here; LLVM would scalarize
  // them into libm calls.
  pm.addNestedPass<func::FuncOp>(moe::createApproximateVectorMath());
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createConvertMathToLibmPass());
  // Reassociated reductions: a fixed tree chosen at compile time, so results
  // stay deterministic.
  ConvertVectorToLLVMPassOptions vectorToLLVM;
  vectorToLLVM.reassociateFPReductions = true;
  pm.addPass(createConvertVectorToLLVMPass(vectorToLLVM));
  pm.addPass(createUBToLLVMConversionPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
  if (targetOk && !target.native)
    pm.addPass(std::make_unique<SetCpuTarget>(options.targetCpu,
                                              /*checkOnly=*/false));
}

void mlir::moe::registerMoEPipelines() {
  registerMoEDensePasses();
  PassPipelineRegistration<LowerToLLVMOptions>(
      LowerToLLVMOptions::getArgument(), LowerToLLVMOptions::getSummary(),
      [](OpPassManager &pm, const LowerToLLVMOptions &options) {
        buildLowerToLLVMPipeline(pm, options);
      });
}
