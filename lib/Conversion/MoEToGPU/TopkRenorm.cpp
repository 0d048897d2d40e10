//===- TopkRenorm.cpp - moe.topk_renorm on the GPU ------------------------===//
//
// Part of the MoE-MLIR project.
//
// Two kernels, chosen at compile time from the static expert count K:
//
//  * K <= 1024 (the register path): a group of W = min(32, pow2ceil(K)) lanes
//    per token (several tokens per warp for small K, as vLLM's topk_softmax),
//    blockDim 128. Each lane holds VPT = ceil(K / W) scores in registers
//    (element m*W + lane: coalesced loads, f16/bf16 upcast to f32) as packed
//    (ordered key, index) candidates. Round r takes the butterfly max of the
//    candidates strictly below round r-1's winner: no state to update, lowest
//    index on ties, NaN above everything. Weights are formed in an epilogue by
//    the lane that stored each raw value. topk-rounds=redux instead carries
//    32-bit keys and takes each round with two redux.sync (max key, then the
//    lowest index holding it) and a knock-out (sm_80+).
//  * topk-rounds=list (K <= 1024; sm_80+, within list-redux): the mapping of issue
//    #46 after vLLM's topk_softmax (16-byte loads, several rows a warp) and
//    SGLang's gate (8 lanes a token): 4-8 lanes a token (listMappingOf), each
//    holding runs of 4 (f32) or 8 (f16/bf16) adjacent scores loaded 16 bytes
//    at a time where the row base is aligned. Each lane sorts its best few
//    candidates once; a round is then the group's best head and a pop
//    (emitListTopk), ~37 SASS instructions a round whatever the lane holds,
//    against ~8 an element a round for redux. Weights are formed after the
//    rounds, once per pick, by the lane that stores it.
//  * K > 1024 or dynamic: a block of 256 threads per token; every round
//    re-reads the row (L1/L2 resident) with a strided scan and a block
//    reduction through 8 words of workgroup memory. No shared copy of the
//    row, so any K works.
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Reductions.h"
#include "RegisterTopk.h"
#include "Lowerings.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

Value mlir::moe::gpu_lowering::viewAs2D(ImplicitLocOpBuilder &b, Value memref) {
  auto type = cast<MemRefType>(memref.getType());
  int64_t rank = type.getRank();
  if (rank == 2)
    return memref;
  if (rank == 1) {
    auto result =
        MemRefType::get({1, type.getShape()[0]}, type.getElementType());
    SmallVector<ReassociationIndices> reassoc = {{0, 1}};
    return memref::ExpandShapeOp::create(b, result, memref, reassoc);
  }
  ReassociationIndices lead;
  for (int64_t d = 0; d + 1 < rank; ++d)
    lead.push_back(d);
  SmallVector<ReassociationIndices> reassoc = {lead, {rank - 1}};
  return memref::CollapseShapeOp::create(b, memref, reassoc);
}

/// Largest K handled with the scores in registers (32 per lane).
static constexpr int64_t kRegisterTopkMaxK = 1024;
/// topk-rounds=list-redux: the most tokens the redux kernel takes. Measured
/// at K = 256, k = 8 on an H200 (2026-11-26, both kernels in one run, us):
/// T = 64: redux 2.0, list 3.5; T = 4096: redux 5.37, list 6.14; T = 65536
/// (K = 128): redux 37.6, list 23.8. Linear in T between the last two, the
/// lines cross near 7300 tokens: redux up to 6144.
static constexpr int64_t kTopkReduxMaxTokens = 6144;
/// Threads of the block-per-token kernel.
static constexpr int64_t kBlockTopkThreads = 256;

