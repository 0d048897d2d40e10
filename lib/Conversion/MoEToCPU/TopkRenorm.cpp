//===- TopkRenorm.cpp - moe.topk_renorm -> fast CPU kernel ----------------===//
//
// Part of the MoE-MLIR project.
//
// Rows (tokens) are independent: blocks of 32 rows go to the workers. Per
// row, every score becomes an i32 ordered key (MoE/Kernels/TopK.h: NaN
// first, then larger values; equal keys go to the lower index), and k
// knockout rounds each take the largest key, the lowest index holding it, and
// knock it out. i32 keys use a whole register on AVX2 (8 lanes) and AVX-512
// (16) alike, with one-instruction max/min/compare on both. A round is a
// long dependency chain, so up to 8 rows of a static K run their rounds
// interleaved (kMaxGroupRows, kKeyVectors), their keys in L1 (a knockout is
// one scalar store), not in registers: 4 rows' keys (32 ymm at K = 64) spill
// AVX2's 16, and selects are 2-3 uops there (VBLENDVPS). A row of 8 key
// vectors or more (K = 256: 32 on AVX2, 16 on AVX-512) selects over two
// levels instead: the chunks' maxima, then the one chunk holding the top key
// (selectByChunkMaxima). The timings behind both are in docs/CPU.md
// ("Measurements"). The weights are vector<16xf32> (AVX2: vector<8xf32>) epilogues
// over the k selected values (kernels::topkWeight), unrolled for k <= 4
// vectors and a loop beyond.
//
// Few experts (K a power of two <= 16, k <= 8): one row per lane instead
// (RowLanes.h, which moe.route's kernel shares): no gathers or scatters,
// shuffles that AVX2 and AVX-512 both do in a cycle or two. The rows past the
// last full block take the per-row path.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "RowLanes.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/TopK.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

