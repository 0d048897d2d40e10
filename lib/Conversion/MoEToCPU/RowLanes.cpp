//===- RowLanes.cpp - One row per lane: the few-expert top-k layout -------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "RowLanes.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

namespace mlir::moe::cpu_lowering {

SmallVector<Value> unzipRound(CpuKernelBuilder &kb, ArrayRef<Value> v) {
  int64_t n = v.size(), lanes = kb.lanes();
  SmallVector<int64_t> evens, odds;
  for (int64_t i = 0; i < lanes; ++i) {
    evens.push_back(2 * i);
    odds.push_back(2 * i + 1);
  }
  SmallVector<Value> out(n);
  for (int64_t q = 0; q < n / 2; ++q) {
    out[q] = kb.shuffle(v[2 * q], v[2 * q + 1], evens);
    out[q + n / 2] = kb.shuffle(v[2 * q], v[2 * q + 1], odds);
  }
  return out;
}

SmallVector<Value> zipRound(CpuKernelBuilder &kb, ArrayRef<Value> v) {
  int64_t n = v.size(), lanes = kb.lanes();
  SmallVector<int64_t> low, high;
  for (int64_t i = 0; i < lanes / 2; ++i) {
    low.append({i, lanes + i});
    high.append({lanes / 2 + i, lanes + lanes / 2 + i});
  }
  SmallVector<Value> out(n);
  for (int64_t q = 0; q < n / 2; ++q) {
    out[2 * q] = kb.shuffle(v[q], v[q + n / 2], low);
    out[2 * q + 1] = kb.shuffle(v[q], v[q + n / 2], high);
  }
  return out;
}

bool fitsRowLanes(int64_t numExperts, int64_t k) {
  return !ShapedType::isDynamic(numExperts) && numExperts >= 2 &&
         numExperts <= kMaxLaneExperts && llvm::isPowerOf2_64(numExperts) &&
         k <= kMaxLaneK;
}

Value flatten(CpuKernelBuilder &kb, Value buffer) {
  return memref::CollapseShapeOp::create(
      kb.b, buffer, ArrayRef<ReassociationIndices>{{0, 1}});
}

SmallVector<Value> loadColumns(CpuKernelBuilder &kb, Value flat, Value r0,
                               int64_t numExperts) {
  int64_t lanes = kb.lanes();
  Value base = kb.mul(r0, kb.idx(numExperts));
  SmallVector<Value> cols;
  for (int64_t q = 0; q < numExperts; ++q)
    cols.push_back(kb.vload(flat, {kb.add(base, kb.idx(q * lanes))}));
  for (int64_t m = numExperts; m > 1; m /= 2)
    cols = unzipRound(kb, cols);
  return cols;
}

void storeColumns(CpuKernelBuilder &kb, ArrayRef<Value> cols, Value flat,
                  Value r0) {
  int64_t n = cols.size(), lanes = kb.lanes();
  Value base = kb.mul(r0, kb.idx(n));
  if (llvm::isPowerOf2_64(n) && n <= lanes) {
    SmallVector<Value> rows(cols);
    for (int64_t m = n; m > 1; m /= 2)
      rows = zipRound(kb, rows);
    for (int64_t q = 0; q < n; ++q)
      kb.vstore(kb.asElementOf(rows[q], flat), flat,
                {kb.add(base, kb.idx(q * lanes))});
    return;
  }
  for (int64_t l = 0; l < lanes; ++l)
    for (int64_t s = 0; s < n; ++s) {
      // The address before the element, as the code was emitted before
      // indices could be i64 (the same bytes for i32).
      Value at = kb.add(base, kb.idx(l * n + s));
      Value v = vector::ExtractOp::create(kb.b, cols[s], l);
      kb.store(kb.asElementOf(v, flat), flat, {at});
    }
}

LaneTopk laneTopk(CpuKernelBuilder &kb, int64_t k, int64_t numExperts,
                  function_ref<Value(int64_t j)> keyOf,
                  function_ref<Value(int64_t j)> valueOf) {
  auto vi32 = VectorType::get({kb.lanes()}, kb.i32());
  LaneTopk t;
  t.keys.assign(
      k, kb.constLike(vi32, double(std::numeric_limits<int32_t>::min())));
  t.vals.assign(k, kb.constLike(kb.vf32(), 0.0));
  t.idxs.assign(k, kb.constLike(vi32, 0.0));
  for (int64_t j = 0; j < numExperts; ++j) {
    Value key = keyOf(j), x = valueOf(j);
    Value column = kb.constLike(vi32, double(j));
    SmallVector<Value> above;
    for (int64_t s = 0; s < k; ++s)
      above.push_back(kb.cmpi(arith::CmpIPredicate::sgt, key, t.keys[s]));
    for (int64_t s = k - 1; s >= 0; --s) {
      // Slot s takes slot s-1 when the column beats that too, else the
      // column when it beats slot s.
      auto next = [&](SmallVector<Value> &slot, Value mine) {
        Value v = kb.select(above[s], mine, slot[s]);
        if (s > 0)
          v = kb.select(above[s - 1], slot[s - 1], v);
        return v;
      };
      t.keys[s] = next(t.keys, key);
      t.vals[s] = next(t.vals, x);
      t.idxs[s] = next(t.idxs, column);
    }
  }
  return t;
}

} // namespace mlir::moe::cpu_lowering
