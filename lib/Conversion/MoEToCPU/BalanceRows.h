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

#include "Lowerings.h"

#include "MoE/Kernels/OnlineSoftmax.h"

namespace mlir::moe::cpu_lowering {

/// What a logits-row kernel (LogitsRowKernel) works on: the op's kernel,
/// the conversion's options, the sizes T (`rows`) and E (`numExperts`) of
/// `logits` [T, E], made before the kernel, and its buffer `x2` inside it.
struct LogitsRows {
  const KernelScope &kernel;
  const KernelOptions &opts;
  Value rows, numExperts, x2;
};

/// The kernel pattern of a balance op that walks the rows of its `logits`
/// operand (router_stats, router_z_loss and their backward ops). It opens
/// the op's kernel, which reads every operand of the op (logits first, as in
/// ODS), with each result sized by the trailing dimensions of [T, E] that its
/// rank takes (dlogits [T, E], per-expert rows [E], scalars); then `Body`
/// fills the outs, and the kernel replaces the op.
template <typename OpTy,
          void (*Body)(OpTy, CpuKernelBuilder &, const LogitsRows &)>
struct LogitsRowKernel : KernelPattern<OpTy> {
  using KernelPattern<OpTy>::KernelPattern;

  LogicalResult emit(OpTy op, CpuKernelBuilder &kb, PatternRewriter &rw) const final {
    Value logits = op.getLogits();
    SmallVector<Value> sz = kb.sizes(logits);
    SmallVector<SmallVector<Value>> outSizes;
    for (Type t : op->getResultTypes())
      outSizes.push_back(SmallVector<Value>(
          ArrayRef<Value>(sz).take_back(cast<ShapedType>(t).getRank())));
    KernelScope kernel(kb, SmallVector<Value>(op->getOperands()),
                       KernelScope::outsOf(op, outSizes));
    Body(op, kb, LogitsRows{kernel, this->opts, sz[0], sz[1], kb.buffer(logits)});
    kernel.replace(rw, op);
    return success();
  }
};

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

} // namespace mlir::moe::cpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOCPU_BALANCEROWS_H
