//===- OnlineSoftmax.cpp - The online-softmax step, once ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/OnlineSoftmax.h"

using namespace mlir;
using namespace mlir::moe::kernels;

SoftmaxState mlir::moe::kernels::softmaxStart(KernelBuilder &k) {
  return {k.negInfLike(k.f32()), k.cF32(0.0)};
}

SoftmaxTile
mlir::moe::kernels::onlineSoftmaxStep(KernelBuilder &k, SoftmaxState state,
                                      ArrayRef<Value> logits,
                                      function_ref<Value(Value)> reduceMax,
                                      function_ref<Value(Value)> reduceSum) {
  assert(!logits.empty() && "a tile has logits");
  Type type = logits.front().getType();
  Value tileMax = logits.front();
  for (Value x : logits.drop_front())
    tileMax = k.fmax(tileMax, x);
  Value max = k.fmax(state.max, reduceMax(tileMax));
  // No key yet (max = -inf): subtract 0 instead, so that exp(-inf - 0) = 0
  // gives alpha = 0 and p = 0 rather than exp(-inf + inf) = NaN.
  Value none = k.cmpf(arith::CmpFPredicate::OEQ, max, k.negInfLike(k.f32()));
  Value shift = k.select(none, k.cF32(0.0), max);
  SoftmaxTile tile;
  tile.rescale = k.softmaxWeight(k.fsub(state.max, shift));
  Value shiftV = k.broadcastLike(shift, type);
  Value partial = k.constLike(type, 0.0);
  for (Value x : logits) {
    Value p = k.softmaxWeight(k.fsub(x, shiftV));
    tile.probs.push_back(p);
    partial = k.fadd(partial, p);
  }
  tile.next = {max,
               k.fadd(k.fmul(state.sum, tile.rescale), reduceSum(partial))};
  return tile;
}

Value mlir::moe::kernels::softmaxNormalize(KernelBuilder &k, SoftmaxState state,
                                           Value acc) {
  Type type = acc.getType();
  Value none = k.cmpf(arith::CmpFPredicate::OEQ, state.sum, k.cF32(0.0));
  return k.select(k.broadcastLike(none, type), k.constLike(type, 0.0),
                  k.fdiv(acc, k.broadcastLike(state.sum, type)));
}

Value mlir::moe::kernels::softmaxLogSumExp(KernelBuilder &k,
                                           SoftmaxState state) {
  return k.fadd(state.max, k.log(state.sum));
}

Value mlir::moe::kernels::softmaxFromLogSumExp(KernelBuilder &k, Value x,
                                               Value lse) {
  return k.softmaxWeight(k.fsub(x, k.broadcastLike(lse, x.getType())));
}

SoftmaxGrad
mlir::moe::kernels::softmaxGradFromLogSumExp(KernelBuilder &k, Value x,
                                             Value lse, Value g,
                                             function_ref<Value()> delta) {
  Value p = softmaxFromLogSumExp(k, x, lse);
  Value d = delta();
  return {p, k.fmul(p, k.fsub(g, d))};
}
