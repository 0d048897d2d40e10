//===- TopK.h - The dialect's top-k order and weights, once -----*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// Every top-k of the dialect (moe.topk_renorm, the fused *_topk ops, the
// argmin of the posterior's head selection) ranks (value, index) pairs by one
// strict total order: NaN first (the lower index first among NaNs), then
// larger values, then, on equal values (-0 == +0), the lower index. Here that
// order is an integer order, written once and used by the portable lowering,
// the CPU kernels (on vector lanes) and the GPU kernels (per thread, then
// across lanes by an integer max):
//
//   key(x)       i32, monotone: -inf < ... < -0 == +0 < ... < +inf < NaN
//   pack(key, i) i64 = key << 32 | (INT32_MAX - i): a larger i64 ranks first
//
// so "the best candidate ranking strictly after the previous pick" is a
// signed max over the candidates below it, and rounds never revisit an
// element. The weight of a selected value (softmax over the selection or the
// row, or renormalized probabilities) is also one function for all targets.
// Every function accepts scalars or vectors (lane-wise).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_TOPK_H
#define MOE_KERNELS_TOPK_H

#include "MoE/Kernels/Builder.h"
#include "MoE/Kernels/RowSoftmax.h"

#include "mlir/IR/BuiltinTypes.h"

#include <type_traits>
#include <utility>

