//===- FlashMma.cpp - The flash mixing kernel on tensor cores -------------===//
//
// Part of the MoE-MLIR project.
//
// The tensor-core form of the flash mixing kernel (launchFlashMix,
// FlashMix.cpp) for f16 and bf16 operands: the two products of each
// key tile, the logits Q·Kᵀ and the mixing P·E, run on warp-level MMA
// (mma.sync m16n8k16, f32 accumulation), FlashAttention-2 style:
//
//  * a block of 4 warps owns 64 query rows, a warp 16 of them; a thread holds
//    its rows' query fragments (the A operand of Q·Kᵀ) in registers for the
//    whole kernel, loaded once from global memory;
//  * key tiles of `cols` keys (64, or 32 / 16 when the tiles would not fit the
//    shared memory) are staged in workgroup memory: keys [cols x D] and
//    values e [cols x K], rows padded by 8 elements (16 bytes: ldmatrix's
//    row addresses then fall in distinct banks); keys past Nk, masked keys
//    and features past D or experts past K are zeros;
//  * the B operands come from workgroup memory through ldmatrix (x4: two
//    8-wide blocks at a time; the values' with .trans), the logits' C
//    fragments become the mixing's A fragments in registers (no trip through
//    memory);
//  * the online softmax runs in f32 on the C fragments, in base 2
//    (FlashAttention-2's: log2(e)/tau folded into one FFMA a score and one
//    MUFU.EX2, the row max in log2 units): a row's 16 values of a tile are
//    spread over the 4 lanes of a quad, so the tile max is a 4-lane
//    reduction; whole key tiles run without bounds or causal selects before
//    the checked last/diagonal ones;
//  * f16: nvgpu.ldmatrix + nvgpu.mma.sync; bf16: nvgpu.ldmatrix and
//    nvvm.mma.sync on the bitcast 32-bit registers (MLIR 22's NVGPU-to-NVVM
//    conversion does not map bf16 mma.sync).
//
// The probabilities enter the second product rounded to the operand type
// (f16/bf16), as in FlashAttention; the sums are f32. One difference from the
// scalar kernel remains: a non-finite e value of a key that causal masking
// hides from some of the tile's rows (the diagonal tiles) reaches those rows
// (0 · inf = NaN), where the scalar kernel skips the key. Masked keys and
// padding are zeros in the staged tile and cannot. The lowering uses this
// kernel for f16/bf16 operands since an H100 run passed the float64 checks
// (2026-11-24: 5.1x the f32-path kernel; its option, flash-mma, is gone).
// What the H200 run of 2026-11-26 decided is the kernel, without options
// (their losers deleted on 2026-11-28): the base-2 softmax with the row sums
// on the tensor cores, 16-byte and cp.async staging, the fused top-k and
// attention_posterior on this kernel, the lazy rescale and three stages.
//
// The kernel also runs similarity_inform_topk: its epilogue selects each
// row's top k from the normalized accumulators with the scalar kernel's
// register top-k (emitRegisterTopk, the shared order of MoE/Kernels/TopK.h)
// on the C-fragment layout, a row's experts over the 4 lanes of its quad
// (17.8x the scalar kernel on the H200).
//
// It runs attention_posterior's mixing too (and attention_posterior_topk's):
// q = u, the keys are the head means in the operand type
// (AttentionPosterior.cpp's head-means kernel rounds them once), and the
// per-key bias and the added scores of the selected head enter the f32 C
// fragments of Q·Kᵀ (the logit of MoE/Kernels/FlashLogit.h, dot / sigma²
// + bias + score, in log2 units), each element at its fragment's key column.
//
// The row sums come from the tensor cores (issue #47 item 2), as P·[e | 1]:
// one more accumulator block past the experts', one more MMA per 16 keys
// against a constant B operand of ones, no FADD a score and no quad shuffles
// of the sums; the sum is then of the rounded probabilities that enter P·e
// (FlashAttention sums the unrounded ones). The accumulators are rescaled
// only in a tile where a row max of the warp changed (a warp vote; elsewhere
// the factor is exactly 1). Where the fragments held through the key loop
// pass 160 registers (D = K = 256) each lane sums its own scores instead.
//
// With flash-mma-block-rows=128 (the default; issue #47 item 3) a warp owns
// two 16-row MMA tiles (a block 128 rows), FlashAttention-2's 4 warps x 128
// rows: each ldmatrix of keys feeds 4 MMAs and each of values 2 per tile
// (half the LDSM a score), the staging's cost is spread over twice the
// scores, and the staging's 16-byte alignment is decided once outside the
// key loops, so the aligned loops stage with straight-line 16-byte loads or
// cp.async copies (D = 64: 4 + 1 a thread and tile) and no loop or branch.
// Where both tiles' fragments pass about 200 registers (D = 256) the kernel
// keeps one row tile; so does attention_posterior (its per-element loads).
// The fused top-k's epilogue selects the thread's four rows one after
// another. With flash-mma-key-splits=S as well, a grid of fewer
// than 264 blocks (B = 1, N = 16384: 128) has its row blocks' key tiles
// split over up to S blocks along z (FlashAttention's split-KV / flash
// decoding): each writes partial rows, a second kernel combines them
// (launchSplitFlashMixMma; for the fused top-k a quad of lanes a row,
// selecting as the epilogue does: launchSplitTopkCombine).
//
// The 128-row kernel runs its whole key tiles in a hot loop against a stale
// shift (issue #47 item 2), FlashAttention-4's conditional rescale: no row
// max, shuffle or rescale a tile, one OR of the packed P registers and one
// vote to find a weight of 2 or more, and the exact step only for such a
// tile, in a loop around the hot one (lazyLoop). Its cp.async pipeline has
// three tile buffers in dynamic shared memory, each tile's copies issued two
// tiles ahead (pipelineStep).
//
//===----------------------------------------------------------------------===//

#include "FlashTile.h"
#include "MmaFragments.h"
#include "HostCode.h"
#include "Reductions.h"
#include "RegisterTopk.h"
#include "Lowerings.h"

#include "MoE/Kernels/FlashLogit.h"
#include "MoE/Kernels/OnlineSoftmax.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

/// The key and value tile buffers of the kernel: `buffers` tiles of `cols`
/// rows, padded by kLdmatrixPad elements.
static SmallVector<MemRefType, 4> flashMmaSharedTypes(const FlashMmaTile &tile,
                                                      Type elt) {
  return {
      workgroupMemRef({tile.buffers * tile.cols, tile.depth + kLdmatrixPad},
                      elt),
      workgroupMemRef({tile.buffers * tile.cols, tile.experts + kLdmatrixPad},
                      elt),
  };
}

/// The bytes of dynamic shared memory the kernel's buffers take at a launch
/// (flashMmaSharedTypes).
static int64_t flashMmaSharedBytes(const FlashMmaTile &tile, Type elt) {
  int64_t bytes = 0;
  for (MemRefType type : flashMmaSharedTypes(tile, elt))
    bytes += type.getNumElements() *
             type.getElementType().getIntOrFloatBitWidth() / 8;
  return bytes;
}

