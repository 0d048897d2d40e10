//===- Flash.h - Tiled online-softmax mixing kernel ---------------*- C++
//-*-===//
//
// Part of the MoE-MLIR project.
//
// p[b,i,:] = Σ_j softmax_j(logit(<q_i, k_j>, b, i, j)) · v[b,j,:] without the
// N x Nk matrix: blocks of query tiles of kQueryTile rows are the parallel
// items (rowBlocks); each streams key tiles of kKeyTile keys, every query
// tile of the block in turn. Per (query tile, key tile) pair:
//  * QK: a register-blocked micro-kernel (blocks of rows x key vectors sized
//    to the target's registers: 8 x 2 zmm on AVX-512, 6 x 2 and 2 x 4 ymm on
//    AVX2), one FMA per (row, vector of keys, d), reading the keys transposed
//    per key tile (packed once) and the query scalars broadcast;
//  * the op-specific logit epilogue on the 16-lane dot vectors (scale, masks,
//    additive terms), -inf = excluded key;
//  * an online softmax per row over the tile (tile max, one rescale of the
//    K-wide accumulator per tile, vectorized exp);
//  * PV: acc[r, :] += p[r, j] · v[j, :], vector<16> over the value width K.
// Extra memory: the packed keys and values (O(Nk·(D+K))) and per-worker
// scratch of a few GpuKernelBuilder, never O(N·Nk).
//
// Excluded keys never reach the accumulator: when some value is non-finite
// (0 · inf = NaN) the blocks that hold an excluded key take a guarded PV loop
// that skips them, exactly as the portable lowering does.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOCPU_FLASH_H
#define MOE_LIB_CONVERSION_MOETOCPU_FLASH_H

#include "Lowerings.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/FlashLogit.h"
#include "MoE/Kernels/OnlineSoftmax.h"
#include "MoE/Kernels/SymmetricMix.h"

#include <functional>
#include <optional>

namespace mlir::moe::cpu_lowering {

constexpr int64_t kQueryTile = 8;
constexpr int64_t kKeyTile = 32;
/// Row tiles that take each column tile in turn, one parallel item
/// (rowBlocks): the backward passes' and, by default, the forward's.
constexpr int64_t kQueryTilesPerBlock = 4;

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
  /// Query tiles a parallel item takes through the key tiles together
  /// (rowBlocks). One for logits that read an [N, Nk] operand along its rows
  /// (attention_posterior's scores): blocks of four interleave 32 row
  /// streams per key tile, ~8% slower there (A/B, x86-64-v4).
  int64_t tilesPerBlock = kQueryTilesPerBlock;
  /// The logits of 16 keys [j0, j0 + 16) of query row `i` from their dot
  /// products (vector<16xf32>); -inf for an excluded key. Must exclude the
  /// padding keys j >= Nk.
  std::function<Value(CpuKernelBuilder &, Value dot, Value b, Value i,
                      Value j0)>
      logits;
};

/// The FlashSpec of the mix of `values` [B, Nk, K] (any float; packed here by
/// packValues with keysPad keys and roundUp(K, kLanes) lanes) into `out`
/// [B, N, K] f32, for the queries `q` [B, N, D] against the packed keys
/// `keysT` (packKeysT layout, keysPad = roundUp(Nk, kKeyTile)) with the logit
/// epilogue `logits`; `lse` is left unset.
FlashSpec flashSpec(
    CpuKernelBuilder &kb, Value q, Value keysT, Value keysPad, Value values,
    Value out, Value batch, Value rows, Value keys, Value depth,
    std::function<Value(CpuKernelBuilder &, Value, Value, Value, Value)> logits,
    bool causal = false);

/// Below this many multiply-adds a kernel stage runs on the calling thread:
/// waking the thread pool costs more than the work (decode sizes).
constexpr int64_t kInlineWork = int64_t(1) << 20;

/// CpuKernelBuilder::workers over `numItems`, on the calling thread when `work`
/// (an index: about the multiply-adds of all items) is below kInlineWork, and
/// on the workers otherwise, however few the items (CpuKernelBuilder::workers
/// by itself decides on the item count).
void workersIfLarge(CpuKernelBuilder &kb, const KernelOptions &opts,
                    Value numItems, Value work,
                    function_ref<void(Value item, Value worker)> body);

/// Emits the kernel (workers over the B x ceil(N / kQueryTile) query tiles,
/// on the calling thread when the whole mix is small).
void emitFlashMix(CpuKernelBuilder &kb, const KernelOptions &opts,
                  const FlashSpec &spec);

