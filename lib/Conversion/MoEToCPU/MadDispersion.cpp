//===- MadDispersion.cpp - moe.mad_dispersion -> fast CPU kernel ----------===//
//
// Part of the MoE-MLIR project.
//
// The portable lowering reduces over the tokens once per cluster (E times the
// work of a scatter). Here the two statistics passes are scatters: token t
// adds its row into the row assign[t] of the [E, D] sums, t ascending. The
// workers own disjoint column blocks of 32 features (two AVX-512 vectors,
// four AVX2 ones), so every sum is accumulated by one thread in the same order
// (t ascending) as the portable lowering: the result is bit-identical to it.
// The block is 128 bytes on every target, not a number of vectors: a token's
// step (load assign[t], range check, address) costs the same whatever the
// width, so a block of fewer features runs more steps (docs/CPU.md,
// "Measurements"). An `assign` value outside [0, E) adds nothing (and is reported, as there). The
// cheap O(E·D) tail (1/(s+eps), clip, rescale) is the portable one.
//
// A block is emitted twice: whole blocks (every block when D is a multiple of
// the block) use plain vector loads and stores, the last, ragged one masked
// ones. The passes read back what the previous token stored to the same row:
// with masked stores that is a microcoded VMASKMOVPS per vector on AVX2
// machines and no store-to-load forwarding.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/SegmentedStats.h"