std::optional<FlashMmaTile> mlir::moe::gpu_lowering::flashMmaTile(
    const FlashMixSpec &spec, Type qElt, Type keyElt, Type eElt, int64_t depth,
    const ConvertMoEToGPUOptions &options) {
  const int64_t sharedMemoryBytes = options.sharedMemoryBytes;
  const int64_t blockRows = options.flashMmaBlockRows;
  const int64_t keySplits = options.flashMmaKeySplits;
  if (!(qElt.isF16() || qElt.isBF16()) || keyElt != qElt || eElt != qElt)
    return std::nullopt;
  if (ShapedType::isDynamic(depth) || depth < 1 || depth > kFlashMmaMaxDepth ||
      spec.numExperts < 1 || spec.numExperts > kFlashMaxExperts)
    return std::nullopt;
  FlashMmaTile tile;
  tile.depth = llvm::alignTo(depth, 16);
  tile.experts = llvm::alignTo(spec.numExperts, 8);
  tile.wideKeys = depth % 8 == 0;
  tile.wideValues = spec.numExperts % 8 == 0;
  // The ones block's 4 accumulators more, not where the fragments held
  // through the key loop pass 160 registers (D = K = 256): there the fused
  // top-k spilled (ptxas, sm_80 and sm_90, 12-24 bytes); nor for
  // attention_posterior past D = 128, whose per-element bias and score
  // loads beside them spilled with the cp.async staging (D = 256, K = 16:
  // 88-104 bytes). Those keep base 2's sums.
  tile.sumMma = 4 * (tile.depth / 16 + tile.experts / 8 + 1) <= 160 &&
                !(spec.hasAddScores && tile.depth > 128);
  // attention_posterior past D = 128 stays single-buffered: with the second
  // buffer's copies in flight beside the per-element bias and score loads
  // ptxas spilled (sm_90, D = 256).
  const bool asyncStaging = !(spec.hasAddScores && tile.depth > 128);
  tile.asyncKeys = asyncStaging && depth % 8 == 0;
  tile.asyncValues =
      asyncStaging && spec.numExperts % 8 == 0 && !spec.hasKeyMask;
  tile.buffers = tile.asyncKeys || tile.asyncValues ? 2 : 1;
  // flash-mma-block-rows=128: two row tiles a warp without
  // attention_posterior's terms (their per-element loads take one row tile),
  // with the staging's alignment decided outside the key loops. The fused
  // top-k's epilogue takes the rows one after another.
  const bool twoRowTiles =
      blockRows == 128 && !spec.hasBias && !spec.hasAddScores;
  const int64_t accBlocks = tile.experts / 8 + (tile.sumMma ? 1 : 0);
  // Three stages: a third buffer, the tiles in dynamic shared memory (the
  // 128-row kernel's pipeline; its whole tiles' buffers known at each step;
  // 1.13x two stages without the lazy rescale on the H200, 2026-11-26).
  const int64_t buffers =
      twoRowTiles && tile.buffers == 2 ? 3 : tile.buffers;
  if (twoRowTiles)
    for (int64_t cols : {64, 32}) {
      int64_t bytes =
          buffers * cols *
          (tile.depth + kLdmatrixPad + tile.experts + kLdmatrixPad) * 2;
      // Both row tiles' query chunks, logits and accumulators held (4
      // registers a 16x8 tile each), 2 a value block (its B fragments), 48
      // with a key mask (the masked tiles' selects and their loads) plus
      // about 40: at most 200 of ptxas's 255 (D = 64, K = 16, 64-key tiles:
      // 166). Past it (D = 256) the kernel of one row tile, staging as
      // before (the hoisted, unrolled staging beside D = 256's fragments
      // spilled 436 bytes on sm_90). Without the value blocks' and the
      // mask's terms ptxas spilled (dynamic N, both kernels of the split
      // pair): D = 128, K = 32 with a mask 180-204 bytes on sm_80 and sm_90
      // (32-key tiles), D = 32, K = 64 56 bytes on sm_90, D = 64, K = 16
      // with a mask 4 bytes on sm_80 (64-key tiles).
      int64_t regs = 8 * (tile.depth / 16 + cols / 8 + accBlocks) +
                     2 * accBlocks + 40 + (spec.hasKeyMask ? 48 : 0);
      // The fused top-k's epilogue: one row's packed 64-bit candidates (2
      // per column of the quad lane) beside both tiles' accumulators.
      if (spec.topk)
        regs = std::max(regs, 8 * accBlocks + 4 * tile.experts / 8 + 40);
      if (bytes > sharedMemoryBytes || regs > 200)
        continue;
      tile.cols = cols;
      tile.rowTiles = 2;
      // The split-key kernel's causal block order (flash-causal-balance):
      // its computed batch element, split and row base, held across the key
      // loop where the block ids are re-read in the grid's order, took it
      // past 255 registers at an estimate of 186 (sm_80 and sm_90, D = 128,
      // K = 32, f16 with the lse, dynamic N: 4 bytes spilled).
      tile.splitCausalOrder = regs <= 176;
      tile.hoistStaging = true;
      tile.keySplits = std::max<int64_t>(keySplits, 1);
      tile.buffers = buffers;
      tile.dynamicShared = buffers == 3;
      // The lazy shift's margin: a probability of the row max is 2^-margin
      // after an exact step, so the warp stays in the lazy loop until a row
      // max grows by margin + 1 (P < 2). bf16 keeps f32's exponent range; f16
      // P flushes below 2^-24, so its margin is smaller (the smallest kept
      // term 2^-22 of the row's largest instead of 2^-24). Not with a key
      // mask in the split-key kernel: the mask's selects beside the lazy
      // loop and the split's partial rows took ptxas past 255 registers
      // (sm_90, D = 64, K = 16: 4 bytes spilled; 254 without the lazy loop).
      if (tile.sumMma && !(spec.hasKeyMask && tile.keySplits > 1)) {
        tile.lazyRescale = true;
        tile.lazyMargin = qElt.isBF16() ? 7 : 2;
      }
      // No register cap: 2 blocks a multiprocessor leave ptxas its 255
      // (what it needs decides the occupancy; a cap of 128 would spill).
      tile.blocksPerSM = 2;
      return tile;
    }
  for (int64_t cols : {64, 32, 16}) {
    // attention_posterior's logits read the bias and the added scores per
    // fragment element, with their addresses: at 64 keys a tile these
    // spilled on sm_80 and sm_90 (ptxas, D = 64 and D = 256), and at 32 keys
    // for D = 256, K = 64 (the estimate below over 144): smaller tiles, fewer
    // logit fragments.
    if (spec.hasAddScores &&
        (cols > 32 ||
         (cols > 16 &&
          4 * (tile.depth / 16 + cols / 8 + tile.experts / 8) + 40 > 144)))
      continue;
    // A thread's fragments (4 registers per 16x8 tile: the query's chunks,
    // the logits, the accumulator) plus about 40 of addresses and state.
    int64_t regs = 4 * (tile.depth / 16 + cols / 8 + tile.experts / 8 +
                        (tile.sumMma ? 1 : 0)) +
                   40;
    // A key mask's selects or the lse beside 64-key tiles of a kernel past
    // 136 registers spilled 4-8 bytes (D = 128, K = 64: with a mask on
    // sm_80, with the lse and causal on sm_90): 32-key tiles.
    if (cols == 64 && (spec.hasKeyMask || spec.withLse) &&
        !spec.hasAddScores && regs > 136)
      continue;
    int64_t bytes = tile.buffers * cols *
                    (tile.depth + kLdmatrixPad + tile.experts + kLdmatrixPad) *
                    2;
    // The fused top-k's epilogue: one row's packed 64-bit candidates (2 per
    // column of the quad lane) beside the other row's probabilities.
    if (spec.topk)
      regs = std::max(regs, 6 * tile.experts / 8 + 40);
    // attention_posterior's per-element bias and score loads spilled under
    // the 128-register cap of 4 blocks (ptxas, D = 64, sm_80 and sm_90);
    // so did the fused top-k of the base-2 kernel with the cp.async
    // staging's copies in flight (sm_80, a key mask, D = 40, K = 12: 12
    // bytes at 128 registers), a key mask's selects (D = 64, K = 32 or 64
    // and D = 128, K = 16: 8-24 bytes at 128 registers, dynamic N) and the
    // lse (D = 128, K = 64 causal, 32-key tiles: 4 bytes on sm_90).
    const int64_t blocksPerSM =
        regs <= 128 && !spec.hasAddScores && !spec.hasKeyMask &&
                !spec.withLse && !(spec.topk && tile.buffers > 1)
            ? 4
            : 2;
    if (bytes <= sharedMemoryBytes) {
      tile.cols = cols;
      tile.blocksPerSM = blocksPerSM;
      return tile;
    }
  }
  return std::nullopt;
}

/// The dynamic shared memory of a launch (i32 bytes), null for static
/// buffers.
static Value flashMmaDynamicBytes(ImplicitLocOpBuilder &b,
                                  const FlashMmaTile &tile, Type elt) {
  if (!tile.dynamicShared)
    return Value();
  return arith::ConstantOp::create(
      b, b.getI32IntegerAttr(flashMmaSharedBytes(tile, elt)));
}

/// The fused top-k (similarity_inform_topk) of one row whose
/// normalized values `vals` lie on the C-fragment layout: the scalar
/// kernel's epilogue (emitRegisterTopk) with the row's K values spread over
/// the 4 lanes of its quad, lane `tig` holding columns 8n + 2·tig and
/// 8n + 2·tig + 1 of each 8-expert block n (run 2 of the register layout),
/// so the rounds' reductions are 4-lane butterflies; the padding columns
/// past K never win (emitRegisterTopk masks indices >= K). `active` must be
/// uniform over the quad (its lanes share the row): every lane reaches the
/// shuffles, an inactive row stores nothing. The kernel's epilogue and the
/// split keys' combine both end here.
static void emitQuadRowTopk(GpuKernelBuilder &kb, const FlashMixSpec &spec,
                            ArrayRef<Value> vals, Value tig, Value flatRow,
                            Value active, Value weights, Value indices) {
  emitRegisterTopk(kb, {.vals = vals,
                        .lane = tig,
                        .width = 4,
                        .run = 2,
                        .numElements = spec.numExperts,
                        .rounds = TopkRounds::Butterfly,
                        .out = {.spec = *spec.topk,
                                .weights = weights,
                                .indices = indices,
                                .row = flatRow,
                                .active = active}});
}

/// The fused top-k of the thread's 2T rows (T row tiles of two rows), one
/// after the other (emitQuadRowTopk); rows past N store nothing.
static void emitMmaTopkEpilogue(GPUKernel &kernel, const FlashMixSpec &spec,
                                ArrayRef<Value> fin, int64_t accCount,
                                int64_t T, int64_t expertBlocks,
                                ArrayRef<Value> rowsOf, Value bi, Value N,
                                Value tig, Value out, Value outIdx) {
  GpuKernelBuilder &kb = kernel.kb;
  Value outRows = viewAs2D(kernel.b, out), idxRows = viewAs2D(kernel.b, outIdx);
  const int64_t accAll = T * accCount;
  for (int64_t rr = 0; rr < 2 * T; ++rr) {
    const int64_t t = rr / 2, r = rr % 2;
    SoftmaxState state = {fin[accAll + 2 * rr], fin[accAll + 2 * rr + 1]};
    SmallVector<Value> vals;
    for (int64_t eb = 0; eb < expertBlocks; ++eb)
      for (int64_t x = 0; x < 2; ++x)
        vals.push_back(softmaxNormalize(
            kb, state, fin[t * accCount + eb * 4 + 2 * r + x]));
    // One op a statement: the IR's order must not be the C++ compiler's
    // order of evaluating arguments.
    Value row = rowsOf[rr];
    Value active = kb.lt(row, N);
    Value flatRow = kb.add(kb.mul(bi, N), row);
    emitQuadRowTopk(kb, spec, vals, tig, flatRow, active, outRows, idxRows);
  }
}

static constexpr double kLog2e = 1.4426950408889634;
static constexpr double kLn2 = 0.6931471805599453;

namespace {
/// The tensor-core kernel (launchFlashMixMma) as a recipe: the block's place
/// and its threads' rows, the query fragments loaded once, then per key tile
/// the staging pipeline (stageKeysAndValues, pipelineStep), the logits on
/// the MMA (logitsOf), the online softmax in base 2 (exactTile, or the lazy
/// rescale's hot loop, lazyLoop) and the mixing (mixTile), and after the key
/// loops the epilogue (the partial rows of a split, the fused top-k, or the
/// normalized rows and the lse). Fragment elements are placed by the MMA
/// atoms' layouts (MmaFragments.h, Atoms.h).
class FlashMmaRecipe {
public:
  FlashMmaRecipe(GPUKernel &kernel, const FlashMixSpec &spec,
                 const FlashMmaTile &tile, Type elt)
      : kernel(kernel), spec(spec), tile(tile), elt(elt), kb(kernel.kb),
        b(kernel.b), log2(kernel.b), m{kernel.b, kernel.kb, elt}, K(spec.numExperts),
        cols(tile.cols), keyBlocks(tile.cols / 8), chunks(tile.depth / 16),
        expertBlocks(tile.experts / 8), sumMma(tile.sumMma),
        accBlocks(expertBlocks + (sumMma ? 1 : 0)), T(tile.rowTiles),
        blockRows(kMmaRows * T), accCount(accBlocks * 4), accAll(T * accCount),
        doubleBuffered(tile.buffers >= 2), stages(tile.buffers),
        rawDots(!spec.hasBias && !spec.hasAddScores) {}
  void emit() {
    bindArguments();
    bindTileBuffers();
    placeThreadRows();
    loadQueryFragments();
    wideType = VectorType::get({8}, elt);
    keysAligned = alignedBase(keys, tile.wideKeys || tile.asyncKeys);
    valuesAligned = alignedBase(e, tile.wideValues || tile.asyncValues);
    splitKeyRange();
    bindAddedScoreRows();
    initCarriedState();
    if (doubleBuffered && !tile.hoistStaging)
      stageFirstTile();
    // The softmax in base 2 (FlashAttention-2's): s = q.k from the MMA,
    // c = log2(e) / tau, the row's max m2 kept in log2 units (max s . c: c > 0,
    // the verifier's tau > 0 and sigma > 0), each weight
    //   p = 2^(s c - m2) = e^(s / tau - m)       one FFMA and one EX2,
    // the accumulator's factor 2^(m2_old - m2) once a row and tile. EX2 is
    // ex2.approx.ftz (2 ulp; a weight below 2^-126 of the row's largest, 1,
    // flushes to 0 and changes no sum: softmaxWeight's rule). The logit's
    // rounding moves from s / tau to the FFMA's s . c - m2, a relative error of
    // the weight of about 2^-24 |s c| + 2 ulp: far inside MMA_TOL (1e-2),
    // behind the operands' own rounding to f16/bf16. attention_posterior's
    // logit, s / sigma^2 + bias + score, becomes s . c + (bias + score) log2(e)
    // (one FFMA after the add), and its max the max of those.
    scale2 = kb.cF32(kLog2e / spec.scaleDiv);
    // Each lane sums its own columns of a row (p with the quad's common max)
    // and the quad's 4 partial sums are added once after the key loop, not
    // per tile: 2 shuffles a row instead of 2 a row and tile.
    // Not where the fragments held through the key loop (4 registers a
    // 16-feature chunk of the query, 4 an 8-expert block of the accumulator)
    // pass 160 of ptxas's 255 (D = K = 256: 192): there, with the quad's sums
    // added after the loop, the fused top-k kernel sat at 255 registers on
    // sm_80 and spilled the quad index g across the key loop to its epilogue
    // (12 bytes; summing the tile before the rescale did not help); the
    // tile's sum reduced over the quad in the loop, added with one FFMA, takes
    // it to 252 and no spill. The 2 shuffles a row and tile cost about half
    // an instruction a score there, against about 8 HMMA a score.
    sumsPerTile = chunks * 4 + accCount > 160;

    // Peeling: keys [0, fullEnd) come in whole tiles that no row of the block
    // excludes (every key < Nk, and when causal every key <= rowBase, the
    // block's first row): those tiles carry no bounds or causal select; the
    // tiles from fullEnd to keyEnd (the last, partial tile; the causal
    // diagonal) are the checked ones. Both loops run the same staging
    // pipeline, indexed by j0.
    // Not past 128 experts (D = K = 256, 32-key tiles): there the second
    // copy of the body made ptxas spill (sm_90, 12-28 bytes); nor past 128
    // features: at D = 256, K = 64 with static sizes (the causal B = 4,
    // N = 4096) it spilled 120 bytes on sm_90 (144 with the row sums from the
    // MMA), none unpeeled. There every tile is the checked one.
    fullEnd = c0;
    if (tile.experts <= 128 && tile.depth <= 128) {
      Value keyLimit = spec.causal ? kb.minu(Nk, kb.add(rowBase, c1)) : Nk;
      fullEnd = kb.mul(kb.divu(keyLimit, kb.idx(cols)), kb.idx(cols));
    }
    SmallVector<Value> fin = runKeyLoops();
    finishRowSums(fin);
    if (partials)
      return storePartialRows(fin);
    if (spec.topk)
      return emitMmaTopkEpilogue(kernel, spec, fin, accCount, T, expertBlocks,
                                 rowsOf, bi, N, tig, out, outIdx);
    storeNormalizedRows(fin);
  }

private:
  /// s[t * keyBlocks + nb]: row tile t's logits of key block nb, the four
  /// f32 of a C fragment.
  using Logits = SmallVector<SmallVector<Value>>;

