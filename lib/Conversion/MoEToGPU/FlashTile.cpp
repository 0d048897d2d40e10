//===- FlashTile.cpp - A thread's place in a flash kernel's tile ----------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "FlashTile.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"

using namespace mlir;
using namespace mlir::moe::gpu_lowering;

// One op a statement, in the order the kernels have always emitted them (a
// call's arguments would be built in the C++ compiler's order).
FlashTile::FlashTile(GpuKernelBuilder &kb, FlashBlockOrder order) {
  Value tid = kb.threadId();
  Value row = kb.divu(tid, kb.idx(kFlashGroup));
  Value lane = kb.remu(tid, kb.idx(kFlashGroup));
  t = {tid, row, lane};
  FlashBlockPlace place = flashBlockPlace(kb, order);
  b = place.batchOf(kb);
  Value tileRows = kb.idx(kFlashRows);
  Value tile = place.tileOf(kb);
  rowBase = kb.mul(tile, tileRows);
}

FlashBlockPlace
mlir::moe::gpu_lowering::flashBlockPlace(GpuKernelBuilder &kb,
                                         FlashBlockOrder order, bool splits) {
  if (order == FlashBlockOrder::Grid)
    return {};
  Value x = kb.blockId();
  Value y = kb.blockId(gpu::Dimension::y);
  Value c1 = kb.idx(1);
  Value tiles = kb.gridDim();
  Value batch = kb.gridDim(gpu::Dimension::y);
  // With splits the (element, split) pairs are the lanes of a tile's work:
  // a split's share of a tile's keys is about the tile's work / splits.
  Value lanes = batch, lane = y;
  if (splits) {
    Value z = kb.blockId(gpu::Dimension::z);
    lanes = kb.mul(batch, kb.gridDim(gpu::Dimension::z));
    lane = kb.add(kb.mul(z, batch), y);
  }
  Value blocks = kb.mul(tiles, lanes);
  Value pos = kb.add(kb.mul(lane, tiles), x);
  Value sms = kb.castInt(NVVM::SmDimOp::create(kb.b, kb.b.getI32Type()),
                         kb.index());
  Value wave = kb.minu(blocks, kb.add(sms, sms));
  // One op a statement: as arguments of one call, the C++ compiler's order.
  Value pastFirstRound = kb.cmpi(arith::CmpIPredicate::uge, pos, sms);
  Value inWave = kb.cmpi(arith::CmpIPredicate::ult, pos, wave);
  Value inSecondRound = kb.andI(pastFirstRound, inWave);
  Value end = kb.add(sms, wave);
  Value reversed = kb.sub(end, kb.add(pos, c1));
  Value item = kb.select(inSecondRound, reversed, pos);
  Value rank = kb.divu(item, lanes);
  Value itemLane = kb.remu(item, lanes);
  Value tile = order == FlashBlockOrder::CausalByQuery
                   ? kb.sub(kb.sub(tiles, c1), rank)
                   : rank;
  if (!splits)
    return {tile, itemLane, Value()};
  Value element = kb.remu(itemLane, batch);
  return {tile, element, kb.divu(itemLane, batch)};
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