namespace mlir::moe::cpu_lowering {
using namespace kernels;

namespace {
constexpr int64_t kRowsPerItem = 32;
/// Selections of up to this many 16-lane chunks (k <= 64) have their epilogue
/// unrolled (no loop overhead in the common k <= 8); larger ones loop, so that
/// the IR, and the compile time, do not grow with k.
constexpr int64_t kUnrolledSelChunks = 4;
/// The row-per-lane layout (RowLanes.h): blocks of lanes rows grouped by
/// kLaneRowsPerItem rows per worker item.
constexpr int64_t kLaneRowsPerItem = 64;
/// The knockout top-k: rows selected together (their rounds interleaved) at
/// most, and the key vectors of all of them at most (a row of more runs the
/// dynamic path). Each round is one long dependency chain (max, index,
/// knockout: ~40 cycles), so a row alone leaves the core mostly idle
/// (measured on AMD Zen 4, AVX2 and AVX-512: 2-4x faster than one row at a
/// time). The keys live in the worker's scratch (L1), not in registers, so
/// the group is not bound by the register file: eight rows at K = 64 took
/// T = 16384 from 1.1-1.2 ms (four rows) to 0.9-1.0 on x86-64-v3 and from
/// 0.94 to 0.78 on x86-64-v4 (2 threads, loaded Xeon); four rows run slower
/// than that with keys in memory (a row's next round loads its knocked-out
/// chunk too soon after the scalar store: no store-to-load forwarding into a
/// wider load).
constexpr int64_t kMaxGroupRows = 8;
constexpr int64_t kKeyVectors = 64;
/// Rows of at least this many key vectors select over two levels (chunk
/// maxima, then one chunk): selectByChunkMaxima.
constexpr int64_t kTwoLevelChunks = 8;
/// Their rounds no longer scan the row, so the group need not shrink as the
/// row grows: at least 4 rows (K = 256, T = 16384, 2 threads: 2 rows 1.24-1.35
/// ms on x86-64-v3, 4 rows 1.09, 8 rows 1.16; x86-64-v4 0.88-0.90 for 4 or
/// 8, 1.15 for 2).
constexpr int64_t kTwoLevelMinRows = 4;

/// The signed max (or min) of the lanes of `v`, in every lane: log2(lanes)
/// rounds of op(v, v with lanes i and i ^ s swapped). Stays in vector
/// registers (no round trip through a scalar and a broadcast), which keeps
/// the dependency chain of a top-k round short.
Value butterfly(CpuKernelBuilder &kb, Value v, bool max) {
  int64_t n = cast<VectorType>(v.getType()).getNumElements();
  for (int64_t s = n / 2; s >= 1; s /= 2) {
    SmallVector<int64_t> mask;
    for (int64_t i = 0; i < n; ++i)
      mask.push_back(i ^ s);
    Value w = kb.shuffle(v, v, mask);
    v = max ? kb.maxs(v, w) : kb.mins(v, w);
  }
  return v;
}

/// The signed max of the vectors `v` as a balanced tree: log2(n) maxes deep,
/// not n - 1 (a top-k round's critical path: 31 at K = 256 on AVX2).
Value maxTree(CpuKernelBuilder &kb, SmallVector<Value> v) {
  while (v.size() > 1) {
    SmallVector<Value> next;
    for (size_t i = 0; i + 1 < v.size(); i += 2)
      next.push_back(kb.maxs(v[i], v[i + 1]));
    if (v.size() % 2)
      next.push_back(v.back());
    v = std::move(next);
  }
  return v[0];
}

/// A constant vector of the target's i32 lanes: lane l holds base + l, or
/// INT32_MAX - (base + l) when `flipped` (whose signed max over and-ed lanes
/// is the lowest id kept).
Value laneIds(CpuKernelBuilder &kb, int64_t base, bool flipped) {
  int64_t lanes = kb.lanes();
  SmallVector<int32_t> ids;
  for (int64_t l = 0; l < lanes; ++l)
    ids.push_back(flipped ? std::numeric_limits<int32_t>::max() -
                                int32_t(base + l)
                          : int32_t(base + l));
  auto type = VectorType::get({lanes}, kb.i32());
  return arith::ConstantOp::create(
      kb.b, DenseElementsAttr::get(type, ArrayRef<int32_t>(ids)));
}

/// In every lane, the lowest id (lane l of vector m: m * lanes + l) among
/// the lanes of `chunks` equal to `top` (i32 keys, `top` in every lane): a
/// max of (compare lanes and INT32_MAX - id), an and instead of a select
/// (VBLENDVPS: 2-3 uops on AVX2).
Value lowestEqual(CpuKernelBuilder &kb, ArrayRef<Value> chunks, Value top) {
  int64_t lanes = kb.lanes();
  auto vi32 = VectorType::get({lanes}, kb.i32());
  SmallVector<Value> hits;
  for (auto [m, x] : llvm::enumerate(chunks)) {
    Value hit = kb.castInt(kb.eq(x, top), vi32);
    Value flipped = laneIds(kb, m * lanes, /*flipped=*/true);
    hits.push_back(kb.andI(hit, flipped));
  }
  Value best = butterfly(kb, maxTree(kb, hits), /*max=*/true);
  Value last = kb.constLike(vi32, double(std::numeric_limits<int32_t>::max()));
  return kb.sub(last, best);
}

/// Whether a static row of `nc` key vectors selects over two levels
/// (selectByChunkMaxima): at least kTwoLevelChunks, at most kKeyVectors.
bool selectsOverTwoLevels(int64_t nc) {
  return nc >= kTwoLevelChunks && nc <= kKeyVectors;
}

/// Runs `body(offset)` for the offsets 0, 16, ... < selPad of the selection.
void eachSelChunk(CpuKernelBuilder &kb, int64_t selPad,
                  function_ref<void(Value)> body) {
  int64_t lanes = kb.lanes();
  if (selPad / lanes <= kUnrolledSelChunks) {
    for (int64_t c = 0; c < selPad; c += lanes)
      body(kb.idx(c));
    return;
  }
  kb.forLoop(kb.idx(0), kb.idx(selPad), kb.idx(lanes), body);
}

/// init + Σ term(offset) over the chunks of the selection, in chunk order.
Value sumSelChunks(CpuKernelBuilder &kb, int64_t selPad, Value init,
                   function_ref<Value(Value)> term) {
  int64_t lanes = kb.lanes();
  if (selPad / lanes <= kUnrolledSelChunks) {
    Value acc = init;
    for (int64_t c = 0; c < selPad; c += lanes)
      acc = kb.fadd(acc, term(kb.idx(c)));
    return acc;
  }
  return kb.forLoop(kb.idx(0), kb.idx(selPad), kb.idx(lanes), ValueRange{init},
                   [&](Value c, ValueRange acc) -> SmallVector<Value> {
                     return {kb.fadd(acc[0], term(c))};
                   })[0];
}

/// What every row of one topk_renorm kernel shares: the spec, the 2-D
/// [rows, ...] scores, weights and indices buffers, the expert count, and the
/// padded selection buffer's length and fill.
struct TopkRows {
  TopkSpec spec;
  Value s2, w2, i2;
  /// E (index) and, when static, its value (else ShapedType::kDynamic).
  Value numExperts;
  int64_t staticExperts;
  /// k rounded up to whole vectors: the length of a row's selection buffer.
  int64_t selPad;
  /// What the selection buffer's pad lanes hold (-inf for logits, else 0),
  /// neutral in the weights' sums.
  double selFill;
};

struct TopkRenormKernel : KernelPattern<TopkRenormOp> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(TopkRenormOp op, CpuKernelBuilder &kb,
                     PatternRewriter &rw) const override {
    auto scoresType = cast<RankedTensorType>(op.getScores().getType());
    if (scoresType.getRank() < 2)
      return rw.notifyMatchFailure(op, "rank-1 scores: portable lowering");
    const TopkSpec spec = topkSpecOf(op);
    int64_t topk = spec.k;
    Type f32 = kb.f32(), i32 = kb.i32();

    // weights and indices: the scores' sizes with k in the last dimension.
    SmallVector<Value> outSizes = kb.sizes(op.getScores());
    outSizes.back() = kb.idx(topk);
    KernelScope kernel(kb, {op.getScores()},
                       KernelScope::outsOf(op, {outSizes, outSizes}));
    Value scores = kb.buffer(op.getScores());
    Value wBuf = kernel.out(0), iBuf = kernel.out(1);

    Value s2 = collapseRows(kb, scores);
    Value w2 = collapseRows(kb, wBuf), i2 = collapseRows(kb, iBuf);
    Value numRows = kb.dim(s2, 0), numExperts = kb.dim(s2, 1);
    int64_t lanes = kb.lanes();
    int64_t staticExperts = scoresType.getShape().back();
    const TopkRows t{spec,
                     s2,
                     w2,
                     i2,
                     numExperts,
                     staticExperts,
                     /*selPad=*/(topk + lanes - 1) / lanes * lanes,
                     /*selFill=*/spec.logits
                         ? -std::numeric_limits<double>::infinity()
                         : 0.0};

    // Rows selected together (static K of at most kKeyVectors vectors).
    int64_t group = 1;
    if (!ShapedType::isDynamic(staticExperts)) {
      int64_t nc = (staticExperts + lanes - 1) / lanes;
      group = std::clamp<int64_t>(kKeyVectors / nc,
                                  selectsOverTwoLevels(nc) ? kTwoLevelMinRows
                                                           : 1,
                                  kMaxGroupRows);
    }
    // The keys of the group's rows, each rounded up to whole vectors.
    Value keysAll =
        kb.scratch(opts, MemRefType::get({ShapedType::kDynamic}, i32),
                  {kb.mul(roundUp(kb, numExperts, lanes), kb.idx(group))});
    Value selAll = kb.scratch(opts, MemRefType::get({group, t.selPad}, f32), {});
    auto rowsFrom = [&](Value worker, Value r0, Value r1, int64_t n) {
      // Rows [r0, r1) in groups of n, then one by one.
      Value sels = kb.workerSlice(selAll, worker);
      Value keys = kb.workerSlice(keysAll, worker);
      Value whole = kb.add(r0, kb.mul(kb.divu(kb.sub(r1, r0), kb.idx(n)),
                                    kb.idx(n)));
      auto emit = [&](Value r, int64_t m) {
        SmallVector<Value> rows, sel;
        for (int64_t q = 0; q < m; ++q) {
          rows.push_back(kb.add(r, kb.idx(q)));
          sel.push_back(kb.workerSlice(sels, kb.idx(q)));
        }
        emitRows(kb, t, rows, keys, sel);
      };
      kb.forLoop(r0, whole, kb.idx(n), [&](Value r) { emit(r, n); });
      if (n > 1)
        kb.forLoop(whole, r1, kb.idx(1), [&](Value r) { emit(r, 1); });
    };
    auto body = [&](Value item, Value worker) {
      Value r0 = kb.mul(item, kb.idx(kRowsPerItem));
      Value r1 = kb.mins(kb.add(r0, kb.idx(kRowsPerItem)), numRows);
      rowsFrom(worker, r0, r1, group);
    };
    if (!fitsRowLanes(staticExperts, topk)) {
      kb.workers(opts, kb.ceilDiv(numRows, kb.idx(kRowsPerItem)), body);
    } else {
      Value s1 = flatten(kb, s2), w1 = flatten(kb, w2), i1 = flatten(kb, i2);
      Value numBlocks = kb.divu(numRows, kb.idx(lanes));
      int64_t blocksPerItem = std::max<int64_t>(kLaneRowsPerItem / lanes, 1);
      kb.workers(opts, kb.ceilDiv(numBlocks, kb.idx(blocksPerItem)),
                [&](Value item, Value) {
                  Value b0 = kb.mul(item, kb.idx(blocksPerItem));
                  Value b1 =
                      kb.mins(kb.add(b0, kb.idx(blocksPerItem)), numBlocks);
                  kb.forLoop(b0, b1, kb.idx(1), [&](Value blk) {
                    emitLaneBlock(kb, spec, kb.mul(blk, kb.idx(lanes)), s1, w1,
                                  i1, staticExperts);
                  });
                });
      // The rows past the last full block, on this thread.
      rowsFrom(kb.idx(0), kb.mul(numBlocks, kb.idx(lanes)), numRows, group);
    }

    kernel.replace(rw, op);
    return success();
  }

