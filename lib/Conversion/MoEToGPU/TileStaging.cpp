//===- TileStaging.cpp - Row tiles from global into shared memory ---------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "TileStaging.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe::gpu_lowering;

SmallVector<TileStaging::Place> TileStaging::places(int64_t rows,
                                                    int64_t cols) {
  const int64_t perRow = cols / 8, vecs = rows * perRow;
  // Where the block's threads cover whole rows, a thread keeps its column
  // and steps its row by a constant (no division a vector).
  const bool fixedColumn = threads % perRow == 0;
  Value r0 = kb.divu(tid, kb.idx(perRow));
  Value col0 = kb.mul(kb.remu(tid, kb.idx(perRow)), kb.idx(8));
  SmallVector<Place> at;
  for (int64_t v0 = 0; v0 < vecs; v0 += threads) {
    Value v = kb.add(tid, kb.idx(v0));
    Place p;
    p.r = fixedColumn ? kb.add(r0, kb.idx(v0 / perRow))
                      : kb.divu(v, kb.idx(perRow));
    p.col = fixedColumn ? col0 : kb.mul(kb.remu(v, kb.idx(perRow)), kb.idx(8));
    if (v0 + threads > vecs)
      p.inTile = kb.lt(v, kb.idx(vecs));
    at.push_back(p);
  }
  return at;
}

Value TileStaging::aligned(Value src, Value width, int64_t depth) {
  if (depth % 8 != 0)
    return kb.cBool(false);
  Value c0 = kb.idx(0);
  Value ptr = memref::ExtractAlignedPointerAsIndexOp::create(b, src);
  return kb.andI(kb.eq(kb.remu(ptr, kb.idx(16)), c0),
                 kb.eq(kb.remu(width, kb.idx(8)), c0));
}

SmallVector<Value> TileStaging::fetch(Value src, ArrayRef<Place> at,
                                      Value width, Value row0, Value aligned,
                                      function_ref<Value(Value row)> rowKept) {
  VectorType vec8 = VectorType::get({8}, elt);
  Value c0 = kb.idx(0);
  SmallVector<Type> types(at.size(), vec8);
  auto load = [&]() -> SmallVector<Value> {
    SmallVector<Value> xs;
    for (const Place &p : at) {
      Value row = kb.add(row0, p.r);
      Value ok = kb.andI(kb.lt(row, N), kb.lt(p.col, width));
      if (p.inTile)
        ok = kb.andI(ok, p.inTile);
      Value safeRow = kb.select(ok, row, c0);
      Value x = vector::LoadOp::create(
          b, vec8, src, ValueRange{bi, safeRow, kb.select(ok, p.col, c0)},
          /*nontemporal=*/false, llvm::MaybeAlign(16));
      if (rowKept)
        ok = kb.andI(ok, rowKept(safeRow));
      xs.push_back(kb.select(ok, x, kb.constLike(vec8, 0.0)));
    }
    return xs;
  };
  if (isConstantIntValue(aligned, 1))
    return load();
  return kb.ifElse(aligned, types, load, [&]() -> SmallVector<Value> {
    return SmallVector<Value>(at.size(), kb.constLike(vec8, 0.0));
  });
}

void TileStaging::put(ValueRange xs, ArrayRef<Place> at, Value dst) {
  for (auto [x, p] : llvm::zip(xs, at)) {
    auto store = [&, x = x, p = p] {
      vector::StoreOp::create(b, x, dst, ValueRange{p.r, p.col},
                              /*nontemporal=*/false, llvm::MaybeAlign(16));
    };
    if (p.inTile)
      kb.ifThen(p.inTile, store);
    else
      store();
  }
}

void TileStaging::copyAsync(Value src, ArrayRef<Place> at, Value width,
                            Value row0, Value dst,
                            function_ref<Value(Value row)> rowKept) {
  Value c0 = kb.idx(0);
  auto token = nvgpu::DeviceAsyncTokenType::get(b.getContext());
  for (const Place &p : at) {
    auto copy = [&, p = p] {
      Value row = kb.add(row0, p.r);
      Value ok = kb.andI(kb.lt(row, N), kb.lt(p.col, width));
      Value safeRow = kb.select(ok, row, c0);
      if (rowKept)
        ok = kb.andI(ok, rowKept(safeRow));
      nvgpu::DeviceAsyncCopyOp::create(
          b, token, dst, ValueRange{p.r, p.col}, src,
          ValueRange{bi, safeRow, kb.select(ok, p.col, c0)}, b.getIndexAttr(8),
          kb.select(ok, kb.idx(8), c0), b.getUnitAttr());
    };
    if (p.inTile)
      kb.ifThen(p.inTile, copy);
    else
      copy();
  }
}

void TileStaging::elements(Value src, Value dst, int64_t rows, int64_t cols,
                           Value width, Value row0,
                           function_ref<Value(Value row)> rowKept) {
  Value c0 = kb.idx(0);
  kb.forLoop(tid, kb.idx(rows * cols), kb.idx(threads), [&](Value v) {
    Value r = kb.divu(v, kb.idx(cols)), col = kb.remu(v, kb.idx(cols));
    Value row = kb.add(row0, r);
    Value ok = kb.andI(kb.lt(row, N), kb.lt(col, width));
    Value safeRow = kb.select(ok, row, c0);
    Value x = kb.load(src, {bi, safeRow, kb.select(ok, col, c0)});
    if (rowKept)
      ok = kb.andI(ok, rowKept(safeRow));
    kb.store(kb.select(ok, x, kb.constLike(elt, 0.0)), dst, {r, col});
  });
}
