//===- SequenceBalanceLoss.cpp - moe.sequence_balance_loss (+ grad) -> linalg
//
// Part of the MoE-MLIR project.
//
// The portable lowerings of DeepSeek-V3's sequence-wise balance loss and its
// gradient (maths in MoEBalanceOps.td): over [B, S, E], the row sums z, the
// slot counts per sequence and expert (a reduction over [B, S, k, E]; an
// index outside [0, E) matches no expert), f = count · E / (k·S)
// (MoE/Kernels/Balance.h), then the loss Σ_{b,e} f · Σ_t (s / z) / S / B, or
// the gradient dloss / (B·S) · (f - Σ_e s f / z) / z.
//
//===----------------------------------------------------------------------===//

#include "BalanceGenerics.h"
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;
using kernels::KernelBuilder;

namespace {
/// What both lowerings compute first.
struct SequenceStats {
  Value s;          // scores in f32 [B, S, E]
  Value z;          // Σ_e s [B, S]
  Value f;          // the fractions f [B, E]
  Value batch, seq; // B and S as f32
  SmallVector<OpFoldResult> sizes;
};

SequenceStats sequenceStats(PatternRewriter &rw, Location loc, Value scores,
                            Value indices) {
  SequenceStats q;
  q.s = promoteToF32(rw, loc, scores);
  q.sizes = sizesOf(rw, loc, q.s);
  q.batch = dimF32(rw, loc, q.s, 0);
  q.seq = dimF32(rw, loc, q.s, 1);
  Value experts = dimF32(rw, loc, q.s, 2);
  Value sel = dimF32(rw, loc, indices, 2);
  Value factor = arith::DivFOp::create(
      rw, loc, experts, arith::MulFOp::create(rw, loc, sel, q.seq));
  BalanceGenerics g3(rw, loc, 3), g4(rw, loc, 4), g2(rw, loc, 2);
  q.z =
      g3.run({q.s}, g3.fill({q.sizes[0], q.sizes[1]}, 0.0),
             {g3.map({0, 1, 2}), g3.map({0, 1})}, {2},
             [](KernelBuilder &kb, ValueRange a) { return kb.fadd(a[1], a[0]); });
  // counts[b, e] = Σ_{t, j} [indices[b, t, j] = e], over [B, S, k, E].
  Value counts =
      g4.run({indices}, g4.fill({q.sizes[0], q.sizes[2]}, 0.0),
             {g4.map({0, 1, 2}), g4.map({0, 3})}, {1, 2},
             [](KernelBuilder &kb, ValueRange a) {
               Value e =
                   kb.castInt(loopIndex(kb.b, kb.b.getLoc(), 3), a[0].getType());
               return kb.select(kb.eq(a[0], e), kb.fadd(a[1], kb.cF32(1.0)), a[1]);
             });
  AffineMap be = g2.map({0, 1});
  q.f = g2.run({counts},
               tensor::EmptyOp::create(
                   rw, loc, ArrayRef<OpFoldResult>{q.sizes[0], q.sizes[2]},
                   rw.getF32Type()),
               {be, be}, {}, [&](KernelBuilder &kb, ValueRange a) {
                 return kernels::sequenceFraction(kb, a[0], factor);
               });
  return q;
}
} // namespace

LogicalResult
linalg_lowering::lowerSequenceBalanceLoss(SequenceBalanceLossOp op,
                                          PatternRewriter &rw) {
  Location loc = op.getLoc();
  SequenceStats q = sequenceStats(rw, loc, op.getScores(), op.getIndices());
  BalanceGenerics g3(rw, loc, 3), g2(rw, loc, 2);
  // Σ_t s / z per sequence and expert, tokens in order.
  Value probSum = g3.run({q.s, q.z}, g3.fill({q.sizes[0], q.sizes[2]}, 0.0),
                         {g3.map({0, 1, 2}), g3.map({0, 1}), g3.map({0, 2})},
                         {1}, [](KernelBuilder &kb, ValueRange a) {
                           return kb.fadd(a[2], kb.fdiv(a[0], a[1]));
                         });
  Value seq = q.seq;
  Value sum = g2.run({q.f, probSum}, g2.fill({}, 0.0),
                     {g2.map({0, 1}), g2.map({0, 1}), g2.map({})}, {0, 1},
                     [&](KernelBuilder &kb, ValueRange a) {
                       return kb.fadd(a[2], kb.fmul(a[0], kb.fdiv(a[1], seq)));
                     });
  Value loss = scalarGeneric(rw, loc, sum, [&](KernelBuilder &kb, Value s) {
    return kb.fdiv(s, q.batch);
  });
  replaceWithCasts(rw, op, loss);
  return success();
}

LogicalResult
linalg_lowering::lowerSequenceBalanceLossGrad(SequenceBalanceLossGradOp op,
                                              PatternRewriter &rw) {
  Location loc = op.getLoc();
  SequenceStats q = sequenceStats(rw, loc, op.getScores(), op.getIndices());
  BalanceGenerics g3(rw, loc, 3);
  AffineMap bte = g3.map({0, 1, 2}), bt = g3.map({0, 1}), be = g3.map({0, 2}),
            scalar = g3.map({});
  // c = Σ_e s · f / z.
  Value sf = g3.run({q.s, q.f}, g3.fill({q.sizes[0], q.sizes[1]}, 0.0),
                    {bte, be, bt}, {2}, [](KernelBuilder &kb, ValueRange a) {
                      return kb.fadd(a[2], kb.fmul(a[0], a[1]));
                    });
  Value batch = q.batch, seq = q.seq;
  Value out = g3.run({q.f, sf, q.z, op.getDloss()},
                     tensor::EmptyOp::create(rw, loc, q.sizes, rw.getF32Type()),
                     {be, bt, bt, scalar, bte}, {},
                     [&](KernelBuilder &kb, ValueRange a) {
                       Value scale = kb.fdiv(a[3], kb.fmul(batch, seq));
                       return kernels::sequenceBalanceGradEntry(
                           kb, a[0], kb.fdiv(a[1], a[2]), a[2], scale);
                     });
  replaceWithCasts(rw, op, out);
  return success();
}