  // The prologue, in the order the kernel computes it.
  void bindArguments() {
    unsigned a = 0;
    q = kernel.arg(a++);
    keys = kernel.arg(a++);
    e = kernel.arg(a++);
    logit.emplace(kernel, spec, a);
    keyMask = logit->keyMask;
    out = kernel.arg(a++);
    outIdx = spec.topk ? kernel.arg(a++) : Value();
    lseOut = spec.withLse ? kernel.arg(a++) : Value();
    // flash-mma-key-splits: the split's partial rows [S, B, N, K + 2] (the
    // unnormalized accumulators, the max in log2 units, the sum).
    partials = tile.keySplits > 1 ? kernel.arg(a++) : Value();
    // The causal order (flash-causal-balance); in the split-key kernel (its
    // splits lanes of a tile beside the batch elements) where flashMmaTile
    // found room for it.
    const bool splitKernel = tile.keySplits > 1;
    place = flashBlockPlace(
        kb,
        flashBlockOrder(spec.causal,
                        spec.balanceCausal &&
                            (!splitKernel || tile.splitCausalOrder),
                        /*byKey=*/false),
        splitKernel);
  }

  void bindTileBuffers() {
    if (!tile.dynamicShared) {
      ks = kernel.workgroup(0);
      vs = kernel.workgroup(1);
      return;
    }
    // Three stages: the key buffers from the start of the block's dynamic
    // shared memory, the value buffers after them (a multiple of 16 bytes:
    // every row is), as flashMmaSharedTypes lays them out.
    SmallVector<MemRefType, 4> types = flashMmaSharedTypes(tile, elt);
    auto space = gpu::AddressSpaceAttr::get(b.getContext(),
                                            gpu::AddressSpace::Workgroup);
    Value bytes = gpu::DynamicSharedMemoryOp::create(
        b, MemRefType::get({ShapedType::kDynamic}, b.getI8Type(),
                           MemRefLayoutAttrInterface(), space));
    Value start = kb.idx(0);
    const int64_t keyBytes = types[0].getNumElements() * 2;
    ks = memref::ViewOp::create(b, types[0], bytes, start, ValueRange{});
    vs = memref::ViewOp::create(b, types[1], bytes, kb.idx(keyBytes),
                                ValueRange{});
  }

  void placeThreadRows() {
    c0 = kb.idx(0);
    c1 = kb.idx(1);
    tid = kb.threadId();
    Value warp = kb.divu(tid, kb.idx(kWarp));
    lane = kb.remu(tid, kb.idx(kWarp));
    g = kb.divu(lane, kb.idx(4));   // the quad: rows g and g + 8
    tig = kb.remu(lane, kb.idx(4)); // the lane in the quad: columns
    cCoords.emplace(kb, cLayout.map.mode(0).shape(), ArrayRef<Value>{tig, g});
    bi = place.batchOf(kb);
    rowBase = kb.mul(place.tileOf(kb), kb.idx(blockRows));
    N = kb.dim(q, 1);
    D = kb.dim(q, 2);
    Nk = kb.dim(keys, 1);
    // A warp's row tiles: rows 16T warp + 16t of the block.
    Value r0 = kb.add(kb.add(rowBase, kb.mul(warp, kb.idx(16 * T))), g);
    rowsOf = {r0, kb.add(r0, kb.idx(8))};
    for (int64_t t = 1; t < T; ++t)
      for (int64_t r = 0; r < 2; ++r)
        rowsOf.push_back(kb.add(r0, kb.idx(16 * t + 8 * r)));
  }

  void loadQueryFragments() {
    // The query fragments, once: chunk c's A operand, its elements where the
    // A atom places them (features 16c + 2tig + {0, 1, 8, 9}, rows g and
    // g + 8); zeros past N and D.
    zeroE = m.zeroElt();
    LaneCoords aCoords(kb, aLayout.map.mode(0).shape(),
                       ArrayRef<Value>{tig, g});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < chunks; ++c) {
        SmallVector<Value> elems;
        for (int64_t v = 0; v < 8; ++v) {
          Value row = rowsOf[2 * t + (v / 2) % 2];
          Value d = fragmentTileIndex(kb, aCoords, aLayout, v, 16 * c,
                                      /*rows=*/false);
          elems.push_back(loadOrZero(q, bi, row, N, d, D));
        }
        qFrag.push_back(m.fragment(elems));
      }
  }

  void splitKeyRange() {
    keyEnd = Nk;
    if (spec.causal)
      keyEnd = kb.minu(Nk, kb.add(rowBase, kb.idx(blockRows)));
    // The block's keys [keyLo, keyHi): all of them, or with key splits (the
    // grid's z) split z's share of the block's key tiles. In tiles: [tileLo,
    // tileHi) of the block's ceil(keyEnd / cols), an empty range for a split
    // past them (keyLo = keyHi rounded to whole tiles).
    keyLo = c0;
    keyHi = keyEnd;
    if (!partials)
      return;
    Value tiles = kb.ceilDiv(keyEnd, kb.idx(cols));
    Value share = kb.ceilDiv(tiles, kb.gridDim(gpu::Dimension::z));
    tileLo = kb.minu(kb.mul(place.splitOf(kb), share), tiles);
    tileHi = kb.minu(kb.add(tileLo, share), tiles);
    keyLo = kb.mul(tileLo, kb.idx(cols));
    keyHi = kb.minu(kb.mul(tileHi, kb.idx(cols)), keyEnd);
  }

  void bindAddedScoreRows() {
    // attention_posterior's added scores add[b, head[b], row, j], read as rows
    // of add viewed [B·H·N, Nk]: the head read once and each of the thread's
    // two rows' offsets computed once (a row past N takes row 0: it computes
    // and stores nothing, but its loads must stay in bounds): fewer live
    // address terms than a 4-D index per element.
    if (!logit->add)
      return;
    Value head = kb.castInt(kb.load(logit->head, {bi}), kb.index());
    addRows2D = viewAs2D(b, logit->add);
    Value bh = kb.add(kb.mul(bi, kb.dim(logit->add, 1)), head);
    for (int r = 0; r < 2; ++r) {
      Value row = kb.select(kb.lt(rowsOf[r], N), rowsOf[r], c0);
      addRows[r] = kb.add(kb.mul(bh, N), row);
    }
  }

  void initCarriedState() {
    init.assign(T * accBlocks * 4, kb.cF32(0.0));
    // The max from -FLT_MAX (SoftmaxStepForm::finiteMax: no select of a
    // row without keys), the sum from 0.
    for (int r = 0; r < 2 * T; ++r) {
      SoftmaxState start = softmaxStart(kb, /*finiteMax=*/true);
      init.push_back(start.max);
      init.push_back(start.sum);
    }
  }

  /// The C-fragment column of value x (0 or 1; the row 8 below holds the
  /// same columns) of the 8-column block at `block0`: block0 + 2·tig + x.
  Value fragmentColumn(int64_t block0, int64_t x) {
    return fragmentTileIndex(kb, *cCoords, cLayout, x, block0,
                             /*rows=*/false);
  }

  Value loadOrZero(Value src, Value bIdx, Value row, Value rowLimit, Value col,
                   Value colLimit) {
    Value ok = kb.andI(kb.lt(row, rowLimit), kb.lt(col, colLimit));
    Value v =
        kb.load(src, {bIdx, kb.select(ok, row, c0), kb.select(ok, col, c0)});
    return kb.select(ok, v, zeroE);
  }

  Value alignedBase(Value memref, bool wide) {
    if (!wide)
      return Value();
    Value ptr = memref::ExtractAlignedPointerAsIndexOp::create(b, memref);
    return kb.eq(kb.remu(ptr, kb.idx(16)), c0);
  }

  Value maskedValue(Value j, Value v) {
    // A masked key adds nothing, not 0 · e.
    Value js = kb.select(kb.lt(j, Nk), j, c0);
    return kb.select(kb.load(keyMask, {bi, js}), v,
                     kb.constLike(v.getType(), 0.0));
  }

  Value bufferAt(Value buffer, Value row) {
    // Rows [row, row + cols) of a tile buffer (the pipeline's buffer of a
    // tile): a view at a dynamic offset, so that the addresses into it are the
    // buffer's base plus ones that do not change in the key loop.
    if (!row || isConstantIntValue(row, 0))
      return buffer;
    auto type = cast<MemRefType>(buffer.getType());
    int64_t width = type.getShape()[1];
    return memref::SubViewOp::create(
        b, buffer, ArrayRef<OpFoldResult>{row, b.getIndexAttr(0)},
        ArrayRef<OpFoldResult>{b.getIndexAttr(cols), b.getIndexAttr(width)},
        ArrayRef<OpFoldResult>{b.getIndexAttr(1), b.getIndexAttr(1)});
  }

