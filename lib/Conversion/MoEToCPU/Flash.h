//===- Flash.h - Tiled online-softmax mixing kernel ---------------*- C++
//-*-===//
//
// Part of the MoE-MLIR project.
//
// p[b,i,:] = Σ_j softmax_j(logit(<q_i, k_j>, b, i, j)) · v[b,j,:] without the
// N x Nk matrix: query tiles of kQueryTile rows are the parallel items; each
// streams key tiles of kKeyTile keys. Per (query tile, key tile) block:
//  * QK: a register-blocked micro-kernel, kQueryTile x (kKeyTile / 16) vector
//    accumulators, one FMA per (row, 16 keys, d), reading the keys transposed
//    per key tile (packed once) and the query scalars broadcast;
//  * the op-specific logit epilogue on the 16-lane dot vectors (scale, masks,
//    additive terms), -inf = excluded key;
//  * an online softmax per row over the tile (tile max, one rescale of the
//    K-wide accumulator per tile, vectorized exp);
//  * PV: acc[r, :] += p[r, j] · v[j, :], vector<16> over the value width K.
// Extra memory: the packed keys and values (O(Nk·(D+K))) and per-worker
// scratch of a few KB, never O(N·Nk).
//
// Excluded keys never reach the accumulator: when some value is non-finite
// (0 · inf = NaN) the blocks that hold an excluded key take a guarded PV loop
// that skips them, exactly as the portable lowering does.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_FLASH_H
#define MOE_LIB_CONVERSION_MOETOCPU_FLASH_H

#include "KernelBuilder.h"

#include <functional>

namespace mlir::moe::cpu {

constexpr int64_t kQueryTile = 8;
constexpr int64_t kKeyTile = 32;

struct FlashSpec {
  /// Queries [B, N, D] (any float type; read as f32 scalars).
  Value q;
  /// Keys transposed in key tiles and padded: [B, Npad / kKeyTile, D,
  /// kKeyTile] f32 (key j at [b, j / kKeyTile, d, j % kKeyTile]), Npad =
  /// roundUp(Nk, kKeyTile). A tile's D x kKeyTile block is contiguous: a
  /// [B, D, Npad] layout puts its rows Npad·4 bytes apart, which for Npad a
  /// multiple of 1024 maps every row to one L1 set.
  Value keysT;
  /// Values padded: [B, Npad, Kp] f32, Kp = roundUp(K, kLanes), zero padding.
  Value values;
  /// Result [B, N, K] f32.
  Value out;
  /// Optional [B, N] f32: the row's log-sum-exp m + log(l) (-inf when no key).
  Value lse;
  Value batch, rows, keys, depth, width, widthPad; // index values
  /// NaN when some value is non-finite (f32, from packValues).
  Value valuesNonFinite;
  /// Query row i sees keys j <= i only (the key-tile loop stops at the
  /// diagonal).
  bool causal = false;
  /// The logits of 16 keys [j0, j0 + 16) of query row `i` from their dot
  /// products (vector<16xf32>); -inf for an excluded key. Must exclude the
  /// padding keys j >= Nk.
  std::function<Value(CK &, Value dot, Value b, Value i, Value j0)> logits;
};

/// Below this many multiply-adds a kernel stage runs on the calling thread:
/// waking the thread pool costs more than the work (decode sizes).
constexpr int64_t kInlineWork = int64_t(1) << 20;

/// CK::workers over `numItems`, on the calling thread when `work` (an index:
/// about the multiply-adds of all items) is below kInlineWork (CK::workers
/// itself decides on the item count only).
void workersIfLarge(CK &k, const KernelOptions &opts, Value numItems,
                    Value work,
                    function_ref<void(Value item, Value worker)> body);

/// Emits the kernel (workers over the B x ceil(N / kQueryTile) query tiles,
/// on the calling thread when the whole mix is small).
void emitFlashMix(CK &k, const KernelOptions &opts, const FlashSpec &spec);

/// Packs values [B, Nk, K] (any float) into [B, Npad, Kp] f32 with zero
/// padding; returns {packed, an f32 that is NaN iff some value is non-finite}.
std::pair<Value, Value> packValues(CK &k, Value values, Value batch, Value keys,
                                   Value width, Value keysPad, Value widthPad);

} // namespace mlir::moe::cpu

#endif // MOE_LIB_CONVERSION_MOETOCPU_FLASH_H