  /// Rows [r0, r0 + lanes), one per lane, of the flat [rows * numExperts]
  /// scores `s1`; writes the flat [rows * k] weights `w1` and indices `i1`.
  static void emitLaneBlock(CpuKernelBuilder &kb, const TopkSpec &spec, Value r0,
                            Value s1, Value w1, Value i1, int64_t numExperts) {
    int64_t topk = spec.k;
    SmallVector<Value> cols = loadColumns(kb, s1, r0, numExperts);
    LaneTopk best = laneTopk(
        kb, topk, numExperts,
        [&](int64_t j) { return orderedKey(kb, cols[j]); },
        [&](int64_t j) { return cols[j]; });
    SmallVector<Value> &vals = best.vals, &idxs = best.idxs;

    // Each lane is a row: the sums need no reduction.
    Value v0 = vals[0], sum, denseMax, denseSum;
    if (spec.renormalize) {
      sum = topkSelectionTerm(kb, spec, vals[0], v0);
      for (int64_t s = 1; s < topk; ++s)
        sum = kb.fadd(sum, topkSelectionTerm(kb, spec, vals[s], v0));
    } else if (spec.logits) {
      RowSoftmaxStats dense = rowSoftmaxStats(kb, cols, nullptr, nullptr,
                                              /*sumFromFirstTerm=*/true);
      denseMax = dense.max;
      denseSum = dense.sum;
    }
    SmallVector<Value> weights;
    for (int64_t s = 0; s < topk; ++s)
      weights.push_back(
          topkWeight(kb, spec, vals[s], v0, sum, denseMax, denseSum));
    storeColumns(kb, weights, w1, r0);
    storeColumns(kb, idxs, i1, r0);
  }

