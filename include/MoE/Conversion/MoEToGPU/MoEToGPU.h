//===- MoEToGPU.h - Lower moe ops to fused GPU kernels ----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// convert-moe-to-gpu rewrites every tensor-level moe op into host code that
// takes the operands' (device) buffers, allocates the results with gpu.alloc
// and launches hand-designed kernels (gpu.func in gpu.module @moe_kernels):
// warp top-k with butterfly shuffles, flash-style streaming mixers with an
// online softmax and the top-k in their epilogue, deterministic segmented
// reductions. moe-lower-to-nvvm takes the result to the LLVM dialect with an
// embedded gpu.binary (PTX, cubin or fatbin) for the mgpu* runtime ABI
// (lib/Runtime/CUDA).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_MOETOGPU_MOETOGPU_H
#define MOE_CONVERSION_MOETOGPU_MOETOGPU_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

#include <string>

namespace mlir {
class OpPassManager;
class RewritePatternSet;

namespace moe {
#define GEN_PASS_DECL_CONVERTMOETOGPU
#define GEN_PASS_DECL_MOEGPUHOSTSTREAM
#define GEN_PASS_DECL_MOEGPURESULTSTOOUTPARAMS
#include "MoE/Conversion/Passes.h.inc"

/// Adds the patterns of convert-moe-to-gpu, one per moe op: each rewrites its
/// op into host code (operand buffers, gpu.alloc of the results, launches on
/// one stream) and kernels in gpu.module @moe_kernels of the op's module, and
/// fails to match, with an error at the op, where the op's form has no kernel
/// or a kernel would exceed a CUDA limit (`options.sharedMemoryBytes` of
/// shared memory per block, threads per block, static grid sizes). Apply them
/// with the dialect conversion driver, which undoes a failed lowering.
void populateMoEToGPUPatterns(RewritePatternSet &patterns,
                              const ConvertMoEToGPUOptions &options);

/// Options of the moe-lower-to-nvvm pipeline.
struct MoELowerToNVVMOptions {
  /// Target chip (sm_80, sm_90, sm_90a, ...).
  std::string chip = "sm_90";
  /// PTX features; empty picks +ptx80 (the PTX ISA that sm_90 needs; enough
  /// for every chip the kernels use).
  std::string features = "";
  /// gpu.binary format: isa (PTX, JIT'd by the driver), bin (cubin) or fatbin.
  std::string format = "fatbin";
  /// CUDA toolkit holding ptxas and fatbinary (bin and fatbin formats).
  std::string toolkit = "/usr/local/cuda";
  /// LLVM optimization level of the device code.
  unsigned optLevel = 3;
  /// Memref results of the public functions as out-params the caller
  /// allocates (moe-gpu-results-to-out-params).
  bool resultsToOutParams = false;
  /// Wait for the stream before returning (moe-gpu-host-stream
  /// wait-at-return); false: return with the work in flight on the ambient
  /// stream, index errors left for moeGpuPollErrors.
  bool waitAtReturn = true;
  /// Shared memory per block the kernels may use (convert-moe-to-gpu's
  /// shared-memory-bytes): 48 KiB, what every device gives without an opt-in.
  int64_t sharedMemoryBytes = 48 * 1024;
  /// Rounds of topk_renorm's register top-k (convert-moe-to-gpu's
  /// topk-rounds): butterfly, redux, or auto (redux on sm_80 and later).
  std::string topkRounds = "auto";
};

/// convert-moe-to-gpu, canonicalization, one-shot bufferization of the
/// function boundaries (device memrefs in, device memrefs out; results as
/// out-params with resultsToOutParams), one stream per function
/// (moe-gpu-host-stream), then the
/// upstream NVVM lowering of the kernels, gpu-to-llvm for the host code and
/// gpu-module-to-binary. Public functions get `_mlir_ciface_` wrappers.
void buildMoELowerToNVVMPipeline(OpPassManager &pm,
                                 const MoELowerToNVVMOptions &options);

/// Registers `moe-lower-to-nvvm` (options chip, features, format, toolkit,
/// opt-level, results-to-out-params, wait-at-return, shared-memory-bytes) with
/// the pass registry.
void registerMoEGPUPipelines();
} // namespace moe
} // namespace mlir

#endif // MOE_CONVERSION_MOETOGPU_MOETOGPU_H