/// Similarity mixing over half the pairs (FlashSymmetric.cpp): for
/// similarity_inform without `ws` and without a causal mask, whose logits
/// u_i·u_j/τ are symmetric. Runs where its guard holds (finite u and e, the
/// spread of |u_j|²/(2τ) over each element's valid keys at most
/// kMaxSymmetricSpread, N >= kMinSymmetricRows) and calls `exact` (the
/// flash kernel over the same outputs) otherwise, or when a row's sum comes
/// out below kMinSymmetricSum. Results equal the exact kernel's within f32
/// rounding and do not depend on the thread count.
struct SymmetricMixSpec {
  Value u;     // [B, N, D], any float
  Value keysT; // packKeysT(u)
  Value e;     // [B, N, K], any float
  Value keyValid; // optional [B, Npad] f32 (keyValidity)
  Value out;      // [B, N, K] f32
  Value lse;      // optional [B, N] f32: the row's log-sum-exp
  Value batch, rows, keysPad, depth, width; // index values
  float tau;
};
using kernels::kMaxSymmetricSpread;
using kernels::kMinSymmetricRows;
using kernels::kMinSymmetricSum;
void emitSymmetricMix(CpuKernelBuilder &kb, const KernelOptions &opts,
                      const SymmetricMixSpec &spec, function_ref<void()> exact);

/// The tiles of the mixing backward (FlashGrad.cpp), the transposed
/// counterpart of emitFlashMix: rows (kQueryTile per parallel item) against
/// columns streamed kKeyTile at a time, with the softmax probabilities
/// recomputed from the saved row log-sum-exp instead of an online max, and
/// several accumulators, each a weighted sum of packed column vectors:
///   out_a[b, r, :] = Σ_c w_a[r, c] · values_a[b, c, :]
/// where w_a is either S[r, c] or dX[r, c] (from `weights`). Nothing of size
/// rows x columns is stored; every output row has one writer (no atomics).
struct FlashGradSpec {
  /// The dot <rows[b, r, :], cols[b, c, :]> over `depth`: rows [B, R, depth]
  /// (any float, read as scalars), colsT packed by packKeysT [B, Ct, depth,
  /// kKeyTile].
  struct Dot {
    Value rows, colsT, depth;
  };
  /// Which column tiles a row tile visits: all, c <= r, or c >= r (causal
  /// masks, seen from the query or from the key side).
  enum class Band { All, Lower, Upper };
  FlashGradSpec(Dot score, Dot cotangent, Value batch, Value rows, Value cols,
                Band band = Band::All)
      : score(score), cotangent(cotangent), batch(batch), rows(rows),
        cols(cols), band(band) {}
  /// The score dot and the cotangent dot.
  Dot score, cotangent;
  /// Optional: a second cotangent dot, for symmetric scores (x_rc = x_cr),
  /// where one pass over the pairs (r, c) serves both the row's gradient and
  /// the gradient it gets as a column (SimilarityInformGrad).
  std::optional<Dot> cotangentT;
  Value batch, rows, cols; // index values
  Band band;
  /// {S, dX} of row `r` and the 16 columns [c0, c0 + 16) from the dot vectors
  /// (gDotT null without cotangentT); both must be 0 for excluded and padding
  /// columns.
  std::function<std::pair<Value, Value>(CpuKernelBuilder &, Value sDot,
                                        Value gDot, Value gDotT, Value b,
                                        Value r, Value c0)>
      weights;
  struct Accumulator {
    /// [B, Cpad, Wp] f32 from packValues (Cpad = roundUp(cols, kKeyTile)).
    Value values;
    /// Result [B, R, W] f32.
    Value out;
    Value width, widthPad;
    /// Weights dX (else S).
    bool useDx;
  };
  SmallVector<Accumulator, 2> accumulators;
};

/// The query-major S and dZ = S (g - delta_i) of row (b, i) and the keys
/// [j0, j0 + 16) (before any 1/scale): the row's logits recomputed by
/// `logits` (the forward's epilogue) from the score dot, then
/// softmaxGradFromLogSumExp with lse[b, i] and delta[b, i] ([B, N] f32).
kernels::SoftmaxGrad queryRowGrad(
    CpuKernelBuilder &kb,
    const std::function<Value(CpuKernelBuilder &, Value, Value, Value, Value)>
        &logits,
    Value lse, Value delta, Value sDot, Value gDot, Value b, Value i, Value j0);

