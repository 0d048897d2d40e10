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

#include "mlir/Pass/Pass.h"

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

} // namespace moe
} // namespace mlir

#endif // MOE_CONVERSION_MOETOGPU_MOETOGPU_H
