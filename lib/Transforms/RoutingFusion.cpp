//===- RoutingFusion.cpp - Fuse mixing ops with their top-k gate and back -===//
//
// Part of the MoE-MLIR project.
//
// moe-fuse-routing turns a mixing op (similarity_inform, attention_posterior)
// and the probs-mode top-k gate that is the only user of its probabilities
// into the fused op (similarity_inform_topk, attention_posterior_topk);
// moe-split-fused-routing does the reverse. Both directions are written once,
// over a description of each (mixing op, fused op) pair.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/IR/PatternMatch.h"
#include "mlir/IR/TypeUtilities.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEFUSEROUTING
#define GEN_PASS_DEF_MOESPLITFUSEDROUTING
#include "MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
// A pair: `Mix` (results: p, then any others) and `Fused` (results: the
// gate's weights and indices, then the mixing op's others), with `fuse`
// building Fused from a Mix and its gate and `split` building the Mix of a
// Fused.

/// TopM_Renormalize(Σ_j S[i,j] e_j) <-> moe.similarity_inform_topk (eq 11).
struct SimilarityPair {
  using Mix = SimilarityInformOp;
  using Fused = SimilarityInformTopkOp;
  static Fused fuse(PatternRewriter &rw, Location loc, Mix mix,
                    TopkRenormOp gate) {
    return Fused::create(rw, loc, gate.getWeights().getType(),
                         gate.getIndices().getType(), mix.getU(), mix.getE(),
                         mix.getWs(), mix.getKeyMask(), mix.getTauAttr(),
                         mix.getCausalAttr(), gate.getKAttr(),
                         gate.getRenormalizeAttr());
  }
  static Mix split(PatternRewriter &rw, Fused op) {
    return Mix::create(rw, op.getLoc(), op.getU(), op.getE(), op.getWs(),
                       op.getKeyMask(), op.getTauAttr(), op.getCausalAttr());
  }
};

/// TopM_Renormalize(Σ_j A'_{h*}[i,j] ē_j) <-> moe.attention_posterior_topk
/// (eq 17). The selected head keeps its users.
struct PosteriorPair {
  using Mix = AttentionPosteriorOp;
  using Fused = AttentionPosteriorTopkOp;
  static Fused fuse(PatternRewriter &rw, Location loc, Mix mix,
                    TopkRenormOp gate) {
    return Fused::create(
        rw, loc, gate.getWeights().getType(), gate.getIndices().getType(),
        mix.getHead().getType(), mix.getScores(), mix.getU(), mix.getV(),
        mix.getWo(), mix.getE(), mix.getSigmaAttr(), mix.getHeadSelectAttr(),
        mix.getHeadScaleAttr(), gate.getKAttr(), gate.getRenormalizeAttr());
  }
  static Mix split(PatternRewriter &rw, Fused op) {
    return Mix::create(rw, op.getLoc(), op.getScores(), op.getU(), op.getV(),
                       op.getWo(), op.getE(), op.getSigmaAttr(),
                       op.getHeadSelectAttr(), op.getHeadScaleAttr());
  }
};

/// Mix + gate -> Fused, when `gate` is a probs-mode top-k and the only user
/// of the probabilities (otherwise fusing would compute the N×N mixing twice).
template <typename Pair>
struct FuseWithGate : OpRewritePattern<TopkRenormOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(TopkRenormOp gate,
                                PatternRewriter &rewriter) const override {
    // The fused ops' indices are i32: a gate whose indices are written as
    // i64 stays a gate of its own.
    if (gate.getMode() != TopkMode::probs ||
        !getElementTypeOrSelf(gate.getIndices().getType()).isInteger(32))
      return failure();
    auto mix = gate.getScores().getDefiningOp<typename Pair::Mix>();
    if (!mix || !mix.getP().hasOneUse())
      return failure();
    auto fused = Pair::fuse(
        rewriter, rewriter.getFusedLoc({mix.getLoc(), gate.getLoc()}), mix,
        gate);
    ResultRange results = fused->getResults();
    rewriter.replaceOp(gate, results.take_front(2));
    rewriter.replaceAllUsesWith(mix->getResults().drop_front(),
                                results.drop_front(2));
    rewriter.eraseOp(mix);
    return success();
  }
};

/// Fused -> Mix + its probs-mode top-k gate.
template <typename Pair>
struct SplitFromGate : OpRewritePattern<typename Pair::Fused> {
  using OpRewritePattern<typename Pair::Fused>::OpRewritePattern;
  LogicalResult matchAndRewrite(typename Pair::Fused op,
                                PatternRewriter &rewriter) const override {
    auto mix = Pair::split(rewriter, op);
    auto gate = TopkRenormOp::create(
        rewriter, op.getLoc(), mix.getP(), op.getKAttr(),
        TopkModeAttr::get(rewriter.getContext(), TopkMode::probs),
        op.getRenormalizeAttr());
    SmallVector<Value> results(gate->getResults());
    llvm::append_range(results, mix->getResults().drop_front());
    rewriter.replaceOp(op, results);
    return success();
  }
};

/// A pass that applies the patterns of `populate` greedily.
template <typename Derived, template <typename> class Base,
          void (*populate)(RewritePatternSet &)>
struct GreedyPatternsPass : Base<Derived> {
  void runOnOperation() override {
    RewritePatternSet patterns(&this->getContext());
    populate(patterns);
    if (failed(applyPatternsGreedily(this->getOperation(),
                                     std::move(patterns))))
      this->signalPassFailure();
  }
};

struct MoEFuseRoutingPass
    : GreedyPatternsPass<MoEFuseRoutingPass, moe::impl::MoEFuseRoutingBase,
                         populateFuseRoutingPatterns> {};
struct MoESplitFusedRoutingPass
    : GreedyPatternsPass<MoESplitFusedRoutingPass,
                         moe::impl::MoESplitFusedRoutingBase,
                         populateSplitFusedRoutingPatterns> {};
} // namespace

void mlir::moe::populateFuseRoutingPatterns(RewritePatternSet &patterns) {
  patterns.add<FuseWithGate<SimilarityPair>, FuseWithGate<PosteriorPair>>(
      patterns.getContext());
}

void mlir::moe::populateSplitFusedRoutingPatterns(RewritePatternSet &patterns) {
  patterns.add<SplitFromGate<SimilarityPair>, SplitFromGate<PosteriorPair>>(
      patterns.getContext());
}
