//===- FlashTile.cpp - A thread's place in a flash kernel's tile ----------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "FlashTile.h"

using namespace mlir;
using namespace mlir::moe::gpu_lowering;

// One op a statement, in the order the kernels have always emitted them (a
// call's arguments would be built in the C++ compiler's order).
FlashTile::FlashTile(GpuKernelBuilder &kb) {
  Value tid = kb.threadId();
  Value row = kb.divu(tid, kb.idx(kFlashGroup));
  Value lane = kb.remu(tid, kb.idx(kFlashGroup));
  t = {tid, row, lane};
  b = kb.blockId(gpu::Dimension::y);
  Value tileRows = kb.idx(kFlashRows);
  Value tile = kb.blockId();
  rowBase = kb.mul(tile, tileRows);
}

void FlashTile::clampRow(GpuKernelBuilder &kb, Value rows, Value c1) {
  i = kb.add(rowBase, t.row);
  active = kb.lt(i, rows);
  row = kb.select(active, i, kb.sub(rows, c1));
}
