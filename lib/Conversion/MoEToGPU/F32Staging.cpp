//===- F32Staging.cpp - f32 row tiles into shared memory ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "F32Staging.h"

#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe::gpu_lowering;

/// Whether the f32 operand `src` [B, rows, width] can be staged kF32Vec floats
/// at a time: a 16-byte aligned base and a width a multiple of kF32Vec.
Value mlir::moe::gpu_lowering::f32StagedAligned(GpuKernelBuilder &kb,
                                                ImplicitLocOpBuilder &b,
                                                Value src, Value width) {
  Value c0 = kb.idx(0);
  Value ptr = memref::ExtractAlignedPointerAsIndexOp::create(b, src);
  return kb.andI(kb.eq(kb.remu(ptr, kb.idx(16)), c0),
                 kb.eq(kb.remu(width, kb.idx(kF32Vec)), c0));
}

void F32Stage::operator()(Value src, Value dst, int64_t rows, int64_t cols,
                          Value row0, Value limit, Value col0, Value width,
                          bool vectors, function_ref<Value(Value row)> rowKept,
                          function_ref<void(Value x, Value r, Value c)> put) {
  Value c0 = kb.idx(0);
  auto store = [&](Value x, Value r, Value c) {
    if (put)
      return put(x, r, c);
    if (isa<VectorType>(x.getType()))
      vector::StoreOp::create(b, x, dst, ValueRange{r, c},
                              /*nontemporal=*/false, llvm::MaybeAlign(16));
    else
      kb.store(x, dst, {r, c});
  };
  auto byVectors = [&] {
    VectorType v4 = VectorType::get({kF32Vec}, kb.f32());
    Value zeros = kb.constLike(v4, 0.0);
    const int64_t perRow = cols / kF32Vec, count = rows * perRow;
    for (int64_t v0 = 0; v0 < count; v0 += threads) {
      Value v = kb.add(tid, kb.idx(v0));
      auto one = [&] {
        Value r = kb.divu(v, kb.idx(perRow));
        Value c = kb.mul(kb.remu(v, kb.idx(perRow)), kb.idx(kF32Vec));
        Value row = kb.add(row0, r), col = kb.add(col0, c);
        Value ok = kb.andI(kb.lt(row, limit), kb.lt(col, width));
        Value safeRow = kb.select(ok, row, c0);
        Value x = vector::LoadOp::create(
            b, v4, src, ValueRange{bi, safeRow, kb.select(ok, col, c0)},
            /*nontemporal=*/false, llvm::MaybeAlign(16));
        if (rowKept)
          ok = kb.andI(ok, rowKept(safeRow));
        store(kb.select(ok, x, zeros), r, c);
      };
      if (v0 + threads > count)
        kb.ifThen(kb.lt(v, kb.idx(count)), one);
      else
        one();
    }
  };
  auto elements = [&] {
    kb.forLoop(tid, kb.idx(rows * cols), kb.idx(threads), [&](Value v) {
      Value r = kb.divu(v, kb.idx(cols)), c = kb.remu(v, kb.idx(cols));
      Value row = kb.add(row0, r), col = kb.add(col0, c);
      Value ok = kb.andI(kb.lt(row, limit), kb.lt(col, width));
      Value safeRow = kb.select(ok, row, c0);
      Value x = kb.loadF(src, {bi, safeRow, kb.select(ok, col, c0)});
      if (rowKept)
        ok = kb.andI(ok, rowKept(safeRow));
      store(kb.select(ok, x, kb.cF32(0.0)), r, c);
    });
  };
  if (vectors)
    byVectors();
  else
    elements();
}
