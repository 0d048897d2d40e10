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
// LowerToLLVMOptions, the options of moe-lower-to-llvm (Pipelines.td).
#define GEN_PIPELINE_OPTIONS_MOELOWERTOLLVM
#include "MoE/Pipelines/Pipelines.h.inc"

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
