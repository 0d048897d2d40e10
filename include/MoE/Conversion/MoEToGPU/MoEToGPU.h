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
#include "mlir/Pass/PassOptions.h"

#include <string>

namespace mlir {
class OpPassManager;
class RewritePatternSet;

namespace moe {
#define GEN_PASS_DECL_CONVERTMOETOGPU
#define GEN_PASS_DECL_MOEGPUBUFFERIZE
#define GEN_PASS_DECL_MOEGPUHOSTSTREAM
#define GEN_PASS_DECL_MOEGPURESULTSTOOUTPARAMS
#include "MoE/Conversion/Passes.h.inc"

/// Adds the patterns of convert-moe-to-gpu, one per moe op: each rewrites its
/// op into a moe.kernel (ins: its operands, outs: alloc_tensors of its
/// results) holding the host code (launches on one stream) and kernels in
/// gpu.module @moe_kernels of the op's module, and fails to match, with an
/// error at the op, where the op's form has no kernel or a kernel would exceed
/// a CUDA limit (`options.sharedMemoryBytes` of shared memory per block,
/// threads per block, static grid sizes). Apply them with the dialect
/// conversion driver, which undoes a failed lowering.
void populateMoEToGPUPatterns(RewritePatternSet &patterns,
                              const ConvertMoEToGPUOptions &options);

/// The options of moe-lower-to-nvvm that are convert-moe-to-gpu's, forwarded
/// to it as they are (buildMoELowerToNVVMPipeline; topk-rounds=auto is first
/// resolved for the chip): X(type, field, name, default, help) each. A new
/// option of the conversion that the pipeline should expose is one more row.
#define MOE_NVVM_CONVERT_OPTIONS(X)                                            \
  X(int64_t, sharedMemoryBytes, "shared-memory-bytes", 48 * 1024,              \
    "shared memory per block the kernels may use (bytes)")                     \
  X(std::string, topkRounds, "topk-rounds", "auto",                            \
    "rounds of topk_renorm's register top-k: butterfly, redux (sm_80+), list " \
    "(sm_80+, candidate lists; not yet run on a GPU) or auto (redux where "    \
    "the chip has it; convert-moe-to-gpu)")                                    \
  X(bool, flashMma, "flash-mma", true,                                         \
    "similarity_inform with f16/bf16 operands on tensor cores (mma.sync, "     \
    "sm_80+; convert-moe-to-gpu flash-mma); checked on an H100 against "       \
    "float64 references (not under memcheck/racecheck); =false selects the "   \
    "previous f32-path kernel")                                                \
  X(bool, balanceKernels, "balance-kernels", true,                             \
    "GPU kernels of the load-balancing ops router_stats, router_stats_grad, "  \
    "load_balancing_loss, router_z_loss and router_z_loss_grad "               \
    "(convert-moe-to-gpu balance-kernels); checked on an H100 against "        \
    "float64 references, memcheck and racecheck; =false leaves these ops "     \
    "without a GPU lowering, as before")                                       \
  X(bool, flashMmaWideStaging, "flash-mma-wide-staging", false,               \
    "the tensor-core kernel's key and value tiles staged with 16-byte "       \
    "vectors (convert-moe-to-gpu flash-mma-wide-staging); not yet run on a "  \
    "GPU")                                                                     \
  X(bool, flashMmaAsyncStaging, "flash-mma-async-staging", false,             \
    "the tensor-core kernel's key and value tiles double-buffered with "      \
    "cp.async (convert-moe-to-gpu flash-mma-async-staging); not yet run on a " \
    "GPU")                                                                     \
  X(bool, flashMmaTopk, "flash-mma-topk", false,                               \
    "similarity_inform_topk with f16/bf16 operands on the tensor-core "        \
    "kernel, the top-k in its epilogue (convert-moe-to-gpu flash-mma-topk); "  \
    "not yet run on a GPU")                                                    \
  X(bool, flashMmaPosterior, "flash-mma-posterior", false,                     \
    "attention_posterior (and attention_posterior_topk with flash-mma-topk) "  \
    "with f16/bf16 u and e on the tensor-core kernel (convert-moe-to-gpu "     \
    "flash-mma-posterior); not yet run on a GPU")                              \
  X(bool, flashMmaBase2, "flash-mma-base2", false,                             \
    "the tensor-core kernel's online softmax in base 2 (FFMA + ex2.approx, "   \
    "row sums after the key loop, whole tiles peeled; convert-moe-to-gpu "     \
    "flash-mma-base2); not yet run on a GPU")                                \
  X(std::string, routeMap, "route-map", "warp",                                \
    "route's kernel: warp (one warp a token) or lanes (lanes a token sized "  \
    "by E, 16-byte loads, groups and candidate lists in registers; "          \
    "convert-moe-to-gpu route-map); not yet run on a GPU")

/// Options of the moe-lower-to-nvvm pipeline (its command-line options and
/// the C++ API's).
struct MoELowerToNVVMOptions
    : public PassPipelineOptions<MoELowerToNVVMOptions> {
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
  // convert-moe-to-gpu's, a row each in MOE_NVVM_CONVERT_OPTIONS.
#define MOE_DECLARE_NVVM_OPTION(TYPE, FIELD, NAME, DEFAULT, HELP)              \
  PassOptions::Option<TYPE> FIELD{*this, NAME, llvm::cl::desc(HELP),           \
                                  llvm::cl::init(DEFAULT)};
  MOE_NVVM_CONVERT_OPTIONS(MOE_DECLARE_NVVM_OPTION)
#undef MOE_DECLARE_NVVM_OPTION
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
/// opt-level, results-to-out-params, wait-at-return and
/// MOE_NVVM_CONVERT_OPTIONS) with the pass registry.
void registerMoEGPUPipelines();
} // namespace moe
} // namespace mlir

#endif // MOE_CONVERSION_MOETOGPU_MOETOGPU_H