  // Staging.

  // Staging a tile of `cols` rows j0 + jj of `src` [B, Nk, cols] into `dst`
  // [cols, width + kLdmatrixPad] at rows `rowOff`: zeros past `rowLimit` and
  // `colLimit`, then `masked(j, v)` (a key mask) on what was loaded. The
  // element loop, or with `wide` (colLimit, the operand's column count, a
  // multiple of 8) 16-byte vectors of 8 elements (ld.global.v4 / st.shared.v4:
  // 8x fewer loads and index computations) when `aligned` (the operand's base
  // is 16-byte aligned: then every 8-element group of a row is, and every
  // workgroup row, (width + kLdmatrixPad) * 2 bytes, is a multiple of 16
  // bytes). With `async` (the operand's cp.async staging) the aligned path
  // issues 16-byte cp.async copies (src-size 0 past the bounds: zeros), which
  // the caller commits and waits for. With `whole` (the lazy loop's copies of a
  // tile known to hold keys only below Nk) the 16-byte path has no row bound:
  // its source addresses stay affine in the loop's j0 (the compiler
  // strength-reduces them to pointer increments, as in the peeled loop, whose
  // bounds fold from the loop's range where Nk is static).
  void stageTile(Value src, Value dst, int64_t width, bool wide, Value aligned,
                 Value j0, Value rowLimit, Value colLimit,
                 function_ref<Value(Value, Value)> masked, Value rowOff,
                 bool async, bool whole) {
    const int64_t rows = cols;
    // The tile's rows of the buffer: row jj of the tile is row jj of `dst`.
    dst = bufferAt(dst, rowOff);
    auto elements = [&] {
      kb.forLoop(tid, kb.idx(rows * width), kb.idx(kMmaThreads),
                 [&](Value flat) {
                   Value jj = kb.divu(flat, kb.idx(width));
                   Value cc = kb.remu(flat, kb.idx(width));
                   Value j = kb.add(j0, jj);
                   Value v = loadOrZero(src, bi, j, rowLimit, cc, colLimit);
                   if (masked)
                     v = masked(j, v);
                   kb.store(v, dst, {jj, cc});
                 });
    };
    if (!wide) {
      elements();
      return;
    }
    int64_t vecs = width / 8;
    assert((!async || !masked) && "cp.async cannot mask what it copies");
    // One 16-byte vector: row jj of the tile, columns cc .. cc + 7.
    auto stageVector = [&](Value jj, Value cc) {
      Value j = kb.add(j0, jj);
      Value ok = whole ? kb.lt(cc, colLimit)
                       : kb.andI(kb.lt(j, rowLimit), kb.lt(cc, colLimit));
      if (async) {
        nvgpu::DeviceAsyncCopyOp::create(
            b, nvgpu::DeviceAsyncTokenType::get(b.getContext()), dst,
            ValueRange{jj, cc}, src,
            ValueRange{bi, kb.select(ok, j, c0), kb.select(ok, cc, c0)},
            b.getIndexAttr(8), kb.select(ok, kb.idx(8), c0), b.getUnitAttr());
        return;
      }
      Value v = vector::LoadOp::create(
          b, wideType, src,
          ValueRange{bi, kb.select(ok, j, c0), kb.select(ok, cc, c0)},
          /*nontemporal=*/false, llvm::MaybeAlign(16));
      v = kb.select(ok, v, kb.constLike(wideType, 0.0));
      if (masked)
        v = masked(j, v);
      vector::StoreOp::create(b, v, dst, ValueRange{jj, cc},
                              /*nontemporal=*/false, llvm::MaybeAlign(16));
    };
    auto stageVectors = [&] {
      int64_t total = rows * vecs;
      if (alignedKnown && total % kMmaThreads == 0 && kMmaThreads % vecs == 0) {
        Value jj0 = kb.divu(tid, kb.idx(vecs));
        Value cc = kb.mul(kb.remu(tid, kb.idx(vecs)), kb.idx(8));
        for (int64_t i = 0; i < total / kMmaThreads; ++i)
          stageVector(kb.add(jj0, kb.idx(i * (kMmaThreads / vecs))), cc);
        return;
      }
      kb.forLoop(tid, kb.idx(total), kb.idx(kMmaThreads), [&](Value flat) {
        Value jj = kb.divu(flat, kb.idx(vecs));
        Value cc = kb.mul(kb.remu(flat, kb.idx(vecs)), kb.idx(8));
        stageVector(jj, cc);
      });
    };
    if (alignedKnown) {
      if (*alignedKnown)
        stageVectors();
      else
        elements();
      return;
    }
    kb.ifThenElse(aligned, stageVectors, elements);
  }

  void stageKeysAndValues(Value j0, Value rowOff, bool whole = false) {
    bool wideK = tile.wideKeys || tile.asyncKeys;
    bool wideV = tile.wideValues || tile.asyncValues;
    stageTile(keys, ks, tile.depth, wideK, keysAligned, j0, Nk, D, nullptr,
              rowOff, tile.asyncKeys, whole);
    auto masked = [this](Value j, Value v) { return maskedValue(j, v); };
    stageTile(e, vs, tile.experts, wideV, valuesAligned, j0, Nk, kb.idx(K),
              keyMask ? function_ref<Value(Value, Value)>(masked)
                      : function_ref<Value(Value, Value)>(),
              rowOff, tile.asyncValues, whole);
  }

  void stageFirstTile() {
    if (stages > 2) {
      Value first = kb.divu(keyLo, kb.idx(cols));
      for (int64_t i = 0; i < stages - 1; ++i) {
        Value j = kb.add(keyLo, kb.idx(i * cols));
        Value slot = kb.remu(kb.add(first, kb.idx(i)), kb.idx(stages));
        kb.ifThen(kb.lt(j, keyHi),
                  [&] { stageKeysAndValues(j, kb.mul(slot, kb.idx(cols))); });
        NVVM::CpAsyncCommitGroupOp::create(b);
      }
      return;
    }
    if (partials) {
      // Into the buffer of the first tile's parity (keyLo / cols).
      Value bufRow = kb.mul(kb.remu(kb.divu(keyLo, kb.idx(cols)), kb.idx(2)),
                            kb.idx(cols));
      kb.ifThen(kb.lt(keyLo, keyHi),
                [&] { stageKeysAndValues(keyLo, bufRow); });
    } else {
      kb.ifThen(kb.lt(c0, keyEnd), [&] { stageKeysAndValues(c0, c0); });
    }
    NVVM::CpAsyncCommitGroupOp::create(b);
  }

  // The staging of the tile at j0. With cp.async: wait for its copies (all but
  // the stages - 2 groups committed after its own), a barrier (every thread's
  // copies visible; every warp done with the buffer the next copies overwrite,
  // the previous tile's), then the copies of the tile stages - 1 ahead into
  // that buffer; returns the tile's first row in the buffers. Without: the
  // tile staged between two barriers (null).
  Value pipelineStep(Value j0, bool whole = false, Value knownSlot = Value()) {
    if (!doubleBuffered) {
      kb.barrier();
      stageKeysAndValues(j0, Value());
      kb.barrier();
      return Value();
    }
    NVVM::CpAsyncWaitGroupOp::create(b, b.getI32IntegerAttr(stages - 2));
    kb.barrier();
    Value tileIndex = kb.divu(j0, kb.idx(cols));
    // With `whole` the tile ahead is known to be a whole one (below keyHi): no
    // test, no row bounds.
    auto stageAhead = [&](Value next, Value row) {
      if (whole)
        return stageKeysAndValues(next, row, /*whole=*/true);
      kb.ifThen(kb.lt(next, keyHi), [&] { stageKeysAndValues(next, row); });
    };
    if (stages == 2) {
      Value bufRow = kb.mul(kb.remu(tileIndex, kb.idx(2)), kb.idx(cols));
      Value next = kb.add(j0, kb.idx(cols));
      stageAhead(next, kb.sub(kb.idx(cols), bufRow));
      NVVM::CpAsyncCommitGroupOp::create(b);
      return bufRow;
    }
    // The tile's buffer, tileIndex mod stages (`knownSlot`: the lazy hot loop
    // carries it, a compare and a select a tile instead of a division).
    Value slot = knownSlot ? knownSlot : kb.remu(tileIndex, kb.idx(stages));
    // (t + stages - 1) mod stages: the previous tile's buffer.
    Value before =
        kb.select(kb.eq(slot, c0), kb.idx(stages - 1), kb.sub(slot, c1));
    Value next = kb.add(j0, kb.idx((stages - 1) * cols));
    stageAhead(next, kb.mul(before, kb.idx(cols)));
    NVVM::CpAsyncCommitGroupOp::create(b);
    return kb.mul(slot, kb.idx(cols));
  }

  // The two products.

  // Logits: keyBlocks tiles of 16 rows x 8 keys, over the chunks, of the
  // staged tile at buffer row `bufRow`. ldmatrix's lanes: row ldRow of matrix
  // ldSel (computed on first use).
  Logits logitsOf(Value bufRow, Value &ldRow, Value &ldSel) {
    if (!ldRow) {
      ldRow = kb.remu(lane, kb.idx(8));
      ldSel = kb.divu(lane, kb.idx(8)); // which 8x8 matrix
    }
    Logits s(T * keyBlocks, SmallVector<Value>(4, kb.cF32(0.0)));
    Value keyTile = bufferAt(ks, bufRow);
    for (int64_t c = 0; c < chunks; ++c) {
      SmallVector<Value> chunk;
      for (int64_t t = 0; t < T; ++t)
        chunk.push_back(qFrag[t * chunks + c]);
      m.keyBlockProducts(s, chunk, keyTile, 16 * c, keyBlocks, ldRow, ldSel);
    }
    return s;
  }

  // Mixing: per 16 keys kc, P's A operand of row tile t (pFragOf(kc): one per
  // row tile), the values' B operands through ldmatrix.trans, and with sumMma
  // P against the block of ones, into `acc`.
  void mixTile(Value bufRow, Value ldRow, Value ldSel,
               function_ref<SmallVector<Value>(int64_t kc)> pFragOf,
               SmallVector<Value> &acc) {
    Value ones;
    if (sumMma)
      ones = arith::ConstantOp::create(
          b, m.vec({2, 2}, elt),
          DenseElementsAttr::get(m.vec({2, 2}, elt), b.getFloatAttr(elt, 1.0)));
    Value valueTile = bufferAt(vs, bufRow);
    for (int64_t kc = 0; kc < keyBlocks / 2; ++kc) {
      SmallVector<Value> pFrag = pFragOf(kc);
      m.valueBlockProducts(acc, pFrag, 0, accCount, valueTile, 16 * kc,
                           expertBlocks, ldRow, ldSel);
      // The row sums: P against the block of ones (the B operand's every
      // element 1: no load).
      if (sumMma)
        for (int64_t t = 0; t < T; ++t)
          m.mmaInto(acc, t * accCount + expertBlocks * 4, pFrag[t], ones);
    }
  }