namespace mlir::moe::kernels {

/// Monotone i32 key of an f32 (every NaN maps to INT32_MAX, above every
/// number). With `descending = false` smaller numbers get larger keys (argmin),
/// NaN still on top.
Value orderedKey(KernelBuilder &kb, Value f, bool descending = true);
/// The f32 of a descending key (a NaN for INT32_MAX).
Value keyToFloat(KernelBuilder &kb, Value key);
/// (key, index) packed so that a larger i64 is the better candidate: a larger
/// key, then a *smaller* index. `index` is i32 (or index), in [0, 2^31).
Value packCandidate(KernelBuilder &kb, Value key, Value index);
Value candidateKey(KernelBuilder &kb, Value packed);
/// The index (i32) of a packed candidate.
Value candidateIndex(KernelBuilder &kb, Value packed);
/// The packed value below every candidate ("none"), of `type` (i64 or a
/// vector of i64).
Value noCandidate(KernelBuilder &kb, Type type);
/// True when (a, ai) ranks strictly before (c, ci) in the dialect's order
/// (indices i32).
Value ranksBefore(KernelBuilder &kb, Value a, Value ai, Value c, Value ci,
                  bool descending = true);

/// One step of a top-k round, on every target: `cand` when it ranks strictly
/// below the previous pick `prev` (and, with `laneMask`, the lane takes part),
/// else `none` (noCandidate of cand's type). The best of these over a row
/// (bestBelow, then the target's reduction: a vector max on the CPU, a warp
/// butterfly on the GPU) is the round's pick; rounds never revisit an element.
/// Lane-wise; `laneMask` is called after the comparison is built.
Value candidateBelow(KernelBuilder &kb, Value cand, Value prev, Value none,
                     function_ref<Value()> laneMask = nullptr);
/// max(best, candidateBelow(cand, prev)): one candidate folded into a round's
/// running best.
Value bestBelow(KernelBuilder &kb, Value best, Value cand, Value prev,
                Value none, function_ref<Value()> laneMask = nullptr);

/// The key of an empty entry of a candidate list (INT32_MIN): below the key of
/// every number (-inf's is INT32_MIN + 0x7fffff), so it never wins a round.
Value emptyListKey(KernelBuilder &kb, Type keyType);

/// A short candidate list of one thread (the GPU's topk-rounds=list): its best
/// `keys.size()` elements in the dialect's order, best first; `positions` are
/// the thread's own ordinals of its elements (any i32 increasing with the
/// element's index). Empty entries hold emptyListKey.
struct TopList {
  SmallVector<Value> keys, positions;
};

/// Inserts (key, position) into `list`; the insertions must come in increasing
/// position (index) order, so that an equal key already listed stays ahead
/// (the lower index first). An emptyListKey is never inserted. Slot j becomes
/// max(key_j, min(x, key_{j-1})) (the sorted insertion, ties included) and
/// its position follows the two strict comparisons x > key_{j-1}, x > key_j:
/// t compares, 2t - 1 min/max and 2t - 1 selects per element.
void insertIntoTopList(KernelBuilder &kb, TopList &list, Value key,
                       Value position);

/// True when (key, position) ranks strictly after the pick (prevKey,
/// prevPosition) of the same thread: a smaller key, or an equal one at a
/// higher position. (INT32_MAX, -1) is "no pick yet": everything ranks after.
Value ranksAfterPick(KernelBuilder &kb, Value key, Value position,
                     Value prevKey, Value prevPosition);

/// How the k selected values become weights (moe.topk_renorm's mode and
/// renormalize attributes).
struct TopkSpec {
  int64_t k = 1;
  bool logits = true;
  bool renormalize = true;
};

namespace detail {
template <typename OpT, typename = void> struct HasGetK : std::false_type {};
template <typename OpT>
struct HasGetK<OpT, std::void_t<decltype(std::declval<OpT>().getK())>>
    : std::true_type {};
template <typename OpT, typename = void> struct HasGetMode : std::false_type {};
template <typename OpT>
struct HasGetMode<OpT, std::void_t<decltype(std::declval<OpT>().getMode())>>
    : std::true_type {};
} // namespace detail

/// The spec of an op that selects the top k of its rows (a template, as
/// routeSpecOf, so that this library does not depend on the dialect):
/// moe.topk_renorm (k, mode, renormalize), moe.topk_renorm_grad (k: the last
/// dimension of its indices, possibly dynamic) and the fused
/// similarity_inform_topk / attention_posterior_topk (k, renormalize; they
/// select probabilities).
template <typename OpT> TopkSpec topkSpecOf(OpT op) {
  TopkSpec spec;
  if constexpr (detail::HasGetK<OpT>::value)
    spec.k = op.getK();
  else
    spec.k =
        llvm::cast<ShapedType>(op.getIndices().getType()).getShape().back();
  if constexpr (detail::HasGetMode<OpT>::value)
    spec.logits = op.getMode() == decltype(op.getMode())::logits;
  else
    spec.logits = false;
  spec.renormalize = op.getRenormalize();
  return spec;
}

/// One term of the selection's sum `selSum` that topkWeight takes, for the
/// selected value `v` and the first (largest) pick `v0`: exp(v - v0) for
/// logits (softmaxTerm: the selection's max is its first pick), v for
/// probabilities (v0 unused, may be null).
Value topkSelectionTerm(KernelBuilder &kb, const TopkSpec &spec, Value v,
                        Value v0);

/// A top-k round's pick `v` (round `r`, an index) folded into the selection
/// state the rounds carry: `v0` (the first pick: v in round 0, else `v0Before`)
/// and the pick's topkSelectionTerm, which the caller adds to its selSum. The
/// GPU's round loops (register, redux and block rounds) share it.
struct TopkPickState {
  Value v0;
  Value term;
};
TopkPickState topkPickState(KernelBuilder &kb, const TopkSpec &spec, Value r,
                            Value v, Value v0Before);

/// The weight of selected value `v` given the first (largest) selected value
/// `v0`, the sum over the selection `selSum` (Σ exp(v - v0) for logits, Σ v
/// for probabilities) and, for logits without renormalization, the row's max
/// and Σ exp(x - max) (`denseMax`, `denseSum`; null otherwise). A row whose
/// max is -inf (fully masked) and a zero probability sum give zero weights.
/// All operands have v's type.
Value topkWeight(KernelBuilder &kb, const TopkSpec &spec, Value v, Value v0,
                 Value selSum, Value denseMax, Value denseSum);

/// The backward of topkWeight (moe.topk_renorm_grad): the gradient to a
/// selected value from its weight's cotangent `g`, its weight `w`, `c` = Σ over
/// the selection of g·w and `selSum` (as for topkWeight; probabilities only):
/// logits: w (g - c); probs renormalized: (g - c) / selSum, 0 for a zero sum;
/// probs raw: g. (Logits without renormalization: every entry j of the row
/// also gets -s_j c, s the dense softmax; this is the selected entries' total.)
Value topkWeightGrad(KernelBuilder &kb, const TopkSpec &spec, Value g, Value w,
                     Value c, Value selSum);

/// One row `r` of moe.topk_renorm_grad (MoEGradOps.td) on one thread's
/// scalars: the weights recomputed from the scores (topkWeight), then
/// out[r, :] = the gradient to every score (0, or -s_j c for logits without
/// renormalization) and topkWeightGrad at the selected entries. `s2` (scores,
/// any float type), `i2` (indices, i32), `g2` (dw, f32) and `o2` (f32) are
/// 2-D [rows, ...] memrefs; `numExperts` and `sel` (k) are index values. An
/// index outside [0, K) reads element 0 and writes nothing. The CPU kernel
/// runs it per row on its workers, the GPU kernel on a thread per row.
void emitTopkGradRow(KernelBuilder &kb, const TopkSpec &spec, Value r, Value s2,
                     Value i2, Value g2, Value o2, Value numExperts, Value sel);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_TOPK_H