/// The outputs of a kernel's top-k of `spec` (TopkOutputs) on the row `vals`
/// that a group of `width` lanes holds: the picks stored to [row, r] of
/// `weights` and `indices` by the `active` lanes; for logits without
/// renormalization also the dense softmax's max and sum of the row, reduced
/// over the group.
static TopkOutputs topkOutputs(GpuKernelBuilder &kb, const TopkSpec &spec,
                               ArrayRef<Value> vals, int64_t width,
                               Value weights, Value indices, Value row,
                               Value active) {
  TopkOutputs out{.spec = spec,
                  .weights = weights,
                  .indices = indices,
                  .row = row,
                  .active = active};
  if (spec.logits && !spec.renormalize) {
    auto reduce = [&](ReduceKind kind) {
      return [&, kind](Value v) {
        return width > 1 ? subgroupReduce(kb, v, kind, width) : v;
      };
    };
    RowSoftmaxStats dense = rowSoftmaxStats(kb, vals, reduce(ReduceKind::Max),
                                            reduce(ReduceKind::Sum));
    out.denseMax = dense.max;
    out.denseSum = dense.sum;
  }
  return out;
}

static void emitWarpTopkKernel(GpuKernelBuilder &kb, Value scores, Value weights,
                               Value indices, int64_t K, int64_t blockSize,
                               const TopkSpec &spec, int64_t width,
                               TopkRounds rounds) {
  int64_t vpt = llvm::divideCeil(K, width);
  int64_t tokensPerBlock = blockSize / width;
  Value tid = kb.threadId();
  Value group = kb.divu(tid, kb.idx(width));
  Value lane = kb.remu(tid, kb.idx(width));
  Value numTokens = kb.dim(scores, 0);
  Value token = kb.add(kb.mul(kb.blockId(), kb.idx(tokensPerBlock)), group);
  Value active = kb.lt(token, numTokens);
  // Inactive groups of the last block read a valid row and store nothing:
  // every lane must take part in the shuffles.
  Value row = kb.select(active, token, kb.sub(numTokens, kb.idx(1)));

  Value negInf = kb.cF32(-std::numeric_limits<double>::infinity());
  SmallVector<Value> vals;
  for (int64_t m = 0; m < vpt; ++m) {
    Value col = kb.add(kb.idx(m * width), lane);
    if ((m + 1) * width <= K) {
      vals.push_back(kb.loadF(scores, {row, col}));
      continue;
    }
    Value inRange = kb.lt(col, kb.idx(K));
    Value safe = kb.select(inRange, col, kb.idx(K - 1));
    vals.push_back(kb.select(inRange, kb.loadF(scores, {row, safe}), negInf));
  }

  TopkOutputs out =
      topkOutputs(kb, spec, vals, width, weights, indices, row, active);
  emitRegisterTopk(kb, {.vals = vals,
                        .lane = lane,
                        .width = width,
                        .numElements = K,
                        .rounds = rounds,
                        .out = out});
}

namespace {
/// How topk-rounds=list maps a row of K scores of `elt` onto lanes.
struct ListMapping {
  /// Elements of one 16-byte vector load (4 f32, 8 f16/bf16).
  int64_t vec;
  /// Lanes per token (a power of two <= 32): 32 / width tokens per warp.
  int64_t width;
  /// Elements per lane: runs of `vec`, chunk c of lane l starting at index
  /// (c * width + l) * vec (RegisterRow{width, vec}).
  int64_t perLane;
  /// Candidates each lane keeps sorted (emitListTopk's listLength).
  int64_t listLength;
  /// 16-byte loads when the row base is aligned (K a multiple of vec).
  bool vectorLoads;
};
} // namespace

/// The mapping of issue #46 (vLLM's topk_softmax loads 16 bytes per lane and
/// packs several rows per warp; SGLang's gate gives a token 8 lanes): per
/// token, warp instructions are about K * c_e / 32 for the per-element work
/// (ordered key, one list insertion) plus k * R(width) * width / 32 for the
/// rounds, R ~ 4 log2(width) + 2t + 10 the round's body. With t = 3 that is
/// least near width = 8 (4 tokens a warp), so: 8 lanes, 4 for K <= 64 (16
/// elements a lane), and more lanes only to hold at most 32 elements a lane
/// (K > 256 f32); never more lanes than K has vectors. t: a lane wins about
/// k / width of the k picks, and a lane that pops its last entry refills
/// (when it may hold more) even if it would not win again. Modelled on
/// Gaussian rows (k = 8): t = k / width + 2 refilled in 34% of tokens at
/// K = 128 and 256 (79% of warps), t = k / width + 3 in 3.5% (13% of warps),
/// for 5 more instructions an element: the refill rescans a lane's elements
/// (~17 instructions each), so the longer list costs less per token.
static ListMapping listMappingOf(int64_t K, int64_t k, Type elt) {
  ListMapping m;
  m.vec = 16 / (elt.getIntOrFloatBitWidth() / 8);
  m.vectorLoads = K % m.vec == 0;
  int64_t p = llvm::PowerOf2Ceil(K);
  int64_t width = std::max<int64_t>(p / 32, std::min<int64_t>(8, std::max<int64_t>(4, p / 16)));
  width = std::min<int64_t>(width, static_cast<int64_t>(llvm::bit_floor(static_cast<uint64_t>(std::max<int64_t>(1, K / m.vec)))));
  m.width = std::min<int64_t>(width, kWarp);
  m.perLane = llvm::divideCeil(K, m.width * m.vec) * m.vec;
  m.listLength = std::min<int64_t>(
      {m.perLane, k, std::max<int64_t>(3, llvm::divideCeil(k, m.width) + 3)});
  return m;
}

