//===- Route.cpp - moe.route's scoring and weights, once ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/Route.h"

using namespace mlir;
using namespace mlir::moe::kernels;

Value mlir::moe::kernels::sigmoid(KernelBuilder &kb, Value x) {
  Type t = x.getType();
  Value one = kb.constLike(t, 1.0);
  return kb.fdiv(one, kb.fadd(one, kb.exp(kb.fsub(kb.constLike(t, 0.0), x))));
}

Value mlir::moe::kernels::routeScore(KernelBuilder &kb, const RouteSpec &spec,
                                     Value x, Value rowMax, Value rowSum) {
  if (spec.fromLogits())
    return x;
  if (spec.scoring == RouteSpec::Scoring::Sigmoid)
    return sigmoid(kb, x);
  return softmaxScore(kb, softmaxTerm(kb, x, rowMax), rowMax, rowSum);
}

Value mlir::moe::kernels::routeSelectedScore(KernelBuilder &kb,
                                             const RouteSpec &spec, Value v,
                                             Value selMax, Value selSum) {
  if (spec.scoreFirst)
    return v;
  switch (spec.scoring) {
  case RouteSpec::Scoring::Softmax:
    // With a bias the first pick need not hold the largest logit: selMax is
    // the selection's own max.
    return softmaxScore(kb, softmaxTerm(kb, v, selMax), selMax, selSum);
  case RouteSpec::Scoring::Sigmoid:
    return sigmoid(kb, v);
  case RouteSpec::Scoring::None:
    return v;
  }
  llvm_unreachable("route scoring");
}

Value mlir::moe::kernels::routeWeight(KernelBuilder &kb, const RouteSpec &spec,
                                      Value w, Value wSum) {
  Type t = w.getType();
  if (spec.renormalize) {
    Value zero = kb.constLike(t, 0.0);
    Value isZero = kb.cmpf(arith::CmpFPredicate::OEQ, wSum, zero);
    w = kb.select(isZero, zero, kb.fdiv(w, wSum));
  }
  if (spec.scale != 1.0)
    w = kb.fmul(w, kb.constLike(t, spec.scale));
  return w;
}
