//===- RowSoftmax.cpp - The softmax of a row held whole, once -------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/RowSoftmax.h"

using namespace mlir;
using namespace mlir::moe::kernels;

static Value reduced(function_ref<Value(Value)> reduce, Value v) {
  return reduce ? reduce(v) : v;
}

Value mlir::moe::kernels::softmaxTerm(KernelBuilder &kb, Value x, Value max) {
  return kb.exp(kb.fsub(x, kb.broadcastLike(max, x.getType())));
}

Value mlir::moe::kernels::softmaxScore(KernelBuilder &kb, Value e, Value rowMax,
                                       Value rowSum) {
  Value masked = kb.cmpf(arith::CmpFPredicate::OEQ, rowMax,
                        kb.negInfLike(rowMax.getType()));
  return kb.select(masked, kb.constLike(e.getType(), 0.0), kb.fdiv(e, rowSum));
}

RowSoftmaxStats mlir::moe::kernels::rowSoftmaxStats(
    KernelBuilder &kb, ArrayRef<Value> xs, function_ref<Value(Value)> reduceMax,
    function_ref<Value(Value)> reduceSum, bool sumFromFirstTerm) {
  assert(!xs.empty() && "a row has values");
  return rowSoftmaxStatsChunked(
      kb, 1, [&](int64_t) { return SmallVector<Value>(xs); }, reduceMax,
      reduceSum, sumFromFirstTerm);
}

RowSoftmaxStats mlir::moe::kernels::rowSoftmaxStatsChunked(
    KernelBuilder &kb, int64_t numChunks,
    function_ref<SmallVector<Value>(int64_t c)> chunk,
    function_ref<Value(Value)> reduceMax, function_ref<Value(Value)> reduceSum,
    bool sumFromFirstTerm) {
  Value partialMax;
  for (int64_t c = 0; c < numChunks; ++c)
    for (Value x : chunk(c))
      partialMax = partialMax ? kb.fmax(partialMax, x) : x;
  assert(partialMax && "a row has values");
  RowSoftmaxStats stats;
  stats.max = reduced(reduceMax, partialMax);
  stats.maxShaped = kb.broadcastLike(stats.max, partialMax.getType());
  Value partialSum;
  if (!sumFromFirstTerm)
    partialSum = kb.constLike(partialMax.getType(), 0.0);
  for (int64_t c = 0; c < numChunks; ++c)
    for (Value x : chunk(c)) {
      Value term = softmaxTerm(kb, x, stats.maxShaped);
      partialSum = partialSum ? kb.fadd(partialSum, term) : term;
    }
  stats.sum = reduced(reduceSum, partialSum);
  return stats;
}

Value mlir::moe::kernels::rowMaxLoop(KernelBuilder &kb, Type chunkType,
                                     Value lb, Value ub, Value step,
                                     function_ref<Value(Value iv)> chunk,
                                     function_ref<Value(Value)> reduceMax) {
  Value partialMax =
      kb.forLoop(lb, ub, step, ValueRange{kb.negInfLike(chunkType)},
                 [&](Value iv, ValueRange acc) -> SmallVector<Value> {
                   return {kb.fmax(acc[0], chunk(iv))};
                 })[0];
  return reduced(reduceMax, partialMax);
}

RowSoftmaxStats mlir::moe::kernels::rowSoftmaxStatsLoop(
    KernelBuilder &kb, Type chunkType, Value lb, Value ub, Value step,
    function_ref<Value(Value iv)> chunk, function_ref<Value(Value)> reduceMax,
    function_ref<Value(Value)> reduceSum,
    function_ref<void(Value iv, Value e)> onTerm) {
  RowSoftmaxStats stats;
  stats.max = rowMaxLoop(kb, chunkType, lb, ub, step, chunk, reduceMax);
  stats.maxShaped = kb.broadcastLike(stats.max, chunkType);
  Value partialSum =
      kb.forLoop(lb, ub, step, ValueRange{kb.constLike(chunkType, 0.0)},
                 [&](Value iv, ValueRange acc) -> SmallVector<Value> {
                   Value e = softmaxTerm(kb, chunk(iv), stats.maxShaped);
                   if (onTerm)
                     onTerm(iv, e);
                   return {kb.fadd(acc[0], e)};
                 })[0];
  stats.sum = reduced(reduceSum, partialSum);
  return stats;
}