  // A key tile with the exact online softmax.

  // Row rr's values of a tile that its softmax takes the max of: the raw dots
  // (similarity) or the posterior's logits in log2 units, -inf where a key is
  // excluded (bounds and causal only where `checked`; the key mask always).
  SmallVector<Value> rowLogits(Value j0, const Logits &s, int64_t rr,
                               bool checked) {
    // Row rr is row r (g or g + 8) of row tile t.
    const int64_t t = rr / 2;
    const int r = rr % 2;
    // attention_posterior's loads of key j: key 0's past Nk (excluded below).
    auto keyIndex = [&](Value j) {
      return checked ? kb.select(kb.lt(j, Nk), j, c0) : j;
    };
    SmallVector<Value> logits;
    for (int64_t nb = 0; nb < keyBlocks; ++nb)
      for (int64_t x = 0; x < 2; ++x) {
        Value j = kb.add(j0, fragmentColumn(nb * 8, x));
        // The per-key bias (f32; the thread's two rows read the same key's)
        // and the added score of (row, key), each read per element from
        // global memory in the C fragment's layout (a tile's bias values
        // loaded once for both rows stayed live across the first row's
        // softmax and spilled more under ptxas): a quad's 4 lanes on 8
        // consecutive keys of one row (a full 32-byte sector of f32 scores,
        // half of one of f16/bf16), 8 rows a warp. Staging the scores through
        // shared memory would coalesce them fully but cost a [64 x cols] tile
        // and its barrier.
        auto addScore = [&] {
          return kb.loadF(addRows2D, {addRows[r], keyIndex(j)});
        };
        Value dot = s[t * keyBlocks + nb][2 * r + x];
        Value v = dot;
        if (!rawDots) {
          Value terms;
          if (spec.hasBias)
            terms = kb.load(logit->bias, {bi, keyIndex(j)});
          if (spec.hasAddScores)
            terms = terms ? kb.fadd(terms, addScore()) : addScore();
          v = kb.fma(dot, scale2, kb.fmul(terms, kb.cF32(kLog2e)));
        }
        FlashLogitSpec keepSpec = spec;
        keepSpec.causal = spec.causal && checked;
        Value inRange = checked ? kb.lt(j, Nk) : Value();
        Value keep = flashKeyKept(
            kb, keepSpec, inRange,
            [&] {
              return keyMask ? kb.load(keyMask, {bi, keyIndex(j)}) : Value();
            },
            [&] { return kb.cmpi(arith::CmpIPredicate::ule, j, rowsOf[rr]); });
        if (keep)
          v = kb.select(keep, v, kb.negInfLike(v.getType()));
        logits.push_back(v);
      }
    return logits;
  }

