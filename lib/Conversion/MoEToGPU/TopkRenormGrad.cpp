//===- TopkRenormGrad.cpp - moe.topk_renorm_grad on the GPU ---------------===//
//
// Part of the MoE-MLIR project.
//
// One thread per row runs the row algorithm shared with the CPU kernel
// (kernels::emitTopkGradRow, MoE/Kernels/TopK.h): the weights recomputed from
// the scores, Σ dw·w, then the row of gradients. The row is short (K experts)
// and read from L1 after its first pass; rows past the last one store
// nothing.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "RowKernels.h"

#include "MoE/Kernels/TopK.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

template <>
LogicalResult GPULowering<TopkRenormGradOp>::lower(
    TopkRenormGradOp op, OpAdaptor adaptor,
    ConversionPatternRewriter &rewriter) const {
  kernels::TopkSpec spec = kernels::topkSpecOf(op);
  lowerPickGradKernel(rewriter, op, adaptor.getOperands(), "topk_renorm_grad",
                      [&](PickGradKernel &k) {
                        GpuKernelBuilder &kk = k.g;
                        k.kernel.forItem(kk.dim(k.x, 0), [&](Value row) {
                          // k (sel) before K: the order the plain (gcc) build
                          // has always emitted (as two arguments of the call,
                          // the C++ compiler's order).
                          Value sel = kk.dim(k.indices, 1);
                          Value numExperts = kk.dim(k.x, 1);
                          kernels::emitTopkGradRow(kk, spec, row, k.x,
                                                   k.indices, k.dw, k.out,
                                                   numExperts, sel);
                        });
                      });
  return success();
}
