//===- BalanceRows.h - Row pieces of the load-balancing kernels -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// What the CPU kernels of the balance ops (RouterStats.cpp, RouterZLoss.cpp,
// SequenceBalanceLoss.cpp and their backward files) share: the log-space row
// softmax on vector lanes (two lane-wise passes, max then Σ exp, giving the
// state of MoE/Kernels/OnlineSoftmax.h) and the fixed row blocks of their token
// reductions (MoE/Kernels/Balance.h).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_BALANCEROWS_H
#define MOE_LIB_CONVERSION_MOETOCPU_BALANCEROWS_H

#include "KernelBuilder.h"

#include "MoE/Kernels/OnlineSoftmax.h"

namespace mlir::moe::cpu {

/// Lane chunk `base` (index) of row `r` of `x2` ([rows, E], any float type)
/// in f32, `pad` past E.
Value balanceChunk(CK &k, Value x2, Value r, Value base, Value numExperts,
                   double pad);

/// The softmax state ({max, Σ exp(x - max)}) of row `r` of `x2`.
/// With `exps` (an f32 buffer of the row's lane chunks), exp(x - max) is
/// also stored there (-inf padding gives 0), so p = exps / Σ needs no exp.
kernels::SoftmaxState balanceRowSoftmax(CK &k, Value x2, Value r,
                                        Value numExperts, Value exps = {});

/// Runs body(chunk base) for every lane chunk of a row of `numExperts`.
void balanceEachChunk(CK &k, Value numExperts,
                      function_ref<void(Value base)> body);

/// A vector accumulation over the lane chunks of a row: Σ_chunks f(base),
/// reduced to a scalar.
Value balanceRowSum(CK &k, Value numExperts, function_ref<Value(Value)> f);

/// The row range [r0, r1) of block `block` of kBalanceRowsPerBlock rows.
std::pair<Value, Value> balanceBlockRows(CK &k, Value block, Value rows);

/// The blocks of kBalanceRowsPerBlock rows covering `rows`.
Value balanceBlocks(CK &k, Value rows);

} // namespace mlir::moe::cpu

#endif // MOE_LIB_CONVERSION_MOETOCPU_BALANCEROWS_H
