//===- CoSelection.cpp - Co-selection counts and update, once -------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/CoSelection.h"

using namespace mlir;
using namespace mlir::moe::kernels;

Value mlir::moe::kernels::coSelectionNext(KernelBuilder &k, Value a,
                                          Value count, Value total,
                                          float beta) {
  Type type = a.getType();
  Value n = count;
  if (total) {
    Value zero = k.constLike(type, 0.0);
    Value isZero = k.cmpf(arith::CmpFPredicate::OEQ, total, zero);
    n = k.select(isZero, zero, k.fdiv(count, total));
  }
  Value keep = k.fmul(k.constLike(type, beta), a);
  return k.fadd(keep, k.fmul(k.constLike(type, 1.0f - beta), n));
}
