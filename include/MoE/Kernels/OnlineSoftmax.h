//===- OnlineSoftmax.h - The online-softmax step, once ----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The flash kernels (similarity_inform, attention_posterior and their
// backward on the CPU; the mixing kernel on the GPU; the portable lowering's
// key loops, a row per linalg.generic element) stream the keys of a row
// in tiles and keep, per row, the running max m of the logits seen so far and
// the running sum l = Σ exp(x - m). One tile updates them as
//
//   m' = max(m, max_tile x)          (NaN-propagating)
//   alpha = exp(m - m'), p = exp(x - m')   with m' read as 0 when it is -inf
//   l' = l · alpha + Σ_tile p
//
// and the caller rescales its accumulator by alpha before adding Σ p·v. An
// excluded key has the logit -inf (p = 0); a row that has seen no key keeps
// m = -inf, l = 0 (alpha = 0: the accumulator, still zero, stays zero). A NaN
// logit makes m', l' and every later p NaN, as the reference does. At the end
// the row is acc / l (zeros for a row without keys) and the backward saves
// the log-sum-exp m + log(l) (-inf without keys), from which it recomputes
// p = exp(x - lse).
//
// (A kernel that holds its row whole takes two passes instead, max then Σ:
// RowSoftmax.h.) Every weight exp(d) is the target's
// KernelBuilder::softmaxWeight (the CPU kernels flush the subnormal ones to
// 0).
//
// Every function takes scalars or vectors (a CPU lane group holds a tile row
// in vectors; a GPU thread holds a few scalars of it): the tile's partial max
// and sum are finished by `reduceMax`/`reduceSum` over what the row's other
// holders have (a vector reduction on the CPU, a subgroup reduction over the
// row's lanes on the GPU), which return the row's scalar.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_ONLINESOFTMAX_H
#define MOE_KERNELS_ONLINESOFTMAX_H

#include "MoE/Kernels/Builder.h"

namespace mlir::moe::kernels {

/// The running statistics of one row (f32 scalars).
struct SoftmaxState {
  Value max, sum;
};

/// The state before any key: {-inf, 0}.
SoftmaxState softmaxStart(KernelBuilder &kb);

/// One tile's update.
struct SoftmaxTile {
  SoftmaxState next;
  /// exp(m - m'): the factor of the accumulator (scalar).
  Value rescale;
  /// exp(x - m') for each logit (0 for -inf), shaped like the logits.
  SmallVector<Value> probs;
};

/// The update of `state` by a tile of logits (scalars or vectors of one type,
/// -inf for excluded keys). `reduceMax`/`reduceSum` turn this holder's partial
/// (shaped like the logits) into the row's f32 (null: the holder has the
/// whole row, as the portable lowering's key loop, a row per element). The
/// tile's Σ p is folded from 0 (`sumFromFirstProb`: from the first p, where
/// no 0 + p is wanted; the same value, since no p is -0).
SoftmaxTile onlineSoftmaxStep(KernelBuilder &kb, SoftmaxState state,
                              ArrayRef<Value> logits,
                              function_ref<Value(Value)> reduceMax = nullptr,
                              function_ref<Value(Value)> reduceSum = nullptr,
                              bool sumFromFirstProb = false);

/// The update of `state` by one logit `x` of a holder that has the whole row
/// (the portable lowering's key loop: a row per linalg.generic element).
inline SoftmaxTile onlineSoftmaxKey(KernelBuilder &kb, SoftmaxState state,
                                    Value x) {
  return onlineSoftmaxStep(kb, state, x, nullptr, nullptr,
                           /*sumFromFirstProb=*/true);
}

/// The row's result from its accumulator `acc` (scalar or vector): acc / l,
/// zeros for a row that saw no key. (That row is told by l = 0, not by
/// m = -inf: the same rows, since a row that saw a key has l >= exp(0) = 1 or
/// NaN, but the test on m gave a wrong p in the first GPU run on an H200.)
Value softmaxNormalize(KernelBuilder &kb, SoftmaxState state, Value acc);

/// The row's log-sum-exp m + log(l) (-inf for a row that saw no key).
Value softmaxLogSumExp(KernelBuilder &kb, SoftmaxState state);

/// The probability of logit `x` recomputed from the row's log-sum-exp `lse`
/// (a scalar is broadcast to x's shape): exp(x - lse), 0 for x = -inf; 0 for
/// every key of a row whose lse the caller set to +inf.
Value softmaxFromLogSumExp(KernelBuilder &kb, Value x, Value lse);

/// The backward of a softmax row at one logit `x`, from the row's
/// log-sum-exp `lse` (softmaxFromLogSumExp), the cotangent `g` of the logit's
/// output weight and the row's delta = Σ_j p_j g_j (read by `delta()` after p
/// is built, broadcast to x's shape by the caller):
///   p = exp(x - lse),   dz = p (g - delta)   (dz: the gradient to x).
struct SoftmaxGrad {
  Value prob, dlogit;
};
SoftmaxGrad softmaxGradFromLogSumExp(KernelBuilder &kb, Value x, Value lse,
                                     Value g, function_ref<Value()> delta);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_ONLINESOFTMAX_H
