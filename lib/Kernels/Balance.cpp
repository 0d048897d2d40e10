//===- Balance.cpp - The load-balancing statistics and losses, once -------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/Balance.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::kernels;

Value mlir::moe::kernels::balanceProbShift(KernelBuilder &k, SoftmaxState row) {
  Value none = k.cmpf(arith::CmpFPredicate::OEQ, row.sum, k.cF32(0.0));
  return k.select(none, k.cF32(std::numeric_limits<double>::infinity()),
                  softmaxLogSumExp(k, row));
}

Value mlir::moe::kernels::routerStatsGradEntry(KernelBuilder &k, Value p,
                                               Value g, Value c, Value scale) {
  Type t = p.getType();
  return k.fmul(k.fmul(k.broadcastLike(scale, t), p),
                k.fsub(g, k.broadcastLike(c, t)));
}

Value mlir::moe::kernels::zLossGradEntry(KernelBuilder &k, Value p, Value lse,
                                         Value scale) {
  Type t = p.getType();
  return k.fmul(k.fmul(k.broadcastLike(scale, t), k.broadcastLike(lse, t)), p);
}

Value mlir::moe::kernels::sequenceFraction(KernelBuilder &k, Value count,
                                           Value factor) {
  return k.fmul(count, k.broadcastLike(factor, count.getType()));
}

Value mlir::moe::kernels::sequenceBalanceGradEntry(KernelBuilder &k, Value f,
                                                   Value c, Value z,
                                                   Value scale) {
  Type t = f.getType();
  return k.fdiv(
      k.fmul(k.broadcastLike(scale, t), k.fsub(f, k.broadcastLike(c, t))),
      k.broadcastLike(z, t));
}
