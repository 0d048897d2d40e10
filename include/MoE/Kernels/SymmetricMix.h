//===- SymmetricMix.h - Similarity mixing over half the pairs ---*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// similarity_inform's logits are symmetric (q = k = u) where it has no `ws`
// and no causal mask: with n_i = |u_i|²/τ and S_ij = u_i·u_j/τ,
// Cauchy-Schwarz gives S_ij <= (n_i + n_j)/2, so
//   A_ij = exp(S_ij - n_i/2 - n_j/2) = exp(-|u_i - u_j|²/(2τ)) <= 1
// is a symmetric weight that cannot overflow, and
//   softmax_j(S_ij) e_j = Σ_j A_ij V'_j[:K] / Σ_j A_ij V'_j[K],
//   V'_j = [w_j e_j, w_j],  w_j = exp(n_j/2 - c) (0 for a masked key),
// c = max over the valid keys of n_j/2 (row i's factor exp(n_i/2 - c)
// cancels). A pair of key tiles is computed once and used twice: A_RJ V'_J
// into the rows of R and A_RJ^T V'_R into those of J, half the dot products
// and exponentials of the exact (flash) kernel, with no online max. The CPU
// kernel (MoEToCPU/FlashSymmetric.cpp) and the GPU one
// (MoEToGPU/FlashSymmetric.cpp) share the guard below: the path runs where
// every u and e of the batch element is finite, the spread max - min of
// n_j/2 over its valid keys is at most kMaxSymmetricSpread (a valid row's
// sum then holds its own term w_i >= e^-spread) and N >= kMinSymmetricRows;
// the exact kernel replaces its result where not, and where a row's sum
// comes out below kMinSymmetricSum although the element has a valid key (a
// masked row far from every key). Issue #47 item 4.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_SYMMETRICMIX_H
#define MOE_KERNELS_SYMMETRICMIX_H

#include <cstdint>

namespace mlir::moe::kernels {

/// Rows below which the exact kernel runs whatever the data (the pairs'
/// set-up does not pay).
constexpr int64_t kMinSymmetricRows = 256;
/// The largest spread of n_j/2 over a batch element's valid keys (natural
/// units).
constexpr double kMaxSymmetricSpread = 60.0;
/// A row sum below this (with a valid key in the element) sends the element
/// to the exact kernel.
constexpr double kMinSymmetricSum = 1e-30;

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_SYMMETRICMIX_H
