//===- RouteDispatchPlan.cpp - moe.route + moe.dispatch_plan, one kernel --===//
//
// Part of the MoE-MLIR project.
//
// When the indices of a moe.route feed a moe.dispatch_plan over the same
// experts (what serving kernels do in their routing step: TensorRT-LLM's and
// FlashInfer's routing, SGLang's fused gate), the two become one kernel: each
// worker routes its rows and counts their picks into its item's histogram
// row while they are in cache (the plan's phase 1, DispatchPlan.cpp), so the
// indices are not read again until the placement. The route's indices are in
// [0, E) by construction: no index check. Results are those of the two
// kernels apart (the same rows, the same stable order).
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "Route.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu;

DispatchPlanOp mlir::moe::cpu::fusableDispatchPlan(RouteOp route) {
  auto logits = cast<RankedTensorType>(route.getLogits().getType());
  if (logits.isDynamicDim(1))
    return nullptr;
  for (Operation *user : route.getIndices().getUsers()) {
    auto plan = dyn_cast<DispatchPlanOp>(user);
    if (plan &&
        static_cast<int64_t>(plan.getNumExperts()) == logits.getDimSize(1) &&
        plan->getBlock() == route->getBlock())
      return plan;
  }
  return nullptr;
}

namespace {
/// Benefit 3: tried before the single-op route kernel (2).
struct RouteDispatchPlanKernel : OpRewritePattern<RouteOp> {
  RouteDispatchPlanKernel(MLIRContext *ctx, KernelOptions opts)
      : OpRewritePattern<RouteOp>(ctx, /*benefit=*/3), opts(opts) {}
  KernelOptions opts;

  LogicalResult matchAndRewrite(RouteOp op,
                                PatternRewriter &rw) const override {
    DispatchPlanOp plan = fusableDispatchPlan(op);
    if (!plan)
      return rw.notifyMatchFailure(op, "no dispatch_plan of its indices");
    ImplicitLocOpBuilder b(op.getLoc(), rw);
    CK k(b);
    int64_t numExperts = plan.getNumExperts();
    Value numRows = tensor::DimOp::create(b, op.getLogits(), 0);
    Value hist = allocPlanHistogram(k, numRows, numExperts);
    RouteKernelBuffers out = emitRouteKernel(
        k, opts, op,
        [&](Value item) { clearPlanItem(k, hist, item, numExperts); },
        [&](Value row, Value item, Value indices) {
          countPlanRow(k, indices, hist, row, item, numExperts);
        });
    SmallVector<Value> planResults;
    for (Value buf : emitPlanFromHistogram(k, opts, plan, out.indices, hist))
      planResults.push_back(k.tensor(buf));
    Value indices = k.tensor(out.indices);
    rw.replaceOp(op, {castResult(k, k.tensor(out.weights),
                             op.getWeights().getType()),
                      castResult(k, indices, op.getIndices().getType())});
    rw.replaceOp(plan, planResults);
    return success();
  }
};
} // namespace

void mlir::moe::cpu::populateRouteDispatchPlanKernel(RewritePatternSet &p,
                                                     const KernelOptions &o) {
  p.add<RouteDispatchPlanKernel>(p.getContext(), o);
}