namespace mlir::moe::cpu_lowering {
using namespace kernels;

namespace {
/// Features of a column block (128 bytes of f32).
constexpr int64_t kBlockFeatures = 32;
/// A scatter pass reads a block of every token's row: with rows a page or
/// more apart (D >= 1024 f32) each step starts a new page, which no hardware
/// prefetcher crosses, and the steps in flight are bounded by the store
/// buffer (a step stores its block of the statistic row). The passes then
/// prefetch the block of the token this many steps ahead: T = 16384,
/// D = 1024, E = 64 took 0.78x (AVX2) and 0.8-0.9x (AVX-512) the time.
constexpr int64_t kPrefetchTokens = 16;
constexpr int64_t kPrefetchMinRowBytes = 4096;
/// Inputs of at most this many elements (T = 64, D = 256: the decode case)
/// run on the calling thread.
constexpr int64_t kInlineElements = 1 << 14;

} // namespace

template <>
LogicalResult CPUKernel<MadDispersionOp>::emit(MadDispersionOp op,
                                               CpuKernelBuilder &kb,
                                               PatternRewriter &rw) const {
  int64_t numExperts = op.getNumExperts();
  if (failed(checkIndexOperand(rw, op, op.getAssign(), numExperts,
                               kMoEErrorMadDispersionAssign)))
    return failure();
  int64_t lanes = kb.lanes();
  Type f32 = kb.f32(), i32 = kb.i32();
  // counts [E] i32 and the deviations [E, D] f32, which
  // finishMadDispersion turns into the op's results.
  Value depthSize = kb.sizes(op.getTokens())[1];
  KernelScope kernel(
      kb, {op.getTokens(), op.getAssign()},
      {{RankedTensorType::get({numExperts}, i32), {}},
       {RankedTensorType::get({numExperts, kDyn}, f32), {kb.idx(numExperts), depthSize}}});
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Value x = kb.buffer(op.getTokens()), assign = kb.buffer(op.getAssign());
  Value tokens = kb.dim(x, 0), depth = kb.dim(x, 1);
  Value e = kb.idx(numExperts);
  Type assignType = cast<MemRefType>(assign.getType()).getElementType();
  Value eA = kb.castInt(e, assignType);
  bool variance = op.getMeasure() == DispersionMeasure::variance;

  // The cluster of token t as an index, or nothing when out of range.
  auto withCluster = [&](Value t, function_ref<void(Value)> body) {
    Value a = kb.load(assign, {t});
    kb.ifThen(idInRange(kb, a, eA), [&] { body(kb.castInt(a, kb.index())); });
  };

  Value counts = kernel.out(0);
  kb.forLoop(c0, e, c1, [&](Value c) { kb.store(kb.cI32(0), counts, {c}); });
  kb.forLoop(c0, tokens, c1, [&](Value t) {
    withCluster(t, [&](Value a) {
      kb.store(kb.add(kb.load(counts, {a}), kb.cI32(1)), counts, {a});
    });
  });

  auto statType = MemRefType::get({numExperts, kDyn}, f32);
  Value sums = kb.alloc(statType, {depth});
  Value dev = kernel.out(1);
  Value zeros = kb.constLike(kb.vf32(), 0.0);
  int64_t blockVectors = std::max<int64_t>(kBlockFeatures / lanes, 1);
  int64_t block = blockVectors * lanes;
  int64_t staticDepth = cast<MemRefType>(x.getType()).getDimSize(1);
  Value numBlocks = kb.ceilDiv(depth, kb.idx(block));

  // Rows at least a page apart: token t + kPrefetchTokens's part of the
  // block is prefetched (each of its 64-byte lines) while token t is added.
  int64_t elemBytes =
      cast<MemRefType>(x.getType()).getElementTypeBitWidth() / 8;
  bool prefetch =
      staticDepth != kDyn && staticDepth * elemBytes >= kPrefetchMinRowBytes;
  auto prefetchBlock = [&](Value t, Value col0, bool full) {
    Value ahead = kb.mins(kb.add(t, kb.idx(kPrefetchTokens)), kb.sub(tokens, c1));
    for (int64_t off = 0; off < block; off += 64 / elemBytes) {
      Value col = kb.add(col0, kb.idx(off));
      if (!full)
        col = kb.mins(col, kb.sub(depth, c1));
      memref::PrefetchOp::create(kb.b, x, ValueRange{ahead, col},
                                 /*isWrite=*/false, /*localityHint=*/3,
                                 /*isDataCache=*/true);
    }
  };

  // One column block: zero both statistics, Σ x, the mean, Σ |x - mean|.
  // `full`: every lane of the block is inside D (plain loads and stores).
  auto emitBlock = [&](Value col0, bool full) {
    SmallVector<Value> cols, counts_;
    for (int64_t v = 0; v < blockVectors; ++v) {
      cols.push_back(kb.add(col0, kb.idx(v * lanes)));
      counts_.push_back(kb.sub(depth, cols.back()));
    }
    // Lanes past D are neither read nor written (masked, ragged block).
    auto forVectors = [&](function_ref<void(Value col, Value count)> f) {
      for (int64_t v = 0; v < blockVectors; ++v) {
        if (full) {
          f(cols[v], counts_[v]);
          continue;
        }
        kb.ifThen(kb.cmpi(arith::CmpIPredicate::slt, cols[v], depth),
                 [&] { f(cols[v], counts_[v]); });
      }
    };
    auto load = [&](Value m, Value row, Value col, Value count) {
      return kb.vloadPart(full, m, {row, col}, count, 0.0);
    };
    auto store = [&](Value v, Value m, Value row, Value col, Value count) {
      kb.vstorePart(full, v, m, {row, col}, count);
    };
    kb.forLoop(c0, e, c1, [&](Value c) {
      forVectors([&](Value col, Value count) {
        store(zeros, sums, c, col, count);
        store(zeros, dev, c, col, count);
      });
    });
    // Token t adds its row, or its dispersion around its cluster's mean
    // (in `sums`), into row assign[t] of `stat`, t ascending.
    auto scatter = [&](Value stat, bool deviation) {
      kb.forLoop(c0, tokens, c1, [&](Value t) {
        if (prefetch)
          prefetchBlock(t, col0, full);
        withCluster(t, [&](Value a) {
          forVectors([&](Value col, Value count) {
            Value term = load(x, t, col, count);
            if (deviation)
              term = dispersionTerm(kb, term, load(sums, a, col, count),
                                    variance);
            Value s = load(stat, a, col, count);
            store(kb.fadd(s, term), stat, a, col, count);
          });
        });
      });
    };
    scatter(sums, /*deviation=*/false);
    // mean = sum / count (0 for an empty cluster), in place.
    kb.forLoop(c0, e, c1, [&](Value c) {
      Value n = kb.load(counts, {c});
      forVectors([&](Value col, Value count) {
        Value mean = segmentMean(kb, load(sums, c, col, count), n);
        store(mean, sums, c, col, count);
      });
    });
    scatter(dev, /*deviation=*/true);
  };
  // The blocks are few (D / 32) but each spans every token: the calling
  // thread runs them alone only when the whole input is small (D = 64 has
  // two blocks, which ran on one thread at T = 16384: 1.6-1.9x the time).
  Value small = kb.cmpi(arith::CmpIPredicate::ule, kb.mul(tokens, depth),
                       kb.idx(kInlineElements));
  kb.workers(opts, numBlocks, [&](Value item, Value) {
    Value col0 = kb.mul(item, kb.idx(block));
    // A static D that is a multiple of the block has no ragged block.
    if (staticDepth != kDyn && staticDepth % block == 0)
      return emitBlock(col0, /*full=*/true);
    Value full =
        kb.cmpi(arith::CmpIPredicate::sle, kb.add(col0, kb.idx(block)), depth);
    kb.splitFull(full, [&](bool isFull) { emitBlock(col0, isFull); });
  }, small);

  ValueRange results = kernel.finish();
  linalg_lowering::finishMadDispersion(rw, op, results[0], results[1]);
  return success();
}

} // namespace mlir::moe::cpu_lowering
