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

#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu;
using namespace mlir::moe::kernels;

namespace {
constexpr int64_t kRowsPerItem = 32;

struct TopkRenormGradKernel : KernelPattern<TopkRenormGradOp> {
  using KernelPattern::KernelPattern;

  LogicalResult matchAndRewrite(TopkRenormGradOp op,
                                PatternRewriter &rw) const override {
    auto scoresType = cast<RankedTensorType>(op.getScores().getType());
    if (scoresType.getRank() < 2)
      return rw.notifyMatchFailure(op, "rank-1 scores: portable lowering");
    for (Value v : op->getOperands())
      if (llvm::is_contained(cast<RankedTensorType>(v.getType()).getShape(),
                             0))
        return rw.notifyMatchFailure(op, "a static zero-sized dimension");
    ImplicitLocOpBuilder b(op.getLoc(), rw);
    CK k(b);
    Value scores = k.buffer(op.getScores());
    int64_t rank = scoresType.getRank();
    SmallVector<Value> sizes;
    for (int64_t d = 0; d < rank; ++d)
      sizes.push_back(k.dim(scores, d));
    auto outType = MemRefType::get(scoresType.getShape(), k.f32());
    Value out = k.alloc(outType, CK::dynamicSizes(outType.getShape(), sizes));
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
    Value t = k.tensor(out);
    if (t.getType() != op.getDscores().getType())
      t = tensor::CastOp::create(b, op.getDscores().getType(), t);
    rw.replaceOp(op, t);
    return success();
  }
};
} // namespace

void mlir::moe::cpu::populateTopkRenormGradKernel(RewritePatternSet &p,
                                                  const KernelOptions &o) {
  p.add<TopkRenormGradKernel>(p.getContext(), o);
}
