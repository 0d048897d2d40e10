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

#include "Kernels.h"

#include "../MoEToLinalg/Patterns.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/SegmentedStats.h"

#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <functional>

namespace mlir::moe::cpu {
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
Value tokenMask(CpuKernelBuilder &k, const AdjacencyInputs &in, Value t) {
  Type i64 = k.i64();
  Value zero = k.cI64(0), one = k.cI64(1);
  auto addSlot = [&](Value s, Value m) {
    Value v = k.load(in.idx, {t, s});
    Value ok = idInRange(k, v, in.eI);
    // Out of range: shift by 0 (never by >= 64), add nothing.
    Value shift = k.select(ok, k.castInt(v, i64), zero);
    return k.orI(m, k.select(ok, k.shl(one, shift), zero));
  };
  if (in.k != kDyn && in.k <= kMaxUnrolledSlots) {
    Value m = zero;
    for (int64_t s = 0; s < in.k; ++s)
      m = addSlot(k.idx(s), m);
    return m;
  }
  return k.forLoop(k.idx(0), in.slots, k.idx(1), ValueRange{zero},
                   [&](Value s, ValueRange it) -> SmallVector<Value> {
                     return {addSlot(s, it[0])};
                   })[0];
}

/// Runs `body(t, worker)` for every token, blocks of kTokensPerItem tokens
/// per worker item; on the calling thread alone when there are at most
/// kInlineSlots (token, slot) pairs.
void forEachToken(CpuKernelBuilder &k, const KernelOptions &o,
                  const AdjacencyInputs &in,
                  function_ref<void(Value t, Value w)> body) {
  Value tokens = in.tokens;
  Value numItems = k.ceilDiv(tokens, k.idx(kTokensPerItem));
  Value pairs = k.mul(tokens, in.slots);
  Value small =
      k.cmpi(arith::CmpIPredicate::ule, pairs, k.idx(kInlineSlots));
  k.workers(o, numItems, [&](Value item, Value w) {
    Value t0 = k.mul(item, k.idx(kTokensPerItem));
    Value t1 = k.mins(k.add(t0, k.idx(kTokensPerItem)), tokens);
    k.forLoop(t0, t1, k.idx(1), [&](Value t) { body(t, w); });
  }, small);
}

/// Stores 0 into every element of `buf` (static shape, i32).
void zeroFill(CpuKernelBuilder &k, Value buf) {
  auto type = cast<MemRefType>(buf.getType());
  SmallVector<Value> ivs;
  std::function<void(int64_t)> nest = [&](int64_t d) {
    if (d == type.getRank()) {
      k.store(k.cI32(0), buf, ivs);
      return;
    }
    k.forLoop(k.idx(0), k.dim(buf, d), k.idx(1), [&](Value iv) {
      ivs.push_back(iv);
      nest(d + 1);
      ivs.pop_back();
    });
  };
  nest(0);
}

/// C[r, col] = Σ_w counts[w, r, col] for r, col < E.
void sumWorkers(CpuKernelBuilder &k, Value counts, Value numWorkers, Value eVal,
                Value c) {
  Value c0 = k.idx(0), c1 = k.idx(1);
  k.forLoop(c0, eVal, c1, [&](Value r) {
    k.forLoop(c0, eVal, c1, [&](Value col) {
      Value sum =
          k.forLoop(c0, numWorkers, c1, ValueRange{k.cI32(0)},
                    [&](Value w, ValueRange acc) -> SmallVector<Value> {
                      return {k.add(acc[0], k.load(counts, {w, r, col}))};
                    })[0];
      k.store(sum, c, {r, col});
    });
  });
}

/// Counting: T·k² scalar increments after deduplicating each token's slots.
void emitCounting(CpuKernelBuilder &k, const KernelOptions &opts,
                  const AdjacencyInputs &in, Value c, MemRefType cType,
                  ValueRange dyn) {
  Value c0 = k.idx(0), c1 = k.idx(1);
  Type indexType = k.index();
  // Per worker: its own counts, the token that last saw each expert, and the
  // token's list of distinct experts. Per-worker matrices only while they are
  // small (E <= 1024: 4 MiB each).
  KernelOptions o = opts;
  if (in.e == kDyn || in.e > kMaxParallelExperts)
    o.numThreads = 1;
  Value counts = k.scratch(o, cType, dyn);
  Value stamps = k.scratch(o, MemRefType::get({in.e}, indexType),
                           in.e == kDyn ? SmallVector<Value>{in.eVal}
                                        : SmallVector<Value>{});
  Value lists = k.scratch(o, MemRefType::get({kDyn}, indexType), {in.slots});
  Value numWorkers = k.idx(std::max<int64_t>(o.numThreads, 1));
  Value none = k.idx(-1);
  k.forLoop(c0, numWorkers, c1, [&](Value w) {
    k.forLoop(c0, in.eVal, c1, [&](Value r) {
      k.store(none, stamps, {w, r});
      k.forLoop(c0, in.eVal, c1, [&](Value col) {
        k.store(k.cI32(0), counts, {w, r, col});
      });
    });
  });
  forEachToken(k, o, in, [&](Value t, Value w) {
    Value cw = k.workerSlice(counts, w);
    Value seen = k.workerSlice(stamps, w);
    Value list = k.workerSlice(lists, w);
    // The distinct in-range experts of token t, in slot order: an expert
    // whose stamp is already t was listed by an earlier slot.
    Value n = k.forLoop(
        c0, in.slots, c1, ValueRange{c0},
        [&](Value s, ValueRange it) -> SmallVector<Value> {
          Value v = k.load(in.idx, {t, s});
          Value ok = idInRange(k, v, in.eI);
          // Out of range: read the stamp of expert 0, add nothing.
          Value vi = k.select(ok, k.castInt(v, indexType), c0);
          Value fresh =
              k.cmpi(arith::CmpIPredicate::ne, k.load(seen, {vi}), t);
          Value add = k.andI(ok, fresh);
          k.ifThen(add, [&] {
            k.store(t, seen, {vi});
            k.store(vi, list, {it[0]});
          });
          return {k.select(add, k.add(it[0], c1), it[0])};
        })[0];
    k.forLoop(c0, n, c1, [&](Value p) {
      Value j = k.load(list, {p});
      k.forLoop(c0, n, c1, [&](Value q) {
        Value m = k.load(list, {q});
        k.store(k.add(k.load(cw, {j, m}), k.cI32(1)), cw, {j, m});
      });
    });
  });
  sumWorkers(k, counts, numWorkers, in.eVal, c);
}

/// Histogram (E <= 8): one increment of the token's mask bin per token, then
/// every bin adds its count to C[j, m] for each pair of its bits.
void emitHistogram(CpuKernelBuilder &k, const KernelOptions &o,
                   const AdjacencyInputs &in, Value c) {
  Value c0 = k.idx(0), c1 = k.idx(1);
  // At least 16 bins (64 bytes): workers never share a cache line.
  int64_t bins = std::max<int64_t>(int64_t(1) << in.e, 16);
  Value hist = k.scratch(o, MemRefType::get({bins}, k.i32()), {});
  Value numWorkers = k.idx(std::max<int64_t>(o.numThreads, 1));
  zeroFill(k, hist);
  forEachToken(k, o, in, [&](Value t, Value w) {
    Value bin = k.castInt(tokenMask(k, in, t), k.index());
    k.store(k.add(k.load(hist, {w, bin}), k.cI32(1)), hist, {w, bin});
  });
  zeroFill(k, c);
  Value one = k.cI32(1);
  k.forLoop(c0, k.idx(int64_t(1) << in.e), c1, [&](Value bin) {
    Value cnt = k.forLoop(c0, numWorkers, c1, ValueRange{k.cI32(0)},
                          [&](Value w, ValueRange acc) -> SmallVector<Value> {
                            return {k.add(acc[0], k.load(hist, {w, bin}))};
                          })[0];
    Value bits = k.castInt(bin, k.i32());
    k.ifThen(k.cmpi(arith::CmpIPredicate::ne, cnt, k.cI32(0)), [&] {
      k.forLoop(c0, in.eVal, c1, [&](Value j) {
        Value jI = k.castInt(j, k.i32());
        Value hasJ = k.cmpi(arith::CmpIPredicate::ne,
                            k.andI(k.shru(bits, jI), one), k.cI32(0));
        k.ifThen(hasJ, [&] {
          k.forLoop(c0, in.eVal, c1, [&](Value m) {
            Value mI = k.castInt(m, k.i32());
            // cnt where bit m is set, else 0.
            Value add = k.mul(cnt, k.andI(k.shru(bits, mI), one));
            k.store(k.add(k.load(c, {j, m}), add), c, {j, m});
          });
        });
      });
    });
  });
}

/// Mask rows (E <= 64): per token, row j of the worker's counts gets the
/// token's mask as 0/1 i32 lanes, for each bit j of the mask; rows padded to
/// whole vectors of the target's width.
void emitMaskRows(CpuKernelBuilder &k, const KernelOptions &o,
                  const AdjacencyInputs &in, Value c) {
  Value c0 = k.idx(0), c1 = k.idx(1);
  int64_t lanes = k.lanes();
  int64_t chunks = (in.e + lanes - 1) / lanes;
  int64_t width = chunks * lanes;
  Value counts = k.scratch(o, MemRefType::get({in.e, width}, k.i32()), {});
  Value numWorkers = k.idx(std::max<int64_t>(o.numThreads, 1));
  zeroFill(k, counts);
  Value laneShift = k.iota(k.cI32(0), lanes);
  Value laneOne = k.splat(k.cI32(1), lanes);
  forEachToken(k, o, in, [&](Value t, Value w) {
    Value cw = k.workerSlice(counts, w);
    Value mask = tokenMask(k, in, t);
    // The mask as i32 lanes, one vector per chunk of `lanes` experts:
    // lane l of chunk q is bit q·lanes + l.
    SmallVector<Value> rows;
    for (int64_t q = 0; q < chunks; ++q) {
      Value bits = k.trunc(k.shru(mask, k.cI64(q * lanes)), k.i32());
      rows.push_back(k.andI(k.shru(k.splat(bits, lanes), laneShift), laneOne));
    }
    // One row add per set bit j (lowest first; m & (m - 1) clears it).
    Value n = k.castInt(math::CtPopOp::create(k.b, mask), k.index());
    k.forLoop(c0, n, c1, ValueRange{mask},
              [&](Value, ValueRange it) -> SmallVector<Value> {
                Value m = it[0];
                Value j = k.castInt(math::CountTrailingZerosOp::create(k.b, m),
                                    k.index());
                for (int64_t q = 0; q < chunks; ++q) {
                  Value col = k.idx(q * lanes);
                  k.vstore(k.add(k.vload(cw, {j, col}, lanes), rows[q]), cw,
                           {j, col});
                }
                return {k.andI(m, k.sub(m, k.cI64(1)))};
              });
  });
  sumWorkers(k, counts, numWorkers, in.eVal, c);
}

struct AdjacencyUpdateKernel : KernelPattern<AdjacencyUpdateOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(AdjacencyUpdateOp op, CpuKernelBuilder &k,
                     PatternRewriter &rw) const override {
    Location loc = op.getLoc();
    Value aT = lowering::promoteToF32(rw, loc, op.getA());
    auto aType = cast<RankedTensorType>(aT.getType());
    OpFoldResult eSize = aType.isDynamicDim(0)
                             ? tensor::getMixedSize(rw, loc, aT, 1)
                             : tensor::getMixedSize(rw, loc, aT, 0);
    Value eVal = getValueOrCreateConstantIndexOp(rw, loc, eSize);
    if (failed(checkIndexOperand(rw, op, op.getIdx(), eVal,
                                 lowering::IndexErrorOp::AdjacencyIdx)))
      return failure();
    // The co-selection counts c [E, E] i32, which finishAdjacencyUpdate
    // turns into a_next.
    int64_t staticE = getConstantIntValue(eSize).value_or(kDyn);
    KernelScope kernel(
        k, {op.getIdx()},
        {{RankedTensorType::get({staticE, staticE}, k.i32()), {eVal, eVal}}});
    AdjacencyInputs in;
    in.idx = k.buffer(op.getIdx());
    in.tokens = k.dim(in.idx, 0);
    in.slots = k.dim(in.idx, 1);
    Type idxType = cast<MemRefType>(in.idx.getType()).getElementType();
    in.eVal = eVal;
    in.eI = k.castInt(eVal, idxType);
    in.e = getConstantIntValue(eSize).value_or(kDyn);
    in.k = cast<MemRefType>(in.idx.getType()).getDimSize(1);

    auto cType = MemRefType::get({in.e, in.e}, k.i32());
    SmallVector<Value> dyn;
    if (in.e == kDyn)
      dyn = {eVal, eVal};
    Value c = kernel.out(0);
    StrategyChoice choice = chooseAdjacencyStrategy(in.e, in.k, k.lanes());
    auto emit = [&](Strategy s) {
      switch (s) {
      case Strategy::Counting:
        emitCounting(k, opts, in, c, cType, dyn);
        break;
      case Strategy::Histogram:
        emitHistogram(k, opts, in, c);
        break;
      case Strategy::MaskRows:
        emitMaskRows(k, opts, in, c);
        break;
      }
    };
    if (choice.histogramMinTokens < 0) {
      emit(choice.strategy);
    } else {
      Value many = k.cmpi(arith::CmpIPredicate::sge, in.tokens,
                          k.idx(choice.histogramMinTokens));
      auto ifOp = scf::IfOp::create(k.b, many, /*withElseRegion=*/true);
      OpBuilder::InsertionGuard guard(k.b);
      k.b.setInsertionPoint(ifOp.thenBlock()->getTerminator());
      emit(Strategy::Histogram);
      k.b.setInsertionPoint(ifOp.elseBlock()->getTerminator());
      emit(choice.strategy);
    }
    lowering::finishAdjacencyUpdate(rw, op, aT, kernel.finish()[0], eSize);
    return success();
  }
};
} // namespace

MOE_CPU_KERNEL_POPULATE(populateAdjacencyUpdateKernel, AdjacencyUpdateKernel)

} // namespace mlir::moe::cpu
