//===- BalanceRows.cpp - Row pieces of the load-balancing kernels ---------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "BalanceRows.h"

#include "MoE/Kernels/Balance.h"

#include <limits>

namespace mlir::moe::cpu {
using namespace kernels;

Value balanceChunk(CK &k, Value x2, Value r, Value base, Value numExperts,
                   double pad) {
  // A static E that is a multiple of the lanes needs no mask (plain loads).
  auto type = cast<MemRefType>(x2.getType());
  int64_t e = type.getDimSize(type.getRank() - 1);
  if (!ShapedType::isDynamic(e) && e % k.lanes() == 0)
    return k.vload(x2, {r, base});
  return k.vloadMasked(x2, {r, base}, k.sub(numExperts, base), pad);
}

void eachLaneChunk(CK &k, Value chunks, function_ref<void(Value base)> body) {
  k.forLoop(k.idx(0), chunks, k.idx(1),
            [&](Value c) { body(k.mul(c, k.idx(k.lanes()))); });
}

Value laneChunkSum(CK &k, Value chunks, function_ref<Value(Value)> f) {
  Value acc = k.forLoop(k.idx(0), chunks, k.idx(1),
                        ValueRange{k.constLike(k.vf32(), 0.0)},
                        [&](Value c, ValueRange a) -> SmallVector<Value> {
                          return {k.fadd(a[0], f(k.mul(c, k.idx(k.lanes()))))};
                        })[0];
  return k.sum(acc);
}

void balanceEachChunk(CK &k, Value numExperts,
                      function_ref<void(Value base)> body) {
  eachLaneChunk(k, k.ceilDiv(numExperts, k.idx(k.lanes())), body);
}

Value balanceRowSum(CK &k, Value numExperts, function_ref<Value(Value)> f) {
  return laneChunkSum(k, k.ceilDiv(numExperts, k.idx(k.lanes())), f);
}

SoftmaxState balanceRowSoftmax(CK &k, Value x2, Value r, Value numExperts,
                               Value exps) {
  // Two passes over the row (it stays in L1), each a lane-wise vector
  // accumulation reduced once at the end: the max, then Σ exp(x - max). The
  // online step (kernels::onlineSoftmaxStep) would reduce every vector to a
  // scalar and rescale with a scalar exp per vector: at E = 256 that made the
  // z-loss 2-3x slower than eager's logsumexp. The state and the rules are
  // the online step's: a row of -inf subtracts 0 (Σ = 0, lse = -inf), NaN
  // and +inf propagate to the sum.
  const double negInf = -std::numeric_limits<double>::infinity();
  Value c0 = k.idx(0), c1 = k.idx(1);
  Value chunks = k.ceilDiv(numExperts, k.idx(k.lanes()));
  auto chunk = [&](Value c) {
    return balanceChunk(k, x2, r, k.mul(c, k.idx(k.lanes())), numExperts,
                        negInf);
  };
  Value maxV = k.forLoop(c0, chunks, c1, ValueRange{k.negInfLike(k.vf32())},
                         [&](Value c, ValueRange a) -> SmallVector<Value> {
                           return {k.fmax(a[0], chunk(c))};
                         })[0];
  Value max = k.maxf(maxV);
  Value none = k.cmpf(arith::CmpFPredicate::OEQ, max, k.negInfLike(k.f32()));
  Value shift = k.splat(k.select(none, k.cF32(0.0), max), k.lanes());
  Value sumV = k.forLoop(c0, chunks, c1, ValueRange{k.constLike(k.vf32(), 0.0)},
                         [&](Value c, ValueRange a) -> SmallVector<Value> {
                           Value e = k.softmaxWeight(k.fsub(chunk(c), shift));
                           if (exps)
                             k.vstore(e, exps, {k.mul(c, k.idx(k.lanes()))});
                           return {k.fadd(a[0], e)};
                         })[0];
  return {max, k.sum(sumV)};
}

std::pair<Value, Value> balanceBlockRows(CK &k, Value block, Value rows) {
  Value r0 = k.mul(block, k.idx(kBalanceRowsPerBlock));
  Value r1 = k.mins(k.add(r0, k.idx(kBalanceRowsPerBlock)), rows);
  return {r0, r1};
}

void balanceEachBlockRow(CK &k, Value block, Value rows,
                         function_ref<void(Value r)> body) {
  auto [r0, r1] = balanceBlockRows(k, block, rows);
  k.forLoop(r0, r1, k.idx(1), body);
}

Value balanceBlockRowSum(CK &k, Value block, Value rows,
                         function_ref<Value(Value r)> f) {
  auto [r0, r1] = balanceBlockRows(k, block, rows);
  return k.forLoop(r0, r1, k.idx(1), ValueRange{k.cF32(0.0)},
                   [&](Value r, ValueRange acc) -> SmallVector<Value> {
                     return {k.fadd(acc[0], f(r))};
                   })[0];
}

Value balanceBlocks(CK &k, Value rows) {
  return k.ceilDiv(rows, k.idx(kBalanceRowsPerBlock));
}

Value sumInOrder(CK &k, Value buf, Value n) {
  return k.forLoop(k.idx(0), n, k.idx(1), ValueRange{k.cF32(0.0)},
                   [&](Value i, ValueRange acc) -> SmallVector<Value> {
                     return {k.fadd(acc[0], k.load(buf, {i}))};
                   })[0];
}

Value indexToF32(CK &k, Value index) {
  return k.sitofp(k.castInt(index, k.i64()));
}

} // namespace mlir::moe::cpu
