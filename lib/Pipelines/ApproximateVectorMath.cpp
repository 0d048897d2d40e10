//===- ApproximateVectorMath.cpp - Vector math without libm calls ---------===//
//
// Part of the MoE-MLIR project.
//
// Upstream provides the approximations (populateMathPolynomialApproximation-
// Patterns) but no pass that applies them to vector ops only; scalar math is
// best left to libm, so the patterns run on the vector-typed math ops alone.
//
//===----------------------------------------------------------------------===//

#include "MoE/Pipelines/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Math/Transforms/Passes.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace mlir::moe {
#define GEN_PASS_DEF_APPROXIMATEVECTORMATH
#include "MoE/Pipelines/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {
struct ApproximateVectorMath
    : moe::impl::ApproximateVectorMathBase<ApproximateVectorMath> {
  void runOnOperation() override {
    SmallVector<Operation *> ops;
    getOperation().walk([&](Operation *op) {
      if (isa<math::MathDialect>(op->getDialect()) && !isa<math::RsqrtOp>(op) &&
          op->getNumResults() == 1 && isa<VectorType>(op->getResult(0).getType()))
        ops.push_back(op);
    });
    if (ops.empty())
      return;
    RewritePatternSet patterns(&getContext());
    auto notRsqrt = [](StringRef name) { return name != "rsqrt"; };
    populateMathF32ExpansionPatterns(patterns, notRsqrt);
    populateMathPolynomialApproximationPatterns(patterns, notRsqrt);
    // New ops the approximations create (exp inside tanh, say) are rewritten
    // too: the default strictness covers existing and new ops.
    if (failed(applyOpPatternsGreedily(ops, std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace
