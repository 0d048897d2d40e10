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

Value mlir::moe::kernels::flashScaledLogit(KernelBuilder &kb,
                                           const FlashLogitSpec &spec,
                                           Value dot,
                                           function_ref<Value()> bias,
                                           function_ref<Value()> addScore) {
  Value x = kb.fdiv(dot, kb.constLike(dot.getType(), spec.scaleDiv));
  if (spec.hasBias)
    x = kb.fadd(x, bias());
  if (spec.hasAddScores)
    x = kb.fadd(x, addScore());
  return x;
}

Value mlir::moe::kernels::flashKeyKept(KernelBuilder &kb,
                                       const FlashLogitSpec &spec,
                                       Value inRange,
                                       function_ref<Value()> keyValid,
                                       function_ref<Value()> notAfter) {
  Value keep = inRange;
  auto join = [&](function_ref<Value()> term) {
    if (Value t = term())
      keep = keep ? kb.andI(keep, t) : t;
  };
  if (keyValid)
    join(keyValid);
  if (spec.causal)
    join(notAfter);
  return keep;
}

Value mlir::moe::kernels::flashLogit(KernelBuilder &kb,
                                     const FlashLogitSpec &spec, Value dot,
                                     function_ref<Value()> bias,
                                     function_ref<Value()> addScore,
                                     function_ref<Value()> kept) {
  Value x = flashScaledLogit(kb, spec, dot, bias, addScore);
  Value keep = kept ? kept() : Value();
  if (!keep)
    return x;
  return kb.select(keep, x, kb.negInfLike(x.getType()));
}