  /// The k best entries of each row of `rows` (the dialect's order) by k
  /// knockout rounds over the row's i32 ordered keys: each round takes the
  /// largest key (a signed max), then the lowest index holding it (a signed
  /// min over the lanes equal to it), and knocks that entry out (its key
  /// becomes INT32_MIN, below the key of every number, -inf included). i32
  /// keys fill the register (8 lanes on AVX2, 16 on AVX-512) and max, min and
  /// compare are one instruction on both, unlike the i64 of packed candidates
  /// (AVX2 has no 64-bit max or min). The keys are in `keys` (each row
  /// rounded up to whole vectors) and an entry is knocked out with a scalar
  /// store (a select-and-store of the whole vector would become a masked
  /// store, microcoded on AVX2). A static row of at most kKeyVectors vectors
  /// has its chunk loops unrolled, the rows of `rows` interleaved; a longer
  /// or dynamic one runs chunk loops, row after row. Writes the indices to
  /// i2[r, j] and the selected values (exact, read back from s2) to
  /// sels[q][j].
  static void selectByKnockout(CpuKernelBuilder &kb, ArrayRef<Value> rows,
                               Value s2, Value i2, Value keys,
                               ArrayRef<Value> sels, Value numExperts,
                               int64_t topk, int64_t staticExperts) {
    int64_t lanes = kb.lanes();
    Type i32 = kb.i32();
    auto vi32 = VectorType::get({lanes}, i32);
    Value numChunks = kb.ceilDiv(numExperts, kb.idx(lanes));
    Value gone = kb.constLike(vi32, double(std::numeric_limits<int32_t>::min()));
    Value last = kb.constLike(vi32, double(std::numeric_limits<int32_t>::max()));
    bool whole = !ShapedType::isDynamic(staticExperts) &&
                 staticExperts % lanes == 0;
    auto experts = [&](Value base) {
      if (std::optional<int64_t> cst = getConstantIntValue(base))
        return laneIds(kb, *cst, /*flipped=*/false);
      return kb.iota(kb.castInt(base, i32), lanes);
    };
    auto chunkKey = [&](Value r, Value base) {
      std::optional<int64_t> cst = getConstantIntValue(base);
      if (whole || (cst && !ShapedType::isDynamic(staticExperts) &&
                    *cst + lanes <= staticExperts))
        return orderedKey(kb, kb.vload(s2, {r, base}));
      Value x = kb.vloadMasked(s2, {r, base}, kb.sub(numExperts, base), 0.0);
      Value inRow =
          kb.lt(experts(base), kb.splat(kb.castInt(numExperts, i32), lanes));
      return kb.select(inRow, orderedKey(kb, x), gone);
    };
    auto emitPick = [&](Value r, Value sel, Value j, Value index) {
      TopkRenormKernel::emitPick(kb, r, s2, i2, sel, j, index);
    };
    auto minIndex = [&](Value v) -> Value {
      return vector::ReductionOp::create(kb.b, vector::CombiningKind::MINSI, v);
    };

    if (!ShapedType::isDynamic(staticExperts) &&
        (staticExperts + lanes - 1) / lanes <= kKeyVectors) {
      // The rows' rounds interleaved: each round is one long dependency
      // chain (max, then the index, then the knockout), so independent rows
      // fill the pipeline. Row q's keys are at q * nc * lanes in `keys`
      // (L1); a round loads them (the chunk loops unrolled), finds the lowest
      // index holding the top key as a max of (compare lanes and INT32_MAX -
      // index), an and instead of a select (VBLENDVPS: 2-3 uops on AVX2), and
      // knocks the pick out with a scalar store. Keeping 4 rows' keys in
      // registers instead (SSA values: 32 ymm at K = 64, on 16) spilled them
      // every round on AVX2 and took 1.2-1.5x the time on both targets.
      int64_t nc = (staticExperts + lanes - 1) / lanes, nr = rows.size();
      auto at = [&](int64_t q, int64_t c) {
        return kb.idx((q * nc + c) * lanes);
      };
      SmallVector<SmallVector<Value>> rowKeys(nr);
      for (int64_t q = 0; q < nr; ++q)
        for (int64_t c = 0; c < nc; ++c) {
          rowKeys[q].push_back(chunkKey(rows[q], kb.idx(c * lanes)));
          kb.vstore(rowKeys[q].back(), keys, {at(q, c)});
        }
      if (selectsOverTwoLevels(nc)) {
        selectByChunkMaxima(kb, rows, rowKeys, s2, i2, keys, sels, topk);
        return;
      }
      kb.forLoop(kb.idx(0), kb.idx(topk), kb.idx(1), [&](Value j) {
        for (int64_t q = 0; q < nr; ++q) {
          SmallVector<Value> key;
          for (int64_t c = 0; c < nc; ++c)
            key.push_back(kb.vload(keys, {at(q, c)}, lanes));
          Value topV = butterfly(kb, maxTree(kb, key), /*max=*/true);
          Value indexV = lowestEqual(kb, key, topV);
          Value index = vector::ExtractOp::create(kb.b, indexV, 0);
          emitPick(rows[q], sels[q], j, index);
          kb.store(kb.cI32(std::numeric_limits<int32_t>::min()), keys,
                  {kb.add(at(q, 0), kb.castInt(index, kb.b.getIndexType()))});
        }
      });
      return;
    }

    for (auto [r, sel] : llvm::zip(rows, sels)) {
    kb.forLoop(kb.idx(0), numChunks, kb.idx(1), [&](Value c) {
      Value base = kb.mul(c, kb.idx(lanes));
      kb.vstore(chunkKey(r, base), keys, {base});
    });
    kb.forLoop(kb.idx(0), kb.idx(topk), kb.idx(1), [&](Value j) {
      Value top = kb.maxsi(
          kb.forLoop(kb.idx(0), numChunks, kb.idx(1), ValueRange{gone},
                    [&](Value c, ValueRange acc) -> SmallVector<Value> {
                      Value base = kb.mul(c, kb.idx(lanes));
                      return {kb.maxs(acc[0], kb.vload(keys, {base}, lanes))};
                    })[0]);
      Value topV = kb.splat(top, lanes);
      Value index = minIndex(
          kb.forLoop(kb.idx(0), numChunks, kb.idx(1), ValueRange{last},
                    [&](Value c, ValueRange acc) -> SmallVector<Value> {
                      Value base = kb.mul(c, kb.idx(lanes));
                      Value key = kb.vload(keys, {base}, lanes);
                      return {kb.mins(acc[0], kb.select(kb.eq(key, topV),
                                                      experts(base), last))};
                    })[0]);
      emitPick(r, sel, j, index);
      kb.store(kb.cI32(std::numeric_limits<int32_t>::min()), keys,
              {kb.castInt(index, kb.b.getIndexType())});
    });
    }
  }