/// topk-rounds=list: `width` lanes per token, each with `perLane` scores in
/// runs of `vec` (one 16-byte load each when the row base is 16-byte aligned,
/// else the same elements one by one: a uniform branch on the base pointer,
/// rows being K * elt bytes apart), their ordered keys, and emitListTopk.
static void emitListTopkKernel(GpuKernelBuilder &kb, Value scores, Value weights,
                               Value indices, int64_t K, int64_t blockSize,
                               const TopkSpec &spec, const ListMapping &map) {
  const int64_t width = map.width, vec = map.vec;
  const int64_t chunks = map.perLane / vec;
  Type elt = cast<MemRefType>(scores.getType()).getElementType();
  Value tid = kb.threadId();
  Value group = kb.divu(tid, kb.idx(width));
  Value lane = kb.remu(tid, kb.idx(width));
  Value numTokens = kb.dim(scores, 0);
  Value token = kb.add(kb.mul(kb.blockId(), kb.idx(blockSize / width)), group);
  Value active = kb.lt(token, numTokens);
  // Inactive groups of the last block read a valid row and store nothing:
  // every lane of the warp takes part in the shuffles, redux and votes.
  Value row = kb.select(active, token, kb.sub(numTokens, kb.idx(1)));
  RegisterRow layout{width, vec};
  Value negInf = kb.cF32(-std::numeric_limits<double>::infinity());

  // Chunk c of this lane starts at column (c * width + lane) * vec; with
  // K % vec == 0 a chunk is wholly inside the row or wholly padding.
  SmallVector<Value> chunkStart, chunkIn;
  for (int64_t c = 0; c < chunks; ++c) {
    Value start = kb.add(kb.idx(c * width * vec), kb.mul(lane, kb.idx(vec)));
    chunkStart.push_back(start);
    chunkIn.push_back((c * width + width - 1) * vec + vec <= K
                          ? Value()
                          : kb.lt(start, kb.idx(K)));
  }
  auto scalarLoads = [&]() {
    SmallVector<Value> out;
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t j = 0; j < vec; ++j) {
        Value col = kb.add(chunkStart[c], kb.idx(j));
        if ((c * width + width - 1) * vec + j < K) {
          out.push_back(kb.loadF(scores, {row, col}));
          continue;
        }
        Value in = kb.lt(col, kb.idx(K));
        Value safe = kb.select(in, col, kb.idx(0));
        out.push_back(kb.select(in, kb.loadF(scores, {row, safe}), negInf));
      }
    return out;
  };
  SmallVector<Value> vals;
  if (map.vectorLoads) {
    Value base = memref::ExtractAlignedPointerAsIndexOp::create(kb.b, scores);
    Value aligned = kb.eq(kb.andI(base, kb.idx(15)), kb.idx(0));
    SmallVector<Type> types(map.perLane, kb.f32());
    int64_t bytes = elt.getIntOrFloatBitWidth() / 8;
    Value rowBase = kb.add(base, kb.mul(row, kb.idx(K * bytes)));
    vals = kb.ifElse(
        aligned, types,
        [&] {
          SmallVector<Value> out;
          for (int64_t c = 0; c < chunks; ++c) {
            Value col = chunkStart[c];
            if (chunkIn[c])
              col = kb.select(chunkIn[c], col, kb.idx(0));
            Value address = kb.add(rowBase, kb.mul(col, kb.idx(bytes)));
            for (Value x : loadGlobal16(kb, address, elt))
              out.push_back(chunkIn[c] ? kb.select(chunkIn[c], x, negInf) : x);
          }
          return out;
        },
        scalarLoads);
  } else {
    vals = scalarLoads();
  }

  Value laneBase = layout.laneBase(kb, kb.castInt(lane, kb.i32()));
  SmallVector<Value> keys;
  SmallVector<int64_t> positions;
  Value gone = emptyListKey(kb, kb.i32());
  for (int64_t m = 0; m < map.perLane; ++m) {
    positions.push_back(layout.offset(m));
    Value key = orderedKey(kb, vals[m]);
    if (layout.mayPad(m, K))
      key = kb.select(kb.lt(layout.index(kb, m, laneBase), kb.cI32(K)), key,
                      gone);
    keys.push_back(key);
  }

  TopkOutputs out =
      topkOutputs(kb, spec, vals, width, weights, indices, row, active);
  emitListTopk(kb, {.keys = keys,
                    .positions = positions,
                    .laneBase = laneBase,
                    .lane = lane,
                    .width = width,
                    .listLength = map.listLength,
                    .out = out});
}

