//===- RouterStats.cpp - moe.router_stats (+ grad, Switch loss) -> linalg -===//
//
// Part of the MoE-MLIR project.
//
// The portable lowerings of moe.router_stats, moe.router_stats_grad and
// moe.load_balancing_loss (maths in MoEBalanceOps.td): linalg.generic chains
// over [T, E] whose bodies are the shared formulas (MoE/Kernels/Balance.h,
// OnlineSoftmax.h): the row max and Σ exp (log space), the probability
// shift, then the per-expert sums as reductions over the tokens in token
// order. The selection is moe.topk_renorm's indices (the op is created here
// and lowered by its own pattern: one top-k order in the dialect), counted by
// a reduction over [T, k, E].
//
//===----------------------------------------------------------------------===//

#include "BalanceGenerics.h"
#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/Balance.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;
using kernels::KernelBuilder;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
} // namespace

RowSoftmax mlir::moe::linalg_lowering::rowSoftmax(PatternRewriter &rw,
                                                  Location loc, Value x) {
  SmallVector<OpFoldResult> sizes = sizesOf(rw, loc, x);
  BalanceGenerics g2(rw, loc, 2), g1(rw, loc, 1);
  AffineMap te = g2.map({0, 1}), t = g2.map({0});
  RowSoftmax r;
  r.max =
      g2.run({x}, g2.fill({sizes[0]}, -kInf), {te, t}, {1},
             [](KernelBuilder &kb, ValueRange a) { return kb.fmax(a[1], a[0]); });
  r.sum = g2.run({x, r.max}, g2.fill({sizes[0]}, 0.0), {te, t, t}, {1},
                 [](KernelBuilder &kb, ValueRange a) {
                   Value none = kb.cmpf(arith::CmpFPredicate::OEQ, a[1],
                                       kb.negInfLike(kb.f32()));
                   Value shift = kb.select(none, kb.cF32(0.0), a[1]);
                   return kb.fadd(a[2], kb.exp(kb.fsub(a[0], shift)));
                 });
  AffineMap id = g1.map({0});
  r.shift =
      g1.run({r.max, r.sum},
             tensor::EmptyOp::create(rw, loc, ArrayRef<OpFoldResult>{sizes[0]},
                                     rw.getF32Type()),
             {id, id, id}, {}, [](KernelBuilder &kb, ValueRange a) {
               return kernels::balanceProbShift(kb, {a[0], a[1]});
             });
  return r;
}

namespace {
/// The token weights [T] (f32): the mask, or ones.
Value tokenWeights(PatternRewriter &rw, Location loc, Value mask,
                   OpFoldResult tokens) {
  if (mask)
    return promoteToF32(rw, loc, mask);
  return filled(rw, loc, {tokens}, f32Const(rw, loc, 1.0));
}

/// What both router_stats lowerings compute first: the logits in f32, their
/// sizes [T, E], the row softmax and the token weights.
struct RouterRows {
  Value x;
  SmallVector<OpFoldResult> sizes;
  RowSoftmax row;
  Value w;
};

RouterRows routerRows(PatternRewriter &rw, Location loc, Value logits,
                      Value mask) {
  RouterRows q;
  q.x = promoteToF32(rw, loc, logits);
  q.sizes = sizesOf(rw, loc, q.x);
  q.row = rowSoftmax(rw, loc, q.x);
  q.w = tokenWeights(rw, loc, mask, q.sizes[0]);
  return q;
}

/// Σ_t w_t (rank 0).
Value weightSum(PatternRewriter &rw, Location loc, Value w) {
  BalanceGenerics g1(rw, loc, 1);
  return g1.run(
      {w}, g1.fill({}, 0.0), {g1.map({0}), g1.map({})}, {0},
      [](KernelBuilder &kb, ValueRange a) { return kb.fadd(a[1], a[0]); });
}
} // namespace

