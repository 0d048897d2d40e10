//===- TopkRenorm.cpp - moe.topk_renorm -> fast CPU kernel ----------------===//
//
// Part of the MoE-MLIR project.
//
// Rows (tokens) are independent: blocks of 32 rows go to the workers. Per
// row, every score becomes an i64 candidate (ordered key << 32 | 2^31-1-index,
// the one order of MoE/Kernels/TopK.h), so that the dialect's order (NaN first,
// then larger values, then the lower index) is a plain signed integer order.
// Each of the k rounds is a vectorized max over the candidates that rank
// strictly after the previous pick (vector<8xi64> on AVX-512, vector<4xi64> on
// AVX2: one register), which skips exactly the elements already taken, as the
// portable lowering's rounds do. The weights are vector<16xf32> (AVX2:
// vector<8xf32>) epilogues over the k selected values (kernels::topkWeight),
// unrolled for k <= 4 vectors and a loop beyond.
//
// Few experts (K a power of two <= 16, k <= 8): one row per lane instead. A
// block of `lanes` rows (K·lanes contiguous scores) is loaded as K vectors and
// transposed in registers by log2(K) unzip rounds of two-input shuffles, so
// that vector j holds expert j of every row of the block; a k-deep insertion
// network (strict ordered-key compares, experts in ascending order: ties and
// NaNs keep the lower index first) keeps the k best per lane, and the weights
// and indices are zipped back to row-major [rows, k] and stored whole. No
// gathers or scatters: shuffles are what AVX2 and AVX-512 both do in a cycle
// or two. The rows past the last full block take the per-row path.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/TopK.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu;
using namespace mlir::moe::kernels;

