//===- Route.cpp - moe.route -> fast CPU kernel ---------------------------===//
//
// Part of the MoE-MLIR project.
//
// Rows (tokens) are independent: blocks of 32 rows go to the workers. Per row:
//
// 1. scores s (softmax / sigmoid) as vector<16xf32> passes over the row with
//    the polynomial exp (softmax: max, Σ exp, divide; a row of -inf scores 0);
// 2. candidates of the choice scores c = s + bias (or the raw logits for
//    topk_then_score) as vector<8xi64> (ordered key << 32 | 2^31-1-index: the
//    one order of MoE/Kernels/TopK.h, so NaN first, then larger values, then
//    the lower index is a plain signed max);
// 3. groups: each group's best one or two candidates by masked vector maxes,
//    its score (their f32 sum, or the best), the topk_group best groups as
//    rounds of a scalar max over the G group candidates, and the candidates of
//    the other groups overwritten by "none" (below every candidate: the kept
//    experts always number at least k, so none of those is ever chosen);
// 4. k rounds of a vector max over the candidates strictly below the previous
//    pick (as moe.topk_renorm's kernel), each reading the weight's source value
//    (s, or the raw logit for topk_then_score);
// 5. the weights over the k picks (scalar: k is small): the post-selection
//    scoring, renormalization (a zero sum gives zeros) and scaling.
//
//===----------------------------------------------------------------------===//

#include "Route.h"
#include "Kernels.h"

#include "MoE/Kernels/Route.h"
#include "MoE/Kernels/TopK.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu {
using namespace kernels;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

/// One row's kernel (the steps of the file header).
class RouteRow {
public:
  RouteRow(CpuKernelBuilder &k, const RouteSpec &spec, Value x, Value bias,
           Value w, Value idx)
      : k(k), spec(spec), x(x), bias(bias), w(w), idx(idx),
        kCandLanes(k.candidateLanes()) {
    // Where the choice scores and the weights come from: the logits
    // themselves, or the scores computed in step 1.
    fromLogits = spec.fromLogits();
    numExperts = k.dim(x, 1);
    numExpertsI32 = k.castInt(numExperts, k.i32());
    candType = VectorType::get({kCandLanes}, k.i64());
    none = noCandidate(k, candType);
  }

  void emit(Value r, Value s, Value cand, Value sel, Value groupCand,
            Value groupKept) {
    if (!fromLogits)
      emitScores(r, s);
    emitCandidates(r, s, cand);
    if (spec.groups > 1)
      emitGroups(cand, groupCand, groupKept);
    emitRounds(r, s, cand, sel);
    emitWeights(r, sel);
  }

private:
  CpuKernelBuilder &k;
  const RouteSpec &spec;
  Value x, bias, w, idx;
  /// Lanes of the candidate chunks (bestCandidateBelow's).
  const int64_t kCandLanes;
  bool fromLogits;
  Value numExperts, numExpertsI32, none;
  VectorType candType;

  Value negInf() { return k.negInfLike(k.vf32()); }

  /// Lanes [base, base + n) of the logits row r, `pad` past E.
  Value logitChunk(Value r, Value base, double pad, int64_t n = kLanes) {
    return k.vloadMasked(x, {r, base}, k.sub(numExperts, base), pad, n);
  }

  /// Runs body(c, base) over the 16-lane chunks of the row.
  void eachChunk(function_ref<void(Value base)> body) {
    Value n = k.ceilDiv(numExperts, k.idx(kLanes));
    k.forLoop(k.idx(0), n, k.idx(1),
              [&](Value c) { body(k.mul(c, k.idx(kLanes))); });
  }

