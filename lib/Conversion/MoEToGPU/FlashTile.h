//===- FlashTile.h - A thread's place in a flash kernel's tile --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The row tile of the flash kernels (FlashMix.cpp, FlashGrad.cpp): a block of
// kFlashThreads threads along x owns the kFlashRows rows from rowBase of
// batch element b (the grid's y), a group of kFlashGroup lanes a row; and
// the alignment of every flash kernel's workgroup buffers.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_FLASHTILE_H
#define MOE_LIB_CONVERSION_MOETOGPU_FLASHTILE_H

#include "GpuKernelBuilder.h"
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

/// The alignment in bytes of the flash kernels' workgroup buffers. ldmatrix
/// reads 16-byte rows, cp.async copies 16 bytes and st.shared.v4 /
/// ld.shared.v4 move 16 bytes: each needs a 16-byte aligned address, which
/// the padded row strides keep only from a 16-byte aligned base (LLVM gives a
/// workgroup global its element's alignment, 2 bytes for f16/bf16, by
/// default). A TMA tile (cp.async.bulk.tensor) would need 128 bytes, and
/// 1024 with the 128-byte swizzle that wgmma's operand descriptors use (the
/// swizzle pattern repeats every 8 rows of 128 bytes): a wgmma variant must
/// pass those.
constexpr int64_t kFlashSharedAlign = 16;

/// Gives every workgroup buffer of `func` the alignment `bytes` (llvm.align on
/// the attribution: the .shared declaration's .align in the PTX).
void alignWorkgroupBuffers(gpu::GPUFuncOp func,
                           int64_t bytes = kFlashSharedAlign);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_FLASHTILE_H
