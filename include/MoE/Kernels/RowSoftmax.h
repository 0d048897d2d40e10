//===- RowSoftmax.h - The softmax of a row held whole, once -----*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The two-pass softmax of a row that a kernel holds whole (in registers, or
// re-read from L1): the row's max m first, then l = Σ exp(x - m), then each
// score exp(x - m) / l. moe.topk_renorm (mode(logits) without
// renormalization: the dense softmax read at the selection; with it: the
// softmax of the selection, whose max is its first pick), its backward and
// moe.route (the scores before the top-k, the softmax of the selection after
// it) all compute it, on the CPU (vector lanes) and on the GPU (a thread's
// scalars). The formula steps are here; the loops over the row and the
// reductions across its holders (a vector reduction on the CPU, a warp or
// block reduction on the GPU) are the targets', passed in as `reduceMax` and
// `reduceSum`.
//
// The rules: the max propagates NaN (a row holding NaN scores NaN); a row of
// -inf (every key masked) has m = -inf and scores 0, never NaN. Every term is
// KernelBuilder::exp (exact to the reference; OnlineSoftmax.h's streaming
// kernels use the target's softmaxWeight instead, which may flush subnormal
// weights).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_ROWSOFTMAX_H
#define MOE_KERNELS_ROWSOFTMAX_H

#include "MoE/Kernels/Builder.h"

namespace mlir::moe::kernels {

/// exp(x - max): a softmax numerator, one term of the row's sum. `max` is
/// broadcast to x's shape when it is a scalar.
Value softmaxTerm(KernelBuilder &kb, Value x, Value max);

/// The score of a term e = softmaxTerm(x, rowMax) given rowSum = Σ_row e:
/// e / rowSum, and 0 on a row whose max is -inf (every logit -inf: no NaN).
Value softmaxScore(KernelBuilder &kb, Value e, Value rowMax, Value rowSum);

/// A row's statistics: its max and Σ exp(x - max) as the reductions return
/// them (the row's scalars, or per lane where a lane is a row), and the max
/// in the shape of the row's values (`max` broadcast once, for the terms).
struct RowSoftmaxStats {
  Value max, sum, maxShaped;
};

/// The statistics of a row of which this holder keeps `xs` (scalars or
/// vectors of one type; pads -inf): the max folded over xs, then
/// `reduceMax`; Σ softmaxTerm folded over xs from 0 (`sumFromFirstTerm`: from
/// the first term, where the fold starts from no sum), then `reduceSum`.
/// Null reductions: the holder has the whole row (or a row per lane).
RowSoftmaxStats
rowSoftmaxStats(KernelBuilder &kb, ArrayRef<Value> xs,
                function_ref<Value(Value)> reduceMax = nullptr,
                function_ref<Value(Value)> reduceSum = nullptr,
                bool sumFromFirstTerm = false);

/// rowSoftmaxStats of a row whose holder builds its values `numChunks`
/// chunks at a time (scalars or vectors of one type): `chunk(c)` is called
/// once for the max and once for Σ (a holder that loads each chunk again
/// keeps one chunk live, not the row), and both fold in rowSoftmaxStats's
/// order over the chunks' values in turn, so that its results are the same.
RowSoftmaxStats rowSoftmaxStatsChunked(
    KernelBuilder &kb, int64_t numChunks,
    function_ref<SmallVector<Value>(int64_t c)> chunk,
    function_ref<Value(Value)> reduceMax = nullptr,
    function_ref<Value(Value)> reduceSum = nullptr,
    bool sumFromFirstTerm = false);

/// The max of a row streamed in one loop over [lb, ub) by `step` (the first
/// loop of rowSoftmaxStatsLoop, with its arguments): the partial starts from
/// -inf of `chunkType` and folds the NaN-propagating max of `chunk(iv)`, then
/// `reduceMax` (null: none) gives the row's.
Value rowMaxLoop(KernelBuilder &kb, Type chunkType, Value lb, Value ub,
                 Value step, function_ref<Value(Value iv)> chunk,
                 function_ref<Value(Value)> reduceMax = nullptr);

/// The statistics of a row streamed in two loops over [lb, ub) by `step`
/// (max, then Σ): `chunk(iv)` loads the holder's values at iv (of type
/// `chunkType`, scalar or vector; pads -inf), the partials start from -inf
/// and 0 of that type, and `reduceMax`/`reduceSum` (null: none) turn them
/// into the row's values. `onTerm(iv, e)`, when given, sees every term
/// e = exp(x - max) of the sum loop (a kernel that keeps them for the scores).
RowSoftmaxStats rowSoftmaxStatsLoop(
    KernelBuilder &kb, Type chunkType, Value lb, Value ub, Value step,
    function_ref<Value(Value iv)> chunk,
    function_ref<Value(Value)> reduceMax = nullptr,
    function_ref<Value(Value)> reduceSum = nullptr,
    function_ref<void(Value iv, Value e)> onTerm = nullptr);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_ROWSOFTMAX_H
