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

#include "KernelUtils.h"
#include "Lowerings.h"

#include "MoE/Kernels/TopK.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

namespace {
constexpr int64_t kThreads = 128;
} // namespace

LogicalResult
TopkRenormGradToGPU::lower(TopkRenormGradOp op, OpAdaptor adaptor,
                           ConversionPatternRewriter &rewriter) const {
  auto outType = cast<RankedTensorType>(op.getDscores().getType());
  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  KB &k = h.k;
  Value scores = h.buffer(adaptor.getScores());
  Value out = h.allocLike(outType, dynamicSizesFrom(k, outType, scores));
  SmallVector<Value> args = {viewAs2D(b, scores),
                             viewAs2D(b, h.buffer(adaptor.getIndices())),
                             viewAs2D(b, h.buffer(adaptor.getDw())),
                             viewAs2D(b, out)};
  kernels::TopkSpec spec;
  spec.k = cast<RankedTensorType>(op.getIndices().getType()).getShape().back();
  spec.logits = op.getMode() == TopkMode::logits;
  spec.renormalize = op.getRenormalize();

  ImplicitLocOpBuilder kb(op.getLoc(), op.getContext());
  auto kernel = createKernel(h, "topk_renorm_grad", ValueRange(args).getTypes(),
                             {}, {kThreads, 1, 1}, kb);
  {
    KB kk(kb);
    Block &entry = kernel.getBody().front();
    Value s2 = entry.getArgument(0), i2 = entry.getArgument(1),
          g2 = entry.getArgument(2), o2 = entry.getArgument(3);
    Value row = kk.add(kk.mul(kk.blockId(), kk.idx(kThreads)), kk.threadId());
    kk.ifThen(kk.lt(row, kk.dim(s2, 0)), [&] {
      kernels::emitTopkGradRow(kk, spec, row, s2, i2, g2, o2, kk.dim(s2, 1),
                               kk.dim(i2, 1));
    });
  }
  Value rows = k.dim(args[0], 0);
  h.launch(kernel, {k.ceilDiv(rows, k.idx(kThreads)), k.idx(1), k.idx(1)},
           {kThreads, 1, 1}, args);
  h.finish();
  h.replace(op, {out});
  return success();
}