static void emitBlockTopkKernel(GpuKernelBuilder &kb, Value scores,
                                Value weights, Value indices,
                                const TopkSpec &spec, Value scratchI64,
                                Value scratchF32) {
  const int64_t threads = kBlockTopkThreads;
  Value tid = kb.threadId();
  Value row = kb.blockId();
  Value K = kb.dim(scores, 1);
  Value step = kb.idx(threads);

  Value denseMax, denseSum;
  if (spec.logits && !spec.renormalize) {
    RowSoftmaxStats dense = rowSoftmaxStatsLoop(
        kb, kb.f32(), tid, K, step,
        [&](Value i) { return kb.loadF(scores, {row, i}); },
        [&](Value v) {
          return blockReduce(kb, v, ReduceKind::Max, threads, scratchF32);
        },
        [&](Value v) {
          return blockReduce(kb, v, ReduceKind::Sum, threads, scratchF32);
        });
    denseMax = dense.max;
    denseSum = dense.sum;
  }

  Value none = noCandidate(kb, kb.i64());
  Value isWriter = kb.eq(tid, kb.idx(0));
  SmallVector<Value> init = {kb.cI64(std::numeric_limits<int64_t>::max()),
                             kb.cF32(0.0), kb.cF32(0.0)};
  SmallVector<Value> done = kb.forLoop(
      kb.idx(0), kb.idx(spec.k), kb.idx(1), init,
      [&](Value r, ValueRange args) -> SmallVector<Value> {
        Value prev = args[0];
        Value local =
            kb.forLoop(tid, K, step, {none},
                      [&](Value i, ValueRange acc) -> SmallVector<Value> {
                        Value v = kb.loadF(scores, {row, i});
                        Value cand = packCandidate(kb, orderedKey(kb, v),
                                                   kb.castInt(i, kb.i32()));
                        return {bestBelow(kb, acc[0], cand, prev, none)};
                      })[0];
        Value best =
            blockReduce(kb, local, ReduceKind::MaxI64, threads, scratchI64);
        Value v = keyToFloat(kb, candidateKey(kb, best));
        TopkPickState pick = topkPickState(kb, spec, r, v, args[1]);
        Value selSum = kb.fadd(args[2], pick.term);
        kb.ifThen(isWriter, [&] {
          kb.store(v, weights, {row, r});
          kb.store(kb.asElementOf(candidateIndex(kb, best), indices), indices,
                   {row, r});
        });
        return {best, pick.v0, selSum};
      });
  if (!spec.logits && !spec.renormalize)
    return;
  kb.ifThen(isWriter, [&] {
    kb.forLoop(kb.idx(0), kb.idx(spec.k), kb.idx(1), [&](Value r) {
      Value v = kb.load(weights, {row, r});
      kb.store(topkWeight(kb, spec, v, done[1], done[2], denseMax, denseSum),
              weights, {row, r});
    });
  });
}

