//===- Balance.h - The load-balancing statistics and losses, once -*- C++
//-*-===//
//
// Part of the MoE-MLIR project.
//
// The maths of moe.router_stats, moe.router_z_loss, moe.sequence_balance_loss
// and their backward ops (MoEBalanceOps.td), shared by every kernel that
// computes them (the CPU kernels on vector lanes; a GPU kernel on a thread's
// scalars). The row softmax is the online-softmax step of OnlineSoftmax.h
// (log space: p = exp(x - lse)); the selection is the dialect's top-k order
// of TopK.h.
//
// Determinism. A sum over tokens is never a per-thread partial: the tokens
// are cut into blocks of kBalanceRowsPerBlock rows (a constant, whatever the
// thread count), each block sums its rows in row order into its own partial,
// and the partials are then summed in block order. Any assignment of blocks
// to threads (CPU workers, GPU thread blocks) gives the same bits.
//
// Every function takes scalars or vectors (lane-wise); scalar operands are
// broadcast to the shape of the first vector operand where noted.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_KERNELS_BALANCE_H
#define MOE_KERNELS_BALANCE_H

#include "MoE/Kernels/OnlineSoftmax.h"

namespace mlir::moe::kernels {

/// Rows per block of the token reductions (router_stats, router_z_loss).
constexpr int64_t kBalanceRowsPerBlock = 64;

/// The shift s with p = exp(x - s) = softmax(x) for a finished row state:
/// the log-sum-exp, or +inf for a row without a finite logit (every logit
/// -inf: l = 0), whose probabilities are then 0, never NaN (moe.topk_renorm's
/// rule). NaN rows keep a NaN shift (p = NaN).
Value balanceProbShift(KernelBuilder &kb, SoftmaxState row);

/// router_stats_grad at one entry: scale · p · (g - c), with scale = w_t / W
/// and c = Σ_j p_j g_j of the row (scalars broadcast to p's shape).
Value routerStatsGradEntry(KernelBuilder &kb, Value p, Value g, Value c,
                           Value scale);

/// router_z_loss_grad at one entry: scale · lse · p, with scale = 2 dloss / T
/// (p = exp(x - lse): NaN for a row of -inf, as PyTorch's autograd).
Value zLossGradEntry(KernelBuilder &kb, Value p, Value lse, Value scale);

/// The per-sequence expert fraction of sequence_balance_loss from its slot
/// count: f = count · E / (k · S) (`factor` = E / (k · S)).
Value sequenceFraction(KernelBuilder &kb, Value count, Value factor);

/// sequence_balance_loss_grad at one entry: scale · (f - c) / z, with
/// scale = dloss / (B · S), z = Σ_e s_e and c = Σ_e s_e f_e / z of the row.
Value sequenceBalanceGradEntry(KernelBuilder &kb, Value f, Value c, Value z,
                               Value scale);

} // namespace mlir::moe::kernels

#endif // MOE_KERNELS_BALANCE_H
