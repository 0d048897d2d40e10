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

#include "Lowerings.h"
#include "Route.h"

namespace mlir::moe::cpu_lowering {

DispatchPlanOp fusableDispatchPlan(RouteOp route) {
  auto logits = cast<RankedTensorType>(route.getLogits().getType());
  if (logits.isDynamicDim(1))
    return nullptr;
  for (Operation *user : route.getIndices().getUsers()) {
    auto plan = dyn_cast<DispatchPlanOp>(user);
    // A capacity decides the plan after every row is routed: not fused.
    if (plan && !plan.getCapacity() &&
        static_cast<int64_t>(plan.getNumExperts()) == logits.getDimSize(1) &&
        plan->getBlock() == route->getBlock())
      return plan;
  }
  return nullptr;
}

namespace {
/// Benefit 3: tried before the single-op route kernel (2).
struct RouteDispatchPlanKernel : KernelPattern<RouteOp, /*TargetLanes=*/false> {
  RouteDispatchPlanKernel(MLIRContext *ctx, KernelOptions opts)
      : KernelPattern(ctx, opts, /*benefit=*/3) {}

  LogicalResult emit(RouteOp op, CpuKernelBuilder &kb, PatternRewriter &rw) const override {
    DispatchPlanOp plan = fusableDispatchPlan(op);
    if (!plan)
      return rw.notifyMatchFailure(op, "no dispatch_plan of its indices");
    int64_t numExperts = plan.getNumExperts();
    if (failed(checkRouteReplay(rw, op)))
      return failure();
    // One kernel with the results of both ops: the route's, then the plan's.
    SmallVector<KernelScope::Out> outs =
        KernelScope::outsOf(op, routeResultSizes(kb, op));
    SmallVector<Value> indicesSizes = routeResultSizes(kb, op)[1];
    llvm::append_range(
        outs, KernelScope::outsOf(plan, planResultSizes(kb, plan, indicesSizes[0],
                                                        indicesSizes[1])));
    KernelScope kernel(kb, routeInputs(op), outs);
    Value numRows = kb.dim(kb.buffer(op.getLogits()), 0);
    Value hist = allocPlanHistogram(kb, numRows, numExperts);
    emitRouteKernel(
        kb, opts, op, kernel.out(0), kernel.out(1),
        [&](Value item) { clearPlanItem(kb, hist, item, numExperts); },
        [&](Value row, Value item, Value indices) {
          countPlanRow(kb, indices, hist, row, item, numExperts);
        });
    emitPlanFromHistogram(kb, opts, plan, kernel.out(1), hist,
                          kernel.outs().drop_front(2));
    ValueRange results = kernel.finish();
    rw.replaceOp(plan, results.drop_front(2));
    rw.replaceOp(op, results.take_front(2));
    return success();
  }
};
} // namespace

void populateRouteDispatchPlanLowering(RewritePatternSet &patterns,
                                       const KernelOptions &options) {
  patterns.add<RouteDispatchPlanKernel>(patterns.getContext(), options);
}

} // namespace mlir::moe::cpu_lowering
