//===- MoEToLinalg.cpp - The convert-moe-to-linalg pass -------------------===//
//
// Part of the MoE-MLIR project.
//
// The pass only gathers the per-op patterns (one file per op in this
// directory, registered through the lowering table, Lowerings.td) and runs them
// as a partial conversion: every moe op must go. mad_dispersion and
// adjacency_update declare moeReportIndexError in the enclosing module, so run
// the pass on the module (or an op inside one), not nested on functions in
// parallel.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToLinalg/MoEToLinalg.h"
#include "Lowerings.h"
#include "MoE/Conversion/Legality.h"
#include "MoE/IR/MoEDialect.h"
#include "MoE/IR/MoEOps.h"
#include "MoE/Transforms/Passes.h"

// The pass's dependent dialects (GEN_PASS_DEF below).
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/DialectConversion.h"

namespace mlir::moe {
#define GEN_PASS_DEF_CONVERTMOETOLINALG
#include "MoE/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

void mlir::moe::populateMoEToLinalgPatterns(RewritePatternSet &patterns) {
  linalg_lowering::populateLowerings(patterns);
  // The portable lowering has no fused kernel: a fused routing op becomes its
  // mixing op and top-k gate again, which the patterns above then lower.
  populateSplitFusedRoutingPatterns(patterns);
}

// populateLowerings: the op table's (Lowerings.td) Portable lowerings.
#include "Lowerings.cpp.inc"

namespace {
struct ConvertMoEToLinalgPass
    : public moe::impl::ConvertMoEToLinalgBase<ConvertMoEToLinalgPass> {
  void runOnOperation() override {
    // The patterns assume sizes within the kernels' limits and no static
    // zero-sized dimension.
    if (failed(legalizeShapes(getOperation())))
      return signalPassFailure();
    MLIRContext *ctx = &getContext();
    RewritePatternSet patterns(ctx);
    populateMoEToLinalgPatterns(patterns);
    // The moe ops are illegal: every op has a portable lowering (it is what
    // runs when convert-moe-to-cpu has no kernel), so one that stays is an
    // error of the pass, not a form left for a later one.
    ConversionTarget target(*ctx);
    configureMoEConversionTarget(target, MoEOpsAfter::Lowered);
    if (failed(applyPartialConversion(getOperation(), target,
                                      std::move(patterns))))
      signalPassFailure();
  }
};
} // namespace