namespace {
constexpr int64_t kRowsPerItem = 32;
/// Selections of up to this many 16-lane chunks (k <= 64) have their epilogue
/// unrolled (no loop overhead in the common k <= 8); larger ones loop, so that
/// the IR, and the compile time, do not grow with k.
constexpr int64_t kUnrolledSelChunks = 4;
/// The row-per-lane layout: K (a power of two) up to this many experts, k up
/// to kMaxLaneK selections, blocks of lanes rows grouped by kLaneRowsPerItem
/// rows per worker item.
constexpr int64_t kMaxLaneExperts = 16;
constexpr int64_t kMaxLaneK = 8;
constexpr int64_t kLaneRowsPerItem = 64;

/// memref [rows, X] -> [rows * X] (identity layout).
Value flatten(CK &k, Value buffer) {
  return memref::CollapseShapeOp::create(
      k.b, buffer, ArrayRef<ReassociationIndices>{{0, 1}});
}

/// One unzip round over vectors holding a row-major sequence: vector q <
/// n/2 takes the even elements of vectors 2q, 2q+1, vector q + n/2 the odd
/// ones. log2(n) rounds turn n vectors of a [lanes, n] row-major block into
/// its n columns.
SmallVector<Value> unzipRound(CK &k, ArrayRef<Value> v) {
  int64_t n = v.size(), lanes = k.lanes();
  SmallVector<int64_t> evens, odds;
  for (int64_t i = 0; i < lanes; ++i) {
    evens.push_back(2 * i);
    odds.push_back(2 * i + 1);
  }
  SmallVector<Value> out(n);
  for (int64_t q = 0; q < n / 2; ++q) {
    out[q] = k.shuffle(v[2 * q], v[2 * q + 1], evens);
    out[q + n / 2] = k.shuffle(v[2 * q], v[2 * q + 1], odds);
  }
  return out;
}

/// The inverse of unzipRound: vectors 2q, 2q+1 interleave vectors q and q + n/2.
SmallVector<Value> zipRound(CK &k, ArrayRef<Value> v) {
  int64_t n = v.size(), lanes = k.lanes();
  SmallVector<int64_t> low, high;
  for (int64_t i = 0; i < lanes / 2; ++i) {
    low.append({i, lanes + i});
    high.append({lanes / 2 + i, lanes + lanes / 2 + i});
  }
  SmallVector<Value> out(n);
  for (int64_t q = 0; q < n / 2; ++q) {
    out[2 * q] = k.shuffle(v[q], v[q + n / 2], low);
    out[2 * q + 1] = k.shuffle(v[q], v[q + n / 2], high);
  }
  return out;
}

/// Stores `cols[s]` (lane l = row r0 + l, column s) into the flat row-major
/// [rows * n] buffer `flat`.
void storeColumns(CK &k, ArrayRef<Value> cols, Value flat, Value r0) {
  int64_t n = cols.size(), lanes = k.lanes();
  Value base = k.mul(r0, k.idx(n));
  if (llvm::isPowerOf2_64(n) && n <= lanes) {
    SmallVector<Value> rows(cols);
    for (int64_t m = n; m > 1; m /= 2)
      rows = zipRound(k, rows);
    for (int64_t q = 0; q < n; ++q)
      k.vstore(rows[q], flat, {k.add(base, k.idx(q * lanes))});
    return;
  }
  for (int64_t l = 0; l < lanes; ++l)
    for (int64_t s = 0; s < n; ++s)
      k.store(vector::ExtractOp::create(k.b, cols[s], l), flat,
              {k.add(base, k.idx(l * n + s))});
}

/// Runs `body(offset)` for the offsets 0, 16, ... < selPad of the selection.
void eachSelChunk(CK &k, int64_t selPad, function_ref<void(Value)> body) {
  int64_t lanes = k.lanes();
  if (selPad / lanes <= kUnrolledSelChunks) {
    for (int64_t c = 0; c < selPad; c += lanes)
      body(k.idx(c));
    return;
  }
  k.forLoop(k.idx(0), k.idx(selPad), k.idx(lanes), body);
}

/// init + Σ term(offset) over the chunks of the selection, in chunk order.
Value sumSelChunks(CK &k, int64_t selPad, Value init,
                   function_ref<Value(Value)> term) {
  int64_t lanes = k.lanes();
  if (selPad / lanes <= kUnrolledSelChunks) {
    Value acc = init;
    for (int64_t c = 0; c < selPad; c += lanes)
      acc = k.fadd(acc, term(k.idx(c)));
    return acc;
  }
  return k.forLoop(k.idx(0), k.idx(selPad), k.idx(lanes), ValueRange{init},
                   [&](Value c, ValueRange acc) -> SmallVector<Value> {
                     return {k.fadd(acc[0], term(c))};
                   })[0];
}

struct TopkRenormKernel : KernelPattern<TopkRenormOp> {
  using KernelPattern::KernelPattern;

