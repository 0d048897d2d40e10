//===- SegmentedStats.cpp - Per-cluster statistics, once ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/SegmentedStats.h"

using namespace mlir;
using namespace mlir::moe::kernels;

Value mlir::moe::kernels::idInRange(KernelBuilder &kb, Value v, Value bound) {
  // Operands that build IR are sequenced into locals: C++ leaves argument
  // evaluation order unspecified (gcc and clang differ).
  Value nonNegative =
      kb.cmpi(arith::CmpIPredicate::sge, v, kb.constLike(v.getType(), 0));
  Value below = kb.cmpi(arith::CmpIPredicate::slt, v, bound);
  return kb.andI(nonNegative, below);
}

Value mlir::moe::kernels::segmentMean(KernelBuilder &kb, Value sum,
                                      Value count) {
  Type type = sum.getType();
  Value empty = kb.eq(count, kb.cI32(0));
  Value n = kb.broadcastLike(kb.sitofp(count), type);
  return kb.select(kb.broadcastLike(empty, type), kb.constLike(type, 0.0),
                  kb.fdiv(sum, n));
}

Value mlir::moe::kernels::dispersionTerm(KernelBuilder &kb, Value x, Value mean,
                                         bool variance) {
  Value diff = kb.fsub(x, mean);
  return variance ? kb.fmul(diff, diff) : kb.fabs(diff);
}

Value mlir::moe::kernels::dispersionWeight(KernelBuilder &kb, Value s,
                                           float eps) {
  Type type = s.getType();
  return kb.fdiv(kb.constLike(type, 1.0), kb.fadd(s, kb.constLike(type, eps)));
}