  /// Step 1: s[0, E) = softmax(x) or sigmoid(x) (pad lanes are scratch).
  void emitScores(Value r, Value s) {
    Value zero = k.constLike(k.vf32(), 0.0);
    if (spec.scoring == RouteSpec::Scoring::Sigmoid) {
      eachChunk([&](Value base) {
        k.vstore(sigmoid(k, logitChunk(r, base, 0.0)), s, {base});
      });
      return;
    }
    // Softmax: the max propagates NaN (a NaN row scores NaN everywhere); a
    // row of -inf (max = -inf) scores 0, never NaN.
    Value n = k.ceilDiv(numExperts, k.idx(kLanes));
    Value max = k.maxf(
        k.forLoop(k.idx(0), n, k.idx(1), ValueRange{negInf()},
                  [&](Value c, ValueRange acc) -> SmallVector<Value> {
                    Value base = k.mul(c, k.idx(kLanes));
                    return {k.fmax(acc[0], logitChunk(r, base, -kInf))};
                  })[0]);
    Value maxV = k.splat(max, kLanes);
    Value sum = k.sum(
        k.forLoop(k.idx(0), n, k.idx(1), ValueRange{zero},
                  [&](Value c, ValueRange acc) -> SmallVector<Value> {
                    Value base = k.mul(c, k.idx(kLanes));
                    Value e = k.exp(k.fsub(logitChunk(r, base, -kInf), maxV));
                    k.vstore(e, s, {base});
                    return {k.fadd(acc[0], e)};
                  })[0]);
    Value sumV = k.splat(sum, kLanes);
    eachChunk([&](Value base) {
      k.vstore(softmaxScore(k, k.vload(s, {base}), maxV, sumV), s, {base});
    });
  }

  /// Step 2: the packed candidates of c = (s or x) + bias; lanes past E are
  /// "none".
  void emitCandidates(Value r, Value s, Value cand) {
    Value n = k.ceilDiv(numExperts, k.idx(kCandLanes));
    k.forLoop(k.idx(0), n, k.idx(1), [&](Value c) {
      Value base = k.mul(c, k.idx(kCandLanes));
      Value count = k.sub(numExperts, base);
      Value v = fromLogits ? logitChunk(r, base, 0.0, kCandLanes)
                           : k.vloadMasked(s, {base}, count, 0.0, kCandLanes);
      if (bias)
        v = k.fadd(v, k.vloadMasked(bias, {base}, count, 0.0, kCandLanes));
      Value lanes = k.iota(k.castInt(base, k.i32()), kCandLanes);
      Value packed = packCandidate(k, orderedKey(k, v), lanes);
      Value inRow = k.lt(lanes, k.splat(numExpertsI32, kCandLanes));
      k.vstore(k.select(inRow, packed, none), cand, {base});
    });
  }

  /// The best candidate of [lo, hi) ranking strictly below `prev` (i64).
  Value bestInRange(Value cand, Value lo, Value hi, Value prev) {
    Value lo32 = k.splat(k.castInt(lo, k.i32()), kCandLanes);
    Value hi32 = k.splat(k.castInt(hi, k.i32()), kCandLanes);
    return bestCandidateBelow(
        k, cand, k.divu(lo, k.idx(kCandLanes)),
        k.ceilDiv(hi, k.idx(kCandLanes)), prev, [&](Value base) {
          Value lanes = k.iota(k.castInt(base, k.i32()), kCandLanes);
          return k.andI(k.cmpi(arith::CmpIPredicate::sge, lanes, lo32),
                        k.lt(lanes, hi32));
        });
  }