  LogicalResult matchAndRewrite(TopkRenormOp op,
                                PatternRewriter &rw) const override {
    auto scoresType = cast<RankedTensorType>(op.getScores().getType());
    if (scoresType.getRank() < 2)
      return rw.notifyMatchFailure(op, "rank-1 scores: portable lowering");
    ImplicitLocOpBuilder b(op.getLoc(), rw);
    CK k(b, opts);
    int64_t topk = op.getK();
    bool logits = op.getMode() == TopkMode::logits;
    bool renormalize = op.getRenormalize();
    Type f32 = k.f32(), i32 = k.i32(), i64 = k.i64();

    Value scores = k.buffer(op.getScores());
    int64_t rank = scoresType.getRank();
    SmallVector<Value> sizes;
    for (int64_t d = 0; d < rank; ++d)
      sizes.push_back(k.dim(scores, d));
    SmallVector<int64_t> outShape(scoresType.getShape());
    outShape.back() = topk;
    SmallVector<Value> outSizes(sizes);
    outSizes.back() = k.idx(topk);
    auto wType = MemRefType::get(outShape, f32);
    auto iType = MemRefType::get(outShape, i32);
    Value wBuf = k.alloc(wType, CK::dynamicSizes(outShape, outSizes));
    Value iBuf = k.alloc(iType, CK::dynamicSizes(outShape, outSizes));

    Value s2 = collapseRows(k, scores);
    Value w2 = collapseRows(k, wBuf), i2 = collapseRows(k, iBuf);
    Value numRows = k.dim(s2, 0), numExperts = k.dim(s2, 1);
    int64_t lanes = k.lanes();
    // i64 candidates: half as many lanes as f32 in one register.
    int64_t candLanes = lanes / 2;
    Value numChunks = k.ceilDiv(numExperts, k.idx(candLanes));
    int64_t selPad = (topk + lanes - 1) / lanes * lanes;
    Value numExpertsI32 = k.castInt(numExperts, i32);
    double selFill = logits ? -std::numeric_limits<double>::infinity() : 0.0;

    Value candAll =
        k.scratch(opts, MemRefType::get({ShapedType::kDynamic}, i64),
                  {k.mul(numChunks, k.idx(candLanes))});
    Value selAll = k.scratch(opts, MemRefType::get({selPad}, f32), {});
    auto body = [&](Value item, Value worker) {
      Value cand = k.workerSlice(candAll, worker);
      Value sel = k.workerSlice(selAll, worker);
      Value r0 = k.mul(item, k.idx(kRowsPerItem));
      Value r1 = k.mins(k.add(r0, k.idx(kRowsPerItem)), numRows);
      k.forLoop(r0, r1, k.idx(1), [&](Value r) {
        emitRow(k, r, s2, w2, i2, cand, sel, numExperts, numExpertsI32,
                numChunks, topk, selPad, selFill, logits, renormalize);
      });
    };
    int64_t staticExperts = scoresType.getShape().back();
    bool rowPerLane = !ShapedType::isDynamic(staticExperts) &&
                      staticExperts >= 2 && staticExperts <= kMaxLaneExperts &&
                      llvm::isPowerOf2_64(staticExperts) && topk <= kMaxLaneK;
    if (!rowPerLane) {
      k.workers(opts, k.ceilDiv(numRows, k.idx(kRowsPerItem)), body);
    } else {
      TopkSpec spec;
      spec.k = topk;
      spec.logits = logits;
      spec.renormalize = renormalize;
      Value s1 = flatten(k, s2), w1 = flatten(k, w2), i1 = flatten(k, i2);
      Value numBlocks = k.divu(numRows, k.idx(lanes));
      int64_t blocksPerItem = std::max<int64_t>(kLaneRowsPerItem / lanes, 1);
      k.workers(opts, k.ceilDiv(numBlocks, k.idx(blocksPerItem)),
                [&](Value item, Value) {
                  Value b0 = k.mul(item, k.idx(blocksPerItem));
                  Value b1 =
                      k.mins(k.add(b0, k.idx(blocksPerItem)), numBlocks);
                  k.forLoop(b0, b1, k.idx(1), [&](Value blk) {
                    emitLaneBlock(k, spec, k.mul(blk, k.idx(lanes)), s1, w1,
                                  i1, staticExperts);
                  });
                });
      // The rows past the last full block, one by one on this thread.
      Value cand = k.workerSlice(candAll, k.idx(0));
      Value sel = k.workerSlice(selAll, k.idx(0));
      k.forLoop(k.mul(numBlocks, k.idx(lanes)), numRows, k.idx(1),
                [&](Value r) {
                  emitRow(k, r, s2, w2, i2, cand, sel, numExperts,
                          numExpertsI32, numChunks, topk, selPad, selFill,
                          logits, renormalize);
                });
    }

    Value w = castTo(k, k.tensor(wBuf), op.getWeights().getType());
    Value idx = castTo(k, k.tensor(iBuf), op.getIndices().getType());
    rw.replaceOp(op, {w, idx});
    return success();
  }

  static Value castTo(CK &k, Value v, Type type) {
    if (v.getType() == type)
      return v;
    return tensor::CastOp::create(k.b, type, v);
  }

