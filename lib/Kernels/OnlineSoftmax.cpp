//===- OnlineSoftmax.cpp - The online-softmax step, once ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/OnlineSoftmax.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::kernels;

SoftmaxState mlir::moe::kernels::softmaxStart(KernelBuilder &kb,
                                              bool finiteMax) {
  Value max = finiteMax ? kb.cF32(-std::numeric_limits<float>::max())
                        : kb.negInfLike(kb.f32());
  return {max, kb.cF32(0.0)};
}

static Value reduced(function_ref<Value(Value)> reduce, Value v) {
  return reduce ? reduce(v) : v;
}

SoftmaxTile
mlir::moe::kernels::onlineSoftmaxStep(KernelBuilder &kb, SoftmaxState state,
                                      ArrayRef<Value> logits,
                                      const SoftmaxStepForm &form) {
  assert(!logits.empty() && "a tile has logits");
  assert((form.sums || form.sumOntoRescaled) && "no sums: l passes through");
  Type type = logits.front().getType();
  Value tileMax = logits.front();
  for (Value x : logits.drop_front())
    tileMax = kb.fmax(tileMax, x);
  Value rowMax = reduced(form.reduceMax, tileMax);
  if (form.scale)
    rowMax = kb.fmul(rowMax, form.scale);
  Value max = kb.fmax(state.max, rowMax);
  SoftmaxTile tile;
  // No key yet (max = -inf): subtract 0 instead, so that exp(-inf - 0) = 0
  // gives alpha = 0 and p = 0 rather than exp(-inf + inf) = NaN.
  Value shift = max;
  if (!form.finiteMax) {
    Value none =
        kb.cmpf(arith::CmpFPredicate::OEQ, max, kb.negInfLike(kb.f32()));
    shift = kb.select(none, kb.cF32(0.0), max);
  }
  tile.shift = shift;
  if (form.sums)
    tile.rescale = kb.softmaxWeight(kb.fsub(state.max, shift));
  Value shiftV = kb.broadcastLike(shift, type);
  Value negShift =
      form.scale ? arith::NegFOp::create(kb.b, shift).getResult() : Value();
  auto weight = [&](Value x) {
    Value p = kb.softmaxWeight(form.scale ? kb.fma(x, form.scale, negShift)
                                          : kb.fsub(x, shiftV));
    tile.probs.push_back(p);
    return p;
  };
  if (form.sumOntoRescaled) {
    Value sum = form.sums ? kb.fmul(state.sum, tile.rescale) : state.sum;
    for (Value x : logits) {
      Value p = weight(x);
      if (form.sums)
        sum = kb.fadd(sum, p);
    }
    tile.next = {max, sum};
    return tile;
  }
  Value partial = form.sumFromFirstProb ? Value() : kb.constLike(type, 0.0);
  for (Value x : logits) {
    Value p = weight(x);
    partial = partial ? kb.fadd(partial, p) : p;
  }
  if (form.fusedSum)
    tile.next = {max, kb.fma(state.sum, tile.rescale,
                             reduced(form.reduceSum, partial))};
  else
    tile.next = {max, kb.fadd(kb.fmul(state.sum, tile.rescale),
                              reduced(form.reduceSum, partial))};
  return tile;
}

Value mlir::moe::kernels::softmaxNormalize(KernelBuilder &kb, SoftmaxState state,
                                           Value acc) {
  Type type = acc.getType();
  Value none = kb.cmpf(arith::CmpFPredicate::OEQ, state.sum, kb.cF32(0.0));
  return kb.select(kb.broadcastLike(none, type), kb.constLike(type, 0.0),
                  kb.fdiv(acc, kb.broadcastLike(state.sum, type)));
}

Value mlir::moe::kernels::softmaxLogSumExp(KernelBuilder &kb,
                                           SoftmaxState state) {
  return kb.fadd(state.max, kb.log(state.sum));
}

Value mlir::moe::kernels::softmaxFromLogSumExp(KernelBuilder &kb, Value x,
                                               Value lse) {
  return kb.softmaxWeight(kb.fsub(x, kb.broadcastLike(lse, x.getType())));
}

SoftmaxGrad
mlir::moe::kernels::softmaxGradFromLogSumExp(KernelBuilder &kb, Value x,
                                             Value lse, Value g,
                                             function_ref<Value()> delta) {
  Value p = softmaxFromLogSumExp(kb, x, lse);
  Value d = delta();
  return {p, kb.fmul(p, kb.fsub(g, d))};
}
