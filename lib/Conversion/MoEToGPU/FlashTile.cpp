//===- FlashTile.cpp - A thread's place in a flash kernel's tile ----------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "FlashTile.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

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

void mlir::moe::gpu_lowering::alignWorkgroupBuffers(gpu::GPUFuncOp func,
                                                    int64_t bytes) {
  Builder b(func.getContext());
  for (unsigned i = 0, e = func.getNumWorkgroupAttributions(); i < e; ++i)
    func.setWorkgroupAttributionAttr(i, LLVM::LLVMDialect::getAlignAttrName(),
                                     b.getI64IntegerAttr(bytes));
}
