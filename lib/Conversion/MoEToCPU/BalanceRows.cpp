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
  return k.vloadMasked(x2, {r, base}, k.sub(numExperts, base), pad);
}

void balanceEachChunk(CK &k, Value numExperts,
                      function_ref<void(Value base)> body) {
  Value chunks = k.ceilDiv(numExperts, k.idx(k.lanes()));
  k.forLoop(k.idx(0), chunks, k.idx(1),
            [&](Value c) { body(k.mul(c, k.idx(k.lanes()))); });
}

Value balanceRowSum(CK &k, Value numExperts, function_ref<Value(Value)> f) {
  Value chunks = k.ceilDiv(numExperts, k.idx(k.lanes()));
  Value acc = k.forLoop(k.idx(0), chunks, k.idx(1),
                        ValueRange{k.constLike(k.vf32(), 0.0)},
                        [&](Value c, ValueRange a) -> SmallVector<Value> {
                          return {k.fadd(a[0], f(k.mul(c, k.idx(k.lanes()))))};
                        })[0];
  return k.sum(acc);
}

SoftmaxState balanceRowSoftmax(CK &k, Value x2, Value r, Value numExperts) {
  SoftmaxState start = softmaxStart(k);
  Value chunks = k.ceilDiv(numExperts, k.idx(k.lanes()));
  SmallVector<Value> end = k.forLoop(
      k.idx(0), chunks, k.idx(1), ValueRange{start.max, start.sum},
      [&](Value c, ValueRange s) -> SmallVector<Value> {
        Value x = balanceChunk(k, x2, r, k.mul(c, k.idx(k.lanes())), numExperts,
                               -std::numeric_limits<double>::infinity());
        SoftmaxTile tile = onlineSoftmaxStep(
            k, {s[0], s[1]}, {x}, [&](Value v) { return k.maxf(v); },
            [&](Value v) { return k.sum(v); });
        return {tile.next.max, tile.next.sum};
      });
  return {end[0], end[1]};
}

std::pair<Value, Value> balanceBlockRows(CK &k, Value block, Value rows) {
  Value r0 = k.mul(block, k.idx(kBalanceRowsPerBlock));
  Value r1 = k.mins(k.add(r0, k.idx(kBalanceRowsPerBlock)), rows);
  return {r0, r1};
}

Value balanceBlocks(CK &k, Value rows) {
  return k.ceilDiv(rows, k.idx(kBalanceRowsPerBlock));
}

} // namespace mlir::moe::cpu
