//===- OnlineSoftmax.cpp - The online-softmax step, once ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/OnlineSoftmax.h"

using namespace mlir;
using namespace mlir::moe::kernels;

SoftmaxState mlir::moe::kernels::softmaxStart(KernelBuilder &kb) {
  return {kb.negInfLike(kb.f32()), kb.cF32(0.0)};
}

static Value reduced(function_ref<Value(Value)> reduce, Value v) {
  return reduce ? reduce(v) : v;
}

SoftmaxTile mlir::moe::kernels::onlineSoftmaxStep(
    KernelBuilder &kb, SoftmaxState state, ArrayRef<Value> logits,
    function_ref<Value(Value)> reduceMax, function_ref<Value(Value)> reduceSum,
    bool sumFromFirstProb) {
  assert(!logits.empty() && "a tile has logits");
  Type type = logits.front().getType();
  Value tileMax = logits.front();
  for (Value x : logits.drop_front())
    tileMax = kb.fmax(tileMax, x);
  Value max = kb.fmax(state.max, reduced(reduceMax, tileMax));
  // No key yet (max = -inf): subtract 0 instead, so that exp(-inf - 0) = 0
  // gives alpha = 0 and p = 0 rather than exp(-inf + inf) = NaN.
  Value none = kb.cmpf(arith::CmpFPredicate::OEQ, max, kb.negInfLike(kb.f32()));
  Value shift = kb.select(none, kb.cF32(0.0), max);
  SoftmaxTile tile;
  tile.rescale = kb.softmaxWeight(kb.fsub(state.max, shift));
  Value shiftV = kb.broadcastLike(shift, type);
  Value partial = sumFromFirstProb ? Value() : kb.constLike(type, 0.0);
  for (Value x : logits) {
    Value p = kb.softmaxWeight(kb.fsub(x, shiftV));
    tile.probs.push_back(p);
    partial = partial ? kb.fadd(partial, p) : p;
  }
  tile.next = {max, kb.fadd(kb.fmul(state.sum, tile.rescale),
                            reduced(reduceSum, partial))};
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
