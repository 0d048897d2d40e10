//===- LegalizeShapes.cpp - The shapes every moe lowering may assume ------===//
//
// Part of the MoE-MLIR project.
//
// Run first by every pipeline: after it, every moe op has sizes within the
// kernels' limits and no static zero-sized dimension, so no lowering needs a
// special case for either (see MoEDegenerate.cpp and MoELimits.cpp).
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEDialect.h"
#include "MoE/IR/MoEOps.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOELEGALIZESHAPES
#include "MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
/// moe.route over no token (a static T = 0): empty weights and indices. The
/// linalg lowering's per-token slices would start out of bounds (issue #15,
/// found by test/Reliability/zero-sized-routing.mlir).
struct EmptyRoute : OpRewritePattern<RouteOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(RouteOp op,
                                PatternRewriter &rewriter) const override {
    SmallVector<Value> empties;
    for (Value result : op->getResults()) {
      auto type = cast<RankedTensorType>(result.getType());
      if (!type.hasStaticShape() || type.getNumElements() != 0)
        return failure();
      empties.push_back(tensor::EmptyOp::create(
          rewriter, op.getLoc(), type.getShape(), type.getElementType()));
    }
    rewriter.replaceOp(op, empties);
    return success();
  }
};
} // namespace

LogicalResult mlir::moe::legalizeShapes(Operation *root) {
  bool withinLimits = true;
  root->walk([&](Operation *op) {
    if (isa<MoEDialect>(op->getDialect()) && failed(checkKernelLimits(op)))
      withinLimits = false;
  });
  if (!withinLimits)
    return failure();
  RewritePatternSet patterns(root->getContext());
  populateDegenerateShapePatterns(patterns);
  patterns.add<EmptyRoute>(root->getContext());
  // Only the ops the patterns rewrite or create change: no folding elsewhere.
  GreedyRewriteConfig config;
  config.enableFolding(false);
  config.setRegionSimplificationLevel(GreedySimplifyRegionLevel::Disabled);
  if (failed(applyPatternsGreedily(root, std::move(patterns), config)))
    return root->emitError()
           << "moe-legalize-shapes: the zero-size rewrites did not converge";
  return success();
}

namespace {
struct MoELegalizeShapesPass
    : public moe::impl::MoELegalizeShapesBase<MoELegalizeShapesPass> {
  void runOnOperation() override {
    if (failed(legalizeShapes(getOperation())))
      signalPassFailure();
  }
};
} // namespace