  /// Rows [r0, r0 + lanes), one per lane, of the flat [rows * numExperts]
  /// scores `s1`; writes the flat [rows * k] weights `w1` and indices `i1`.
  static void emitLaneBlock(CK &k, const TopkSpec &spec, Value r0, Value s1,
                            Value w1, Value i1, int64_t numExperts) {
    int64_t lanes = k.lanes(), topk = spec.k;
    // The block's columns: numExperts row-major vectors, transposed.
    Value base = k.mul(r0, k.idx(numExperts));
    SmallVector<Value> cols;
    for (int64_t q = 0; q < numExperts; ++q)
      cols.push_back(k.vload(s1, {k.add(base, k.idx(q * lanes))}));
    for (int64_t m = numExperts; m > 1; m /= 2)
      cols = unzipRound(k, cols);

    // The k best per lane, best first: experts in ascending order, inserted
    // only above a strictly smaller ordered key (equal keys keep the lower
    // index first; NaN has the largest key).
    auto vi32 = VectorType::get({lanes}, k.i32());
    SmallVector<Value> keys(
        topk, k.constLike(vi32, double(std::numeric_limits<int32_t>::min())));
    SmallVector<Value> vals(topk, k.constLike(k.vf32(), 0.0));
    SmallVector<Value> idxs(topk, k.constLike(vi32, 0.0));
    for (int64_t j = 0; j < numExperts; ++j) {
      Value x = cols[j], key = orderedKey(k, x);
      Value expert = k.constLike(vi32, double(j));
      SmallVector<Value> above;
      for (int64_t s = 0; s < topk; ++s)
        above.push_back(k.cmpi(arith::CmpIPredicate::sgt, key, keys[s]));
      for (int64_t s = topk - 1; s >= 0; --s) {
        // Slot s takes slot s-1 when x beats that too, else x when x beats
        // slot s.
        auto next = [&](SmallVector<Value> &slot, Value mine) {
          Value v = k.select(above[s], mine, slot[s]);
          if (s > 0)
            v = k.select(above[s - 1], slot[s - 1], v);
          return v;
        };
        keys[s] = next(keys, key);
        vals[s] = next(vals, x);
        idxs[s] = next(idxs, expert);
      }
    }

    Value v0 = vals[0], sum, denseMax, denseSum;
    if (spec.logits && spec.renormalize) {
      sum = k.exp(k.fsub(vals[0], v0));
      for (int64_t s = 1; s < topk; ++s)
        sum = k.fadd(sum, k.exp(k.fsub(vals[s], v0)));
    } else if (spec.renormalize) {
      sum = vals[0];
      for (int64_t s = 1; s < topk; ++s)
        sum = k.fadd(sum, vals[s]);
    } else if (spec.logits) {
      denseMax = cols[0];
      for (int64_t j = 1; j < numExperts; ++j)
        denseMax = k.fmax(denseMax, cols[j]);
      denseSum = k.exp(k.fsub(cols[0], denseMax));
      for (int64_t j = 1; j < numExperts; ++j)
        denseSum = k.fadd(denseSum, k.exp(k.fsub(cols[j], denseMax)));
    }
    SmallVector<Value> weights;
    for (int64_t s = 0; s < topk; ++s)
      weights.push_back(
          topkWeight(k, spec, vals[s], v0, sum, denseMax, denseSum));
    storeColumns(k, weights, w1, r0);
    storeColumns(k, idxs, i1, r0);
  }

