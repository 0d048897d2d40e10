//===- SegmentedStats.cpp - Per-cluster statistics, once ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/SegmentedStats.h"

using namespace mlir;
using namespace mlir::moe::kernels;

Value mlir::moe::kernels::idInRange(KernelBuilder &k, Value v, Value bound) {
  // Operands that build IR are sequenced into locals: C++ leaves argument
  // evaluation order unspecified (gcc and clang differ).
  Value nonNegative =
      k.cmpi(arith::CmpIPredicate::sge, v, k.constLike(v.getType(), 0));
  Value below = k.cmpi(arith::CmpIPredicate::slt, v, bound);
  return k.andI(nonNegative, below);
}

Value mlir::moe::kernels::segmentMean(KernelBuilder &k, Value sum,
                                      Value count) {
  Type type = sum.getType();
  Value empty = k.eq(count, k.cI32(0));
  Value n = k.broadcastLike(k.sitofp(count), type);
  return k.select(k.broadcastLike(empty, type), k.constLike(type, 0.0),
                  k.fdiv(sum, n));
}

Value mlir::moe::kernels::dispersionTerm(KernelBuilder &k, Value x, Value mean,
                                         bool variance) {
  Value diff = k.fsub(x, mean);
  return variance ? k.fmul(diff, diff) : k.fabs(diff);
}

Value mlir::moe::kernels::dispersionWeight(KernelBuilder &k, Value s,
                                           float eps) {
  Type type = s.getType();
  return k.fdiv(k.constLike(type, 1.0), k.fadd(s, k.constLike(type, eps)));
}
