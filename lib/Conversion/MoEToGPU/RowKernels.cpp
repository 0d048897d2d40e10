//===- RowKernels.cpp - Layouts of the kernels over rows ------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "RowKernels.h"

#include "MoE/Kernels/Balance.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

Value mlir::moe::gpu_lowering::allocResultLike(HostCode &h,
                                               RankedTensorType type,
                                               Value like) {
  return h.allocLike(type, dynamicSizesFrom(h.kb, type, like));
}

WarpRow::WarpRow(GpuKernelBuilder &g, int64_t blockSize) {
  Value tid = g.threadId();
  lane = g.remu(tid, g.idx(kWarp));
  Value warp = g.divu(tid, g.idx(kWarp));
  Value block = g.blockId();
  Value firstRow = g.mul(block, g.idx(blockSize / kWarp));
  row = g.add(firstRow, warp);
}

Value WarpRow::blocks(GpuKernelBuilder &kb, Value rows, int64_t blockSize) {
  return kb.ceilDiv(rows, kb.idx(blockSize / kWarp));
}

RowBlock::RowBlock(GpuKernelBuilder &g, Value x) : g(g) {
  tid = g.threadId();
  warp = g.divu(tid, g.idx(kWarp));
  lane = g.remu(tid, g.idx(kWarp));
  rows = g.dim(x, 0);
  block = g.blockId();
  first = g.mul(block, g.idx(kernels::kBalanceRowsPerBlock));
  Value left = g.sub(rows, first);
  count = g.minu(left, g.idx(kernels::kBalanceRowsPerBlock));
}

void RowBlock::forEachRowOfWarp(function_ref<void(Value r)> body) {
  g.forLoop(warp, count, g.idx(kRowBlockThreads / kWarp), body);
}

Value mlir::moe::gpu_lowering::rowBlockCount(GpuKernelBuilder &kb,
                                             Value rows) {
  return kb.ceilDiv(rows, kb.idx(kernels::kBalanceRowsPerBlock));
}

SmallVector<Value>
mlir::moe::gpu_lowering::sumInOrder(GpuKernelBuilder &g, Value n,
                                    ArrayRef<function_ref<Value(Value)>> terms) {
  SmallVector<Value> zeros;
  for (size_t j = 0; j < terms.size(); ++j)
    zeros.push_back(g.cF32(0.0));
  Value from = g.idx(0);
  Value step = g.idx(1);
  return g.forLoop(from, n, step, zeros,
                   [&](Value i, ValueRange acc) -> SmallVector<Value> {
                     SmallVector<Value> next;
                     for (auto [sum, term] : llvm::zip_equal(acc, terms))
                       next.push_back(g.fadd(sum, term(i)));
                     return next;
                   });
}

Value mlir::moe::gpu_lowering::sumInOrder(GpuKernelBuilder &g, Value n,
                                          function_ref<Value(Value)> term) {
  return sumInOrder(g, n, ArrayRef<function_ref<Value(Value)>>{term})[0];
}