  void rescaleAccumulators(SmallVector<Value> &acc, ArrayRef<Value> rescale) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t eb = 0; eb < accBlocks; ++eb)
        for (int64_t i = 0; i < 4; ++i) {
          Value &x = acc[t * accCount + eb * 4 + i];
          x = kb.fmul(x, rescale[2 * t + i / 2]);
        }
  }

  // The accumulators (and the sums with them) are rescaled only in a tile
  // where a row max of the warp changed: elsewhere every factor is 2^0 = 1
  // exactly, so skipping is exact. The vote keeps the branch warp-uniform; a
  // NaN max compares unequal.
  void rescaleWhereMaxChanged(SmallVector<Value> &acc, ValueRange carried,
                              ArrayRef<Value> next, SmallVector<Value> &rescale,
                              ArrayRef<Value> shifts) {
    Value changed;
    for (int rr = 0; rr < 2 * T; ++rr) {
      Value ne = kb.cmpf(arith::CmpFPredicate::UNE, next[2 * rr],
                         carried[accAll + 2 * rr]);
      changed = changed ? kb.orI(changed, ne) : ne;
    }
    Value all = kb.cI32(-1);
    Value anyChanged = NVVM::VoteSyncOp::create(b, b.getI1Type(), all, changed,
                                                NVVM::VoteSyncKind::any);
    SmallVector<Type> types(accAll, b.getF32Type());
    SmallVector<Value> kept(acc);
    acc = kb.ifElse(
        anyChanged, types,
        [&] {
          for (int rr = 0; rr < 2 * T; ++rr)
            rescale[rr] =
                exp2Approx(b, kb.fsub(carried[accAll + 2 * rr], shifts[rr]));
          rescaleAccumulators(acc, rescale);
          return acc;
        },
        [&] { return kept; });
  }

  // One key tile with the exact online softmax (whole tiles unchecked, the
  // last and the causal diagonal ones `checked`): stage, the logits, each
  // row's softmax step, the rescale, the mixing.
  SmallVector<Value> exactTile(bool checked, Value j0, ValueRange carried) {
    Value bufRow = pipelineStep(j0);
    Value ldRow, ldSel;
    Logits s = logitsOf(bufRow, ldRow, ldSel);

    // Masks and the online softmax of each of the thread's rows.
    SmallVector<Value> acc(carried.begin(), carried.begin() + accAll);
    SmallVector<Value> next;
    SmallVector<SmallVector<Value>> probs(2 * T);
    SmallVector<Value> rescale(2 * T), shifts(2 * T);
    auto quadMax = [&](Value v) {
      return subgroupReduce(kb, v, ReduceKind::Max, 4);
    };
    auto quadSum = [&](Value v) {
      return subgroupReduce(kb, v, ReduceKind::Sum, 4);
    };
    // MoE/Kernels/OnlineSoftmax.h's step in base 2 (log2's weights 2^d):
    // the raw dots scaled by scale2, the max from -FLT_MAX; the sums per lane
    // (each p onto the rescaled sum; the quad's added after the key loop), or
    // per tile over the quad with one FFMA (sumsPerTile), or none (sumMma).
    SoftmaxStepForm form;
    form.reduceMax = quadMax;
    if (sumsPerTile && !sumMma)
      form.reduceSum = quadSum;
    form.sumFromFirstProb = form.fusedSum = form.finiteMax = true;
    form.scale = rawDots ? scale2 : Value();
    form.sums = !sumMma;
    form.sumOntoRescaled = !form.reduceSum;
    for (int rr = 0; rr < 2 * T; ++rr) {
      SmallVector<Value> logits = rowLogits(j0, s, rr, checked);
      SoftmaxTile st = onlineSoftmaxStep(
          log2, {carried[accAll + 2 * rr], carried[accAll + 2 * rr + 1]},
          logits, form);
      probs[rr] = st.probs;
      rescale[rr] = st.rescale;
      shifts[rr] = st.shift;
      next.push_back(st.next.max);
      next.push_back(st.next.sum);
    }
    if (!sumMma)
      rescaleAccumulators(acc, rescale);
    else
      rescaleWhereMaxChanged(acc, carried, next, rescale, shifts);

    // Mixing: per 16 keys, P's A operand from the logits' C fragments of key
    // blocks 2kc and 2kc + 1 (rounded to the operand type).
    mixTile(
        bufRow, ldRow, ldSel,
        [&](int64_t kc) {
          // pFrag[t]: row tile t's A operand.
          SmallVector<Value> pFrag;
          for (int64_t t = 0; t < T; ++t) {
            SmallVector<Value> pairs;
            for (int64_t half = 0; half < 2; ++half)
              for (int r = 0; r < 2; ++r) {
                Value lo = probs[2 * t + r][(2 * kc + half) * 2];
                Value hi = probs[2 * t + r][(2 * kc + half) * 2 + 1];
                pairs.push_back(m.roundPair(lo, hi));
              }
            pFrag.push_back(m.fragmentOfPairs(pairs));
          }
          return pFrag;
        },
        acc);
    acc.append(next);
    return acc;
  }

  auto exactTileBody(bool checked) {
    return [this, checked](Value j0, ValueRange carried) {
      return exactTile(checked, j0, carried);
    };
  }

  // The lazy rescale's loops over the whole tiles.

  // The lazy rescale (tile.lazyRescale): the whole tiles [lo, hi) against a
  // stale shift (FlashAttention-4's conditional rescale). Each row's carried
  // max is a shift m, at least its max so far plus the margin after an exact
  // step; a tile's weights are p = 2^(s c - m), rounded in pairs to the
  // operand type, with no row max, shuffle or rescale. While every p < 2,
  // i.e. no bf16/f16 pair has bit 14 of either half set (2.0 is 0x4000 in
  // both; every larger value, inf and NaN have it, every smaller one not: one
  // OR of the tile's pair registers and one test), the tile is mixed as it is
  // (the sums from the MMA: P and its sum share the shift). A tile where some
  // p of the warp reaches 2 (a row max grew past m + 1; the first tile, where
  // m = -FLT_MAX) leaves the hot loop with its logits for the exact step
  // (lazyExactStep). The shift is as good as the max for the epilogue, the lse
  // and the checked tiles after (they take it as their running max): every
  // weight is relative to it. The hot loop runs the whole tiles whose tile
  // stages - 1 ahead is whole too (its copies then need no bounds): [lo, hi)
  // with hi = wholeEnd less stages - 1 tiles; the rest of the whole tiles go
  // to the checked loop. Returns the state with j0 = hi first.
  SmallVector<Value> lazyLoop(Value lo, Value wholeEnd, ArrayRef<Value> start) {
    Value ahead = kb.idx((stages - 1) * cols);
    lazy.hi = kb.select(kb.lt(kb.add(lo, ahead), wholeEnd),
                        kb.sub(wholeEnd, ahead), lo);
    Type f32 = b.getF32Type(), index = b.getIndexType();
    lazy.pairType = m.vec({2}, elt);
    lazy.nV = T * keyBlocks * 4;
    lazy.nP = T * keyBlocks * 2;
    lazy.margin = kb.cF32(static_cast<double>(tile.lazyMargin));
    lazy.ldRow = kb.remu(lane, kb.idx(8));
    lazy.ldSel = kb.divu(lane, kb.idx(8));
    // The state: j0, with three stages the buffer of j0's tile (carried: the
    // hot loop's addresses then take no division by 3), the accumulators and
    // the rows' (shift, sum).
    lazy.carrySlot = stages > 2;
    lazy.off = lazy.carrySlot ? 2 : 1;
    lazy.carried = start.size();
    lazy.stateTypes = {index};
    if (lazy.carrySlot)
      lazy.stateTypes.push_back(index);
    lazy.stateTypes.append(start.size(), f32);
    // Leaving the hot loop: the state, the tile's buffer row, its masked
    // logits v[(t * keyBlocks + nb) * 4 + 2r + x] and P's pairs.
    lazy.exitTypes = lazy.stateTypes;
    lazy.exitTypes.push_back(index);
    lazy.exitTypes.append(lazy.nV, f32);
    lazy.exitTypes.append(lazy.nP, lazy.pairType);
    // Around it: a tile that left the hot loop inside [lo, hi) takes the
    // exact step.
    SmallVector<Type> coldTypes(lazy.stateTypes);
    coldTypes.push_back(index);
    coldTypes.append(lazy.nV, f32);
    SmallVector<Value> state = {lo};
    if (lazy.carrySlot)
      state.push_back(kb.remu(kb.divu(lo, kb.idx(cols)), kb.idx(stages)));
    state.append(start.begin(), start.end());
    SmallVector<Value> out = whileLoop(
        b, state, coldTypes,
        [&](ValueRange args) -> std::pair<Value, SmallVector<Value>> {
          SmallVector<Value> exit = lazyHotLoop(args);
          exit.resize(coldTypes.size());
          return {kb.lt(exit[0], lazy.hi), exit};
        },
        [&](ValueRange args) { return lazyExactStep(args); });
    SmallVector<Value> result = {out[0]};
    result.append(out.begin() + lazy.off,
                  out.begin() + lazy.off + start.size());
    return result;
  }

  // A key mask's -inf on the logits of a whole tile (which have no bounds or
  // causal ones): v[(t * keyBlocks + nb) * 4 + 2r + x].
  SmallVector<Value> lazyMaskedLogits(Value j0, const Logits &s) {
    SmallVector<Value> v(lazy.nV);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t nb = 0; nb < keyBlocks; ++nb)
        for (int64_t i = 0; i < 4; ++i) {
          Value x = s[t * keyBlocks + nb][i];
          if (keyMask) {
            Value j = kb.add(j0, fragmentColumn(nb * 8, i % 2));
            x = kb.select(kb.load(keyMask, {bi, j}), x,
                          kb.negInfLike(b.getF32Type()));
          }
          v[(t * keyBlocks + nb) * 4 + i] = x;
        }
    return v;
  }

  // P's pairs of the weights 2^(v c - m) of each row, in the order of
  // mixTile's fragments: [kc][t][half][r].
  SmallVector<Value> lazyPairs(ArrayRef<Value> v, ArrayRef<Value> shift) {
    SmallVector<Value> negShift;
    for (int rr = 0; rr < 2 * T; ++rr)
      negShift.push_back(arith::NegFOp::create(b, shift[rr]));
    auto weight = [&](int64_t t, int r, int64_t col) {
      Value x = v[(t * keyBlocks + col / 2) * 4 + 2 * r + col % 2];
      return exp2Approx(b, kb.fma(x, scale2, negShift[2 * t + r]));
    };
    SmallVector<Value> pairs;
    for (int64_t kc = 0; kc < keyBlocks / 2; ++kc)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t half = 0; half < 2; ++half)
          for (int r = 0; r < 2; ++r) {
            int64_t col = (2 * kc + half) * 2;
            pairs.push_back(
                m.roundPair(weight(t, r, col), weight(t, r, col + 1)));
          }
    return pairs;
  }

  SmallVector<Value> carriedShifts(ValueRange carried) {
    SmallVector<Value> shift;
    for (int rr = 0; rr < 2 * T; ++rr)
      shift.push_back(carried[accAll + 2 * rr]);
    return shift;
  }

  // The mixing of a lazy tile from P's pairs, and the next state (j0 + cols,
  // its buffer, the accumulators, the rows' (shift, sum)).
  SmallVector<Value> lazyMix(Value bufRow, ArrayRef<Value> pairs,
                             ValueRange carried, Value j0, Value slot) {
    SmallVector<Value> acc(carried.begin(), carried.begin() + accAll);
    mixTile(
        bufRow, lazy.ldRow, lazy.ldSel,
        [&](int64_t kc) {
          SmallVector<Value> pFrag;
          for (int64_t t = 0; t < T; ++t)
            pFrag.push_back(
                m.fragmentOfPairs(pairs.slice((kc * T + t) * 4, 4)));
          return pFrag;
        },
        acc);
    SmallVector<Value> next = {kb.add(j0, kb.idx(cols))};
    if (lazy.carrySlot)
      next.push_back(
          kb.select(kb.eq(slot, kb.idx(stages - 1)), c0, kb.add(slot, c1)));
    next.append(acc);
    next.append(carried.begin() + accAll, carried.end());
    return next;
  }

  // The hot loop: runs tiles while they are whole and no p reaches 2 (the test
  // after the tile's staging step and logits; past hi nothing: the forwarded
  // values are poison, read by no one).
  SmallVector<Value> lazyHotLoop(ValueRange state) {
    Type index = b.getIndexType();
    return whileLoop(
        b, state, lazy.exitTypes,
        [&](ValueRange args) -> std::pair<Value, SmallVector<Value>> {
          Value j0 = args[0];
          Value slot = lazy.carrySlot ? args[1] : Value();
          ValueRange carried = args.drop_front(lazy.off);
          SmallVector<Type> frontTypes = {b.getI1Type(), index};
          frontTypes.append(lazy.nV, b.getF32Type());
          frontTypes.append(lazy.nP, lazy.pairType);
          SmallVector<Value> front = kb.ifElse(
              kb.lt(j0, lazy.hi), frontTypes,
              [&] { return lazyHotTile(j0, slot, carried, frontTypes); },
              [&] {
                SmallVector<Value> out = {
                    arith::ConstantOp::create(b, b.getBoolAttr(false)), c0};
                for (Type type : ArrayRef<Type>(frontTypes).drop_front(2))
                  out.push_back(LLVM::PoisonOp::create(b, type));
                return out;
              });
          SmallVector<Value> fwd(args);
          fwd.append(front.begin() + 1, front.end());
          return {front[0], fwd};
        },
        [&](ValueRange args) -> SmallVector<Value> {
          Value j0 = args[0];
          Value slot = lazy.carrySlot ? args[1] : Value();
          ValueRange carried = args.slice(lazy.off, lazy.carried);
          Value bufRow = args[lazy.off + lazy.carried];
          SmallVector<Value> pairs(args.take_back(lazy.nP));
          return lazyMix(bufRow, pairs, carried, j0, slot);
        });
  }

  // A tile of the hot loop up to its test: the staging step, the logits, P's
  // pairs against the stale shift, and the warp's vote on whether some p
  // reaches 2. Returns (stay, the tile's buffer row, its logits, P's pairs).
  SmallVector<Value> lazyHotTile(Value j0, Value slot, ValueRange carried,
                                 TypeRange frontTypes) {
    Value bufRow = pipelineStep(j0, /*whole=*/true, slot);
    SmallVector<Value> v =
        lazyMaskedLogits(j0, logitsOf(bufRow, lazy.ldRow, lazy.ldSel));
    SmallVector<Value> pairs = lazyPairs(v, carriedShifts(carried));
    Value any;
    for (Value pair : pairs) {
      Value word = vector::ExtractOp::create(
          b, vector::BitCastOp::create(b, m.vec({1}, b.getI32Type()), pair),
          ArrayRef<int64_t>{0});
      any = any ? kb.orI(any, word) : word;
    }
    Value big = kb.cmpi(arith::CmpIPredicate::ne,
                        kb.andI(any, kb.cI32(0x40004000)), kb.cI32(0));
    // A warp's vote.
    Value cold = NVVM::VoteSyncOp::create(b, b.getI1Type(), kb.cI32(-1), big,
                                          NVVM::VoteSyncKind::any);
    SmallVector<Value> out = {kb.notI1(cold), bufRow};
    out.append(v);
    out.append(pairs);
    return out;
  }

  // The exact step of a tile that left the hot loop: the quads' max, m' =
  // max(m, max c + margin), the accumulators times 2^(m - m'), p again against
  // m', then the mixing.
  SmallVector<Value> lazyExactStep(ValueRange args) {
    Value j0 = args[0];
    Value slot = lazy.carrySlot ? args[1] : Value();
    SmallVector<Value> carried(args.slice(lazy.off, lazy.carried));
    Value bufRow = args[lazy.off + lazy.carried];
    SmallVector<Value> v(args.take_back(lazy.nV));
    SmallVector<Value> shift = carriedShifts(carried), factor(2 * T);
    for (int rr = 0; rr < 2 * T; ++rr) {
      const int64_t t = rr / 2;
      const int r = rr % 2;
      Value tileMax;
      for (int64_t nb = 0; nb < keyBlocks; ++nb)
        for (int64_t x = 0; x < 2; ++x) {
          Value val = v[(t * keyBlocks + nb) * 4 + 2 * r + x];
          tileMax = tileMax ? kb.fmax(tileMax, val) : val;
        }
      tileMax = subgroupReduce(kb, tileMax, ReduceKind::Max, 4);
      Value next = kb.fmax(shift[rr], kb.fma(tileMax, scale2, lazy.margin));
      factor[rr] = exp2Approx(b, kb.fsub(shift[rr], next));
      shift[rr] = next;
      carried[accAll + 2 * rr] = next;
    }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < accCount; ++i) {
        Value &x = carried[t * accCount + i];
        x = kb.fmul(x, factor[2 * t + (i % 4) / 2]);
      }
    return lazyMix(bufRow, lazyPairs(v, shift), carried, j0, slot);
  }

  // The key loops and the epilogue.

  // The key loops from the carried state `init`: the whole tiles (below
  // fullEnd: unchecked, or the lazy loop's), then the checked ones; with key
  // splits over this split's tiles.
  SmallVector<Value> keyLoops() {
    if (doubleBuffered && tile.hoistStaging)
      stageFirstTile();
    if (partials) {
      // This split's whole tiles, then its checked ones, looping over tile
      // indices (j0 = tile x cols: a multiple of cols that the compiler sees,
      // as it sees a loop from 0 in steps of cols).
      Value fullHi = kb.maxs(keyLo, kb.minu(fullEnd, keyHi));
      Value c = kb.idx(cols);
      auto byTile = [&](bool checked) {
        return [&, checked](Value tileIdx, ValueRange carried) {
          return exactTile(checked, kb.mul(tileIdx, c), carried);
        };
      };
      Value fullTiles = kb.divu(fullHi, c);
      if (tile.lazyRescale) {
        SmallVector<Value> hot = lazyLoop(keyLo, kb.mul(fullTiles, c), init);
        return kb.forLoop(kb.divu(hot[0], c), tileHi, c1,
                          ArrayRef<Value>(hot).drop_front(), byTile(true));
      }
      SmallVector<Value> full =
          kb.forLoop(tileLo, fullTiles, c1, init, byTile(false));
      return kb.forLoop(fullTiles, tileHi, c1, full, byTile(true));
    }
    if (tile.lazyRescale) {
      SmallVector<Value> hot = lazyLoop(c0, fullEnd, init);
      return kb.forLoop(hot[0], keyEnd, kb.idx(cols),
                        ArrayRef<Value>(hot).drop_front(),
                        exactTileBody(/*checked=*/true));
    }
    SmallVector<Value> full = kb.forLoop(c0, fullEnd, kb.idx(cols), init,
                                         exactTileBody(/*checked=*/false));
    return kb.forLoop(fullEnd, keyEnd, kb.idx(cols), full,
                      exactTileBody(/*checked=*/true));
  }

  // flash-mma-block-rows=128 (tile.hoistStaging): the operands' alignment
  // decided once, outside the key loops: the loops of the aligned operands
  // stage only 16-byte vectors (unrolled: the tile's loads or copies back to
  // back), those of a misaligned one only elements.
  SmallVector<Value> runKeyLoops() {
    Value alignedBoth;
    if (tile.hoistStaging)
      alignedBoth = keysAligned && valuesAligned
                        ? kb.andI(keysAligned, valuesAligned)
                        : (keysAligned ? keysAligned : valuesAligned);
    if (!alignedBoth)
      return keyLoops();
    SmallVector<Type> types(init.size(), b.getF32Type());
    return kb.ifElse(
        alignedBoth, types,
        [&] {
          alignedKnown = true;
          return keyLoops();
        },
        [&] {
          alignedKnown = false;
          return keyLoops();
        });
  }

  // The quad's partial sums, once (unless added every tile); the state in
  // natural-log terms for the epilogue (softmaxNormalize reads only the sum)
  // and the lse. FlashMmaTile::sumMma: row r's sum is its C elements 2r and
  // 2r + 1 of the ones block (rows g and g + 8), the whole row's in every lane
  // of the quad.
  void finishRowSums(SmallVector<Value> &fin) {
    if (sumMma) {
      for (int rr = 0; rr < 2 * T; ++rr)
        fin[accAll + 2 * rr + 1] =
            fin[(rr / 2) * accCount + expertBlocks * 4 + 2 * (rr % 2)];
      return;
    }
    if (sumsPerTile)
      return;
    for (int rr = 0; rr < 2 * T; ++rr) {
      Value &sum = fin[accAll + 2 * rr + 1];
      sum = subgroupReduce(kb, sum, ReduceKind::Sum, 4);
    }
  }

  // Key splits: the partial rows, unnormalized (launchFlashMixMma's combine
  // kernel normalizes them).
  void storePartialRows(ArrayRef<Value> fin) {
    for (int rr = 0; rr < 2 * T; ++rr) {
      const int64_t t = rr / 2;
      const int r = rr % 2;
      Value row = rowsOf[rr];
      Value split = place.splitOf(kb);
      kb.ifThen(kb.lt(row, N), [&] {
        for (int64_t eb = 0; eb < expertBlocks; ++eb)
          for (int64_t x = 0; x < 2; ++x) {
            Value col = fragmentColumn(eb * 8, x);
            Value v = fin[t * accCount + eb * 4 + 2 * r + x];
            if ((eb + 1) * 8 <= K) {
              kb.store(v, partials, {split, bi, row, col});
              continue;
            }
            kb.ifThen(kb.lt(col, kb.idx(K)), [&] {
              kb.store(v, partials, {split, bi, row, col});
            });
          }
        kb.ifThen(kb.eq(tig, c0), [&] {
          kb.store(fin[accAll + 2 * rr], partials, {split, bi, row, kb.idx(K)});
          kb.store(fin[accAll + 2 * rr + 1], partials,
                   {split, bi, row, kb.idx(K + 1)});
        });
      });
    }
  }

  // Normalize; a row without any key gets zeros.
  void storeNormalizedRows(ArrayRef<Value> fin) {
    for (int rr = 0; rr < 2 * T; ++rr) {
      const int64_t t = rr / 2;
      const int r = rr % 2;
      SoftmaxState state = {fin[accAll + 2 * rr], fin[accAll + 2 * rr + 1]};
      Value row = rowsOf[rr];
      kb.ifThen(kb.lt(row, N), [&] {
        for (int64_t eb = 0; eb < expertBlocks; ++eb)
          for (int64_t x = 0; x < 2; ++x) {
            Value col = fragmentColumn(eb * 8, x);
            Value v = softmaxNormalize(kb, state,
                                       fin[t * accCount + eb * 4 + 2 * r + x]);
            if ((eb + 1) * 8 <= K) {
              kb.store(v, out, {bi, row, col});
              continue;
            }
            kb.ifThen(kb.lt(col, kb.idx(K)), [&] {
              kb.store(v, out, {bi, row, col});
            });
          }
        if (lseOut)
          kb.ifThen(kb.eq(tig, c0), [&] {
            // m2 ln 2 + ln l: the natural lse the backward recomputes
            // p = exp(s / tau - lse) from (-inf for a row without keys).
            Value max = kb.fmul(state.max, kb.cF32(kLn2));
            kb.store(softmaxLogSumExp(kb, {max, state.sum}), lseOut, {bi, row});
          });
      });
    }
  }

  GPUKernel &kernel;
  const FlashMixSpec &spec;
  const FlashMmaTile &tile;
  Type elt;
  GpuKernelBuilder &kb;
  ImplicitLocOpBuilder &b;
  /// The online softmax's builder: weights 2^d, the logits in log2 units.
  Log2SoftmaxBuilder log2;
  Mma m;

  const int64_t K, cols;
  /// n-blocks and k-steps of the logits; 8-expert blocks.
  const int64_t keyBlocks, chunks, expertBlocks;
  // FlashMmaTile::sumMma: one more accumulator block past the experts', P
  // times a constant block of ones: each of its columns is the row's sum.
  const bool sumMma;
  const int64_t accBlocks;
  // flash-mma-block-rows=128: T = 2 row tiles of 16 rows a warp; each
  // ldmatrix of keys or values feeds the MMAs of both. A thread's rows are
  // rr = 2t + r: g + 16t + 8r of its warp's 16T.
  const int64_t T, blockRows;
  // Carried: the accumulator (expertBlocks x 4 f32), then per row the
  // running max and sum (the max in log2 units and, where the quad's sums
  // wait for the end of the loop, this lane's part of the sum). Row tile t's
  // accumulators at t * accCount; the rows' (max, sum) after all of them, at
  // accAll + 2 rr.
  const int64_t accCount, accAll;
  // Double buffering (cp.async staging): tile 0 is copied before the loop;
  // each iteration waits for its tile's copies, then (after a barrier: every
  // warp is done with the buffer it overwrites, and every thread's copies
  // are visible) starts the next tile's copies into the other buffer and
  // computes on its own. With three buffers (two row tiles) the first two
  // tiles are copied before the loop, each its own commit group, and a
  // tile's copies are issued two tiles ahead (pipelineStep).
  const bool doubleBuffered;
  const int64_t stages;
  const bool rawDots;
  bool sumsPerTile = false;
  const kernels::TVLayout cLayout = kernels::atoms::mmaM16N8C();
  const kernels::TVLayout aLayout = kernels::atoms::mmaM16N8K16A();

  Value q, keys, e;
  std::optional<FlashLogitArgs> logit;
  Value keyMask, out, outIdx, lseOut, partials;
  FlashBlockPlace place;
  Value ks, vs;
  Value c0, c1, tid, lane, g, tig, bi, rowBase, N, D, Nk;
  /// This lane's coordinates in the C fragment's thread mode (tig, g).
  std::optional<LaneCoords> cCoords;
  SmallVector<Value> rowsOf;
  /// qFrag[t * chunks + c]: row tile t's chunk c.
  SmallVector<Value> qFrag;
  Value zeroE;
  VectorType wideType;
  Value keysAligned, valuesAligned;
  // With the alignment known (flash-mma-block-rows=128: the branch taken
  // once outside the key loops) the tile takes one path, and the 16-byte
  // path's trips, when the block's threads divide the tile's vectors, are
  // unrolled: every load or copy of the tile issued back to back, their
  // addresses a constant apart.
  std::optional<bool> alignedKnown;
  Value keyEnd, keyLo, keyHi, tileLo, tileHi;
  Value addRows2D;
  std::array<Value, 2> addRows;
  SmallVector<Value> init;
  Value scale2, fullEnd;

  /// The lazy loop's state (lazyLoop), set by each of its calls.
  struct LazyState {
    Value hi, margin, ldRow, ldSel;
    bool carrySlot;
    int64_t off, nV, nP;
    size_t carried;
    Type pairType;
    SmallVector<Type> stateTypes, exitTypes;
  } lazy;
};
} // namespace

