//===- AdjacencyUpdate.cpp - moe.adjacency_update -> fast CPU kernel ------===//
//
// Part of the MoE-MLIR project.
//
// The portable lowering builds the [T, E] indicator and an i32 matmul
// (T·E² multiply-adds). The kernel counts the co-selections C[j, m] (tokens
// that chose both j and m) with one of three strategies, picked by E, k and
// the target's vector width (chooseAdjacencyStrategy):
//
// - counting (any E): each token adds one to C[j, m] for each pair of its
//   distinct in-range experts (T·k² scalar increments); its slots are first
//   deduplicated (an expert stamped with the token already is skipped);
// - histogram (E <= 8; E <= 12 from 2^E tokens on): a token's distinct
//   in-range experts are one bitmask (a repeated expert sets its bit once, an
//   out-of-range slot none); the tokens only count their masks (one increment
//   per token, 2^E bins), and every bin then adds its count to C[j, m] for
//   each pair of its bits;
// - mask rows (E <= 64, k >= 2 or one vector per row): per token, for each
//   bit j of its mask, row j of C gets the mask expanded to one i32 lane per
//   expert (vector adds of the target's width: the sparse form of the one-hot
//   product Ind^T · Ind, k·ceil(E/lanes) vector adds per token instead of k²
//   scalar ones; the dense product, T·E² multiply-adds, loses to both).
//
// Blocks of tokens go to the workers, each counting into its own buffer; the
// buffers are summed at the end (integer counts are exact in any order, so
// the result does not depend on the thread count or the strategy). The O(E²)
// tail (row/column normalization, moving average) is the portable one.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/SegmentedStats.h"

#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <functional>

