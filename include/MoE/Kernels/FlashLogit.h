//===- FlashLogit.h - The flash kernels' logit, once ------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The flash kernels (similarity_inform, attention_posterior and their
// backward: the CPU's lane-group kernels, the GPU's mixing, mma and backward
// kernels) stream (query i, key j) pairs and need one logit per pair:
//
//   logit[i,j] = <q_i, key_j> / scaleDiv (+ bias[b,j]) (+ add[b,head[b],i,j])
//
// excluded (-inf) unless the key counts for the row: it is in range (not
// padding), key_mask[b,j] holds and, when causal, j <= i. Here that formula
// and its exclusion rule are written once, on scalars (a GPU thread's pair) or
// vectors (a CPU lane group's keys): each target supplies only how it reads
// the dot product, the bias, the added score and the masks (a load of an i1
// key mask or of a padded 1.0/0.0 validity row; an index or a lane-iota
// comparison), in the order given below, which fixes the order of the
// emitted operations.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_FLASHLOGIT_H
#define MOE_KERNELS_FLASHLOGIT_H

#include "MoE/Kernels/Builder.h"

namespace mlir::moe::kernels {

/// What enters the logit of a flash kernel. The backward kernels recompute
/// the forward's logit: their lowerings take the forward's spec.
struct FlashLogitSpec {
  /// Divisor of the dot products (tau, or sigma^2).
  double scaleDiv = 1.0;
  bool causal = false;
  bool hasKeyMask = false;
  /// A per-key bias [B,Nk] (f32) added to the logits.
  bool hasBias = false;
  /// Scores add [B,H,Nq,Nk] (any float) of the head head[b] ([B], i32)
  /// added to the logits.
  bool hasAddScores = false;
};

/// similarity_inform's logit: <q_i, u_j> / tau, key-masked, causal.
FlashLogitSpec similarityInformLogit(double tau, bool causal, bool hasKeyMask);
/// attention_posterior's logit (the GPU kernels' form): <u_i, m_j> / sigma^2
/// + bias[b,j] (= -‖m_j‖²/(2 sigma^2)) + scores[b,head[b],i,j].
FlashLogitSpec attentionPosteriorLogit(double sigma);

/// dot / scaleDiv, then + bias() when spec.hasBias, then + addScore() when
/// spec.hasAddScores (each read when its term is added). Scalar or vector.
Value flashScaledLogit(KernelBuilder &kb, const FlashLogitSpec &spec, Value dot,
                       function_ref<Value()> bias = nullptr,
                       function_ref<Value()> addScore = nullptr);

/// Whether key j counts for row i: `inRange` (null: no padding to exclude)
/// and keyValid() (when given; a null result is no term) and, with
/// spec.causal, notAfter() (j <= i), each built when its term is joined, in
/// this order. Null when nothing excludes a key.
Value flashKeyKept(KernelBuilder &kb, const FlashLogitSpec &spec, Value inRange,
                   function_ref<Value()> keyValid,
                   function_ref<Value()> notAfter);

/// The logit of the forward kernels: flashScaledLogit, then -inf where
/// kept() (built after it; null: every key counts) is false.
Value flashLogit(KernelBuilder &kb, const FlashLogitSpec &spec, Value dot,
                 function_ref<Value()> bias, function_ref<Value()> addScore,
                 function_ref<Value()> kept);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_FLASHLOGIT_H