  static void emitRow(CK &k, Value r, Value s2, Value w2, Value i2, Value cand,
                      Value sel, Value numExperts, Value numExpertsI32,
                      Value numChunks, int64_t topk, int64_t selPad,
                      double selFill, bool logits, bool renormalize) {
    Type i64 = k.i64();
    int64_t lanes = k.lanes(), candLanes = lanes / 2;
    auto candType = VectorType::get({candLanes}, i64);
    Value none = noCandidate(k, candType);
    // Candidates of the row (padding lanes: below everything).
    k.forLoop(k.idx(0), numChunks, k.idx(1), [&](Value c) {
      Value base = k.mul(c, k.idx(candLanes));
      Value x = k.vloadMasked(s2, {r, base}, k.sub(numExperts, base), 0.0,
                              candLanes);
      Value experts = k.iota(k.castInt(base, k.i32()), candLanes);
      Value packed = packCandidate(k, orderedKey(k, x), experts);
      Value inRow = k.cmpi(arith::CmpIPredicate::slt, experts,
                           k.splat(numExpertsI32, candLanes));
      k.vstore(k.select(inRow, packed, none), cand, {base});
    });
    eachSelChunk(k, selPad, [&](Value c) {
      k.vstore(k.constLike(k.vf32(), selFill), sel, {c});
    });

    // k rounds: the best candidate strictly below the previous pick.
    k.forLoop(
        k.idx(0), k.idx(topk), k.idx(1),
        ValueRange{k.cI64(std::numeric_limits<int64_t>::max())},
        [&](Value j, ValueRange it) -> SmallVector<Value> {
          Value top = bestCandidateBelow(k, cand, k.idx(0), numChunks, it[0]);
          Value index = candidateIndex(k, top);
          Value value = k.loadF(s2, {r, k.castInt(index, k.b.getIndexType())});
          k.store(index, i2, {r, j});
          k.store(value, sel, {j});
          return {top};
        });

    // Weights (kernels::topkWeight, the GPU's epilogue, on vector lanes).
    auto left = [&](Value c) { // selected entries from chunk offset c on
      if (std::optional<int64_t> cst = getConstantIntValue(c))
        return k.idx(topk - *cst);
      return k.sub(k.idx(topk), c);
    };
    TopkSpec spec;
    spec.k = topk;
    spec.logits = logits;
    spec.renormalize = renormalize;
    if (!logits && !renormalize) {
      eachSelChunk(k, selPad, [&](Value c) {
        k.vstoreMasked(k.vload(sel, {c}), w2, {r, c}, left(c));
      });
      return;
    }
    Value zeros = k.constLike(k.vf32(), 0.0);
    auto selSum = [&](function_ref<Value(Value)> term) {
      return k.sum(sumSelChunks(
          k, selPad, zeros, [&](Value c) { return term(k.vload(sel, {c})); }));
    };
    Value v0, sum, denseMax, denseSum;
    if (!logits) {
      sum = k.splat(selSum([](Value v) { return v; }), lanes);
    } else if (renormalize) {
      // Softmax over the selection: its max is the first pick.
      v0 = k.splat(k.load(sel, {k.idx(0)}), lanes);
      sum = k.splat(selSum([&](Value v) { return k.exp(k.fsub(v, v0)); }),
                    lanes);
    } else {
      // Softmax over the whole row, read at the selection.
      Value negInf = k.negInfLike(k.vf32());
      Value numRowChunks = k.ceilDiv(numExperts, k.idx(lanes));
      auto rowChunk = [&](Value c) {
        Value base = k.mul(c, k.idx(lanes));
        return k.vloadMasked(s2, {r, base}, k.sub(numExperts, base),
                             -std::numeric_limits<double>::infinity());
      };
      Value max =
          k.maxf(k.forLoop(k.idx(0), numRowChunks, k.idx(1), ValueRange{negInf},
                           [&](Value c, ValueRange acc) -> SmallVector<Value> {
                             return {k.fmax(acc[0], rowChunk(c))};
                           })[0]);
      denseMax = k.splat(max, lanes);
      denseSum = k.splat(
          k.sum(k.forLoop(k.idx(0), numRowChunks, k.idx(1), ValueRange{zeros},
                          [&](Value c, ValueRange acc) -> SmallVector<Value> {
                            return {k.fadd(
                                acc[0], k.exp(k.fsub(rowChunk(c), denseMax)))};
                          })[0]),
          lanes);
    }
    eachSelChunk(k, selPad, [&](Value c) {
      Value w =
          topkWeight(k, spec, k.vload(sel, {c}), v0, sum, denseMax, denseSum);
      k.vstoreMasked(w, w2, {r, c}, left(c));
    });
  }
};
} // namespace

void mlir::moe::cpu::populateTopkRenormKernel(RewritePatternSet &p,
                                              const KernelOptions &o) {
  p.add<TopkRenormKernel>(p.getContext(), o);
}
