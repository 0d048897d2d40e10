//===- BalanceRows.cpp - Row pieces of the load-balancing kernels ---------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "BalanceRows.h"

#include "MoE/Kernels/Balance.h"

#include <limits>

namespace mlir::moe::cpu_lowering {
using namespace kernels;

Value balanceChunk(CpuKernelBuilder &kb, Value x2, Value r, Value base, Value numExperts,
                   double pad) {
  // A static E that is a multiple of the lanes needs no mask (plain loads).
  auto type = cast<MemRefType>(x2.getType());
  int64_t e = type.getDimSize(type.getRank() - 1);
  if (!ShapedType::isDynamic(e) && e % kb.lanes() == 0)
    return kb.vload(x2, {r, base});
  return kb.vloadMasked(x2, {r, base}, kb.sub(numExperts, base), pad);
}

void eachLaneChunk(CpuKernelBuilder &kb, Value chunks, function_ref<void(Value base)> body) {
  kb.forLoop(kb.idx(0), chunks, kb.idx(1),
            [&](Value c) { body(kb.mul(c, kb.idx(kb.lanes()))); });
}

Value laneChunkSum(CpuKernelBuilder &kb, Value chunks, function_ref<Value(Value)> f) {
  Value acc = kb.forLoop(kb.idx(0), chunks, kb.idx(1),
                        ValueRange{kb.constLike(kb.vf32(), 0.0)},
                        [&](Value c, ValueRange a) -> SmallVector<Value> {
                          return {kb.fadd(a[0], f(kb.mul(c, kb.idx(kb.lanes()))))};
                        })[0];
  return kb.sum(acc);
}

void balanceEachChunk(CpuKernelBuilder &kb, Value numExperts,
                      function_ref<void(Value base)> body) {
  eachLaneChunk(kb, kb.ceilDiv(numExperts, kb.idx(kb.lanes())), body);
}

Value balanceRowSum(CpuKernelBuilder &kb, Value numExperts, function_ref<Value(Value)> f) {
  return laneChunkSum(kb, kb.ceilDiv(numExperts, kb.idx(kb.lanes())), f);
}

SoftmaxState balanceRowSoftmax(CpuKernelBuilder &kb, Value x2, Value r, Value numExperts,
                               Value exps) {
  // Two passes over the row (it stays in L1), each a lane-wise vector
  // accumulation reduced once at the end: the max, then Σ exp(x - max). The
  // online step (kernels::onlineSoftmaxStep) would reduce every vector to a
  // scalar and rescale with a scalar exp per vector: at E = 256 that made the
  // z-loss 2-3x slower than eager's logsumexp. The state and the rules are
  // the online step's: a row of -inf subtracts 0 (Σ = 0, lse = -inf), NaN
  // and +inf propagate to the sum.
  const double negInf = -std::numeric_limits<double>::infinity();
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value chunks = kb.ceilDiv(numExperts, kb.idx(kb.lanes()));
  auto chunk = [&](Value c) {
    return balanceChunk(kb, x2, r, kb.mul(c, kb.idx(kb.lanes())), numExperts,
                        negInf);
  };
  Value maxV = kb.forLoop(c0, chunks, c1, ValueRange{kb.negInfLike(kb.vf32())},
                         [&](Value c, ValueRange a) -> SmallVector<Value> {
                           return {kb.fmax(a[0], chunk(c))};
                         })[0];
  Value max = kb.maxf(maxV);
  Value none = kb.cmpf(arith::CmpFPredicate::OEQ, max, kb.negInfLike(kb.f32()));
  Value shift = kb.splat(kb.select(none, kb.cF32(0.0), max), kb.lanes());
  Value sumV = kb.forLoop(c0, chunks, c1, ValueRange{kb.constLike(kb.vf32(), 0.0)},
                         [&](Value c, ValueRange a) -> SmallVector<Value> {
                           Value e = kb.softmaxWeight(kb.fsub(chunk(c), shift));
                           if (exps)
                             kb.vstore(e, exps, {kb.mul(c, kb.idx(kb.lanes()))});
                           return {kb.fadd(a[0], e)};
                         })[0];
  return {max, kb.sum(sumV)};
}

std::pair<Value, Value> balanceBlockRows(CpuKernelBuilder &kb, Value block, Value rows) {
  Value r0 = kb.mul(block, kb.idx(kBalanceRowsPerBlock));
  Value r1 = kb.mins(kb.add(r0, kb.idx(kBalanceRowsPerBlock)), rows);
  return {r0, r1};
}

void balanceEachBlockRow(CpuKernelBuilder &kb, Value block, Value rows,
                         function_ref<void(Value r)> body) {
  auto [r0, r1] = balanceBlockRows(kb, block, rows);
  kb.forLoop(r0, r1, kb.idx(1), body);
}

Value balanceBlockRowSum(CpuKernelBuilder &kb, Value block, Value rows,
                         function_ref<Value(Value r)> f) {
  auto [r0, r1] = balanceBlockRows(kb, block, rows);
  return kb.forLoop(r0, r1, kb.idx(1), ValueRange{kb.cF32(0.0)},
                   [&](Value r, ValueRange acc) -> SmallVector<Value> {
                     return {kb.fadd(acc[0], f(r))};
                   })[0];
}

Value balanceBlocks(CpuKernelBuilder &kb, Value rows) {
  return kb.ceilDiv(rows, kb.idx(kBalanceRowsPerBlock));
}

Value sumInOrder(CpuKernelBuilder &kb, Value buf, Value n) {
  return kb.forLoop(kb.idx(0), n, kb.idx(1), ValueRange{kb.cF32(0.0)},
                   [&](Value i, ValueRange acc) -> SmallVector<Value> {
                     return {kb.fadd(acc[0], kb.load(buf, {i}))};
                   })[0];
}

Value indexToF32(CpuKernelBuilder &kb, Value index) {
  return kb.sitofp(kb.castInt(index, kb.i64()));
}

} // namespace mlir::moe::cpu_lowering
