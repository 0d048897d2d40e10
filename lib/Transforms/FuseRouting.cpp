//===- FuseRouting.cpp - Fuse mixing ops with their top-k gate ------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEFUSEROUTING
#include "MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
/// The mixing op that produced the probabilities of `gate`, when `gate` is a
/// probs-mode top-k and is their only user (otherwise fusing would compute the
/// N×N mixing twice).
template <typename MixOp>
MixOp fusableProducer(TopkRenormOp gate) {
  if (gate.getMode() != TopkMode::probs)
    return nullptr;
  auto mix = gate.getScores().getDefiningOp<MixOp>();
  if (!mix || !mix.getP().hasOneUse())
    return nullptr;
  return mix;
}

/// TopM_Renormalize(Σ_j S[i,j] e_j) -> moe.similarity_inform_topk (eq 11).
struct FuseSimilarityTopk : OpRewritePattern<TopkRenormOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TopkRenormOp gate,
                                PatternRewriter &rewriter) const override {
    auto mix = fusableProducer<SimilarityInformOp>(gate);
    if (!mix)
      return failure();
    auto fused = SimilarityInformTopkOp::create(
        rewriter, rewriter.getFusedLoc({mix.getLoc(), gate.getLoc()}),
        gate.getWeights().getType(), gate.getIndices().getType(), mix.getU(),
        mix.getE(), mix.getWs(), mix.getKeyMask(), mix.getTauAttr(),
        mix.getCausalAttr(), gate.getKAttr(), gate.getRenormalizeAttr());
    rewriter.replaceOp(gate, fused.getResults());
    rewriter.eraseOp(mix);
    return success();
  }
};

/// TopM_Renormalize(Σ_j A'_{h*}[i,j] ē_j) -> moe.attention_posterior_topk
/// (eq 17). The selected head keeps its users.
struct FusePosteriorTopk : OpRewritePattern<TopkRenormOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TopkRenormOp gate,
                                PatternRewriter &rewriter) const override {
    auto mix = fusableProducer<AttentionPosteriorOp>(gate);
    if (!mix)
      return failure();
    auto fused = AttentionPosteriorTopkOp::create(
        rewriter, rewriter.getFusedLoc({mix.getLoc(), gate.getLoc()}),
        gate.getWeights().getType(), gate.getIndices().getType(),
        mix.getHead().getType(), mix.getScores(), mix.getU(), mix.getV(),
        mix.getWo(), mix.getE(), mix.getSigmaAttr(), mix.getHeadSelectAttr(),
        mix.getHeadScaleAttr(), gate.getKAttr(), gate.getRenormalizeAttr());
    rewriter.replaceOp(gate, {fused.getWeights(), fused.getIndices()});
    rewriter.replaceAllUsesWith(mix.getHead(), fused.getHead());
    rewriter.eraseOp(mix);
    return success();
  }
};

struct MoEFuseRoutingPass
    : public moe::impl::MoEFuseRoutingBase<MoEFuseRoutingPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateFuseRoutingPatterns(patterns);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace

void mlir::moe::populateFuseRoutingPatterns(RewritePatternSet &patterns) {
  patterns.add<FuseSimilarityTopk, FusePosteriorTopk>(patterns.getContext());
}
