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

#include "llvm/ADT/SmallVector.h"

#include <functional>
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

/// The help text Passes.td gives convert-moe-to-gpu's option `arg`, followed
/// by `more` where it is not empty; fatal where the pass has no such option.
/// The text lives as long as the program.
StringRef getConvertMoEToGPUOptionHelp(StringRef arg, StringRef more = "");

/// Options of a pipeline that runs convert-moe-to-gpu and exposes options of
/// it: each is declared once, in Passes.td; the pipeline shows it under the
/// pass's name with the pass's help and default (the generated
/// ConvertMoEToGPUOptions's) and hands its value to the pass
/// (`convertMoEToGPUOptions`), so that exposing an option of the pass is one
/// member naming the option and its field.
template <typename Derived>
class ConvertMoEToGPUPipelineOptions : public PassPipelineOptions<Derived> {
public:
  /// The pass's options: Passes.td's defaults with the values of the
  /// pipeline's options of the pass put in.
  ConvertMoEToGPUOptions convertMoEToGPUOptions() const {
    ConvertMoEToGPUOptions options;
    for (const auto &forward : forwards)
      forward(options);
    return options;
  }

protected:
  /// The pass's option `arg`, the field `field` of ConvertMoEToGPUOptions.
  /// `init` and `moreHelp` are for a pipeline that takes a value the pass
  /// does not (and resolves it before handing it on).
  template <typename T>
  class ConvertOption : public ::mlir::detail::PassOptions::Option<T> {
  public:
    ConvertOption(ConvertMoEToGPUPipelineOptions &parent, StringRef arg,
                  T ConvertMoEToGPUOptions::*field)
        : ConvertOption(parent, arg, field, ConvertMoEToGPUOptions().*field,
                        "") {}
    ConvertOption(ConvertMoEToGPUPipelineOptions &parent, StringRef arg,
                  T ConvertMoEToGPUOptions::*field, T init, StringRef moreHelp)
        : ::mlir::detail::PassOptions::Option<T>(
              parent, arg,
              llvm::cl::desc(getConvertMoEToGPUOptionHelp(arg, moreHelp)),
              llvm::cl::init(init)) {
      parent.forwards.push_back([this, field](ConvertMoEToGPUOptions &options) {
        options.*field = this->getValue();
      });
    }
    using ::mlir::detail::PassOptions::Option<T>::operator=;
  };

private:
  SmallVector<std::function<void(ConvertMoEToGPUOptions &)>> forwards;
};

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

#endif // MOE_CONVERSION_MOETOGPU_MOETOGPU_H
