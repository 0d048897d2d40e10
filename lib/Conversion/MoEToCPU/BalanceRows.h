//===- BalanceRows.h - Row pieces of the load-balancing kernels -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// What the CPU kernels of the balance ops (RouterStats.cpp, RouterZLoss.cpp,
// SequenceBalanceLoss.cpp and their backward files) share: the log-space row
// softmax on vector lanes (two lane-wise passes, max then Σ exp, giving the
// state of MoE/Kernels/OnlineSoftmax.h), the loops over a row's lane chunks,
// and the fixed row blocks of their token reductions (MoE/Kernels/Balance.h)
// whose partials are summed in block order.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_BALANCEROWS_H
#define MOE_LIB_CONVERSION_MOETOCPU_BALANCEROWS_H

#include "KernelBuilder.h"

#include "MoE/Kernels/OnlineSoftmax.h"

namespace mlir::moe::cpu {

/// Lane chunk `base` (index) of row `r` of `x2` ([rows, E], any float type)
/// in f32, `pad` past E.
Value balanceChunk(CpuKernelBuilder &kb, Value x2, Value r, Value base, Value numExperts,
                   double pad);

/// The softmax state ({max, Σ exp(x - max)}) of row `r` of `x2`.
/// With `exps` (an f32 buffer of the row's lane chunks), exp(x - max) is
/// also stored there (-inf padding gives 0), so p = exps / Σ needs no exp.
kernels::SoftmaxState balanceRowSoftmax(CpuKernelBuilder &kb, Value x2, Value r,
                                        Value numExperts, Value exps = {});

/// Runs body(chunk base) for each of `chunks` lane chunks (index).
void eachLaneChunk(CpuKernelBuilder &kb, Value chunks, function_ref<void(Value base)> body);

/// A vector accumulation over `chunks` lane chunks: Σ_chunks f(base),
/// reduced to a scalar.
Value laneChunkSum(CpuKernelBuilder &kb, Value chunks, function_ref<Value(Value)> f);

/// eachLaneChunk over the lane chunks of a row of `numExperts`.
void balanceEachChunk(CpuKernelBuilder &kb, Value numExperts,
                      function_ref<void(Value base)> body);

/// laneChunkSum over the lane chunks of a row of `numExperts`.
Value balanceRowSum(CpuKernelBuilder &kb, Value numExperts, function_ref<Value(Value)> f);

/// The row range [r0, r1) of block `block` of kBalanceRowsPerBlock rows.
std::pair<Value, Value> balanceBlockRows(CpuKernelBuilder &kb, Value block, Value rows);

/// Runs body(r) for the rows of block `block`, in order.
void balanceEachBlockRow(CpuKernelBuilder &kb, Value block, Value rows,
                         function_ref<void(Value r)> body);

/// Σ f(r) (f32 scalars) over the rows of block `block`, in row order.
Value balanceBlockRowSum(CpuKernelBuilder &kb, Value block, Value rows,
                         function_ref<Value(Value r)> f);

/// The blocks of kBalanceRowsPerBlock rows covering `rows`.
Value balanceBlocks(CpuKernelBuilder &kb, Value rows);

/// Σ_{i < n} buf[i] (f32 partials, one per row block or sequence) in index
/// order, on the calling thread: the same bits for any thread count.
Value sumInOrder(CpuKernelBuilder &kb, Value buf, Value n);

/// `index` (a count) as f32.
Value indexToF32(CpuKernelBuilder &kb, Value index);

} // namespace mlir::moe::cpu

#endif // MOE_LIB_CONVERSION_MOETOCPU_BALANCEROWS_H