  /// Step 3: keep the topk_group best groups.
  void emitGroups(Value cand, Value groupCand, Value groupKept) {
    int64_t groups = spec.groups;
    Value groupSize = k.divu(numExperts, k.idx(groups));
    Value top = k.cI64(std::numeric_limits<int64_t>::max());
    k.forLoop(k.idx(0), k.idx(groups), k.idx(1), [&](Value g) {
      Value lo = k.mul(g, groupSize), hi = k.add(lo, groupSize);
      Value first = bestInRange(cand, lo, hi, top);
      Value score = keyToFloat(k, candidateKey(k, first));
      if (spec.top2) {
        Value second = bestInRange(cand, lo, hi, first);
        score = k.fadd(score, keyToFloat(k, candidateKey(k, second)));
      }
      k.store(packCandidate(k, orderedKey(k, score), g), groupCand, {g});
      k.store(k.cI32(0), groupKept, {g});
    });
    Value noneScalar = noCandidate(k, k.i64());
    k.forLoop(
        k.idx(0), k.idx(spec.topkGroup), k.idx(1), ValueRange{top},
        [&](Value, ValueRange prev) -> SmallVector<Value> {
          Value best = k.forLoop(
              k.idx(0), k.idx(groups), k.idx(1), ValueRange{noneScalar},
              [&](Value g, ValueRange acc) -> SmallVector<Value> {
                Value v = k.load(groupCand, {g});
                return {kernels::bestBelow(k, acc[0], v, prev[0], noneScalar)};
              })[0];
          Value g = k.castInt(candidateIndex(k, best), k.index());
          k.store(k.cI32(1), groupKept, {g});
          return {best};
        });
    k.forLoop(k.idx(0), k.idx(groups), k.idx(1), [&](Value g) {
      Value dropped = k.eq(k.load(groupKept, {g}), k.cI32(0));
      k.ifThen(dropped, [&] {
        Value lo = k.mul(g, groupSize), hi = k.add(lo, groupSize);
        Value lo32 = k.splat(k.castInt(lo, k.i32()), kCandLanes);
        Value hi32 = k.splat(k.castInt(hi, k.i32()), kCandLanes);
        k.forLoop(k.divu(lo, k.idx(kCandLanes)),
                  k.ceilDiv(hi, k.idx(kCandLanes)), k.idx(1), [&](Value c) {
                    Value base = k.mul(c, k.idx(kCandLanes));
                    Value lanes =
                        k.iota(k.castInt(base, k.i32()), kCandLanes);
                    Value in = k.andI(
                        k.cmpi(arith::CmpIPredicate::sge, lanes, lo32),
                        k.lt(lanes, hi32));
                    Value v = k.vload(cand, {base}, kCandLanes);
                    k.vstore(k.select(in, none, v), cand, {base});
                  });
      });
    });
  }

  /// Step 4: k rounds; sel[j] = the weight source of pick j.
  void emitRounds(Value r, Value s, Value cand, Value sel) {
    Value numChunks = k.ceilDiv(numExperts, k.idx(kCandLanes));
    k.forLoop(k.idx(0), k.idx(spec.k), k.idx(1),
              ValueRange{k.cI64(std::numeric_limits<int64_t>::max())},
              [&](Value j, ValueRange it) -> SmallVector<Value> {
                Value pick =
                    bestCandidateBelow(k, cand, k.idx(0), numChunks, it[0]);
                Value index = candidateIndex(k, pick);
                Value e = k.castInt(index, k.index());
                Value value = fromLogits ? k.loadF(x, {r, e}) : k.load(s, {e});
                k.store(index, idx, {r, j});
                k.store(value, sel, {j});
                return {pick};
              });
  }

  /// Σ_j f(sel[j]) in pick order.
  Value sumSel(Value sel, function_ref<Value(Value)> f) {
    return k.forLoop(k.idx(0), k.idx(spec.k), k.idx(1), ValueRange{k.cF32(0.0)},
                     [&](Value j, ValueRange acc) -> SmallVector<Value> {
                       return {k.fadd(acc[0], f(k.load(sel, {j})))};
                     })[0];
  }

  /// Rewrites sel[j] = f(sel[j]).
  void mapSel(Value sel, function_ref<Value(Value)> f) {
    k.forLoop(k.idx(0), k.idx(spec.k), k.idx(1),
              [&](Value j) { k.store(f(k.load(sel, {j})), sel, {j}); });
  }

