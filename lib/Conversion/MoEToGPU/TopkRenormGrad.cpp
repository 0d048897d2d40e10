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

#include "HostCode.h"
#include "RegisterTopk.h"
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
  auto outType = cast<RankedTensorType>(op.getDscores().getType());
  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  Value scores = h.buffer(adaptor.getScores());
  Value out = allocResultLike(h, outType, scores);
  SmallVector<Value> args = {
      viewAs2D(b, scores), viewAs2D(b, h.buffer(adaptor.getIndices())),
      viewAs2D(b, h.buffer(adaptor.getDw())), viewAs2D(b, out)};
  kernels::TopkSpec spec = kernels::topkSpecOf(op);

  GPUKernel kernel(h, "topk_renorm_grad", args, {}, {kKernelThreads, 1, 1},
                   op.getLoc());
  {
    GpuKernelBuilder &kk = kernel.kb;
    Value s2 = kernel.arg(0), i2 = kernel.arg(1), g2 = kernel.arg(2),
          o2 = kernel.arg(3);
    kernel.forItem(kk.dim(s2, 0), [&](Value row) {
      // k before K: the order the plain (gcc) build has always emitted (as
      // two arguments of the call, the C++ compiler's order).
      Value k = kk.dim(i2, 1);
      Value numExperts = kk.dim(s2, 1);
      kernels::emitTopkGradRow(kk, spec, row, s2, i2, g2, o2, numExperts, k);
    });
  }
  kernel.launchOver(h.kb.dim(args[0], 0));
  h.finish();
  h.replace(op, {out});
  return success();
}
