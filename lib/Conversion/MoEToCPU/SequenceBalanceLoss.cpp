//===- SequenceBalanceLoss.cpp - moe.sequence_balance_loss (+ grad) -> CPU
//-===//
//
// Part of the MoE-MLIR project.
//
// The forward and backward kernels of DeepSeek-V3's sequence-wise loss. The
// sequences go to the workers (one item each). Per sequence: its slot counts
// per expert (f = count · E / (k·S), MoE/Kernels/Balance.h; an index outside
// [0, E) counts for none), then
// * forward: P = Σ_t s_t / Σ_e s_te (rows in order) / S and the sequence's
//   Σ_e f·P into its own partial; the calling thread sums the partials in
//   sequence order and divides by B (the same bits for any thread count);
// * backward: per row, z = Σ_e s, c = Σ_e s·f / z and
//   dscores = dloss / (B·S) · (f - c) / z.
//
//===----------------------------------------------------------------------===//

#include "BalanceRows.h"
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

namespace mlir::moe::cpu_lowering {
using namespace kernels;

namespace {
/// The operands of both ops, as buffers, and the per-worker scratch rows.
struct SequenceRows {
  CpuKernelBuilder &kb;
  Value s3, i3, batch, seq, numExperts, numSel, padded;

  SequenceRows(CpuKernelBuilder &kb, Value scores, Value indices) : kb(kb) {
    s3 = kb.buffer(scores);
    i3 = kb.buffer(indices);
    SmallVector<Value> ss = kb.sizes(s3), is = kb.sizes(i3);
    batch = ss[0];
    seq = ss[1];
    numExperts = ss[2];
    numSel = is[2];
    padded = roundUp(kb, numExperts, kb.lanes());
  }

  Value f32(Value index) { return indexToF32(kb, index); }

  Value chunks() { return kb.divu(padded, kb.idx(kb.lanes())); }
  void eachChunk(function_ref<void(Value base)> body) {
    eachLaneChunk(kb, chunks(), body);
  }
  Value rowSum(function_ref<Value(Value base)> f) {
    return laneChunkSum(kb, chunks(), f);
  }
  /// Row t of sequence b (0 past E).
  Value scores(Value b, Value t, Value base) {
    return kb.vloadMasked(s3, {b, t, base}, kb.sub(numExperts, base), 0.0);
  }

  /// f of sequence b into `frac` ([padded] f32, 0 past E).
  void fractions(Value b, Value frac) {
    Value zero = kb.constLike(kb.vf32(), 0.0);
    eachChunk([&](Value base) { kb.vstore(zero, frac, {base}); });
    Value c0 = kb.idx(0), c1 = kb.idx(1);
    kb.forLoop(c0, seq, c1, [&](Value t) {
      kb.forLoop(c0, numSel, c1, [&](Value j) {
        Value e = kb.castInt(kb.load(i3, {b, t, j}), kb.index());
        Value in = kb.andI(kb.cmpi(arith::CmpIPredicate::sge, e, c0),
                          kb.lt(e, numExperts));
        kb.ifThen(in, [&] {
          kb.store(kb.fadd(kb.load(frac, {e}), kb.cF32(1.0)), frac, {e});
        });
      });
    });
    Value factor = kb.fdiv(f32(numExperts), kb.fmul(f32(numSel), f32(seq)));
    eachChunk([&](Value base) {
      kb.vstore(sequenceFraction(kb, kb.vload(frac, {base}), factor), frac,
               {base});
    });
  }
};

} // namespace

template <>
LogicalResult CPUKernel<SequenceBalanceLossOp>::emit(
    SequenceBalanceLossOp op, CpuKernelBuilder &kb, PatternRewriter &rw) const {
  KernelScope kernel(kb, {op.getScores(), op.getIndices()},
                     KernelScope::outsOf(op, {{}}));
  SequenceRows q(kb, op.getScores(), op.getIndices());
  auto rowType = MemRefType::get({kDyn}, kb.f32());
  Value fracs = kb.scratch(opts, rowType, {q.padded});
  Value probs = kb.scratch(opts, rowType, {q.padded});
  Value partial = kb.alloc(rowType, {q.batch});
  Value zero = kb.constLike(kb.vf32(), 0.0);
  kb.workers(opts, q.batch, [&](Value b, Value worker) {
    Value frac = kb.workerSlice(fracs, worker);
    Value prob = kb.workerSlice(probs, worker);
    q.fractions(b, frac);
    q.eachChunk([&](Value base) { kb.vstore(zero, prob, {base}); });
    kb.forLoop(kb.idx(0), q.seq, kb.idx(1), [&](Value t) {
      Value z = q.rowSum([&](Value base) { return q.scores(b, t, base); });
      Value zV = kb.splat(z, kb.lanes());
      q.eachChunk([&](Value base) {
        Value p =
            kb.fadd(kb.vload(prob, {base}), kb.fdiv(q.scores(b, t, base), zV));
        kb.vstore(p, prob, {base});
      });
    });
    Value seqV = kb.splat(q.f32(q.seq), kb.lanes());
    Value loss = q.rowSum([&](Value base) {
      return kb.fmul(kb.vload(frac, {base}),
                    kb.fdiv(kb.vload(prob, {base}), seqV));
    });
    kb.store(loss, partial, {b});
  });
  Value total = sumInOrder(kb, partial, q.batch);
  kb.store(kb.fdiv(total, q.f32(q.batch)), kernel.out(0), {});
  kernel.replace(rw, op);
  return success();
}

template <>
LogicalResult
CPUKernel<SequenceBalanceLossGradOp>::emit(SequenceBalanceLossGradOp op,
                                           CpuKernelBuilder &kb,
                                           PatternRewriter &rw) const {
  KernelScope kernel(kb, {op.getScores(), op.getIndices(), op.getDloss()},
                     KernelScope::outsOf(op, {kb.sizes(op.getScores())}));
  SequenceRows q(kb, op.getScores(), op.getIndices());
  Value out = kernel.out(0);
  Value dloss = kb.load(kb.buffer(op.getDloss()), {});
  Value scale = kb.fdiv(dloss, kb.fmul(q.f32(q.batch), q.f32(q.seq)));
  Value fracs = kb.scratch(opts, MemRefType::get({kDyn}, kb.f32()), {q.padded});
  kb.workers(opts, q.batch, [&](Value b, Value worker) {
    Value frac = kb.workerSlice(fracs, worker);
    q.fractions(b, frac);
    kb.forLoop(kb.idx(0), q.seq, kb.idx(1), [&](Value t) {
      Value z = q.rowSum([&](Value base) { return q.scores(b, t, base); });
      Value c = kb.fdiv(q.rowSum([&](Value base) {
        return kb.fmul(q.scores(b, t, base), kb.vload(frac, {base}));
      }),
                       z);
      q.eachChunk([&](Value base) {
        Value d =
            sequenceBalanceGradEntry(kb, kb.vload(frac, {base}), c, z, scale);
        kb.vstoreMasked(d, out, {b, t, base}, kb.sub(q.numExperts, base));
      });
    });
  });
  kernel.replace(rw, op);
  return success();
}

} // namespace mlir::moe::cpu_lowering