/// Emits the backward tiles (workers over the B x ceil(R / kQueryTile) row
/// tiles).
void emitFlashGrad(CpuKernelBuilder &kb, const KernelOptions &opts,
                   const FlashGradSpec &spec);

/// The per-row inputs of a FlashGradSpec's weights, [B, rowsPad] f32 each
/// (padded for the vector loads of the column-major pass): lse' = the row's
/// log-sum-exp `lse` ([B, rows], from FlashSpec::lse), +inf for a row
/// without keys and for padding rows (so that exp(x - lse') = 0), and
/// delta_i = <dp_i, p_i> (0 for padding), from the forward's result `p` and
/// its cotangent `dp` ([B, rows, width]).
struct GradRowStats {
  Value lse, delta;
};
GradRowStats gradRowStats(CpuKernelBuilder &kb, Value lse, Value p, Value dp,
                          Value batch, Value rows, Value width, Value widthPad,
                          Value rowsPad);

// Building blocks shared by the forward and backward kernels.

/// The rows of each batch element in tiles of kQueryTile, the tiles in
/// blocks of `tilesPerBlock`: a block is a parallel item of the forward and
/// backward kernels (emitFlashMix, emitFlashGrad) and takes each column tile
/// in turn, so that the column tile's packed data is read from memory once
/// per block. `items` = B x blocksPerBatch.
struct RowBlocks {
  Value rows, tilesPerBatch, blocksPerBatch, items;
  int64_t tilesPerBlock;
};
RowBlocks rowBlocks(CpuKernelBuilder &kb, Value batch, Value rows,
                    int64_t tilesPerBlock = kQueryTilesPerBlock);
/// A row tile: its first row `i0` and kQueryTile row indices, where rows past
/// the end repeat the last row (computed, never stored).
struct RowTile {
  Value i0;
  SmallVector<Value> rows;
};
/// Block `item`: its batch element, first tile, tile count (<=
/// tilesPerBlock) and last row (< rows).
struct RowBlock {
  Value b, t0, count, lastRow;
  Value rows; // of the batch element
  /// The first row of tile qt (< count) of the block.
  Value firstRow(CpuKernelBuilder &kb, Value qt) const;
  /// Tile qt (< count) of the block.
  RowTile tile(CpuKernelBuilder &kb, Value qt) const;
};
RowBlock rowBlock(CpuKernelBuilder &kb, Value item, const RowBlocks &blocks);
/// Zeros the kQueryTile rows of `chunks` kLanes-vectors of `buf`.
void zeroRows(CpuKernelBuilder &kb, Value buf, Value chunks);

/// The kQueryTile x kKeyTile dot products of a tile (dotTile): in registers
/// when they fit the target's (AVX-512), else in a [kQueryTile, kKeyTile] f32
/// buffer (AVX2).
struct DotTile {
  /// The kLanes-wide vector of dots of row r, keys [v·kLanes, (v+1)·kLanes).
  Value at(int64_t r, int64_t v) const;
  CpuKernelBuilder *kb = nullptr;
  SmallVector<Value> dots; // in registers: row-major, kKeyTile / kLanes a row
  Value buf;               // else the buffer
};
/// The dot products of the rows `rowIdx` of `q` [B, R, D] with key tile `jt`
/// of `keysT` (packKeysT layout), over `depth`, computed in register blocks
/// of the target's width (opts.lanes()). `dotBuf` ([kQueryTile, kKeyTile]
/// f32) receives them when they do not fit the registers, or always with
/// `inBuffer` (a tile read while two others hold the registers); a caller may
/// overwrite a row of it once it has read that row's dots.
DotTile dotTile(CpuKernelBuilder &kb, const KernelOptions &opts, Value q,
                Value keysT, Value b, ArrayRef<Value> rowIdx, Value jt,
                Value depth, Value dotBuf, bool inBuffer = false);
/// accBuf[r, :] = accBuf[r, :] · alpha[r] + Σ_j pBuf[r, j] · values[b, j0 + j,
/// :] over the widthChunks 16-lane chunks (alpha empty: 1), in vectors of the
/// target's width (opts.lanes()). With `logitBuf`,
/// when `guarded` is true the entries whose logit is -inf are skipped (a
/// non-finite value times a zero weight must not reach the sum).
void accumulateTile(CpuKernelBuilder &kb, const KernelOptions &opts,
                    Value accBuf, Value pBuf, Value values, Value b, Value j0,
                    Value widthChunks, ArrayRef<Value> alpha,
                    Value logitBuf = {}, Value guarded = {});
