//===- TopkRenorm.cpp - moe.topk_renorm -> fast CPU kernel ----------------===//
//
// Part of the MoE-MLIR project.
//
// Rows (tokens) are independent: blocks of 32 rows go to the workers. Per
// row, every score becomes an i64 candidate (ordered key << 32 | 2^31-1-index,
// the one order of MoE/Kernels/TopK.h), so that the dialect's order (NaN first,
// then larger values, then the lower index) is a plain signed integer order.
// Each of the k rounds is a vectorized max over the candidates that rank
// strictly after the previous pick (vector<8xi64>, one AVX-512 register), which
// skips exactly the elements already taken, as the portable lowering's rounds
// do. The weights are vector<16xf32> epilogues over the k selected values
// (kernels::topkWeight), unrolled for k <= 64 and a loop beyond.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "MoE/IR/MoEOps.h"
#include "MoE/Kernels/TopK.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu;
using namespace mlir::moe::kernels;

namespace {
constexpr int64_t kCandLanes = 8;
constexpr int64_t kRowsPerItem = 32;
/// Selections of up to this many 16-lane chunks (k <= 64) have their epilogue
/// unrolled (no loop overhead in the common k <= 8); larger ones loop, so that
/// the IR, and the compile time, do not grow with k.
constexpr int64_t kUnrolledSelChunks = 4;

/// Runs `body(offset)` for the offsets 0, 16, ... < selPad of the selection.
void eachSelChunk(CK &k, int64_t selPad, function_ref<void(Value)> body) {
  if (selPad / kLanes <= kUnrolledSelChunks) {
    for (int64_t c = 0; c < selPad; c += kLanes)
      body(k.idx(c));
    return;
  }
  k.forLoop(k.idx(0), k.idx(selPad), k.idx(kLanes), body);
}

/// init + Σ term(offset) over the chunks of the selection, in chunk order.
Value sumSelChunks(CK &k, int64_t selPad, Value init,
                   function_ref<Value(Value)> term) {
  if (selPad / kLanes <= kUnrolledSelChunks) {
    Value acc = init;
    for (int64_t c = 0; c < selPad; c += kLanes)
      acc = k.fadd(acc, term(k.idx(c)));
    return acc;
  }
  return k.forLoop(k.idx(0), k.idx(selPad), k.idx(kLanes), ValueRange{init},
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
    CK k(b);
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
    Value numChunks = k.ceilDiv(numExperts, k.idx(kCandLanes));
    int64_t selPad = (topk + kLanes - 1) / kLanes * kLanes;
    Value numExpertsI32 = k.castInt(numExperts, i32);
    double selFill = logits ? -std::numeric_limits<double>::infinity() : 0.0;

    Value candAll =
        k.scratch(opts, MemRefType::get({ShapedType::kDynamic}, i64),
                  {k.mul(numChunks, k.idx(kCandLanes))});
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
    k.workers(opts, k.ceilDiv(numRows, k.idx(kRowsPerItem)), body);

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

  static void emitRow(CK &k, Value r, Value s2, Value w2, Value i2, Value cand,
                      Value sel, Value numExperts, Value numExpertsI32,
                      Value numChunks, int64_t topk, int64_t selPad,
                      double selFill, bool logits, bool renormalize) {
    Type i64 = k.i64();
    auto candType = VectorType::get({kCandLanes}, i64);
    Value none = noCandidate(k, candType);
    // Candidates of the row (padding lanes: below everything).
    k.forLoop(k.idx(0), numChunks, k.idx(1), [&](Value c) {
      Value base = k.mul(c, k.idx(kCandLanes));
      Value x = k.vloadMasked(s2, {r, base}, k.sub(numExperts, base), 0.0,
                              kCandLanes);
      Value lanes = k.iota(k.castInt(base, k.i32()), kCandLanes);
      Value packed = packCandidate(k, orderedKey(k, x), lanes);
      Value inRow = k.cmpi(arith::CmpIPredicate::slt, lanes,
                           k.splat(numExpertsI32, kCandLanes));
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

    // Weights (kernels::topkWeight, the GPU's epilogue on 16 lanes).
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
      sum = k.splat(selSum([](Value v) { return v; }), kLanes);
    } else if (renormalize) {
      // Softmax over the selection: its max is the first pick.
      v0 = k.splat(k.load(sel, {k.idx(0)}), kLanes);
      sum = k.splat(selSum([&](Value v) { return k.exp(k.fsub(v, v0)); }),
                    kLanes);
    } else {
      // Softmax over the whole row, read at the selection.
      Value negInf = k.negInfLike(k.vf32());
      Value numRowChunks = k.ceilDiv(numExperts, k.idx(kLanes));
      auto rowChunk = [&](Value c) {
        Value base = k.mul(c, k.idx(kLanes));
        return k.vloadMasked(s2, {r, base}, k.sub(numExperts, base),
                             -std::numeric_limits<double>::infinity());
      };
      Value max =
          k.maxf(k.forLoop(k.idx(0), numRowChunks, k.idx(1), ValueRange{negInf},
                           [&](Value c, ValueRange acc) -> SmallVector<Value> {
                             return {k.fmax(acc[0], rowChunk(c))};
                           })[0]);
      denseMax = k.splat(max, kLanes);
      denseSum = k.splat(
          k.sum(k.forLoop(k.idx(0), numRowChunks, k.idx(1), ValueRange{zeros},
                          [&](Value c, ValueRange acc) -> SmallVector<Value> {
                            return {k.fadd(
                                acc[0], k.exp(k.fsub(rowChunk(c), denseMax)))};
                          })[0]),
          kLanes);
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
