//===- SplitFusedRouting.cpp - Split fused routing ops --------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOESPLITFUSEDROUTING
#include "MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
/// The probs-mode top-k that a fused op folds into its epilogue.
TopkRenormOp createGate(PatternRewriter &rewriter, Location loc, Value p,
                        IntegerAttr k, BoolAttr renormalize) {
  return TopkRenormOp::create(
      rewriter, loc, p, k,
      TopkModeAttr::get(rewriter.getContext(), TopkMode::probs), renormalize);
}

struct SplitSimilarityTopk : OpRewritePattern<SimilarityInformTopkOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(SimilarityInformTopkOp op,
                                PatternRewriter &rewriter) const override {
    auto mix = SimilarityInformOp::create(
        rewriter, op.getLoc(), op.getU(), op.getE(), op.getWs(),
        op.getKeyMask(), op.getTauAttr(), op.getCausalAttr());
    auto gate = createGate(rewriter, op.getLoc(), mix.getP(), op.getKAttr(),
                           op.getRenormalizeAttr());
    rewriter.replaceOp(op, gate.getResults());
    return success();
  }
};

struct SplitPosteriorTopk : OpRewritePattern<AttentionPosteriorTopkOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AttentionPosteriorTopkOp op,
                                PatternRewriter &rewriter) const override {
    auto mix = AttentionPosteriorOp::create(
        rewriter, op.getLoc(), op.getScores(), op.getU(), op.getV(),
        op.getWo(), op.getE(), op.getSigmaAttr(), op.getHeadSelectAttr(),
        op.getHeadScaleAttr());
    auto gate = createGate(rewriter, op.getLoc(), mix.getP(), op.getKAttr(),
                           op.getRenormalizeAttr());
    rewriter.replaceOp(op, {gate.getWeights(), gate.getIndices(),
                            mix.getHead()});
    return success();
  }
};

struct MoESplitFusedRoutingPass
    : public moe::impl::MoESplitFusedRoutingBase<MoESplitFusedRoutingPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateSplitFusedRoutingPatterns(patterns);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace

void mlir::moe::populateSplitFusedRoutingPatterns(RewritePatternSet &patterns) {
  patterns.add<SplitSimilarityTopk, SplitPosteriorTopk>(patterns.getContext());
}
