//===- CoSelection.cpp - Co-selection counts and update, once -------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/CoSelection.h"

using namespace mlir;
using namespace mlir::moe::kernels;

Value mlir::moe::kernels::coSelectionNext(KernelBuilder &kb, Value a,
                                          Value count, Value total,
                                          float beta) {
  Type type = a.getType();
  Value n = count;
  if (total)
    n = kb.divOrZero(count, total);
  Value keep = kb.fmul(kb.constLike(type, beta), a);
  return kb.fadd(keep, kb.fmul(kb.constLike(type, 1.0f - beta), n));
}
