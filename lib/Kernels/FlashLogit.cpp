//===- FlashLogit.cpp - The flash kernels' logit, once --------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/FlashLogit.h"

using namespace mlir;
using namespace mlir::moe::kernels;

FlashLogitSpec mlir::moe::kernels::similarityInformLogit(double tau,
                                                         bool causal,
                                                         bool hasKeyMask) {
  return {tau, causal, hasKeyMask, /*hasBias=*/false, /*hasAddScores=*/false};
}

FlashLogitSpec mlir::moe::kernels::attentionPosteriorLogit(double sigma) {
  return {sigma * sigma, /*causal=*/false, /*hasKeyMask=*/false,
          /*hasBias=*/true, /*hasAddScores=*/true};
}

Value mlir::moe::kernels::flashScaledLogit(KernelBuilder &k,
                                           const FlashLogitSpec &spec,
                                           Value dot,
                                           function_ref<Value()> bias,
                                           function_ref<Value()> addScore) {
  Value x = k.fdiv(dot, k.constLike(dot.getType(), spec.scaleDiv));
  if (spec.hasBias)
    x = k.fadd(x, bias());
  if (spec.hasAddScores)
    x = k.fadd(x, addScore());
  return x;
}

Value mlir::moe::kernels::flashKeyKept(KernelBuilder &k,
                                       const FlashLogitSpec &spec,
                                       Value inRange,
                                       function_ref<Value()> keyValid,
                                       function_ref<Value()> notAfter) {
  Value keep = inRange;
  auto join = [&](function_ref<Value()> term) {
    if (Value t = term())
      keep = keep ? k.andI(keep, t) : t;
  };
  if (keyValid)
    join(keyValid);
  if (spec.causal)
    join(notAfter);
  return keep;
}

Value mlir::moe::kernels::flashLogit(KernelBuilder &k,
                                     const FlashLogitSpec &spec, Value dot,
                                     function_ref<Value()> bias,
                                     function_ref<Value()> addScore,
                                     function_ref<Value()> kept) {
  Value x = flashScaledLogit(k, spec, dot, bias, addScore);
  Value keep = kept ? kept() : Value();
  if (!keep)
    return x;
  return k.select(keep, x, k.negInfLike(x.getType()));
}
