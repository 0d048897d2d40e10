//===- MoEToGPU.h - Lower moe ops to fused GPU kernels ----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// convert-moe-to-gpu rewrites every tensor-level moe op into host code that
// takes the operands' (device) buffers, allocates the results with gpu.alloc
// and launches hand-designed kernels (gpu.func in gpu.module @moe_kernels):
// warp top-k with butterfly shuffles, flash-style streaming mixers with an
// online softmax and the top-k in their epilogue, deterministic segmented
// reductions. moe-lower-to-nvvm (MoE/Pipelines/GPUPipeline.h) takes the
// result to the LLVM dialect with an embedded gpu.binary (PTX, cubin or
// fatbin) for the mgpu* runtime ABI (lib/Runtime/CUDA).
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

} // namespace moe
} // namespace mlir

#endif // MOE_CONVERSION_MOETOGPU_MOETOGPU_H
