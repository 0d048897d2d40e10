//===- Lowerings.h - One GPU lowering per moe op ----------------*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// One conversion pattern per moe op, added by the op's populate function
// (generated from the lowering table, include/MoE/Conversion/Lowerings.td;
// populateMoEToGPUPatterns calls them all): each rewrites one tensor-level op
// into host code + kernels (see HostCode.h) and replaces its results; on
// failure it emits an error on the op and leaves the IR unchanged.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H
#define MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H

#include "Limits.h"
#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"
#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/FlashLogit.h"
#include "MoE/Kernels/OnlineSoftmax.h"
#include "MoE/Kernels/Route.h"
#include "MoE/Kernels/TopK.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/Transforms/DialectConversion.h"

#include <optional>

namespace mlir::moe::gpu_lowering {

/// The per-op patterns of convert-moe-to-gpu (one file each in this
/// directory) derive from this: `lower` rewrites the op through the rewriter
/// into host code + kernels (HostCode.h), or emits an error on the op and
/// changes nothing. The kernels it made must then fit the CUDA limits
/// (Limits.h); one that does not is a match failure with the limit named at
/// the op, and the conversion driver rolls the lowering back.
template <typename OpTy>
class GPULoweringPattern : public OpConversionPattern<OpTy> {
public:
  GPULoweringPattern(MLIRContext *context,
                     const ConvertMoEToGPUOptions &options)
      : OpConversionPattern<OpTy>(context), options(options) {}

  LogicalResult
  matchAndRewrite(OpTy op, typename OpTy::Adaptor adaptor,
                  ConversionPatternRewriter &rewriter) const final {
    KernelLimitCheck limits(op->template getParentOfType<ModuleOp>(), op,
                            options.sharedMemoryBytes,
                            options.dynamicSharedMemoryBytes);
    if (failed(lower(op, adaptor, rewriter)))
      return failure();
    return limits.verify();
  }

protected:
  virtual LogicalResult lower(OpTy op, typename OpTy::Adaptor adaptor,
                              ConversionPatternRewriter &rewriter) const = 0;
  ConvertMoEToGPUOptions options;
};

/// The pattern of `OpTy`: the file of the op's lowering defines its `lower`
/// (`template <> LogicalResult GPULowering<OpTy>::lower(...)`); the lowering
/// table (Lowerings.td) declares that specialization and generates the
/// populate<Name>Lowering that adds the pattern.
template <typename OpTy> struct GPULowering final : GPULoweringPattern<OpTy> {
  using GPULoweringPattern<OpTy>::GPULoweringPattern;
  LogicalResult lower(OpTy op, typename OpTy::Adaptor adaptor,
                      ConversionPatternRewriter &rewriter) const override;
};

} // namespace mlir::moe::gpu_lowering

// populate<Name>Lowering of each op that Lowerings.td lowers with GPUKernel
// and populateLowerings (every one of them); the GPULowering<Op>::lower
// specializations that the generated populate functions (Lowerings.cpp.inc)
// instantiate.
#include "Lowerings.h.inc"

