//===- Pipelines.h - End-to-end lowering pipelines --------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_PIPELINES_PIPELINES_H
#define MOE_PIPELINES_PIPELINES_H

#include "mlir/Pass/PassOptions.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mlir {
class OpPassManager;

namespace moe {
/// Options of moe-lower-to-llvm.
struct LowerToLLVMOptions : public PassPipelineOptions<LowerToLLVMOptions> {
  PassOptions::Option<bool> cpuKernels{
      *this, "cpu-kernels",
      llvm::cl::desc("lower the moe ops with the fast CPU kernels "
                     "(convert-moe-to-cpu) before the portable lowering "
                     "(convert-moe-to-linalg), which then only sees what "
                     "has no kernel"),
      llvm::cl::init(true)};
  PassOptions::Option<int64_t> numThreads{
      *this, "num-threads",
      llvm::cl::desc("workers of the kernels' token loops. 1 (default): "
                     "sequential code, no runtime library. N > 1: "
                     "async-parallel-for onto the MLIR async runtime, which "
                     "needs libmlir_async_runtime.so at run time "
                     "(mlir-runner -shared-libs=...; the execution API "
                     "loads it). 0: defaultNumThreads()"),
      llvm::cl::init(1)};
  PassOptions::Option<std::string> targetCpu{
      *this, "target-cpu",
      llvm::cl::desc("the x86-64 CPU the code is for: an LLVM CPU name "
                     "(x86-64-v3 = AVX2, x86-64-v4 = AVX-512, znver3, "
                     "skylake-avx512, ...) or native (default: the host). "
                     "Sets the kernels' vector width (256 bits without "
                     "avx512f, 512 with it) and, unless native, every "
                     "function's target-cpu/target-features, which the JIT "
                     "and clang then compile for"),
      llvm::cl::init("native")};
  PassOptions::Option<int64_t> vectorBits{
      *this, "vector-bits",
      llvm::cl::desc("the kernels' vector width in bits (convert-moe-to-cpu "
                     "vector-bits); 0 (default): from target-cpu"),
      llvm::cl::init(0)};
  PassOptions::Option<bool> dense{
      *this, "dense",
      llvm::cl::desc("compile the dense linalg ops (matmuls, contractions, "
                     "reductions, elementwise chains) with the tiled, fused, "
                     "vectorized and multi-threaded strategy "
                     "(moe-dense-tile-and-vectorize); false: plain "
                     "convert-linalg-to-loops"),
      llvm::cl::init(true)};
  PassOptions::Option<bool> blas{
      *this, "blas",
      llvm::cl::desc("call cblas_sgemm (OpenBLAS) for f32 GEMM-shaped "
                     "contractions (matmul, batch_matmul, einsum generics) of "
                     "at least blas-min-flops multiply-adds per batch element "
                     "(moe-linalg-to-blas); needs libopenblas.so "
                     "at run time (the execution API loads it)"),
      llvm::cl::init(false)};
  PassOptions::Option<int64_t> blasMinFlops{
      *this, "blas-min-flops",
      llvm::cl::desc("smallest M*N*K (per batch element) sent to BLAS"),
      llvm::cl::init(1 << 20)};
  PassOptions::Option<int64_t> tileM{
      *this, "tile-m",
      llvm::cl::desc("register tile of the dense strategy: output rows of a "
                     "contraction per vector.contract"),
      llvm::cl::init(8)};
  PassOptions::Option<int64_t> tileN{
      *this, "tile-n",
      llvm::cl::desc("register tile of the dense strategy: output columns of "
                     "a contraction per vector.contract"),
      llvm::cl::init(32)};
  PassOptions::Option<bool> resultsToOutParams{
      *this, "results-to-out-params",
      llvm::cl::desc("public functions take their memref results as "
                     "out-params appended to the arguments (the caller "
                     "allocates them), upstream buffer-results-to-out-params; "
                     "a result the function allocates itself is computed in "
                     "the caller's buffer (static and dynamic shapes), any "
                     "other (an argument, a constant) is copied into it. "
                     "false: results are returned (the execution API)"),
      llvm::cl::init(false)};
};

/// Tensor-level `func.func`s holding moe ops -> the LLVM dialect, for the CPU:
/// convert-moe-to-cpu (unless cpu-kernels=false), convert-moe-to-linalg,
/// the dense strategy on the remaining linalg ops (tile + fuse + vectorize on
/// tensors, unless dense=false), one-shot bufferization (function boundaries
/// included; results as out-params with results-to-out-params=true), BLAS calls for large matmuls (blas=true), loops (parallel ones
/// onto the async runtime when num-threads > 1), vector and the upstream
/// conversions to LLVM. See docs/Pipelines.md. Every public function gets a `_mlir_ciface_`
/// wrapper for the ExecutionEngine.
void buildLowerToLLVMPipeline(OpPassManager &pm,
                              const LowerToLLVMOptions &options);
/// The same with the default options (sequential kernels).
void buildLowerToLLVMPipeline(OpPassManager &pm);

/// An x86-64 code-generation target resolved from a CPU name.
struct CpuTarget {
  /// The LLVM CPU name (the host's for native).
  std::string cpu;
  /// Its features as LLVM spells them, "+avx2" style.
  std::vector<std::string> features;
  /// 512 with avx512f, else 256 with avx2, else 128.
  int64_t vectorBits = 512;
  /// The host itself: functions are not annotated.
  bool native = true;
};

/// Resolves `name` ("native" or empty: the host; else an x86-64 CPU name
/// LLVM knows, e.g. x86-64-v3); false with a message in `error` for an
/// unknown name.
bool resolveCpuTarget(llvm::StringRef name, CpuTarget &target,
                      std::string &error);

/// The features of `target` the host lacks ("avx512f", ...): running code
/// compiled for it here would stop on an illegal instruction.
std::vector<std::string> missingHostFeatures(const CpuTarget &target);

/// The thread count the execution API compiles for: $MOE_NUM_THREADS, else
/// $OMP_NUM_THREADS, else the hardware concurrency (cores in the affinity
/// mask); at least 1. Read when a module is compiled.
int64_t defaultNumThreads();

/// Registers `moe-lower-to-llvm` (and convert-moe-to-cpu) with the pass
/// registry (moe-opt --help).
void registerMoEPipelines();
} // namespace moe
} // namespace mlir

#endif // MOE_PIPELINES_PIPELINES_H