/// The body of the kernel (launchFlashMixMma).
static void emitFlashMixMma(GPUKernel &kernel, const FlashMixSpec &spec,
                            const FlashMmaTile &tile, Type elt) {
  FlashMmaRecipe(kernel, spec, tile, elt).emit();
}

/// Blocks below which flash-mma-key-splits splits the keys: twice the 132
/// multiprocessors of an H100 / H200 (FlashAttention's split-KV rule: fewer
/// blocks leave multiprocessors idle or at one block).
static constexpr int64_t kSplitBelowBlocks = 2 * 132;

/// The kernel with its keys split over S = min(keySplits, ceil(264 /
/// blocks), key tiles) blocks along z (S = 1 from 264 blocks on): each
/// writes its rows' unnormalized accumulators, max (log2 units) and sum to
/// a workspace [S, B, N, K + 2]; a second kernel, a thread a row, combines
/// them in split order (deterministic): M = max m_s, w_s = 2^(m_s - M),
/// out = sum w_s acc_s / sum w_s l_s (0 for a row without keys), lse = M ln 2
/// + ln sum w_s l_s.
/// The splits of the keys the host picks: min(keySplits, ceil(264 / blocks),
/// key tiles), at least 1.
static Value flashMmaSplits(GpuKernelBuilder &kb, const FlashMmaTile &tile,
                            Value q, ValueRange args) {
  Value B = kb.dim(q, 0), N = kb.dim(q, 1), Nk = kb.dim(args[1], 1);
  Value grid = kb.ceilDiv(N, kb.idx(kMmaRows * tile.rowTiles));
  Value want = kb.ceilDiv(kb.idx(kSplitBelowBlocks), kb.mul(grid, B));
  Value tiles = kb.maxs(kb.ceilDiv(Nk, kb.idx(tile.cols)), kb.idx(1));
  Value splits = kb.minu(kb.minu(want, kb.idx(tile.keySplits)), tiles);
  return kb.maxs(splits, kb.idx(1));
}

/// The columns the unfused combine merges in one pass over the splits: 8
/// accumulators a thread beside its row's addresses (the combine took 32
/// registers a column at a time).
static constexpr int64_t kCombineColumns = 8;