LogicalResult linalg_lowering::lowerRouterStats(RouterStatsOp op,
                                                PatternRewriter &rw) {
  Location loc = op.getLoc();
  auto [x, sizes, row, w] =
      routerRows(rw, loc, op.getLogits(), op.getTokenMask());
  BalanceGenerics g2(rw, loc, 2), g1(rw, loc, 1), g3(rw, loc, 3);
  AffineMap te = g2.map({0, 1}), t = g2.map({0}), e = g2.map({1});
  // Σ_t w_t p_te, tokens in order.
  Value probSum =
      g2.run({x, row.shift, w}, g2.fill({sizes[1]}, 0.0), {te, t, t, e}, {0},
             [](KernelBuilder &kb, ValueRange a) {
               Value p = kernels::softmaxFromLogSumExp(kb, a[0], a[1]);
               return kb.fadd(a[3], kb.fmul(a[2], p));
             });
  Value total = weightSum(rw, loc, w);
  // counts_e = Σ_t w_t [e ∈ sel_t], over [T, k, E].
  Value indices =
      TopkRenormOp::create(rw, loc, op.getLogits(), op.getK()).getIndices();
  Value counts =
      g3.run({indices, w}, g3.fill({sizes[1]}, 0.0),
             {g3.map({0, 1}), g3.map({0}), g3.map({2})}, {0, 1},
             [](KernelBuilder &kb, ValueRange a) {
               Value expert =
                   kb.castInt(loopIndex(kb.b, kb.b.getLoc(), 2), kb.i32());
               return kb.select(kb.eq(a[0], expert), kb.fadd(a[2], a[1]), a[2]);
             });
  AffineMap id = g1.map({0}), scalar = g1.map({});
  Value meanProbs =
      g1.run({probSum, total},
             tensor::EmptyOp::create(rw, loc, ArrayRef<OpFoldResult>{sizes[1]},
                                     rw.getF32Type()),
             {id, scalar, id}, {},
             [](KernelBuilder &kb, ValueRange a) { return kb.fdiv(a[0], a[1]); });
  replaceWithCasts(rw, op, {counts, meanProbs, total});
  return success();
}

LogicalResult linalg_lowering::lowerRouterStatsGrad(RouterStatsGradOp op,
                                                    PatternRewriter &rw) {
  Location loc = op.getLoc();
  auto [x, sizes, row, w] =
      routerRows(rw, loc, op.getLogits(), op.getTokenMask());
  Value g = op.getDmeanProbs();
  BalanceGenerics g2(rw, loc, 2);
  AffineMap te = g2.map({0, 1}), t = g2.map({0}), e = g2.map({1}),
            scalar = g2.map({});
  // c_t = Σ_e p_te g_e.
  Value c = g2.run({x, row.shift, g}, g2.fill({sizes[0]}, 0.0), {te, t, e, t},
                   {1}, [](KernelBuilder &kb, ValueRange a) {
                     Value p = kernels::softmaxFromLogSumExp(kb, a[0], a[1]);
                     return kb.fadd(a[3], kb.fmul(p, a[2]));
                   });
  Value out = g2.run({x, row.shift, g, c, w, op.getWeightSum()},
                     tensor::EmptyOp::create(rw, loc, sizes, rw.getF32Type()),
                     {te, t, e, t, t, scalar, te}, {},
                     [](KernelBuilder &kb, ValueRange a) {
                       Value p = kernels::softmaxFromLogSumExp(kb, a[0], a[1]);
                       return kernels::routerStatsGradEntry(kb, p, a[2], a[3],
                                                            kb.fdiv(a[4], a[5]));
                     });
  replaceWithCasts(rw, op, out);
  return success();
}

LogicalResult linalg_lowering::lowerLoadBalancingLoss(LoadBalancingLossOp op,
                                                      PatternRewriter &rw) {
  Location loc = op.getLoc();
  BalanceGenerics g1(rw, loc, 1);
  AffineMap id = g1.map({0}), scalar = g1.map({});
  Value experts = dimF32(rw, loc, op.getCounts(), 0);
  // Σ_e (counts_e / W) · P_e in expert order, then · E (transformers' order).
  Value sum = g1.run({op.getCounts(), op.getMeanProbs(), op.getWeightSum()},
                     g1.fill({}, 0.0), {id, id, scalar, scalar}, {0},
                     [](KernelBuilder &kb, ValueRange a) {
                       return kb.fadd(a[3], kb.fmul(kb.fdiv(a[0], a[2]), a[1]));
                     });
  Value loss = scalarGeneric(rw, loc, sum, [&](KernelBuilder &kb, Value s) {
    return kb.fmul(s, experts);
  });
  replaceWithCasts(rw, op, loss);
  return success();
}