/// x [B, N, D] (any float) packed transposed in key tiles: [B, ceil(N /
/// kKeyTile), D, kKeyTile] f32, zero padding (the keysT of FlashSpec).
Value packKeysT(CpuKernelBuilder &kb, const KernelOptions &opts, Value x,
                Value batch, Value rows, Value depth);
/// [B, keysPad] f32: 1 where key j < rows is valid (and mask[b, j], an
/// optional [B, N] i1), else 0.
Value keyValidity(CpuKernelBuilder &kb, Value mask, Value batch, Value rows,
                  Value keysPad);
/// Runs `body(b, i, col, count)` for every row (b, i) of a [batch, rows,
/// width] array (workers over the rows) and every kLanes-chunk of it: `col`
/// its first column, `count` = width - col the lanes inside (for masked
/// loads and stores).
void forEachRowChunk(
    CpuKernelBuilder &kb, const KernelOptions &opts, Value batch, Value rows,
    Value width,
    function_ref<void(Value b, Value i, Value col, Value count)> body);
/// init + x · w for x [B, N, D] (any float), w [D, W] (any float), init an
/// optional [B, N, W] f32: written into `out` ([B, N, W] f32; may be init),
/// or when `out` is null into a new buffer; returns it (vector over W).
Value projectRows(CpuKernelBuilder &kb, const KernelOptions &opts, Value x,
                  Value w, Value batch, Value rows, Value depth, Value outWidth,
                  Value init = {}, Value out = {});
/// The logit epilogue of `logit` (MoE/Kernels/FlashLogit.h: dot / scaleDiv,
/// no bias or added scores), -inf where keyValid (optional, [B, Npad] f32,
/// padding and key_mask) is 0 or, when causal, where the key comes after the
/// row.
std::function<Value(CpuKernelBuilder &, Value, Value, Value, Value)>
scaledMaskedLogits(Value keyValid, const kernels::FlashLogitSpec &logit);

/// Packs values [B, Nk, K] (any float) into [B, Npad, Kp] f32 with zero
/// padding; returns {packed, an f32 that is NaN iff some value is non-finite}.
std::pair<Value, Value> packValues(CpuKernelBuilder &kb, Value values,
                                   Value batch, Value keys, Value width,
                                   Value keysPad, Value widthPad);

// Attention-Inform (AttentionPosterior.cpp), shared by the forward and the
// backward kernel.

/// head_scale when set (`scale`), else the number of heads H (an index).
Value headScaleValue(CpuKernelBuilder &kb, std::optional<double> scale,
                     Value heads);
struct HeadMeans {
  /// m[b,j,:] = scale · v[b,h,j,:] · wo[:, h·Dh:(h+1)·Dh]^T of the head
  /// h = head[b] (i32 [B]) in the keysT layout of FlashSpec (zero padding).
  Value keysT;
  /// [B, keysPad] f32: ‖m_j‖² (0 for padding keys).
  Value norm2;
  Value keysPad; // roundUp(Nk, kKeyTile)
};
HeadMeans packHeadMeans(CpuKernelBuilder &kb, const KernelOptions &opts, Value v,
                        Value wo, Value head, Value scale, Value batch,
                        Value keys, Value model, Value headDim);
/// The posterior logit epilogue of FlashSpec (q = u, keys m):
/// kernels::flashLogit of attentionPosteriorLogit(σ), the GPU kernels' logit
/// term for term: <u_i,m_j>/σ² + ‖m_j‖²/(-2σ²) + s with
/// s = scores[b, head[b], i, j]; -inf where s = -inf and for the padding keys
/// j >= keys.
std::function<Value(CpuKernelBuilder &, Value, Value, Value, Value)>
posteriorLogits(Value scores, Value head, Value norm2, Value keys,
                double sigma);

/// The attention_posterior kernels, forward and backward, build head_select =
/// min_entropy: one head per batch element mixed by the flash passes;
/// head_select = all (a softmax over every head's pairs) stays on the
/// portable lowering, a match failure here.
template <typename OpTy>
LogicalResult matchMinEntropyHead(OpTy op, PatternRewriter &rw) {
  if (op.getHeadSelect() != HeadSelect::min_entropy)
    return rw.notifyMatchFailure(op, "head_select = all: portable lowering");
  return success();
}

} // namespace mlir::moe::cpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOCPU_FLASH_H