namespace mlir::moe::gpu_lowering {

/// The logit of the flash kernels (the mixing and its backward), the same on
/// the CPU: MoE/Kernels/FlashLogit.h. The backward kernels recompute the
/// forward's: their lowerings take it from the forward's.
using kernels::attentionPosteriorLogit;
using kernels::FlashLogitSpec;
using kernels::similarityInformLogit;

/// The logit's optional operands of a flash kernel: key_mask, bias, add and
/// head (FlashLogitSpec), each null unless the spec has it; taken in that
/// order from the kernel's arguments from `next` on (`next` moves past them).
struct FlashLogitArgs {
  FlashLogitArgs(class GPUKernel &kernel, const FlashLogitSpec &spec,
                 unsigned &next);
  Value keyMask, bias, add, head;
};

/// The flash-style mixing kernel shared by similarity_inform and
/// attention_posterior (FlashMix.cpp), on the logit of FlashLogitSpec:
///   out[b,i,:] = Σ_j softmax_j(logit[i,:]) · e[b,j,:]   (0 for a masked row)
/// and, with a top-k, TopM_Renormalize(out) in the epilogue.
struct FlashMixSpec : FlashLogitSpec {
  /// Experts (static, <= kFlashMaxExperts).
  int64_t numExperts = 0;
  /// Fused top-k (probs mode) in the epilogue: topkSpecOf the *_topk op.
  std::optional<kernels::TopkSpec> topk;
  /// A last output lse [B,N] (f32): the row's log-sum-exp of the logits
  /// (-inf for a row without keys), from which the backward recomputes the
  /// probabilities.
  bool withLse = false;
  /// Under a causal mask, the blocks take the row tiles heaviest first, the
  /// first wave's second round reversed (flash-causal-balance;
  /// FlashBlockOrder in FlashTile.h).
  bool balanceCausal = false;
};

/// The largest expert count of the flash kernel (accumulator in registers,
/// value tile in workgroup memory).
constexpr int64_t kFlashMaxExperts = 256;

/// The expert count K of a flash lowering's op `op`, from its values `e`
/// [B, Nk, K]; an error at `op` where K is dynamic or above kFlashMaxExperts.
FailureOr<int64_t> flashExpertCount(Operation *op, Value e);

/// Creates the kernel and launches it (grid (ceil(N / kFlashRows), B) with N
/// the rows of `q`, block kFlashThreads) on `args`, in order: q [B,N,D], keys
/// [B,Nk,D], e [B,Nk,K], then key_mask [B,Nk] (i1), bias [B,Nk] (f32), add
/// [B,H,N,Nk] and head [B] (i32) when present, then the outputs: p [B,N,K],
/// or weights and indices [B,N,k], then lse [B,N] with `withLse`.
void launchFlashMix(class HostCode &h, StringRef name, const FlashMixSpec &spec,
                    Value q, ValueRange args, Location loc);

/// A flash mixing kernel's outputs (launchFlashMix's arguments after the
/// logit's): p, or the fused top-k's weights and indices, then the lse.
struct FlashMixOutputs {
  Value out, outIdx, lse;
};

/// A mixing kernel's arguments, in launchFlashMix's order.
struct FlashMixArgs {
  FlashMixArgs(class GPUKernel &kernel, const FlashMixSpec &spec);
  /// The index of the next argument (the logit's, then the outputs').
  unsigned next;
  Value q, keys, e;
  FlashLogitArgs logit;
  FlashMixOutputs outs;
};

/// The forward logit (flashLogit) of row `row` and key j of a mixing kernel,
/// the bias, added scores (head h) and key mask read from `logit`'s operands
/// at batch element b: -inf where j >= Nk, the key is masked or, causal,
/// after the row.
Value flashPairLogit(class GpuKernelBuilder &kb, const FlashMixSpec &spec,
                     const FlashLogitArgs &logit, Value dot, Value b, Value h,
                     Value row, Value j, Value Nk);

/// The end of a row of the f32 mixing kernel: `accs` are the
/// row's unnormalized sums a lane holds, column m * kFlashGroup + `lane` in
/// accs[m], normalized by the row's softmax `state`; then the lse (by lane
/// 0) and p, or the fused top-k's weights and indices, stored for row i of
/// batch element `b` where `active` (`row`: i clamped, `N`: the rows).
void emitFlashMixEpilogue(class GPUKernel &kernel, const FlashMixSpec &spec,
                          const FlashMixOutputs &outs,
                          kernels::SoftmaxState state, ArrayRef<Value> accs,
                          Value b, Value N, Value i, Value row, Value active,
                          Value lane);

/// The f32 mixing kernel on tensor cores by 3xTF32 (FlashTf32.cpp,
/// flash-mma-tf32): its padded features and experts and key tile.
struct FlashTf32Tile {
  int64_t depth = 0, experts = 0, cols = 64;
};

/// The tile where the 3xTF32 kernel applies to `spec` (similarity_inform,
/// its training forward and similarity_inform_grad's recomputed forward: f32
/// operands, at most 64 features and experts, no fused top-k), else nullopt.
std::optional<FlashTf32Tile>
flashTf32Tile(const FlashMixSpec &spec, Type qElt, Type keyElt, Type eElt,
              int64_t depth, const ConvertMoEToGPUOptions &options);

/// Creates the 3xTF32 kernel and launches it (grid (ceil(N / 64), B), block
/// 128) on launchFlashMix's arguments.
void launchFlashTf32(class HostCode &h, StringRef name,
                     const FlashMixSpec &spec, const FlashTf32Tile &tile,
                     Value q, ValueRange args, Location loc);

/// The tensor-core form of the flash mixing kernel (FlashMma.cpp): f16/bf16
/// operands on mma.sync m16n8k16 with f32 sums, a block of 4 warps per 64
/// query rows, key tiles of `cols` keys. Its tile sizes: the feature and
/// expert counts rounded up to 16 and 8 (zeros past them) and the key tile.
struct FlashMmaTile {
  int64_t depth = 0, experts = 0, cols = 0;
  /// Blocks per multiprocessor stated to ptxas (nvvm.minctasm): 4 (at most
  /// 128 registers a thread) when the fragments fit, else 2. Without it
  /// ptxas aimed at more blocks for the D = 64 kernel on sm_90 and spilled.
  int64_t blocksPerSM = 2;
  /// Stage the keys / the values with 16-byte loads and stores of 8 elements
  /// (where D / K is a multiple of 8); the kernel still takes the element
  /// loop for an operand whose base is not 16-byte aligned.
  bool wideKeys = false, wideValues = false;
  /// Stage the keys / the values with cp.async (nvgpu.device_async_copy of
  /// 16 bytes, zero-filled past the tile's bounds) into two buffers, the next
  /// tile's copies in flight while the current tile is computed (where D / K
  /// is a multiple of 8; the values only without a key mask, which must zero
  /// masked keys' values after the load; not attention_posterior past
  /// D = 128); `buffers` is then 2 (3 with two row tiles). An operand whose
  /// base is not 16-byte aligned is staged element by element into the same
  /// buffers.
  bool asyncKeys = false, asyncValues = false;
  int64_t buffers = 1;
  /// The row sums from the tensor cores: P·[e | 1], one more MMA per 16 keys
  /// against a constant block of ones past the experts' blocks, whose every
  /// column is the row's sum of the rounded probabilities, in place of an
  /// FADD a score and the quad's shuffles; not where the fragments held
  /// through the key loop would pass 160 registers (D = K = 256) nor for
  /// attention_posterior past D = 128: there each lane sums its scores and
  /// the quad's sums are added after the key loop (or every tile).
  bool sumMma = false;
  /// Row tiles of 16 query rows a warp (flash-mma-block-rows=128: 2, a block
  /// of 4 warps then owns 128 rows; each key and value fragment loaded by
  /// ldmatrix feeds both tiles' MMAs) and whether the staging's alignment is
  /// decided once outside the key loops (its 16-byte trips then unrolled).
  int64_t rowTiles = 1;
  bool hoistStaging = false;
  /// At most this many blocks split a row block's keys when the grid is
  /// small (flash-mma-key-splits, with two row tiles): the kernel writes
  /// partial rows to a workspace and a second kernel combines them.
  int64_t keySplits = 1;
  /// The split-key kernel takes the causal block order (flash-causal-balance)
  /// where flashMmaTile's register estimate leaves room for the block's
  /// computed place (FlashTile.h's flashBlockPlace).
  bool splitCausalOrder = false;
  /// The whole tiles against a stale shift (with two row tiles and the sums
  /// from the MMA): the row max, its shuffles and the rescale only in a tile
  /// where a probability reaches 2; the shift is the row max plus
  /// `lazyMargin` (log2 units) after such a tile.
  bool lazyRescale = false;
  int64_t lazyMargin = 0;
  /// The tile buffers are in dynamic shared memory (two row tiles with
  /// cp.async staging: `buffers` is then 3), passed at the launch; the
  /// static workgroup buffers otherwise.
  bool dynamicShared = false;
};

/// The largest feature count of the tensor-core kernel (its query fragments
/// stay in registers).
constexpr int64_t kFlashMmaMaxDepth = 256;

/// The tiles of the tensor-core kernel for `spec` on q/keys/e elements
/// `qElt`/`keyElt`/`eElt` and `depth` features under the pass's `options`,
/// or none where it does not apply (operands that are not all f16 or all
/// bf16, a dynamic depth or one over kFlashMmaMaxDepth, tiles over
/// shared-memory-bytes): the scalar kernel then runs. The softmax is in base
/// 2 (FlashAttention-2's: log2(e)/tau folded into one FFMA a score and
/// ex2.approx.ftz, the row max in log2 units, whole tiles peeled from the
/// checked last/diagonal ones up to 128 features and experts, P rounded two
/// scores at a time); a fused top-k is selected in the epilogue and
/// attention_posterior's per-key bias and added scores enter the logits' C
/// fragments. flash-mma-block-rows=128 gives two row tiles a warp where they
/// fit, with up to flash-mma-key-splits blocks sharing a row block's keys,
/// the lazy rescale and three cp.async stages (FlashMmaTile::rowTiles,
/// ::keySplits, ::lazyRescale, ::buffers).
std::optional<FlashMmaTile>
flashMmaTile(const FlashMixSpec &spec, Type qElt, Type keyElt, Type eElt,
             int64_t depth, const ConvertMoEToGPUOptions &options);

/// launchFlashMix on tensor cores (the same arguments; grid ceil(N / rows) x
/// B, rows 64 or 128 (FlashMmaTile::rowTiles), block 128; with key splits a
/// z dimension and a second, combining kernel) with the tiles of
/// flashMmaTile.
void launchFlashMixMma(class HostCode &h, StringRef name,
                       const FlashMixSpec &spec, const FlashMmaTile &tile,
                       Value q, ValueRange args, Location loc);

/// The flash mixing kernel of `spec` on launchFlashMix's arguments, the
/// kernel named `name`: on tensor cores where a tile applies (`mma`, f16/bf16
/// operands: `name`_mma; `tf32`, f32 operands: `name`_tf32), else the scalar
/// kernel (similarity_inform, attention_posterior and the recomputed forward
/// of similarity_inform_grad all choose so).
void launchFlashMixKernel(class HostCode &h, StringRef name,
                          const FlashMixSpec &spec,
                          const std::optional<FlashMmaTile> &mma,
                          const std::optional<FlashTf32Tile> &tf32, Value q,
                          ValueRange args, Location loc);

/// The tiles of the flash kernels (FlashMix.cpp, FlashGrad.cpp): a
/// block of kFlashThreads threads owns kFlashRows rows, a group of
/// kFlashGroup lanes (inside one warp) owns a row, and column tiles of
/// kFlashCols stream through workgroup memory in feature chunks of
/// kFlashChunk.
constexpr int64_t kFlashRows = 16;
constexpr int64_t kFlashGroup = 8;
constexpr int64_t kFlashCols = 32;
constexpr int64_t kFlashChunk = 32;
constexpr int64_t kFlashThreads = kFlashRows * kFlashGroup; // 128

/// A thread of a flash kernel: its id, the row of the tile it serves
/// (tid / kFlashGroup) and its lane in that row's group.
struct FlashLanes {
  Value tid, row, lane;
};

/// The kFlashCols / kFlashGroup dot products of a thread in one tile:
/// <rowsOp[b, rowBase + t.row, :], colsOp[b, colBase + c*kFlashGroup +
/// t.lane, :]> over `depth` features, both operands staged chunk by chunk in
/// the workgroup tiles rowTile [kFlashRows x kFlashChunk+1] and colTile
/// [kFlashCols x kFlashChunk+1] (zeros past numRows, numCols and depth).
/// Every thread of the block must reach it (barriers).
SmallVector<Value> emitFlashDots(class GpuKernelBuilder &kb,
                                 const FlashLanes &t, Value b, Value rowsOp,
                                 Value rowBase, Value numRows, Value colsOp,
                                 Value colBase, Value numCols, Value depth,
                                 Value rowTile, Value colTile);

/// The backward tiles of the flash mixing (FlashGrad.cpp), FlashAttention-2
/// style: no N x Nk buffer, every output row written by one block in a fixed
/// order (no atomics: deterministic). A block owns kFlashRows rows (queries,
/// or keys with `keyMajor`) of one sequence and streams the columns (the
/// other side) in tiles; per pair (query i, key j) it recomputes
///   S = exp(<sq_i, sk_j> / scaleDiv - lse_i)       (0 unless j is a key of i)
///   dX = S (<gq_i, gk_j> - delta_i) / scaleDiv
/// and adds Σ_col W · values[b, col, :] to out[b, row, :] for each
/// accumulator (W = S or dX). With a bias and added scores (the posterior of
/// attention_posterior) the logit is, in the forward kernel's order,
///   <sq_i, sk_j> / scaleDiv + bias[b,j] + add[b,head[b],i,j]
/// and a pair whose added score is -inf is excluded.
struct FlashGradSpec : FlashLogitSpec {
  /// Rows are keys and columns queries (the key-major pass).
  bool keyMajor = false;
  /// Under a causal mask, the blocks take the tiles heaviest first
  /// (flash-causal-balance; FlashBlockOrder in FlashTile.h).
  bool balanceCausal = false;
  /// Query-major with added scores only: stores dz = S (<gq_i, gk_j> -
  /// delta_i) (dX before the division; 0 for an excluded pair) at
  /// dz[b, head[b], i, j] for every pair of the block's rows.
  bool storeDz = false;
  struct Accumulator {
    /// Weighted by dX (else by S).
    bool byDx = false;
    /// `out` already holds a sum to add to (else the first column tile
    /// stores).
    bool addToOut = false;
    /// The values are all 1 and take no argument: out [B,R,1] gets the row
    /// sums of the weights.
    bool ones = false;
  };
  SmallVector<Accumulator> accumulators;
};

/// Creates the kernel and launches it (grid ceil(rows / kFlashRows) x B,
/// block kFlashThreads) on `args`: scoreRows [B,R,D], scoreCols [B,C,D],
/// gradRows [B,R,G], gradCols [B,C,G], lse [B,Nq] (+inf for a row without
/// keys: every S of it is 0), delta [B,Nq], then when present key_mask
/// [B,Nk] (i1), bias [B,Nk], add [B,H,Nq,Nk] and head [B], dz [B,H,Nq,Nk]
/// (f32), then per accumulator values [B,C,W] (none for `ones`) and out
/// [B,R,W] (f32).
void launchFlashGrad(class HostCode &h, StringRef name,
                     const FlashGradSpec &spec, ValueRange args, Location loc);

/// The tensor-core form of similarity_inform_grad's flash passes
/// (FlashMmaGrad.cpp; flash-mma-grad): f16/bf16 u and e of one type, no ws,
/// at most kFlashGradMmaMaxDepth features and kFlashGradMmaMaxExperts
/// experts (a warp's row operands and sums stay in registers).
constexpr int64_t kFlashGradMmaMaxDepth = 256;
constexpr int64_t kFlashGradMmaMaxExperts = 64;
bool flashGradMmaApplies(const FlashLogitSpec &spec, Type uElt, Type eElt,
                         int64_t depth, int64_t experts);
/// Creates the query-major (dq) or, with `spec.keyMajor`, the key-major (de,
/// du +=) pass and launches it (grid ceil(N / 64) x B, block 128; the blocks
/// in the causal order with `spec.balanceCausal`) on `args`: u [B,N,D], e
/// [B,N,K], dp [B,N,W] rounded to u's type with its rows padded to a multiple
/// of 8 by zeros, lse' and delta [B,N] (launchFlashGradStats), key_mask [B,N]
/// (i1) when the spec has one, then dq [B,N,D] (f32, stored) by query, or de
/// [B,N,K] (stored) and du [B,N,D] (f32, added to) by key. The spec's
/// accumulators are not read (the pass's sums are fixed).
void launchFlashGradMma(class HostCode &h, StringRef name,
                        const FlashGradSpec &spec, ValueRange args,
                        Location loc);

/// The per-row statistics of the backward from the forward's p and lse:
/// lse' [B,N] (lse, +inf where it is -inf: a row without keys) into `lseOut`
/// (default: lse itself, rewritten in place) and delta [B,N] = <dp_i, p_i>
/// (p, dp [B,N,K], f32). With `skip` ([B] i32), the rows of a batch element
/// whose entry is nonzero get lse' = +inf too: every weight exp(x - lse') of
/// the element, and so its gradients, are 0. With `dpRounded` ([B,N,W] of
/// f16/bf16, W >= K), dp rounded to its type is written there (zeros past
/// K) and delta is of it, as the tensor-core passes take dp in their dots
/// <dp_i, e_j>: dX = S (G - delta) then cancels as the exact one does where
/// p_i is close to e_j (a row dominated by one key).
void launchFlashGradStats(class HostCode &h, Value lse, Value p, Value dp,
                          Value delta, Location loc, Value lseOut = {},
                          Value skip = {}, Value dpRounded = {});

/// out[b,i,:] = x[b,i,:] · w (w^T with `transposed`; += with `accumulate`)
/// for x [B,N,D] (any float type), w [D,D], out [B,N,D] (f32): a thread per
/// output feature, the B·N rows strided over the blocks along y
/// (FlashMix.cpp).
void launchRowProjection(class HostCode &h, StringRef name, Value x, Value w,
                         Value out, bool transposed, bool accumulate,
                         Location loc);

/// The head means of attention_posterior (AttentionPosterior.cpp), a block
/// per 8 keys of a sequence b: means[b,j,:] = c · v[b,h*,j,:] · wo[:, h*·Dh:(h*+1)·Dh]^T
/// with h* = head[b] read on the device and c = `headScale` (H, the dim 1
/// of v, when absent), and bias[b,j] = -‖means[b,j,:]‖² / (2 sigma²) (f32,
/// from the f32 means). `means` is f32, or the tensor-core kernel's operand
/// type (f16/bf16): the f32 means rounded once where they are stored.
void launchHeadMeans(class HostCode &h, Value v, Value wo, Value head,
                     Value means, Value bias, std::optional<double> headScale,
                     double sigma, Location loc);

/// The softmax state (max, Σ exp(x - max)) of row `row` of `x` [T, E] taken
/// by one warp (RouterZLoss.cpp): lane `lane` strides over the experts 32 at
/// a time, one online-softmax step per chunk with butterfly max and sum.
/// Every lane of the warp must reach it with the same row; every lane gets
/// the row's state.
kernels::SoftmaxState warpRowSoftmax(class GpuKernelBuilder &kb, Value x,
                                     Value row, Value lane);

/// The token of a route kernel's thread (Route.cpp, RouteLanes.cpp): `width`
/// lanes a token, `blockSize` threads a block, on logits x [T, E]. `tid` is
/// the thread's id in the block, `lane` its lane in its token's group, `active`
/// whether the token exists and `row` the row the group works on: the token's,
/// or the last row for an inactive group of the last block, which stores
/// nothing (every lane must take part in the shuffles and votes).
struct RouteTokenLanes {
  Value tid, lane, active, row;
};
RouteTokenLanes routeTokenLanes(GpuKernelBuilder &kb, Value x, int64_t width,
                                int64_t blockSize);

/// Pick j of `row` of a replayed choice, read from replay[row, at]
/// (kernels::routeReplayPick: an index outside [0, E) read as expert 0) and,
/// where `reportIf(pick)` holds, reported through the error word `word` as
/// element row * k + j of moe.route's replay operand.
kernels::RouteReplayPick routeReplayPickReported(
    GpuKernelBuilder &kb, Value replay, Value word, Value row, Value at,
    Value j, Value k, int64_t numExperts,
    function_ref<Value(const kernels::RouteReplayPick &)> reportIf);

enum class ReduceKind; // Reductions.h

/// The softmax statistics of a route kernel's token row, of which this lane
/// holds `xs` and `reduce` combines the lanes' values, where the scoring needs
/// them (softmax before the choice); null max and sum otherwise.
kernels::RowSoftmaxStats
routeRowStats(GpuKernelBuilder &kb, const kernels::RouteSpec &spec,
              ArrayRef<Value> xs,
              function_ref<Value(Value, ReduceKind)> reduce);

/// How route-map=lanes (RouteLanes.cpp) maps a token of E experts onto
/// lanes: `width` lanes a token (a power of two <= 32), lane l holding the
/// `perLane` slots [l * perLane, (l + 1) * perLane) of the lanes' layout;
/// with groups, a lane holds `groupsPerLane` whole groups or a group spans
/// `groupLanes` lanes (one of the two is 1), each group taking `groupStride`
/// slots: its E / n_group experts, or more where they do not split evenly
/// over its lanes (the slots past its end empty); `listLength` candidates
/// sorted per lane (emitListTopk); `vec` elements of the logits a 16-byte
/// load.
struct RouteLanesMap {
  int64_t width, perLane, groupLanes, groupsPerLane, listLength, vec;
  int64_t groupStride;
};

/// The mapping of route-map=lanes for E experts of `elt` logits, or none
/// where it has none (more than 128 experts a lane): the warp kernel then
/// routes. Groups that split evenly over a power of two of lanes, or fit
/// whole on one, are laid out without gaps; with `padGroups`, groups that
/// do neither span lanes with the last ones' slots partly empty.
std::optional<RouteLanesMap>
routeLanesMapOf(int64_t E, const kernels::RouteSpec &spec, Type elt,
                bool padGroups = false);

/// The score of one expert as the route-map=lanes kernel computes it: sigmoid
/// on the SFU (ex2.approx + rcp.approx, a few ulps from kernels::sigmoid),
/// every other score as MoE/Kernels/Route.h's routeScore.
Value routeLanesScore(GpuKernelBuilder &kb, const kernels::RouteSpec &spec,
                      Value x, Value rowMax, Value rowSum);

/// The block size of the route-map=lanes kernel: `blockSize` (the pass
/// option), halved while the block's shared memory (P + 1 floats a thread)
/// exceeds `sharedMemoryBytes` or its registers an SM's.
int64_t routeLanesBlockSize(const RouteLanesMap &map, int64_t blockSize,
                            int64_t sharedMemoryBytes);

/// Defines and launches the route-map=lanes kernel of moe.route on x [T, E]
/// (bias [E] or null) into weights/indices [T, k] with `blockSize` threads a
/// block (routeLanesBlockSize) (RouteLanes.cpp); with `replay` [T, k] (else
/// null) the choice given, an index outside [0, E) reported through the
/// error word `word`.
void launchRouteLanes(class HostCode &h, const kernels::RouteSpec &spec,
                      const RouteLanesMap &map, int64_t numExperts,
                      int64_t blockSize, Value x, Value bias, Value weights,
                      Value indices, Value replay, Value word, Location loc);

/// Why moe.dispatch_plan `op` has no GPU lowering (an error on the op), or
/// success.
LogicalResult checkDispatchPlanOnGPU(DispatchPlanOp op);

/// The kernels of moe.dispatch_plan `op` on `h`'s stream (DispatchPlan.cpp),
/// in two steps so that the producer of the indices can launch between them
/// with no host work after it: the constructor allocates the results (outs
/// of `h`) and the one scratch buffer; launch() launches the three kernels
/// on `indices` (a [T, k] buffer of i32 or i64) and releases the scratch.
class DispatchPlanKernels {
public:
  DispatchPlanKernels(class HostCode &h, DispatchPlanOp op, Value indices);
  void launch();
  /// The result buffers, in the op's order.
  SmallVector<Value> results;

private:
  class HostCode &h;
  Value indices, chunks, scratch, word;
  int64_t numExperts, blockSize;
  Location loc;
};

/// A memref of rank >= 1 viewed as 2-D [rows, last]: rank 1 gets a unit
/// leading dim, rank > 2 has its leading dims collapsed (identity layouts).
Value viewAs2D(ImplicitLocOpBuilder &b, Value memref);

} // namespace mlir::moe::gpu_lowering

#endif // MOE_LIB_CONVERSION_MOETOGPU_LOWERINGS_H
