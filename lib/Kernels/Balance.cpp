//===- Balance.cpp - The load-balancing statistics and losses, once -------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/Balance.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::kernels;

Value mlir::moe::kernels::balanceProbShift(KernelBuilder &kb, SoftmaxState row) {
  Value none = kb.cmpf(arith::CmpFPredicate::OEQ, row.sum, kb.cF32(0.0));
  return kb.select(none, kb.cF32(std::numeric_limits<double>::infinity()),
                  softmaxLogSumExp(kb, row));
}

Value mlir::moe::kernels::routerStatsGradEntry(KernelBuilder &kb, Value p,
                                               Value g, Value c, Value scale) {
  Type t = p.getType();
  return kb.fmul(kb.fmul(kb.broadcastLike(scale, t), p),
                kb.fsub(g, kb.broadcastLike(c, t)));
}

Value mlir::moe::kernels::zLossGradEntry(KernelBuilder &kb, Value p, Value lse,
                                         Value scale) {
  Type t = p.getType();
  return kb.fmul(kb.fmul(kb.broadcastLike(scale, t), kb.broadcastLike(lse, t)), p);
}

Value mlir::moe::kernels::sequenceFraction(KernelBuilder &kb, Value count,
                                           Value factor) {
  return kb.fmul(count, kb.broadcastLike(factor, count.getType()));
}

Value mlir::moe::kernels::sequenceBalanceGradEntry(KernelBuilder &kb, Value f,
                                                   Value c, Value z,
                                                   Value scale) {
  Type t = f.getType();
  return kb.fdiv(
      kb.fmul(kb.broadcastLike(scale, t), kb.fsub(f, kb.broadcastLike(c, t))),
      kb.broadcastLike(z, t));
}
