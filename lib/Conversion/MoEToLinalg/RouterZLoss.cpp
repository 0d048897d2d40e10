//===- RouterZLoss.cpp - moe.router_z_loss (+ grad) -> linalg -------------===//
//
// Part of the MoE-MLIR project.
//
// The portable lowerings of the router z-loss and its gradient (maths in
// MoEBalanceOps.td): the row log-sum-exp from the row softmax statistics
// (RouterStats.cpp, log space), Σ lse² over the tokens in order / T, and
// dlogits = (2 dloss / T) · lse · exp(x - lse) (MoE/Kernels/Balance.h).
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
/// The row log-sum-exps [T] of `x` (-inf for a row of -inf).
Value rowLse(PatternRewriter &rw, Location loc, Value x) {
  RowSoftmax row = rowSoftmax(rw, loc, x);
  BalanceGenerics g1(rw, loc, 1);
  AffineMap id = g1.map({0});
  return g1.run({row.max, row.sum},
                tensor::EmptyOp::create(
                    rw, loc, ArrayRef<OpFoldResult>{sizesOf(rw, loc, x)[0]},
                    rw.getF32Type()),
                {id, id, id}, {}, [](KernelBuilder &kb, ValueRange a) {
                  return kernels::softmaxLogSumExp(kb, {a[0], a[1]});
                });
}
} // namespace

LogicalResult linalg_lowering::lowerRouterZLoss(RouterZLossOp op,
                                                PatternRewriter &rw) {
  Location loc = op.getLoc();
  Value x = promoteToF32(rw, loc, op.getLogits());
  Value lse = rowLse(rw, loc, x);
  BalanceGenerics g1(rw, loc, 1);
  Value sum = g1.run({lse}, g1.fill({}, 0.0), {g1.map({0}), g1.map({})}, {0},
                     [](KernelBuilder &kb, ValueRange a) {
                       return kb.fadd(a[1], kb.fmul(a[0], a[0]));
                     });
  Value tokens = dimF32(rw, loc, x, 0);
  Value loss = scalarGeneric(rw, loc, sum, [&](KernelBuilder &kb, Value s) {
    return kb.fdiv(s, tokens);
  });
  replaceWithCasts(rw, op, loss);
  return success();
}

LogicalResult linalg_lowering::lowerRouterZLossGrad(RouterZLossGradOp op,
                                                    PatternRewriter &rw) {
  Location loc = op.getLoc();
  Value x = promoteToF32(rw, loc, op.getLogits());
  Value lse = rowLse(rw, loc, x);
  Value tokens = dimF32(rw, loc, x, 0);
  BalanceGenerics g2(rw, loc, 2);
  AffineMap te = g2.map({0, 1}), t = g2.map({0}), scalar = g2.map({});
  Value out = g2.run(
      {x, lse, op.getDloss()},
      tensor::EmptyOp::create(rw, loc, sizesOf(rw, loc, x), rw.getF32Type()),
      {te, t, scalar, te}, {}, [&](KernelBuilder &kb, ValueRange a) {
        Value scale = kb.fdiv(kb.fmul(kb.cF32(2.0), a[2]), tokens);
        Value p = kernels::softmaxFromLogSumExp(kb, a[0], a[1]);
        return kernels::zLossGradEntry(kb, p, a[1], scale);
      });
  replaceWithCasts(rw, op, out);
  return success();
}