  /// Pick j of row r: entry `index` (i32) of s2's row r.
  static void emitPick(CpuKernelBuilder &kb, Value r, Value s2, Value i2,
                       Value sel, Value j, Value index) {
    Value value = kb.loadF(s2, {r, kb.castInt(index, kb.b.getIndexType())});
    kb.store(kb.asElementOf(index, i2), i2, {r, j});
    kb.store(value, sel, {j});
  }

  /// The knockout rounds of selectByKnockout over two levels, for rows of
  /// many chunks: lane l of the row's chunk-maxima vector m holds the largest
  /// key of chunk m * lanes + l. A round finds the top key in the maxima, the
  /// lowest chunk holding it (the lowest index holding the top key lies in
  /// it: every chunk before has only smaller keys), and the lowest lane of
  /// that chunk; it knocks the entry out with a whole-vector store (the next
  /// round's load of the chunk is forwarded from it) and replaces the chunk's
  /// maximum. A round touches one chunk instead of all nc twice: at K = 256
  /// it is ~40 vector ops for any nc, where the one-level round took ~5 nc
  /// (160 on AVX2, 80 on AVX-512). The maxima are loop-carried (registers).
  /// `rowKeys[q][c]` is chunk c of row q's keys, also stored in `keys`.
  static void selectByChunkMaxima(CpuKernelBuilder &kb, ArrayRef<Value> rows,
                                  ArrayRef<SmallVector<Value>> rowKeys,
                                  Value s2, Value i2, Value keys,
                                  ArrayRef<Value> sels, int64_t topk) {
    int64_t lanes = kb.lanes(), nr = rows.size(), nc = rowKeys[0].size();
    int64_t nm = (nc + lanes - 1) / lanes;
    auto vi32 = VectorType::get({lanes}, kb.i32());
    Value gone = kb.constLike(vi32, double(std::numeric_limits<int32_t>::min()));
    // Chunk maxima: log2(lanes) unzip rounds, each followed by the max of
    // the evens and the odds of every pair, transpose-reduce `lanes` chunks
    // into one vector, in chunk order.
    SmallVector<Value> maxima;
    for (int64_t q = 0; q < nr; ++q)
      for (int64_t m = 0; m < nm; ++m) {
        SmallVector<Value> v;
        for (int64_t c = m * lanes; c < (m + 1) * lanes; ++c)
          v.push_back(c < nc ? rowKeys[q][c] : gone);
        while (v.size() > 1) {
          SmallVector<Value> halves = unzipRound(kb, v);
          int64_t n = v.size() / 2;
          v.clear();
          for (int64_t i = 0; i < n; ++i)
            v.push_back(kb.maxs(halves[i], halves[i + n]));
        }
        maxima.push_back(v[0]);
      }
    Value lane0 = laneIds(kb, 0, /*flipped=*/false);
    Value lanesI32 = kb.cI32(lanes);
    kb.forLoop(kb.idx(0), kb.idx(topk), kb.idx(1), ValueRange(maxima),
              [&](Value j, ValueRange acc) -> SmallVector<Value> {
      SmallVector<Value> next;
      for (int64_t q = 0; q < nr; ++q) {
        SmallVector<Value> m(acc.slice(q * nm, nm));
        Value top = butterfly(kb, maxTree(kb, m), /*max=*/true);
        Value chunkV = lowestEqual(kb, m, top);
        Value chunk = vector::ExtractOp::create(kb.b, chunkV, 0);
        Value first = kb.mul(chunk, lanesI32);
        // (Operands named first: gcc and clang evaluate a call's arguments
        // in different orders, and with them the order of the emitted ops.)
        Value rowStart = kb.idx(q * nc * lanes);
        Value firstIndex = kb.castInt(first, kb.b.getIndexType());
        Value offset = kb.add(rowStart, firstIndex);
        Value keysOfChunk = kb.vload(keys, {offset}, lanes);
        Value laneV = lowestEqual(kb, {keysOfChunk}, top);
        Value lane = vector::ExtractOp::create(kb.b, laneV, 0);
        Value index = kb.add(first, lane);
        emitPick(kb, rows[q], s2, i2, sels[q], j, index);
        Value picked = kb.eq(lane0, laneV);
        Value knocked = kb.select(picked, gone, keysOfChunk);
        kb.vstore(knocked, keys, {offset});
        Value newMax = butterfly(kb, knocked, /*max=*/true);
        for (int64_t mm = 0; mm < nm; ++mm) {
          Value chunkIds = laneIds(kb, mm * lanes, /*flipped=*/false);
          Value isChunk = kb.eq(chunkIds, chunkV);
          next.push_back(kb.select(isChunk, newMax, m[mm]));
        }
      }
      return next;
    });
  }