template <>
LogicalResult
GPULowering<TopkRenormOp>::lower(TopkRenormOp op, OpAdaptor adaptor,
                                 ConversionPatternRewriter &rewriter) const {
  auto scoresType = cast<RankedTensorType>(op.getScores().getType());
  auto weightsType = cast<RankedTensorType>(op.getWeights().getType());
  auto indicesType = cast<RankedTensorType>(op.getIndices().getType());
  if (!weightsType.hasStaticShape() &&
      weightsType.isDynamicDim(weightsType.getRank() - 1))
    return op.emitOpError("GPU lowering needs a static k");
  TopkSpec spec = kernels::topkSpecOf(op);
  int64_t K = scoresType.getShape().back();
  bool registerPath = !ShapedType::isDynamic(K) && K <= kRegisterTopkMaxK;

  HostCode h(rewriter, op);
  ImplicitLocOpBuilder &b = h.b;
  GpuKernelBuilder &kb = h.kb;
  Value scores = h.buffer(adaptor.getScores());
  Value weights =
      h.allocLike(weightsType, dynamicSizesFrom(kb, weightsType, scores));
  Value indices =
      h.allocLike(indicesType, dynamicSizesFrom(kb, indicesType, scores));
  Value s2 = viewAs2D(b, scores);
  Value w2 = viewAs2D(b, weights);
  Value i2 = viewAs2D(b, indices);
  Value numTokens = kb.dim(s2, 0);
  SmallVector<Value> args = {s2, w2, i2};

  if (registerPath) {
    int64_t block = options.blockSize;
    // Defines the register kernel of `rounds` and launches it over the tokens
    // where `run` holds (an i1, or null for always), else over an empty grid,
    // which the runtime does not launch (mgpuLaunchKernel).
    auto launchRegister = [&](StringRef rounds, Value run) {
      int64_t width = std::min<int64_t>(kWarp, llvm::PowerOf2Ceil(K));
      GPUKernel kernel(h, "topk_renorm_warp", args, {}, {block, 1, 1},
                       op.getLoc());
      if (rounds == "list") {
        ListMapping map =
            listMappingOf(K, spec.k, scoresType.getElementType());
        width = map.width;
        emitListTopkKernel(kernel.kb, kernel.arg(0), kernel.arg(1),
                           kernel.arg(2), K, block, spec, map);
      } else {
        TopkRounds kind =
            rounds == "redux" ? TopkRounds::Redux : TopkRounds::Butterfly;
        emitWarpTopkKernel(kernel.kb, kernel.arg(0), kernel.arg(1),
                           kernel.arg(2), K, block, spec, width, kind);
      }
      Value grid = kb.ceilDiv(numTokens, kb.idx(block / width));
      if (run)
        grid = kb.select(run, grid, kb.idx(0));
      kernel.launch({grid, kb.idx(1), kb.idx(1)});
    };
    if (options.topkRounds == "list-redux") {
      // Both kernels, the token count choosing on the host: redux's warp a
      // token has the shorter latency while the tokens are few (an H200 at
      // T = 64: 2.01 us against list's 3.47), list's lanes the fewer
      // instructions a token past that (T = 65536: 1.5-1.7x redux).
      Value few = kb.lt(numTokens, kb.idx(kTopkReduxMaxTokens + 1));
      launchRegister("redux", few);
      launchRegister("list", kb.notI1(few));
    } else {
      launchRegister(options.topkRounds, Value());
    }
  } else {
    int64_t warps = kBlockTopkThreads / kWarp;
    GPUKernel kernel(h, "topk_renorm_block", args,
                     {workgroupMemRef({warps}, b.getI64Type()),
                      workgroupMemRef({warps}, b.getF32Type())},
                     {kBlockTopkThreads, 1, 1}, op.getLoc());
    emitBlockTopkKernel(kernel.kb, kernel.arg(0), kernel.arg(1), kernel.arg(2),
                        spec, kernel.workgroup(0), kernel.workgroup(1));
    kernel.launch({numTokens, kb.idx(1), kb.idx(1)});
  }
  h.finish();
  h.replace(op, {weights, indices});
  return success();
}
