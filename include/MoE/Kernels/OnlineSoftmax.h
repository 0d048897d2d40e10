//===- OnlineSoftmax.h - The online-softmax step, once ----------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The flash kernels (similarity_inform, attention_posterior and their
// backward on the CPU; the mixing kernels on the GPU, the tensor-core ones in
// base 2 (SoftmaxStepForm); the portable lowering's key loops, a row per
// linalg.generic element) stream the keys of a row
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

/// The state before any key: {-inf, 0}; with `finiteMax` {-FLT_MAX, 0}
/// (SoftmaxStepForm::finiteMax).
SoftmaxState softmaxStart(KernelBuilder &kb, bool finiteMax = false);

/// One tile's update.
struct SoftmaxTile {
  SoftmaxState next;
  /// exp(m - m'): the factor of the accumulator (scalar; null without
  /// SoftmaxStepForm::sums).
  Value rescale;
  /// What the exponents subtract: m', or 0 for a row that has seen no key.
  Value shift;
  /// exp(x - m') for each logit (0 for -inf), shaped like the logits.
  SmallVector<Value> probs;
};

/// How a kernel holds and sums a row: the same update, in the instructions
/// and roundings of the kernel's choosing.
struct SoftmaxStepForm {
  /// Turn this holder's partial (shaped like the logits) into the row's f32
  /// (null: the holder has the whole row, as the portable lowering's key
  /// loop, a row per element; `reduceSum` null with `sumOntoRescaled`: the
  /// sum carried is this holder's own, summed over the holders by the caller
  /// after the key loop).
  function_ref<Value(Value)> reduceMax = nullptr, reduceSum = nullptr;
  /// The tile's Σ p folded from the first p, not from 0 (the same value,
  /// since no p is -0).
  bool sumFromFirstProb = false;
  /// The logits are raw values x of logit x · scale (an f32 scalar > 0, so
  /// the max of x scaled is the max of the logits): the max is scaled once
  /// and each exponent is one FMA, x · scale - m' (the tensor-core kernel's
  /// dot products times log2(e) / tau; with KernelBuilder::softmaxWeight
  /// 2^d the logits are in log2 units).
  Value scale;
  /// The max starts at -FLT_MAX (softmaxStart(kb, true)), not -inf: a row
  /// that has seen no key then subtracts -FLT_MAX from its -inf logits (p =
  /// 0, alpha = 1 on a zero accumulator), so m' is the shift with no select;
  /// its lse is -FLT_MAX + log(0) = -inf as well.
  bool finiteMax = false;
  /// Without: the caller sums the weights itself (the tensor cores' P · 1):
  /// l passes through, and no rescale is computed (from `shift` where the
  /// caller needs it).
  bool sums = true;
  /// l' = fma(l, alpha, Σ p): one rounding (else l · alpha + Σ p).
  bool fusedSum = false;
  /// l' = (l · alpha + p_0) + p_1 + ..: each p added to the rescaled sum in
  /// turn (no Σ p of the tile first).
  bool sumOntoRescaled = false;
};

/// The update of `state` by a tile of logits (scalars or vectors of one type,
/// -inf for excluded keys), in `form`.
SoftmaxTile onlineSoftmaxStep(KernelBuilder &kb, SoftmaxState state,
                              ArrayRef<Value> logits,
                              const SoftmaxStepForm &form);

/// The update of `state` by a tile of logits (scalars or vectors of one type,
/// -inf for excluded keys). `reduceMax`/`reduceSum` turn this holder's partial
/// (shaped like the logits) into the row's f32 (null: the holder has the
/// whole row, as the portable lowering's key loop, a row per element). The
/// tile's Σ p is folded from 0 (`sumFromFirstProb`: from the first p, where
/// no 0 + p is wanted; the same value, since no p is -0).
inline SoftmaxTile
onlineSoftmaxStep(KernelBuilder &kb, SoftmaxState state,
                  ArrayRef<Value> logits,
                  function_ref<Value(Value)> reduceMax = nullptr,
                  function_ref<Value(Value)> reduceSum = nullptr,
                  bool sumFromFirstProb = false) {
  SoftmaxStepForm form;
  form.reduceMax = reduceMax;
  form.reduceSum = reduceSum;
  form.sumFromFirstProb = sumFromFirstProb;
  return onlineSoftmaxStep(kb, state, logits, form);
}

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