  /// Rows `rows` (their selections in `sels`, one per row; `keys` the
  /// group's key scratch), selected together.
  static void emitRows(CpuKernelBuilder &kb, const TopkRows &t,
                       ArrayRef<Value> rows, Value keys, ArrayRef<Value> sels) {
    for (Value sel : sels)
      eachSelChunk(kb, t.selPad, [&](Value c) {
        kb.vstore(kb.constLike(kb.vf32(), t.selFill), sel, {c});
      });
    selectByKnockout(kb, rows, t.s2, t.i2, keys, sels, t.numExperts, t.spec.k,
                     t.staticExperts);
    for (auto [r, sel] : llvm::zip(rows, sels))
      emitWeights(kb, t, r, sel);
  }

  /// Row r's weights from its selection `sel` (kernels::topkWeight).
  static void emitWeights(CpuKernelBuilder &kb, const TopkRows &t, Value r,
                          Value sel) {
    int64_t lanes = kb.lanes();
    const TopkSpec &spec = t.spec;
    int64_t topk = spec.k, selPad = t.selPad;
    bool logits = spec.logits, renormalize = spec.renormalize;
    Value s2 = t.s2, w2 = t.w2, numExperts = t.numExperts;

    // Weights (kernels::topkWeight, the GPU's epilogue, on vector lanes).
    auto left = [&](Value c) { // selected entries from chunk offset c on
      if (std::optional<int64_t> cst = getConstantIntValue(c))
        return kb.idx(topk - *cst);
      return kb.sub(kb.idx(topk), c);
    };
    if (!logits && !renormalize) {
      eachSelChunk(kb, selPad, [&](Value c) {
        kb.vstoreMasked(kb.vload(sel, {c}), w2, {r, c}, left(c));
      });
      return;
    }
    Value zeros = kb.constLike(kb.vf32(), 0.0);
    auto selSum = [&](function_ref<Value(Value)> term) {
      return kb.sum(sumSelChunks(
          kb, selPad, zeros, [&](Value c) { return term(kb.vload(sel, {c})); }));
    };
    Value v0, sum, denseMax, denseSum;
    if (!logits || renormalize) {
      // Over the selection; a softmax's max is the first pick.
      if (logits)
        v0 = kb.splat(kb.load(sel, {kb.idx(0)}), lanes);
      sum = kb.splat(
          selSum([&](Value v) { return topkSelectionTerm(kb, spec, v, v0); }),
          lanes);
    } else {
      // Softmax over the whole row, read at the selection.
      Value numRowChunks = kb.ceilDiv(numExperts, kb.idx(lanes));
      auto rowChunk = [&](Value c) {
        Value base = kb.mul(c, kb.idx(lanes));
        return kb.vloadMasked(s2, {r, base}, kb.sub(numExperts, base),
                             -std::numeric_limits<double>::infinity());
      };
      RowSoftmaxStats dense = rowSoftmaxStatsLoop(
          kb, kb.vf32(), kb.idx(0), numRowChunks, kb.idx(1), rowChunk,
          [&](Value v) { return kb.maxf(v); },
          [&](Value v) { return kb.sum(v); });
      denseMax = dense.maxShaped;
      denseSum = kb.splat(dense.sum, lanes);
    }
    eachSelChunk(kb, selPad, [&](Value c) {
      Value w =
          topkWeight(kb, spec, kb.vload(sel, {c}), v0, sum, denseMax, denseSum);
      kb.vstoreMasked(w, w2, {r, c}, left(c));
    });
  }
};
} // namespace

void populateTopkRenormLowering(RewritePatternSet &patterns,
                                const KernelOptions &options) {
  patterns.add<TopkRenormKernel>(patterns.getContext(), options);
}

} // namespace mlir::moe::cpu_lowering
