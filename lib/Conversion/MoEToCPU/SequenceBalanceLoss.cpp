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
#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

namespace mlir::moe::cpu {
using namespace kernels;

namespace {
/// The operands of both ops, as buffers, and the per-worker scratch rows.
struct SequenceRows {
  CK &k;
  Value s3, i3, batch, seq, numExperts, numSel, padded;

  SequenceRows(CK &k, Value scores, Value indices) : k(k) {
    s3 = k.buffer(scores);
    i3 = k.buffer(indices);
    SmallVector<Value> ss = k.sizes(s3), is = k.sizes(i3);
    batch = ss[0];
    seq = ss[1];
    numExperts = ss[2];
    numSel = is[2];
    padded = roundUp(k, numExperts, k.lanes());
  }

  Value f32(Value index) { return indexToF32(k, index); }

  Value chunks() { return k.divu(padded, k.idx(k.lanes())); }
  void eachChunk(function_ref<void(Value base)> body) {
    eachLaneChunk(k, chunks(), body);
  }
  Value rowSum(function_ref<Value(Value base)> f) {
    return laneChunkSum(k, chunks(), f);
  }
  /// Row t of sequence b (0 past E).
  Value scores(Value b, Value t, Value base) {
    return k.vloadMasked(s3, {b, t, base}, k.sub(numExperts, base), 0.0);
  }

  /// f of sequence b into `frac` ([padded] f32, 0 past E).
  void fractions(Value b, Value frac) {
    Value zero = k.constLike(k.vf32(), 0.0);
    eachChunk([&](Value base) { k.vstore(zero, frac, {base}); });
    Value c0 = k.idx(0), c1 = k.idx(1);
    k.forLoop(c0, seq, c1, [&](Value t) {
      k.forLoop(c0, numSel, c1, [&](Value j) {
        Value e = k.castInt(k.load(i3, {b, t, j}), k.index());
        Value in = k.andI(k.cmpi(arith::CmpIPredicate::sge, e, c0),
                          k.lt(e, numExperts));
        k.ifThen(in, [&] {
          k.store(k.fadd(k.load(frac, {e}), k.cF32(1.0)), frac, {e});
        });
      });
    });
    Value factor = k.fdiv(f32(numExperts), k.fmul(f32(numSel), f32(seq)));
    eachChunk([&](Value base) {
      k.vstore(sequenceFraction(k, k.vload(frac, {base}), factor), frac,
               {base});
    });
  }
};

struct SequenceBalanceLossKernel : KernelPattern<SequenceBalanceLossOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(SequenceBalanceLossOp op, CK &k,
                     PatternRewriter &rw) const override {
    KernelScope kernel(k, {op.getScores(), op.getIndices()},
                       KernelScope::outsOf(op, {{}}));
    SequenceRows q(k, op.getScores(), op.getIndices());
    auto rowType = MemRefType::get({kDyn}, k.f32());
    Value fracs = k.scratch(opts, rowType, {q.padded});
    Value probs = k.scratch(opts, rowType, {q.padded});
    Value partial = k.alloc(rowType, {q.batch});
    Value zero = k.constLike(k.vf32(), 0.0);
    k.workers(opts, q.batch, [&](Value b, Value worker) {
      Value frac = k.workerSlice(fracs, worker);
      Value prob = k.workerSlice(probs, worker);
      q.fractions(b, frac);
      q.eachChunk([&](Value base) { k.vstore(zero, prob, {base}); });
      k.forLoop(k.idx(0), q.seq, k.idx(1), [&](Value t) {
        Value z = q.rowSum([&](Value base) { return q.scores(b, t, base); });
        Value zV = k.splat(z, k.lanes());
        q.eachChunk([&](Value base) {
          Value p =
              k.fadd(k.vload(prob, {base}), k.fdiv(q.scores(b, t, base), zV));
          k.vstore(p, prob, {base});
        });
      });
      Value seqV = k.splat(q.f32(q.seq), k.lanes());
      Value loss = q.rowSum([&](Value base) {
        return k.fmul(k.vload(frac, {base}),
                      k.fdiv(k.vload(prob, {base}), seqV));
      });
      k.store(loss, partial, {b});
    });
    Value total = sumInOrder(k, partial, q.batch);
    k.store(k.fdiv(total, q.f32(q.batch)), kernel.out(0), {});
    kernel.replace(rw, op);
    return success();
  }
};

struct SequenceBalanceLossGradKernel
    : KernelPattern<SequenceBalanceLossGradOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(SequenceBalanceLossGradOp op, CK &k,
                     PatternRewriter &rw) const override {
    KernelScope kernel(k, {op.getScores(), op.getIndices(), op.getDloss()},
                       KernelScope::outsOf(op, {k.sizes(op.getScores())}));
    SequenceRows q(k, op.getScores(), op.getIndices());
    Value out = kernel.out(0);
    Value dloss = k.load(k.buffer(op.getDloss()), {});
    Value scale = k.fdiv(dloss, k.fmul(q.f32(q.batch), q.f32(q.seq)));
    Value fracs = k.scratch(opts, MemRefType::get({kDyn}, k.f32()), {q.padded});
    k.workers(opts, q.batch, [&](Value b, Value worker) {
      Value frac = k.workerSlice(fracs, worker);
      q.fractions(b, frac);
      k.forLoop(k.idx(0), q.seq, k.idx(1), [&](Value t) {
        Value z = q.rowSum([&](Value base) { return q.scores(b, t, base); });
        Value c = k.fdiv(q.rowSum([&](Value base) {
          return k.fmul(q.scores(b, t, base), k.vload(frac, {base}));
        }),
                         z);
        q.eachChunk([&](Value base) {
          Value d =
              sequenceBalanceGradEntry(k, k.vload(frac, {base}), c, z, scale);
          k.vstoreMasked(d, out, {b, t, base}, k.sub(q.numExperts, base));
        });
      });
    });
    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateSequenceBalanceLossKernel,
                        SequenceBalanceLossKernel,
                        SequenceBalanceLossGradKernel)

} // namespace mlir::moe::cpu
