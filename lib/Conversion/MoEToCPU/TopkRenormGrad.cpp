//===- TopkRenormGrad.cpp - moe.topk_renorm_grad -> CPU kernel ------------===//
//
// Part of the MoE-MLIR project.
//
// Rows are independent: blocks of 32 rows go to the workers. Per row (O(K)):
// the selected values are read through the forward's indices, the weights
// recomputed with the forward's formula (kernels::topkWeight), c = Σ dw·w, and
// the gradient written: zeros (or -s_j c for every entry of a logits gate
// without renormalization), then kernels::topkWeightGrad at the selected
// entries. An index outside [0, K) is read clamped and never written.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/TopK.h"

namespace mlir::moe::cpu {
using namespace kernels;

namespace {
constexpr int64_t kRowsPerItem = 32;

struct TopkRenormGradKernel
    : KernelPattern<TopkRenormGradOp, /*TargetLanes=*/false> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(TopkRenormGradOp op, CK &k,
                     PatternRewriter &rw) const override {
    if (cast<RankedTensorType>(op.getScores().getType()).getRank() < 2)
      return rw.notifyMatchFailure(op, "rank-1 scores: portable lowering");
    if (hasStaticZeroSize(op))
      return rw.notifyMatchFailure(op, "a static zero-sized dimension");
    KernelScope kernel(
        k, {op.getScores(), op.getIndices(), op.getDw()},
        KernelScope::outsOf(op, {k.sizes(op.getScores())}));
    Value scores = k.buffer(op.getScores());
    Value out = kernel.out(0);
    Value s2 = collapseRows(k, scores), o2 = collapseRows(k, out);
    Value i2 = collapseRows(k, k.buffer(op.getIndices()));
    Value g2 = collapseRows(k, k.buffer(op.getDw()));
    Value rows = k.dim(s2, 0), numExperts = k.dim(s2, 1), sel = k.dim(i2, 1);

    TopkSpec spec;
    spec.logits = op.getMode() == TopkMode::logits;
    spec.renormalize = op.getRenormalize();
    Value c1 = k.idx(1);
    Value items = k.ceilDiv(rows, k.idx(kRowsPerItem));
    k.workers(opts, items, [&](Value item, Value) {
      Value r0 = k.mul(item, k.idx(kRowsPerItem));
      Value r1 = k.mins(k.add(r0, k.idx(kRowsPerItem)), rows);
      k.forLoop(r0, r1, c1, [&](Value r) {
        emitTopkGradRow(k, spec, r, s2, i2, g2, o2, numExperts, sel);
      });
    });
    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateTopkRenormGradKernel, TopkRenormGradKernel)

} // namespace mlir::moe::cpu
