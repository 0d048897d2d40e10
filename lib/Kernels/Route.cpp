//===- Route.cpp - moe.route's scoring and weights, once ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/Route.h"

using namespace mlir;
using namespace mlir::moe::kernels;

Value mlir::moe::kernels::sigmoid(KernelBuilder &k, Value x) {
  Type t = x.getType();
  Value one = k.constLike(t, 1.0);
  return k.fdiv(one, k.fadd(one, k.exp(k.fsub(k.constLike(t, 0.0), x))));
}

Value mlir::moe::kernels::softmaxScore(KernelBuilder &k, Value e, Value rowMax,
                                       Value rowSum) {
  Value masked = k.cmpf(arith::CmpFPredicate::OEQ, rowMax,
                        k.negInfLike(rowMax.getType()));
  return k.select(masked, k.constLike(e.getType(), 0.0), k.fdiv(e, rowSum));
}

Value mlir::moe::kernels::routeScore(KernelBuilder &k, const RouteSpec &spec,
                                     Value x, Value rowMax, Value rowSum) {
  if (spec.fromLogits())
    return x;
  if (spec.scoring == RouteSpec::Scoring::Sigmoid)
    return sigmoid(k, x);
  return softmaxScore(k, k.exp(k.fsub(x, rowMax)), rowMax, rowSum);
}

Value mlir::moe::kernels::routeSelectedScore(KernelBuilder &k,
                                             const RouteSpec &spec, Value v,
                                             Value selMax, Value selSum) {
  if (spec.scoreFirst)
    return v;
  switch (spec.scoring) {
  case RouteSpec::Scoring::Softmax:
    // With a bias the first pick need not hold the largest logit: selMax is
    // the selection's own max.
    return softmaxScore(k, k.exp(k.fsub(v, selMax)), selMax, selSum);
  case RouteSpec::Scoring::Sigmoid:
    return sigmoid(k, v);
  case RouteSpec::Scoring::None:
    return v;
  }
  llvm_unreachable("route scoring");
}

Value mlir::moe::kernels::routeWeight(KernelBuilder &k, const RouteSpec &spec,
                                      Value w, Value wSum) {
  Type t = w.getType();
  if (spec.renormalize) {
    Value zero = k.constLike(t, 0.0);
    Value isZero = k.cmpf(arith::CmpFPredicate::OEQ, wSum, zero);
    w = k.select(isZero, zero, k.fdiv(w, wSum));
  }
  if (spec.scale != 1.0)
    w = k.fmul(w, k.constLike(t, spec.scale));
  return w;
}
