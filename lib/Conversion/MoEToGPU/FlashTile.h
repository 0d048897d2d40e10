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

/// Which row tile (along the grid's x) and batch element (y) each block of a
/// flash kernel takes. Under a causal mask the tiles' work differs: by query,
/// tile t reads the key tiles up to its last row (t + 1 of them); by key (the
/// backward's key-major passes), the query tiles from its first row. Taken in
/// the grid's order, the blocks a multiprocessor holds at once are then of
/// like weight (the hardware deals the first blocks one a multiprocessor,
/// then a second round in the same order), and the light ones go first: at
/// B = 4, N = 4096 with 64-row tiles (256 blocks, all resident on 132
/// multiprocessors at 2 each) the busiest multiprocessor has 124 tile pairs
/// to compute where the mean is 63. Balanced, the blocks take the tiles
/// heaviest first (the longest processing time first rule, for grids of
/// several waves), and the first wave's second round in reverse, so that a
/// multiprocessor's second block holds about what its first lacks: the
/// busiest multiprocessor then has about 65. A permutation of the blocks: the
/// results are the same bits.
enum class FlashBlockOrder {
  /// Block (x, y) takes tile x of batch element y.
  Grid,
  /// Causal, the tile's work growing with its index (by query).
  CausalByQuery,
  /// Causal, the work shrinking with the index (by key).
  CausalByKey,
};

/// The tile, batch element and (with `splits`: a grid of key splits along z)
/// split of this block under `order`, for a grid of (tiles, batch elements,
/// splits) blocks. With a causal order the lanes of a tile are its (element,
/// split) pairs, l = split * batch + element, L of them (a split's share of
/// a tile's keys is about the tile's work / splits): the position p = l *
/// tiles + x, the multiprocessors S (%nsmid) and the first wave W =
/// min(tiles * L, 2S) give the work item i = S + W - 1 - p for p in [S, W)
/// and p elsewhere; item i is the (i / L)-th heaviest tile of lane i % L.
/// In the grid's order nothing is computed: the accessors read the block id
/// where they are called (ptxas re-reads a block id rather than holding it
/// in a register across the kernel's loops).
struct FlashBlockPlace {
  /// Computed under a causal order; null in the grid's.
  Value tile, batch, split;
  Value tileOf(GpuKernelBuilder &kb) const {
    return tile ? tile : kb.blockId();
  }
  Value batchOf(GpuKernelBuilder &kb) const {
    return batch ? batch : kb.blockId(gpu::Dimension::y);
  }
  Value splitOf(GpuKernelBuilder &kb) const {
    return split ? split : kb.blockId(gpu::Dimension::z);
  }
};
FlashBlockPlace flashBlockPlace(GpuKernelBuilder &kb, FlashBlockOrder order,
                                bool splits = false);

/// The causal order of a kernel whose tile work grows with the index
/// (`byKey` false) or shrinks (true) where `causal` and `balance`, else
/// FlashBlockOrder::Grid.
inline FlashBlockOrder flashBlockOrder(bool causal, bool balance, bool byKey) {
  if (!causal || !balance)
    return FlashBlockOrder::Grid;
  return byKey ? FlashBlockOrder::CausalByKey : FlashBlockOrder::CausalByQuery;
}

struct FlashTile {
  /// Builds the thread's lanes, b and the tile's first row in kernel `kb`,
  /// the block's tile and batch element taken in `order`.
  explicit FlashTile(GpuKernelBuilder &kb,
                     FlashBlockOrder order = FlashBlockOrder::Grid);
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

/// The rows of a mixing kernel on FlashTile's blocks (FlashMix.cpp): the thread's tile in the spec's block order, the rows
/// N and features D of q and the keys Nk, the thread's row clamped, the head
/// of the added scores (attention_posterior's; null without them) and the
/// key loop's end: Nk, or causal the block's last row + 1 (at most Nk).
struct FlashMixRows {
  FlashMixRows(GpuKernelBuilder &kb, const FlashMixSpec &spec,
               const FlashMixArgs &args);
  FlashTile tile;
  Value N, D, Nk, head, keyEnd;
};

/// The alignment in bytes of the flash kernels' workgroup buffers. ldmatrix
/// reads 16-byte rows, cp.async copies 16 bytes and st.shared.v4 /
/// ld.shared.v4 move 16 bytes: each needs a 16-byte aligned address, which
/// the padded row strides keep only from a 16-byte aligned base (LLVM gives a
/// workgroup global its element's alignment, 2 bytes for f16/bf16, by
/// default).
constexpr int64_t kFlashSharedAlign = 16;

/// Gives every workgroup buffer of `func` the alignment `bytes` (llvm.align on
/// the attribution: the .shared declaration's .align in the PTX).
void alignWorkgroupBuffers(gpu::GPUFuncOp func,
                           int64_t bytes = kFlashSharedAlign);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_FLASHTILE_H