  /// Step 5: scoring after the top-k, renormalization, scaling (the shared
  /// formulas of MoE/Kernels/Route.h; sums in pick order).
  void emitWeights(Value r, Value sel) {
    Value selMax, selSum;
    if (!spec.scoreFirst && spec.scoring == RouteSpec::Scoring::Softmax) {
      selMax = k.forLoop(k.idx(0), k.idx(spec.k), k.idx(1),
                         ValueRange{k.negInfLike(k.f32())},
                         [&](Value j, ValueRange acc) -> SmallVector<Value> {
                           return {k.fmax(acc[0], k.load(sel, {j}))};
                         })[0];
      selSum = sumSel(sel, [&](Value v) { return k.exp(k.fsub(v, selMax)); });
    }
    if (!spec.scoreFirst)
      mapSel(sel, [&](Value v) {
        return routeSelectedScore(k, spec, v, selMax, selSum);
      });
    Value wSum;
    if (spec.renormalize)
      wSum = sumSel(sel, [](Value v) { return v; });
    k.forLoop(k.idx(0), k.idx(spec.k), k.idx(1), [&](Value j) {
      k.store(routeWeight(k, spec, k.load(sel, {j}), wSum), w, {r, j});
    });
  }
};

struct RouteKernel : KernelPattern<RouteOp, /*TargetLanes=*/false> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(RouteOp op, CpuKernelBuilder &k,
                     PatternRewriter &rw) const override {
    KernelScope kernel(k, {op.getLogits(), op.getBias()},
                       KernelScope::outsOf(op, routeResultSizes(k, op)));
    emitRouteKernel(k, opts, op, kernel.out(0), kernel.out(1));
    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

SmallVector<SmallVector<Value>> routeResultSizes(CpuKernelBuilder &k,
                                                 RouteOp op) {
  SmallVector<Value> sizes = {k.sizes(op.getLogits())[0], k.idx(op.getK())};
  return {sizes, sizes};
}

void emitRouteKernel(CpuKernelBuilder &k, const KernelOptions &opts, RouteOp op,
                     Value wBuf, Value iBuf,
                     function_ref<void(Value)> itemBegin,
                     function_ref<void(Value, Value, Value)> rowEnd) {
  Type f32 = k.f32(), i32 = k.i32(), i64 = k.i64();
  RouteSpec spec = routeSpecOf(op);
  Value x = k.buffer(op.getLogits());
  Value bias = op.getBias() ? k.buffer(op.getBias()) : Value();
  Value numRows = k.dim(x, 0), numExperts = k.dim(x, 1);

  // Per-worker scratch: scores (16-lane chunks), candidates (8-lane chunks),
  // the k weight sources, the group candidates and kept flags.
  Value sAll = k.scratch(opts, MemRefType::get({kDyn}, f32),
                         {roundUp(k, numExperts, kLanes)});
  Value candAll = k.scratch(opts, MemRefType::get({kDyn}, i64),
                            {roundUp(k, numExperts, k.candidateLanes())});
  Value selAll = k.scratch(opts, MemRefType::get({spec.k}, f32), {});
  int64_t groups = spec.groups;
  Value gCandAll, gKeptAll;
  if (groups > 1) {
    gCandAll = k.scratch(opts, MemRefType::get({groups}, i64), {});
    gKeptAll = k.scratch(opts, MemRefType::get({groups}, i32), {});
  }
  RouteRow row(k, spec, x, bias, wBuf, iBuf);
  k.workers(
      opts, k.ceilDiv(numRows, k.idx(kRouteRowsPerItem)),
      [&](Value item, Value worker) {
        Value s = k.workerSlice(sAll, worker);
        Value cand = k.workerSlice(candAll, worker);
        Value sel = k.workerSlice(selAll, worker);
        Value gCand = gCandAll ? k.workerSlice(gCandAll, worker) : Value();
        Value gKept = gKeptAll ? k.workerSlice(gKeptAll, worker) : Value();
        if (itemBegin)
          itemBegin(item);
        Value r0 = k.mul(item, k.idx(kRouteRowsPerItem));
        Value r1 = k.mins(k.add(r0, k.idx(kRouteRowsPerItem)), numRows);
        k.forLoop(r0, r1, k.idx(1), [&](Value r) {
          row.emit(r, s, cand, sel, gCand, gKept);
          if (rowEnd)
            rowEnd(r, item, iBuf);
        });
      });
}

MOE_CPU_KERNEL_POPULATE(populateRouteKernel, RouteKernel)

} // namespace mlir::moe::cpu