namespace {
/// One output row (bi, row) of the split keys' partial rows `part` [S, B,
/// N, K + 2] (each split's unnormalized accumulators, its max in log2 units,
/// its sum), merged in split order (deterministic): M = max m_s, w_s =
/// 2^(m_s - M), the row's state (M ln 2, sum w_s l_s) and each column's
/// sum w_s acc_s normalized by it (0 for a row without keys).
struct SplitRow {
  SplitRow(ImplicitLocOpBuilder &b, GpuKernelBuilder &ck, Value part, Value bi,
           Value row, int64_t K)
      : b(b), ck(ck), part(part), bi(bi), row(row), K(K) {
    Value c0 = ck.idx(0), c1 = ck.idx(1);
    S = ck.dim(part, 0);
    Value M = ck.forLoop(c0, S, c1, {ck.negInfLike(ck.f32())},
                         [&](Value s, ValueRange m) -> SmallVector<Value> {
                           return {ck.fmax(m[0], at(s, ck.idx(K)))};
                         })[0];
    Value none = ck.cmpf(arith::CmpFPredicate::OEQ, M, ck.negInfLike(ck.f32()));
    shift = ck.select(none, ck.cF32(0.0), M);
    Value l = ck.forLoop(c0, S, c1, {ck.cF32(0.0)},
                         [&](Value s, ValueRange acc) -> SmallVector<Value> {
                           return {ck.fma(weight(s), at(s, ck.idx(K + 1)),
                                          acc[0])};
                         })[0];
    state = {ck.fmul(M, ck.cF32(kLn2)), l};
  }
  /// Columns `cols` of the merged row, normalized: one pass over the
  /// splits, each split's weight 2^(m_s - M) computed once for all the
  /// columns (a load and an EX2 a split, not a split and column); each
  /// column's sum still adds the splits in order.
  SmallVector<Value> normalized(ArrayRef<Value> cols) {
    SmallVector<Value> init(cols.size(), ck.cF32(0.0));
    SmallVector<Value> sums = ck.forLoop(
        ck.idx(0), S, ck.idx(1), init,
        [&](Value s, ValueRange acc) -> SmallVector<Value> {
          Value w = weight(s);
          SmallVector<Value> next;
          for (auto [col, a] : llvm::zip_equal(cols, acc))
            next.push_back(ck.fma(w, at(s, col), a));
          return next;
        });
    for (Value &sum : sums)
      sum = softmaxNormalize(ck, state, sum);
    return sums;
  }

  SoftmaxState state;

private:
  Value at(Value s, Value col) { return ck.load(part, {s, bi, row, col}); }
  Value weight(Value s) {
    return exp2Approx(b, ck.fsub(at(s, ck.idx(K)), shift));
  }
  ImplicitLocOpBuilder &b;
  GpuKernelBuilder &ck;
  Value part, bi, row, S, shift;
  int64_t K;
};
} // namespace

/// The split keys' combine of the fused top-k (launchSplitFlashMixMma):
/// a quad of lanes a row, 32 rows a block, each lane merging the columns it
/// holds in the MMA epilogue's C-fragment layout (8n + 2·tig + x) and the
/// quad selecting as the epilogue does (emitQuadRowTopk). A row past B·N
/// reads the last row (every lane reaches the quad's shuffles) and stores
/// nothing. `outputs`: the weights and indices [B, N, k].
static void launchSplitTopkCombine(HostCode &h, StringRef name,
                                   const FlashMixSpec &spec, Value ws,
                                   ValueRange outputs, Location loc,
                                   Value run) {
  assert(!spec.withLse && "a fused top-k has no lse");
  const int64_t K = spec.numExperts;
  const int64_t rowsPerBlock = kMmaThreads / 4;
  GPUKernel comb(h, (name + "_combine").str(), {ws, outputs[0], outputs[1]}, {},
                 {kMmaThreads, 1, 1}, loc);
  GpuKernelBuilder &ck = comb.kb;
  Value part = comb.arg(0);
  Value cB = ck.dim(part, 1), cN = ck.dim(part, 2);
  Value rows = ck.mul(cB, cN);
  Value tid = ck.threadId();
  Value tig = ck.remu(tid, ck.idx(4));
  // One op a statement (the IR's order is not the C++ compiler's).
  Value quad = ck.divu(tid, ck.idx(4));
  Value first = ck.mul(ck.blockId(), ck.idx(rowsPerBlock));
  Value item = ck.add(first, quad);
  Value active = ck.lt(item, rows);
  Value flat = ck.minu(item, ck.sub(rows, ck.idx(1)));
  Value bi = ck.divu(flat, cN);
  Value row = ck.remu(flat, cN);
  SplitRow split(comb.b, ck, part, bi, row, K);
  SmallVector<Value> cols;
  for (int64_t eb = 0; eb < (K + 7) / 8; ++eb)
    for (int64_t x = 0; x < 2; ++x) {
      // Padding columns past K read column 0 (emitRegisterTopk never picks
      // them).
      Value col = ck.add(ck.mul(tig, ck.idx(2)), ck.idx(eb * 8 + x));
      Value inRange = ck.lt(col, ck.idx(K));
      cols.push_back(ck.select(inRange, col, ck.idx(0)));
    }
  SmallVector<Value> vals = split.normalized(cols);
  Value weights = viewAs2D(comb.b, comb.arg(1));
  Value indices = viewAs2D(comb.b, comb.arg(2));
  emitQuadRowTopk(ck, spec, vals, tig, flat, active, weights, indices);
  GpuKernelBuilder &kb = h.kb;
  Value hostRows = kb.mul(kb.dim(outputs[0], 0), kb.dim(outputs[0], 1));
  Value grid = kb.ceilDiv(hostRows, kb.idx(rowsPerBlock));
  comb.launch({kb.select(run, grid, kb.idx(0)), kb.idx(1), kb.idx(1)});
}

/// Defines the tensor-core kernel of `tile` on `operands` and launches it
/// over `grid` with its dynamic shared memory; `q` gives the operand type.
static void launchFlashMmaKernel(HostCode &h, StringRef name,
                                 ValueRange operands, TypeRange workgroup,
                                 const FlashMixSpec &spec,
                                 const FlashMmaTile &tile, Value q,
                                 Location loc, std::array<Value, 3> grid) {
  GPUKernel kernel(h, name, operands, workgroup, {kMmaThreads, 1, 1}, loc);
  // ldmatrix, cp.async and the 16-byte stores need 16-byte aligned rows.
  alignWorkgroupBuffers(kernel.func);
  kernel.func->setAttr(NVVM::NVVMDialect::getMinctasmAttrName(),
                       kernel.b.getI32IntegerAttr(tile.blocksPerSM));
  Type elt = cast<MemRefType>(q.getType()).getElementType();
  emitFlashMixMma(kernel, spec, tile, elt);
  kernel.launch(grid, flashMmaDynamicBytes(h.b, tile, elt));
}

/// `run`: whether the split pair runs (more than one split); where not, its
/// kernels launch over empty grids, which the runtime does not launch, and its
/// workspace is empty (no allocation).
static void launchSplitFlashMixMma(HostCode &h, StringRef name,
                                   const FlashMixSpec &spec,
                                   const FlashMmaTile &tile, Value q,
                                   ValueRange args, TypeRange workgroup,
                                   Location loc, Value splits, Value run) {
  GpuKernelBuilder &kb = h.kb;
  const int64_t K = spec.numExperts;
  Value B = kb.dim(q, 0), N = kb.dim(q, 1);
  Value grid = kb.ceilDiv(N, kb.idx(kMmaRows * tile.rowTiles));
  auto wsType = MemRefType::get(
      {ShapedType::kDynamic, ShapedType::kDynamic, ShapedType::kDynamic, K + 2},
      kb.f32());
  Value ws = h.alloc(wsType, {kb.select(run, splits, kb.idx(0)), B, N});
  SmallVector<Value> operands(args);
  operands.push_back(ws);
  launchFlashMmaKernel(h, name, operands, workgroup, spec, tile, q, loc,
                       {kb.select(run, grid, kb.idx(0)), B, splits});
  if (spec.topk) {
    launchSplitTopkCombine(h, name, spec, ws, args.take_back(2), loc, run);
    h.release(ws);
    return;
  }
  // The outputs: the last of args (p, then lse with withLse).
  SmallVector<Value> combineArgs = {ws};
  combineArgs.push_back(args[args.size() - (spec.withLse ? 2 : 1)]);
  if (spec.withLse)
    combineArgs.push_back(args.back());
  GPUKernel comb(h, (name + "_combine").str(), combineArgs, {},
                 {kMmaThreads, 1, 1}, loc);
  GpuKernelBuilder &ck = comb.kb;
  Value part = comb.arg(0), out = comb.arg(1);
  Value lse = spec.withLse ? comb.arg(2) : Value();
  Value cB = ck.dim(part, 1), cN = ck.dim(part, 2);
  comb.forItem(ck.mul(cB, cN), [&](Value item) {
    Value bi = ck.divu(item, cN), row = ck.remu(item, cN);
    SplitRow split(comb.b, ck, part, bi, row, K);
    // kCombineColumns columns a pass over the splits (one weight a split and
    // pass), the last K % kCombineColumns in a pass of their own.
    auto storeColumns = [&](Value first, int64_t n) {
      SmallVector<Value> cols;
      for (int64_t x = 0; x < n; ++x)
        cols.push_back(ck.add(first, ck.idx(x)));
      SmallVector<Value> vals = split.normalized(cols);
      for (auto [col, val] : llvm::zip_equal(cols, vals))
        ck.store(val, out, {bi, row, col});
    };
    const int64_t whole = K / kCombineColumns * kCombineColumns;
    if (whole > 0)
      ck.forLoop(ck.idx(0), ck.idx(whole), ck.idx(kCombineColumns),
                 [&](Value first) { storeColumns(first, kCombineColumns); });
    if (whole < K)
      storeColumns(ck.idx(whole), K - whole);
    if (lse)
      ck.store(softmaxLogSumExp(ck, split.state), lse, {bi, row});
  });
  comb.launchOver(kb.select(run, kb.mul(B, N), kb.idx(0)));
  h.release(ws);
}

void mlir::moe::gpu_lowering::launchFlashMixMma(HostCode &h, StringRef name,
                                                const FlashMixSpec &spec,
                                                const FlashMmaTile &tile,
                                                Value q, ValueRange args,
                                                Location loc) {
  Type elt = cast<MemRefType>(q.getType()).getElementType();
  // The tile buffers: static workgroup attributions, or (three stages) the
  // same shapes in dynamic shared memory, sized at the launch.
  SmallVector<Type> workgroup;
  if (!tile.dynamicShared)
    for (MemRefType type : flashMmaSharedTypes(tile, elt))
      workgroup.push_back(type);
  GpuKernelBuilder &kb = h.kb;
  // Launches the kernel of `direct` (no split) where `run` holds (null:
  // always), else over an empty grid.
  auto launchDirect = [&](const FlashMmaTile &direct, Value run) {
    Value grid = kb.ceilDiv(kb.dim(q, 1), kb.idx(kMmaRows * direct.rowTiles));
    if (run)
      grid = kb.select(run, grid, kb.idx(0));
    launchFlashMmaKernel(h, name, args, workgroup, spec, direct, q, loc,
                         {grid, kb.dim(q, 0), kb.idx(1)});
  };
  if (tile.keySplits > 1) {
    // One split (a grid of 264 blocks or more, or one key tile): the direct
    // kernel, without the split pair's workspace round trip and second
    // launch (an H200 decode step, B = 1, N = 64: 6.5 us through the pair
    // against 3.3 for the 64-row kernel); the pair over empty grids.
    FlashMmaTile direct = tile;
    direct.keySplits = 1;
    Value splits = flashMmaSplits(kb, tile, q, args);
    Value one = kb.eq(splits, kb.idx(1));
    launchDirect(direct, one);
    launchSplitFlashMixMma(h, name, spec, tile, q, args, workgroup, loc, splits,
                           kb.notI1(one));
    return;
  }
  launchDirect(tile, Value());
}
