//===- Route.h - The moe.route and moe.dispatch_plan CPU kernels -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The pieces of the routing kernels that the fused form (RouteDispatchPlan.cpp:
// moe.route whose indices feed a moe.dispatch_plan, one kernel) shares with the
// two single-op kernels (Route.cpp, DispatchPlan.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_ROUTE_H
#define MOE_LIB_CONVERSION_MOETOCPU_ROUTE_H

#include "KernelBuilder.h"

#include "MoE/IR/MoEOps.h"

namespace mlir::moe::cpu_lowering {

/// Rows (tokens) per work item of the routing kernels; also the item of the
/// dispatch plan's per-item histograms, so that a fused kernel counts the
/// indices of the rows it has just routed.
constexpr int64_t kRouteRowsPerItem = 32;

/// Emits the moe.route kernel into the weights [T, k] f32 and indices [T, k]
/// i32 buffers `weights` and `indices`, spreading blocks of
/// kRouteRowsPerItem rows over the workers. `itemBegin(item)` runs when a
/// worker starts an item and `rowEnd(row, item, indices)` after each of its
/// rows (both may be null): the fused kernel's hooks.
void emitRouteKernel(
    CpuKernelBuilder &kb, const KernelOptions &opts, RouteOp op, Value weights, Value indices,
    function_ref<void(Value item)> itemBegin = nullptr,
    function_ref<void(Value row, Value item, Value indices)> rowEnd = nullptr);
/// The tensors moe.route's kernel reads: logits, and bias and replay where
/// the op has them.
SmallVector<Value> routeInputs(RouteOp op);
/// The run-time check of a replayed choice (every index in [0, E), before the
/// kernel; moeReportIndexError); success without `replay`.
LogicalResult checkRouteReplay(PatternRewriter &rw, RouteOp op);
/// The sizes of moe.route's results (weights and indices: [T, k]).
SmallVector<SmallVector<Value>> routeResultSizes(CpuKernelBuilder &kb, RouteOp op);

/// The first moe.dispatch_plan that reads `route`'s indices over its E
/// experts in the same block (so that the fused kernel, emitted at the route,
/// dominates it), or null: the pair the fused kernel takes (RouteDispatchPlan.cpp).
DispatchPlanOp fusableDispatchPlan(RouteOp route);

/// The dispatch plan of the i32/i64 indices buffer `indices` [T, K] with E
/// experts and block size B, built from `hist` [ceil(T / kRouteRowsPerItem),
/// E] i32 holding each item's per-expert counts of its in-range assignments
/// (emitPlanCounts, or the fused kernel's hook), written into `results`, the
/// seven result buffers of moe.dispatch_plan in order. With a capacity mask
/// `keep` [N] (i32, 0 = dropped), the dropped assignments are left out like
/// out-of-range ones (`hist` must count the kept ones only).
void emitPlanFromHistogram(CpuKernelBuilder &kb, const KernelOptions &opts, DispatchPlanOp op,
                           Value indices, Value hist, ValueRange results,
                           Value keep = nullptr);
/// The sizes of moe.dispatch_plan's results for indices [T, K] (seven, and
/// `dropped` with a capacity).
SmallVector<SmallVector<Value>> planResultSizes(CpuKernelBuilder &kb, DispatchPlanOp op,
                                                Value rows, Value slots);
/// A fresh [items, E] histogram buffer for `numRows` (T) rows.
Value allocPlanHistogram(CpuKernelBuilder &kb, Value numRows, int64_t numExperts);
/// Adds the in-range (and, with `keep`, kept) assignments of row `row` of
/// `indices` to `hist[item]`.
void countPlanRow(CpuKernelBuilder &kb, Value indices, Value hist, Value row, Value item,
                  int64_t numExperts, Value keep = nullptr);
/// Zeroes `hist[item]`.
void clearPlanItem(CpuKernelBuilder &kb, Value hist, Value item, int64_t numExperts);

} // namespace mlir::moe::cpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOCPU_ROUTE_H