namespace mlir::moe::cpu_lowering {
using namespace kernels;

namespace {
/// Tokens per worker item.
constexpr int64_t kTokensPerItem = 512;
/// Up to this many (token, slot) pairs the calling thread counts alone: the
/// work is a few cycles a pair, less than starting the workers and summing
/// their buffers (T = 16384, k = 2, Intel Xeon, 2 threads: E = 8 0.02 ms on
/// one thread against 0.04-0.09 ms on two; E = 16 0.044 against 0.092).
constexpr int64_t kInlineSlots = int64_t(1) << 16;
/// Largest E counted by several workers (each with its own E x E matrix).
constexpr int64_t kMaxParallelExperts = 1024;
/// Largest E whose masks are always histogrammed (2^E bins per worker).
constexpr int64_t kMaxHistogramExperts = 8;
/// Largest E whose masks are histogrammed when there are at least 2^E tokens
/// (the bins' fixed cost, zeroing and scanning 2^E counts, is then covered).
constexpr int64_t kMaxLargeHistogramExperts = 12;
/// Largest E of a token mask (one i64).
constexpr int64_t kMaxMaskExperts = 64;
/// Slots of a token read unrolled (more: an scf.for).
constexpr int64_t kMaxUnrolledSlots = 16;

enum class Strategy { Counting, Histogram, MaskRows };

/// The strategy for E experts and k slots (kDyn: unknown at compile time) on
/// a target with `lanes` i32 lanes per vector, and the token count from which
/// the histogram replaces it (-1: never). Measured through the execution API
/// (AMD EPYC, 2 threads, T = 16384, ms, x86-64-v3 / x86-64-v4; the machine was
/// shared, so the ratios matter more than the times):
///   E=8  k=2:  counting 0.199/0.194, histogram 0.051/0.042, rows 0.059/0.063
///   E=8  k=8:  counting 0.709/1.12,  histogram 0.129/0.091, rows 0.162/0.212
///   E=12 k=2:  counting 0.199/0.202, histogram 0.041/0.039, rows 0.073/0.065
///              (T = 64: histogram 0.0059/0.0062, rows 0.0034/0.0034)
///   E=16 k=2:  histogram 0.123/0.071, rows 0.090/0.066
///   E=64 k=2:  counting 0.190/0.181, rows 0.165/0.140
///   E=64 k=8:  counting 1.28/1.06,   rows 0.433/0.462
///   E=64 k=1:  counting 0.037/0.064, rows 0.090/0.079
///   E=16 k=1:  counting 0.036/0.036, rows 0.038/0.032
/// The dense one-hot product (the portable lowering, $MOE_CPU_KERNELS=0):
/// 0.21/0.19 at E=8 k=2, 0.39/0.88 at E=16 k=2, 4.3/2.7 at E=64 k=2, 6.8/6.0
/// at E=64 k=8: never the fastest.
/// So: the histogram (one increment per token whatever k is) up to E = 8, and
/// up to E = 12 once there are 2^E tokens; mask rows (k·ceil(E/lanes) vector
/// adds per token) up to E = 64, except for k = 1 with more than one vector
/// per row (one scalar increment per token beats a row of vector adds);
/// counting for the rest (masks no longer fit one i64) and dynamic E.
struct StrategyChoice {
  Strategy strategy;
  int64_t histogramMinTokens = -1;
};
StrategyChoice chooseAdjacencyStrategy(int64_t e, int64_t k, int64_t lanes) {
  if (e == kDyn || e > kMaxMaskExperts)
    return {Strategy::Counting};
  if (e <= kMaxHistogramExperts)
    return {Strategy::Histogram};
  int64_t chunks = (e + lanes - 1) / lanes;
  Strategy s =
      k == 1 && chunks > 1 ? Strategy::Counting : Strategy::MaskRows;
  if (e <= kMaxLargeHistogramExperts)
    return {s, int64_t(1) << e};
  return {s};
}

/// What the strategies share.
struct AdjacencyInputs {
  Value idx, tokens, slots, eVal, eI;
  int64_t e, k;
};

/// The bitmask (i64) of token t's in-range experts: bit v for each slot
/// holding v in [0, E) (E <= 64); a repeated expert sets its bit once.
Value tokenMask(CpuKernelBuilder &kb, const AdjacencyInputs &in, Value t) {
  Type i64 = kb.i64();
  Value zero = kb.cI64(0), one = kb.cI64(1);
  auto addSlot = [&](Value s, Value m) {
    Value v = kb.load(in.idx, {t, s});
    Value ok = idInRange(kb, v, in.eI);
    // Out of range: shift by 0 (never by >= 64), add nothing.
    Value shift = kb.select(ok, kb.castInt(v, i64), zero);
    return kb.orI(m, kb.select(ok, kb.shl(one, shift), zero));
  };
  if (in.k != kDyn && in.k <= kMaxUnrolledSlots) {
    Value m = zero;
    for (int64_t s = 0; s < in.k; ++s)
      m = addSlot(kb.idx(s), m);
    return m;
  }
  return kb.forLoop(kb.idx(0), in.slots, kb.idx(1), ValueRange{zero},
                   [&](Value s, ValueRange it) -> SmallVector<Value> {
                     return {addSlot(s, it[0])};
                   })[0];
}

/// Runs `body(t, worker)` for every token, blocks of kTokensPerItem tokens
/// per worker item; on the calling thread alone when there are at most
/// kInlineSlots (token, slot) pairs.
void forEachToken(CpuKernelBuilder &kb, const KernelOptions &o,
                  const AdjacencyInputs &in,
                  function_ref<void(Value t, Value w)> body) {
  Value tokens = in.tokens;
  Value numItems = kb.ceilDiv(tokens, kb.idx(kTokensPerItem));
  Value pairs = kb.mul(tokens, in.slots);
  Value small =
      kb.cmpi(arith::CmpIPredicate::ule, pairs, kb.idx(kInlineSlots));
  kb.workers(o, numItems, [&](Value item, Value w) {
    Value t0 = kb.mul(item, kb.idx(kTokensPerItem));
    Value t1 = kb.mins(kb.add(t0, kb.idx(kTokensPerItem)), tokens);
    kb.forLoop(t0, t1, kb.idx(1), [&](Value t) { body(t, w); });
  }, small);
}

/// Stores 0 into every element of `buf` (static shape, i32).
void zeroFill(CpuKernelBuilder &kb, Value buf) {
  auto type = cast<MemRefType>(buf.getType());
  SmallVector<Value> ivs;
  std::function<void(int64_t)> nest = [&](int64_t d) {
    if (d == type.getRank()) {
      kb.store(kb.cI32(0), buf, ivs);
      return;
    }
    kb.forLoop(kb.idx(0), kb.dim(buf, d), kb.idx(1), [&](Value iv) {
      ivs.push_back(iv);
      nest(d + 1);
      ivs.pop_back();
    });
  };
  nest(0);
}

/// C[r, col] = Σ_w counts[w, r, col] for r, col < E.
void sumWorkers(CpuKernelBuilder &kb, Value counts, Value numWorkers, Value eVal,
                Value c) {
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  kb.forLoop(c0, eVal, c1, [&](Value r) {
    kb.forLoop(c0, eVal, c1, [&](Value col) {
      Value sum =
          kb.forLoop(c0, numWorkers, c1, ValueRange{kb.cI32(0)},
                    [&](Value w, ValueRange acc) -> SmallVector<Value> {
                      return {kb.add(acc[0], kb.load(counts, {w, r, col}))};
                    })[0];
      kb.store(sum, c, {r, col});
    });
  });
}

/// Counting: T·k² scalar increments after deduplicating each token's slots.
void emitCounting(CpuKernelBuilder &kb, const KernelOptions &opts,
                  const AdjacencyInputs &in, Value c, MemRefType cType,
                  ValueRange dyn) {
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  Type indexType = kb.index();
  // Per worker: its own counts, the token that last saw each expert, and the
  // token's list of distinct experts. Per-worker matrices only while they are
  // small (E <= 1024: 4 MiB each).
  KernelOptions o = opts;
  if (in.e == kDyn || in.e > kMaxParallelExperts)
    o.numThreads = 1;
  Value counts = kb.scratch(o, cType, dyn);
  Value stamps = kb.scratch(o, MemRefType::get({in.e}, indexType),
                           in.e == kDyn ? SmallVector<Value>{in.eVal}
                                        : SmallVector<Value>{});
  Value lists = kb.scratch(o, MemRefType::get({kDyn}, indexType), {in.slots});
  Value numWorkers = kb.idx(std::max<int64_t>(o.numThreads, 1));
  Value none = kb.idx(-1);
  kb.forLoop(c0, numWorkers, c1, [&](Value w) {
    kb.forLoop(c0, in.eVal, c1, [&](Value r) {
      kb.store(none, stamps, {w, r});
      kb.forLoop(c0, in.eVal, c1, [&](Value col) {
        kb.store(kb.cI32(0), counts, {w, r, col});
      });
    });
  });
  forEachToken(kb, o, in, [&](Value t, Value w) {
    Value cw = kb.workerSlice(counts, w);
    Value seen = kb.workerSlice(stamps, w);
    Value list = kb.workerSlice(lists, w);
    // The distinct in-range experts of token t, in slot order: an expert
    // whose stamp is already t was listed by an earlier slot.
    Value n = kb.forLoop(
        c0, in.slots, c1, ValueRange{c0},
        [&](Value s, ValueRange it) -> SmallVector<Value> {
          Value v = kb.load(in.idx, {t, s});
          Value ok = idInRange(kb, v, in.eI);
          // Out of range: read the stamp of expert 0, add nothing.
          Value vi = kb.select(ok, kb.castInt(v, indexType), c0);
          Value fresh =
              kb.cmpi(arith::CmpIPredicate::ne, kb.load(seen, {vi}), t);
          Value add = kb.andI(ok, fresh);
          kb.ifThen(add, [&] {
            kb.store(t, seen, {vi});
            kb.store(vi, list, {it[0]});
          });
          return {kb.select(add, kb.add(it[0], c1), it[0])};
        })[0];
    kb.forLoop(c0, n, c1, [&](Value p) {
      Value j = kb.load(list, {p});
      kb.forLoop(c0, n, c1, [&](Value q) {
        Value m = kb.load(list, {q});
        kb.store(kb.add(kb.load(cw, {j, m}), kb.cI32(1)), cw, {j, m});
      });
    });
  });
  sumWorkers(kb, counts, numWorkers, in.eVal, c);
}

/// Histogram (E <= 8): one increment of the token's mask bin per token, then
/// every bin adds its count to C[j, m] for each pair of its bits.
void emitHistogram(CpuKernelBuilder &kb, const KernelOptions &o,
                   const AdjacencyInputs &in, Value c) {
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  // At least 16 bins (64 bytes): workers never share a cache line.
  int64_t bins = std::max<int64_t>(int64_t(1) << in.e, 16);
  Value hist = kb.scratch(o, MemRefType::get({bins}, kb.i32()), {});
  Value numWorkers = kb.idx(std::max<int64_t>(o.numThreads, 1));
  zeroFill(kb, hist);
  forEachToken(kb, o, in, [&](Value t, Value w) {
    Value bin = kb.castInt(tokenMask(kb, in, t), kb.index());
    kb.store(kb.add(kb.load(hist, {w, bin}), kb.cI32(1)), hist, {w, bin});
  });
  zeroFill(kb, c);
  Value one = kb.cI32(1);
  kb.forLoop(c0, kb.idx(int64_t(1) << in.e), c1, [&](Value bin) {
    Value cnt = kb.forLoop(c0, numWorkers, c1, ValueRange{kb.cI32(0)},
                          [&](Value w, ValueRange acc) -> SmallVector<Value> {
                            return {kb.add(acc[0], kb.load(hist, {w, bin}))};
                          })[0];
    Value bits = kb.castInt(bin, kb.i32());
    kb.ifThen(kb.cmpi(arith::CmpIPredicate::ne, cnt, kb.cI32(0)), [&] {
      kb.forLoop(c0, in.eVal, c1, [&](Value j) {
        Value jI = kb.castInt(j, kb.i32());
        Value hasJ = kb.cmpi(arith::CmpIPredicate::ne,
                            kb.andI(kb.shru(bits, jI), one), kb.cI32(0));
        kb.ifThen(hasJ, [&] {
          kb.forLoop(c0, in.eVal, c1, [&](Value m) {
            Value mI = kb.castInt(m, kb.i32());
            // cnt where bit m is set, else 0.
            Value add = kb.mul(cnt, kb.andI(kb.shru(bits, mI), one));
            kb.store(kb.add(kb.load(c, {j, m}), add), c, {j, m});
          });
        });
      });
    });
  });
}

/// Mask rows (E <= 64): per token, row j of the worker's counts gets the
/// token's mask as 0/1 i32 lanes, for each bit j of the mask; rows padded to
/// whole vectors of the target's width.
void emitMaskRows(CpuKernelBuilder &kb, const KernelOptions &o,
                  const AdjacencyInputs &in, Value c) {
  Value c0 = kb.idx(0), c1 = kb.idx(1);
  int64_t lanes = kb.lanes();
  int64_t chunks = (in.e + lanes - 1) / lanes;
  int64_t width = chunks * lanes;
  Value counts = kb.scratch(o, MemRefType::get({in.e, width}, kb.i32()), {});
  Value numWorkers = kb.idx(std::max<int64_t>(o.numThreads, 1));
  zeroFill(kb, counts);
  Value laneShift = kb.iota(kb.cI32(0), lanes);
  Value laneOne = kb.splat(kb.cI32(1), lanes);
  forEachToken(kb, o, in, [&](Value t, Value w) {
    Value cw = kb.workerSlice(counts, w);
    Value mask = tokenMask(kb, in, t);
    // The mask as i32 lanes, one vector per chunk of `lanes` experts:
    // lane l of chunk q is bit q·lanes + l.
    SmallVector<Value> rows;
    for (int64_t q = 0; q < chunks; ++q) {
      Value bits = kb.trunc(kb.shru(mask, kb.cI64(q * lanes)), kb.i32());
      rows.push_back(kb.andI(kb.shru(kb.splat(bits, lanes), laneShift), laneOne));
    }
    // One row add per set bit j (lowest first; m & (m - 1) clears it).
    Value n = kb.castInt(math::CtPopOp::create(kb.b, mask), kb.index());
    kb.forLoop(c0, n, c1, ValueRange{mask},
              [&](Value, ValueRange it) -> SmallVector<Value> {
                Value m = it[0];
                Value j = kb.castInt(math::CountTrailingZerosOp::create(kb.b, m),
                                    kb.index());
                for (int64_t q = 0; q < chunks; ++q) {
                  Value col = kb.idx(q * lanes);
                  kb.vstore(kb.add(kb.vload(cw, {j, col}, lanes), rows[q]), cw,
                           {j, col});
                }
                return {kb.andI(m, kb.sub(m, kb.cI64(1)))};
              });
  });
  sumWorkers(kb, counts, numWorkers, in.eVal, c);
}

} // namespace

template <>
LogicalResult CPUKernel<AdjacencyUpdateOp>::emit(AdjacencyUpdateOp op,
                                                 CpuKernelBuilder &kb,
                                                 PatternRewriter &rw) const {
  Location loc = op.getLoc();
  Value aT = linalg_lowering::promoteToF32(rw, loc, op.getA());
  auto aType = cast<RankedTensorType>(aT.getType());
  OpFoldResult eSize = aType.isDynamicDim(0)
                           ? tensor::getMixedSize(rw, loc, aT, 1)
                           : tensor::getMixedSize(rw, loc, aT, 0);
  Value eVal = getValueOrCreateConstantIndexOp(rw, loc, eSize);
  if (failed(checkIndexOperand(rw, op, op.getIdx(), eVal,
                               kMoEErrorAdjacencyUpdateIdx)))
    return failure();
  // The co-selection counts c [E, E] i32, which finishAdjacencyUpdate
  // turns into a_next.
  int64_t staticE = getConstantIntValue(eSize).value_or(kDyn);
  KernelScope kernel(
      kb, {op.getIdx()},
      {{RankedTensorType::get({staticE, staticE}, kb.i32()), {eVal, eVal}}});
  AdjacencyInputs in;
  in.idx = kb.buffer(op.getIdx());
  in.tokens = kb.dim(in.idx, 0);
  in.slots = kb.dim(in.idx, 1);
  Type idxType = cast<MemRefType>(in.idx.getType()).getElementType();
  in.eVal = eVal;
  in.eI = kb.castInt(eVal, idxType);
  in.e = getConstantIntValue(eSize).value_or(kDyn);
  in.k = cast<MemRefType>(in.idx.getType()).getDimSize(1);

  auto cType = MemRefType::get({in.e, in.e}, kb.i32());
  SmallVector<Value> dyn;
  if (in.e == kDyn)
    dyn = {eVal, eVal};
  Value c = kernel.out(0);
  StrategyChoice choice = chooseAdjacencyStrategy(in.e, in.k, kb.lanes());
  auto emit = [&](Strategy s) {
    switch (s) {
    case Strategy::Counting:
      emitCounting(kb, opts, in, c, cType, dyn);
      break;
    case Strategy::Histogram:
      emitHistogram(kb, opts, in, c);
      break;
    case Strategy::MaskRows:
      emitMaskRows(kb, opts, in, c);
      break;
    }
  };
  if (choice.histogramMinTokens < 0) {
    emit(choice.strategy);
  } else {
    Value many = kb.cmpi(arith::CmpIPredicate::sge, in.tokens,
                        kb.idx(choice.histogramMinTokens));
    auto ifOp = scf::IfOp::create(kb.b, many, /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(kb.b);
    kb.b.setInsertionPoint(ifOp.thenBlock()->getTerminator());
    emit(Strategy::Histogram);
    kb.b.setInsertionPoint(ifOp.elseBlock()->getTerminator());
    emit(choice.strategy);
  }
  linalg_lowering::finishAdjacencyUpdate(rw, op, aT, kernel.finish()[0],
                                         eSize);
  return success();
}

} // namespace mlir::moe::cpu_lowering
