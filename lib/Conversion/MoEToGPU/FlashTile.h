//===- FlashTile.h - A thread's place in a flash kernel's tile --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The row tile of the flash kernels (FlashMix.cpp, FlashGrad.cpp): a block of
// kFlashThreads threads along x owns the kFlashRows rows from rowBase of
// batch element b (the grid's y), a group of kFlashGroup lanes a row.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_FLASHTILE_H
#define MOE_LIB_CONVERSION_MOETOGPU_FLASHTILE_H

#include "KernelUtils.h"
#include "Lowerings.h"

namespace mlir::moe::gpu_lowering {

struct FlashTile {
  /// Builds the thread's lanes, b and the tile's first row in kernel `kb`.
  explicit FlashTile(GpuKernelBuilder &kb);
  /// Builds the thread's row among `rows` (c1: the index 1): i = rowBase +
  /// its group's row, active iff i < rows, and `row` = i clamped to the last
  /// row, so that the groups past the end load a valid row (and store
  /// nothing: the caller guards its stores with `active`). Apart from the
  /// constructor so that the caller's dims stay where they were built.
  void clampRow(GpuKernelBuilder &kb, Value rows, Value c1);

  FlashLanes t;
  Value b, rowBase;
  Value i, active, row;
};

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_FLASHTILE_H
