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

static void emitWarpTopkKernel(GpuKernelBuilder &k, Value scores, Value weights,
                               Value indices, int64_t K, int64_t blockSize,
                               const TopkSpec &spec, int64_t width,
                               TopkRounds rounds) {
  int64_t vpt = llvm::divideCeil(K, width);
  int64_t tokensPerBlock = blockSize / width;
  Value tid = k.threadId();
  Value group = k.divu(tid, k.idx(width));
  Value lane = k.remu(tid, k.idx(width));
  Value numTokens = k.dim(scores, 0);
  Value token = k.add(k.mul(k.blockId(), k.idx(tokensPerBlock)), group);
  Value active = k.lt(token, numTokens);
  // Inactive groups of the last block read a valid row and store nothing:
  // every lane must take part in the shuffles.
  Value row = k.select(active, token, k.sub(numTokens, k.idx(1)));

  Value negInf = k.cF32(-std::numeric_limits<double>::infinity());
  SmallVector<Value> vals;
  for (int64_t m = 0; m < vpt; ++m) {
    Value col = k.add(k.idx(m * width), lane);
    if ((m + 1) * width <= K) {
      vals.push_back(k.loadF(scores, {row, col}));
      continue;
    }
    Value inRange = k.lt(col, k.idx(K));
    Value safe = k.select(inRange, col, k.idx(K - 1));
    vals.push_back(k.select(inRange, k.loadF(scores, {row, safe}), negInf));
  }

  Value denseMax, denseSum;
  if (spec.logits && !spec.renormalize) {
    Value m = vals[0];
    for (Value v : ArrayRef<Value>(vals).drop_front())
      m = k.fmax(m, v);
    denseMax = subgroupReduce(k, m, ReduceKind::Max, width);
    Value s = k.cF32(0.0);
    for (Value v : vals)
      s = k.fadd(s, k.exp(k.fsub(v, denseMax)));
    denseSum = subgroupReduce(k, s, ReduceKind::Sum, width);
  }
  emitRegisterTopk(k, vals, lane, width, K, spec, weights, indices, row, active,
                   denseMax, denseSum, rounds);
}

static void emitBlockTopkKernel(GpuKernelBuilder &k, Value scores,
                                Value weights, Value indices,
                                const TopkSpec &spec, Value scratchI64,
                                Value scratchF32) {
  const int64_t threads = kBlockTopkThreads;
  Value tid = k.threadId();
  Value row = k.blockId();
  Value K = k.dim(scores, 1);
  Value step = k.idx(threads);

  Value denseMax, denseSum;
  if (spec.logits && !spec.renormalize) {
    Value negInf = k.cF32(-std::numeric_limits<double>::infinity());
    Value m = k.forLoop(tid, K, step, {negInf},
                        [&](Value i, ValueRange acc) -> SmallVector<Value> {
                          return {k.fmax(acc[0], k.loadF(scores, {row, i}))};
                        })[0];
    denseMax = blockReduce(k, m, ReduceKind::Max, threads, scratchF32);
    Value s = k.forLoop(tid, K, step, {k.cF32(0.0)},
                        [&](Value i, ValueRange acc) -> SmallVector<Value> {
                          Value v = k.loadF(scores, {row, i});
                          return {k.fadd(acc[0], k.exp(k.fsub(v, denseMax)))};
                        })[0];
    denseSum = blockReduce(k, s, ReduceKind::Sum, threads, scratchF32);
  }

  Value none = noCandidate(k, k.i64());
  Value isWriter = k.eq(tid, k.idx(0));
  SmallVector<Value> init = {k.cI64(std::numeric_limits<int64_t>::max()),
                             k.cF32(0.0), k.cF32(0.0)};
  SmallVector<Value> done = k.forLoop(
      k.idx(0), k.idx(spec.k), k.idx(1), init,
      [&](Value r, ValueRange args) -> SmallVector<Value> {
        Value prev = args[0];
        Value local =
            k.forLoop(tid, K, step, {none},
                      [&](Value i, ValueRange acc) -> SmallVector<Value> {
                        Value v = k.loadF(scores, {row, i});
                        Value cand = packCandidate(k, orderedKey(k, v),
                                                   k.castInt(i, k.i32()));
                        return {bestBelow(k, acc[0], cand, prev, none)};
                      })[0];
        Value best =
            blockReduce(k, local, ReduceKind::MaxI64, threads, scratchI64);
        Value v = keyToFloat(k, candidateKey(k, best));
        Value v0 = k.select(k.eq(r, k.idx(0)), v, args[1]);
        Value term = spec.logits ? k.exp(k.fsub(v, v0)) : v;
        Value selSum = k.fadd(args[2], term);
        k.ifThen(isWriter, [&] {
          k.store(v, weights, {row, r});
          k.store(candidateIndex(k, best), indices, {row, r});
        });
        return {best, v0, selSum};
      });
  if (!spec.logits && !spec.renormalize)
    return;
  k.ifThen(isWriter, [&] {
    k.forLoop(k.idx(0), k.idx(spec.k), k.idx(1), [&](Value r) {
      Value v = k.load(weights, {row, r});
      k.store(topkWeight(k, spec, v, done[1], done[2], denseMax, denseSum),
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
  GpuKernelBuilder &k = h.k;
  Value scores = h.buffer(adaptor.getScores());
  Value weights =
      h.allocLike(weightsType, dynamicSizesFrom(k, weightsType, scores));
  Value indices =
      h.allocLike(indicesType, dynamicSizesFrom(k, indicesType, scores));
  Value s2 = viewAs2D(b, scores);
  Value w2 = viewAs2D(b, weights);
  Value i2 = viewAs2D(b, indices);
  Value numTokens = k.dim(s2, 0);
  SmallVector<Value> args = {s2, w2, i2};

  if (registerPath) {
    int64_t width = std::min<int64_t>(kWarp, llvm::PowerOf2Ceil(K));
    int64_t block = options.blockSize;
    GPUKernel kernel(h, "topk_renorm_warp", args, {}, {block, 1, 1},
                     op.getLoc());
    TopkRounds rounds = options.topkRounds == "redux" ? TopkRounds::Redux
                                                      : TopkRounds::Butterfly;
    emitWarpTopkKernel(kernel.k, kernel.arg(0), kernel.arg(1), kernel.arg(2), K,
                       block, spec, width, rounds);
    Value grid = k.ceilDiv(numTokens, k.idx(block / width));
    kernel.launch({grid, k.idx(1), k.idx(1)});
  } else {
    int64_t warps = kBlockTopkThreads / kWarp;
    GPUKernel kernel(h, "topk_renorm_block", args,
                     {workgroupMemRef({warps}, b.getI64Type()),
                      workgroupMemRef({warps}, b.getF32Type())},
                     {kBlockTopkThreads, 1, 1}, op.getLoc());
    emitBlockTopkKernel(kernel.k, kernel.arg(0), kernel.arg(1), kernel.arg(2),
                        spec, kernel.workgroup(0), kernel.workgroup(1));
    kernel.launch({numTokens, k.idx(1), k.idx(1)});
  }
  h.finish();
  h.replace(op, {weights, indices});
  return success();
}
