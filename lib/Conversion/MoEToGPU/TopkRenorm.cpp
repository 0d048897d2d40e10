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
//  * K > 1024 or dynamic: a block of 256 threads per token; every round
//    re-reads the row (L1/L2 resident) with a strided scan and a block
//    reduction through 8 words of workgroup memory. No shared copy of the
//    row, so any K works.
//
//===----------------------------------------------------------------------===//

#include "KernelUtils.h"
#include "Lowerings.h"

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
/// Threads of the block-per-token kernel.
static constexpr int64_t kBlockTopkThreads = 256;

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

  Value denseMax, denseSum;
  if (spec.logits && !spec.renormalize) {
    RowSoftmaxStats dense = rowSoftmaxStats(
        kb, vals,
        [&](Value v) { return subgroupReduce(kb, v, ReduceKind::Max, width); },
        [&](Value v) { return subgroupReduce(kb, v, ReduceKind::Sum, width); });
    denseMax = dense.max;
    denseSum = dense.sum;
  }
  emitRegisterTopk(kb, vals, lane, width, K, spec, weights, indices, row, active,
                   denseMax, denseSum, rounds);
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
          kb.store(candidateIndex(kb, best), indices, {row, r});
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

LogicalResult
TopkRenormToGPU::lower(TopkRenormOp op, OpAdaptor adaptor,
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
    int64_t width = std::min<int64_t>(kWarp, llvm::PowerOf2Ceil(K));
    int64_t block = options.blockSize;
    GPUKernel kernel(h, "topk_renorm_warp", args, {}, {block, 1, 1},
                     op.getLoc());
    TopkRounds rounds = options.topkRounds == "redux" ? TopkRounds::Redux
                                                      : TopkRounds::Butterfly;
    emitWarpTopkKernel(kernel.kb, kernel.arg(0), kernel.arg(1), kernel.arg(2), K,
                       block, spec, width, rounds);
    Value grid = kb.ceilDiv(numTokens, kb.idx(block / width));
    kernel.launch({grid, kb.idx(1), kb.idx(1)});
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
