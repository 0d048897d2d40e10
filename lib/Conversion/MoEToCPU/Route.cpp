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
//    scoring, renormalization (a zero sum gives zeros) and scaling; softmax
//    scores renormalized (RouteSpec::weighsPickedTerms) instead from the k
//    picked logits in the lanes of one vector: exp(x - m) over their sum.
//
// With `replay` (the choice given: routing replay, hash routing) steps 2-4
// are one pass over the row's given indices, each checked against E before
// the kernel (checkRouteReplay) and read as expert 0 when outside [0, E).
// Step 1 then computes only what the weights read: an elementwise score at
// the k given experts, and for renormalized softmax scores the row's max (a
// pass of maxima over E: E comparisons and k exponentials, where the
// row's softmax takes E exponentials). The router's own choice replayed
// gets its weights bit for bit: both weigh the same lanes the same way.
//
// Few experts (E a power of two <= 16, k <= 8), no groups or replay, and a
// sigmoid (either order), a custom score taken before the selection, or none:
// one row per lane instead (RowLanes.h), every step above lane-wise on
// vectors of the target's width, with the per-row path's operations in its
// order, so that a row gets the same bits in either path (a block's rows here, the rows past the last full
// block on the per-row path). A row of 16 experts is a vector or two: per row
// the candidates' packing, k vector maxima and scalar stores were most of its
// time, which the lanes do as compares and selects shared by 8-16 rows.
//
// The maths of every step is MoE/Kernels/Route.h's (routeScore, routeChoice,
// routeGroupCandidate, routeKeepGroups, routeRounds, routeWeights), shared
// with the GPU kernel; this file holds the vector chunks and the scratch.
//
//===----------------------------------------------------------------------===//

#include "Route.h"
#include "Lowerings.h"
#include "RowLanes.h"

#include "MoE/Kernels/Route.h"
#include "MoE/Kernels/TopK.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <limits>

namespace mlir::moe::cpu_lowering {
using namespace kernels;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

/// One row's kernel (the steps of the file header).
class RouteRow {
public:
  RouteRow(CpuKernelBuilder &kb, const RouteSpec &spec, Value x, Value bias,
           Value replay, Value w, Value idx)
      : kb(kb), spec(spec), x(x), bias(bias), replay(replay), w(w), idx(idx),
        kCandLanes(kb.candidateLanes()) {
    // Where the choice scores and the weights come from: the logits
    // themselves, or the scores computed in step 1.
    fromLogits = spec.fromLogits();
    pickedTerms = spec.weighsPickedTerms() && spec.k <= kLanes;
    numExperts = kb.dim(x, 1);
    numExpertsI32 = kb.castInt(numExperts, kb.i32());
    candType = VectorType::get({kCandLanes}, kb.i64());
    none = noCandidate(kb, candType);
  }

  void emit(Value r, Value s, Value cand, Value sel, Value groupCand,
            Value groupKept) {
    if (replay && pickedTerms) {
      // The normaliser cancels: the row's max is all the weights read of it.
      Value rowMax = emitRowMax(r);
      Value numExperts64 = kb.castInt(numExperts, kb.i64());
      emitPickedSoftmaxWeights(r, rowMax, pickedLogits(r, -kInf, [&](Value j) {
                                 return storeReplayPick(r, j, numExperts64);
                               }));
      return;
    }
    if (replay) {
      // Only a softmax needs the whole row; an elementwise score is computed
      // at the k given experts.
      if (!fromLogits && spec.scoring == RouteSpec::Scoring::Softmax)
        emitScores(r, s);
      emitReplay(r, s, sel);
      emitWeights(r, sel);
      return;
    }
    Value rowMax = fromLogits ? Value() : emitScores(r, s);
    emitCandidates(r, s, cand);
    if (spec.groups > 1)
      emitGroups(cand, groupCand, groupKept);
    emitRounds(r, s, cand, sel);
    if (pickedTerms)
      emitPickedSoftmaxWeights(r, rowMax, pickedLogits(r, -kInf, [&](Value j) {
                                 return kb.load(idx, {r, j});
                               }));
    else
      emitWeights(r, sel);
  }

  /// Whether the row keeps scores and weight sources in scratch (a replayed
  /// renormalized softmax keeps its picks in registers).
  bool usesScratch() const { return !(replay && pickedTerms); }

private:
  CpuKernelBuilder &kb;
  const RouteSpec &spec;
  Value x, bias, replay, w, idx;
  /// Lanes of the candidate chunks (bestCandidateBelow's).
  const int64_t kCandLanes;
  bool fromLogits;
  /// Step 5 from the picks' softmax terms, in the lanes of one vector.
  bool pickedTerms;
  Value numExperts, numExpertsI32, none;
  VectorType candType;

  /// Lanes [base, base + n) of the logits row r, `pad` past E.
  Value logitChunk(Value r, Value base, double pad, int64_t n = kLanes) {
    return kb.vloadMasked(x, {r, base}, kb.sub(numExperts, base), pad, n);
  }

  /// Runs body(c, base) over the 16-lane chunks of the row.
  void eachChunk(function_ref<void(Value base)> body) {
    Value n = kb.ceilDiv(numExperts, kb.idx(kLanes));
    kb.forLoop(kb.idx(0), n, kb.idx(1),
              [&](Value c) { body(kb.mul(c, kb.idx(kLanes))); });
  }

  /// Step 1: s[0, E) = softmax(x), sigmoid(x) or the custom score region's
  /// f(x) on the chunk's vector (pad lanes are scratch). Returns the row's
  /// max for a softmax (null otherwise).
  Value emitScores(Value r, Value s) {
    if (spec.scoring != RouteSpec::Scoring::Softmax) {
      eachChunk([&](Value base) {
        kb.vstore(routeElementwiseScore(kb, spec, logitChunk(r, base, 0.0)), s,
                  {base});
      });
      return Value();
    }
    // Softmax (RowSoftmax.h): the terms exp(x - max) kept in s, then each
    // divided by the row's sum.
    Value n = kb.ceilDiv(numExperts, kb.idx(kLanes));
    auto chunkBase = [&](Value c) { return kb.mul(c, kb.idx(kLanes)); };
    RowSoftmaxStats stats = rowSoftmaxStatsLoop(
        kb, kb.vf32(), kb.idx(0), n, kb.idx(1),
        [&](Value c) { return logitChunk(r, chunkBase(c), -kInf); },
        [&](Value v) { return kb.maxf(v); }, [&](Value v) { return kb.sum(v); },
        [&](Value c, Value e) { kb.vstore(e, s, {chunkBase(c)}); });
    Value sumV = kb.splat(stats.sum, kLanes);
    eachChunk([&](Value base) {
      kb.vstore(softmaxScore(kb, kb.vload(s, {base}), stats.maxShaped, sumV), s,
               {base});
    });
    return stats.max;
  }

  /// The row's max alone (NaN-propagating; -inf for a row of -inf): the
  /// first pass of step 1's softmax, the same chunks and folds.
  Value emitRowMax(Value r) {
    Value n = kb.ceilDiv(numExperts, kb.idx(kLanes));
    return rowMaxLoop(
        kb, kb.vf32(kLanes), kb.idx(0), n, kb.idx(1),
        [&](Value c) {
          return logitChunk(r, kb.mul(c, kb.idx(kLanes)), -kInf);
        },
        [&](Value v) { return kb.maxf(v); });
  }

  /// Step 2: the packed candidates of c = (s or x) + bias; lanes past E are
  /// "none".
  void emitCandidates(Value r, Value s, Value cand) {
    Value n = kb.ceilDiv(numExperts, kb.idx(kCandLanes));
    kb.forLoop(kb.idx(0), n, kb.idx(1), [&](Value c) {
      Value base = kb.mul(c, kb.idx(kCandLanes));
      Value count = kb.sub(numExperts, base);
      Value score = fromLogits
                        ? logitChunk(r, base, 0.0, kCandLanes)
                        : kb.vloadMasked(s, {base}, count, 0.0, kCandLanes);
      Value b = bias ? kb.vloadMasked(bias, {base}, count, 0.0, kCandLanes)
                     : Value();
      Value v = routeChoice(kb, score, b);
      Value lanes = kb.iota(kb.castInt(base, kb.i32()), kCandLanes);
      Value packed = packCandidate(kb, orderedKey(kb, v), lanes);
      Value inRow = kb.lt(lanes, kb.splat(numExpertsI32, kCandLanes));
      kb.vstore(kb.select(inRow, packed, none), cand, {base});
    });
  }

  /// The best candidate of [lo, hi) ranking strictly below `prev` (i64).
  Value bestInRange(Value cand, Value lo, Value hi, Value prev) {
    Value lo32 = kb.splat(kb.castInt(lo, kb.i32()), kCandLanes);
    Value hi32 = kb.splat(kb.castInt(hi, kb.i32()), kCandLanes);
    return bestCandidateBelow(
        kb, cand, kb.divu(lo, kb.idx(kCandLanes)),
        kb.ceilDiv(hi, kb.idx(kCandLanes)), prev, [&](Value base) {
          Value lanes = kb.iota(kb.castInt(base, kb.i32()), kCandLanes);
          return kb.andI(kb.cmpi(arith::CmpIPredicate::sge, lanes, lo32),
                        kb.lt(lanes, hi32));
        });
  }

  /// Step 3: keep the topk_group best groups.
  void emitGroups(Value cand, Value groupCand, Value groupKept) {
    int64_t groups = spec.groups;
    Value groupSize = kb.divu(numExperts, kb.idx(groups));
    Value top = kb.cI64(std::numeric_limits<int64_t>::max());
    kb.forLoop(kb.idx(0), kb.idx(groups), kb.idx(1), [&](Value g) {
      Value lo = kb.mul(g, groupSize), hi = kb.add(lo, groupSize);
      Value gc = routeGroupCandidate(kb, spec, g, [&](Value prev) {
        return bestInRange(cand, lo, hi, prev ? prev : top);
      });
      kb.store(gc, groupCand, {g});
      kb.store(kb.cI32(0), groupKept, {g});
    });
    Value noneScalar = noCandidate(kb, kb.i64());
    routeKeepGroups(
        kb, spec, {},
        [&](Value prev) {
          return kb.forLoop(
              kb.idx(0), kb.idx(groups), kb.idx(1), ValueRange{noneScalar},
              [&](Value g, ValueRange acc) -> SmallVector<Value> {
                Value v = kb.load(groupCand, {g});
                return {kernels::bestBelow(kb, acc[0], v, prev, noneScalar)};
              })[0];
        },
        [&](Value best, ValueRange) -> SmallVector<Value> {
          Value g = kb.castInt(candidateIndex(kb, best), kb.index());
          kb.store(kb.cI32(1), groupKept, {g});
          return {};
        });
    kb.forLoop(kb.idx(0), kb.idx(groups), kb.idx(1), [&](Value g) {
      Value dropped = kb.eq(kb.load(groupKept, {g}), kb.cI32(0));
      kb.ifThen(dropped, [&] {
        Value lo = kb.mul(g, groupSize), hi = kb.add(lo, groupSize);
        Value lo32 = kb.splat(kb.castInt(lo, kb.i32()), kCandLanes);
        Value hi32 = kb.splat(kb.castInt(hi, kb.i32()), kCandLanes);
        kb.forLoop(kb.divu(lo, kb.idx(kCandLanes)),
                  kb.ceilDiv(hi, kb.idx(kCandLanes)), kb.idx(1), [&](Value c) {
                    Value base = kb.mul(c, kb.idx(kCandLanes));
                    Value lanes =
                        kb.iota(kb.castInt(base, kb.i32()), kCandLanes);
                    Value in = kb.andI(
                        kb.cmpi(arith::CmpIPredicate::sge, lanes, lo32),
                        kb.lt(lanes, hi32));
                    Value v = kb.vload(cand, {base}, kCandLanes);
                    kb.vstore(kb.select(in, none, v), cand, {base});
                  });
      });
    });
  }

  /// Step 4: k rounds; sel[j] = the weight source of pick j.
  void emitRounds(Value r, Value s, Value cand, Value sel) {
    Value numChunks = kb.ceilDiv(numExperts, kb.idx(kCandLanes));
    routeRounds(
        kb, spec,
        [&](Value prev) {
          return bestCandidateBelow(kb, cand, kb.idx(0), numChunks, prev);
        },
        [&](Value j, Value pick) {
          Value index = candidateIndex(kb, pick);
          Value e = kb.castInt(index, kb.index());
          Value value = fromLogits ? kb.loadF(x, {r, e}) : kb.load(s, {e});
          kb.store(kb.asElementOf(index, idx), idx, {r, j});
          kb.store(value, sel, {j});
        });
  }

  /// Pick j of the given choice: replay[r, j] (expert 0 when outside [0, E):
  /// checkRouteReplay has reported it), stored as index j; returns it (i32).
  Value storeReplayPick(Value r, Value j, Value numExperts64) {
    Value index =
        routeReplayPick(kb, kb.load(replay, {r, j}), numExperts64).expert;
    kb.store(kb.asElementOf(index, idx), idx, {r, j});
    return index;
  }

  /// The k picks' logits in the lanes of one vector (k <= 16: 8 lanes for
  /// k <= 8, else 16), `pad` past k; `expertOf(j)` is pick j's expert (i32).
  Value pickedLogits(Value r, double pad,
                     function_ref<Value(Value j)> expertOf) {
    Value vals = kb.constLike(kb.vf32(spec.k <= 8 ? 8 : kLanes), pad);
    for (int64_t l = 0; l < spec.k; ++l) {
      Value e = kb.castInt(expertOf(kb.idx(l)), kb.index());
      vals = vector::InsertOp::create(kb.b, kb.loadF(x, {r, e}), vals, l);
    }
    return vals;
  }

  /// Step 5 of RouteSpec::weighsPickedTerms: the picks' softmax terms
  /// exp(x - m) (`picked`: their logits in lanes, -inf past k, where the
  /// terms are 0), renormalized over their sum and scaled, to w[r, :].
  void emitPickedSoftmaxWeights(Value r, Value rowMax, Value picked) {
    Value terms = routePickedSoftmaxTerm(kb, picked, rowMax);
    auto lanes = cast<VectorType>(terms.getType()).getNumElements();
    Value sum = kb.splat(kb.sum(terms), lanes);
    Value weights = routeWeight(kb, spec, terms, sum);
    for (int64_t l = 0; l < spec.k; ++l)
      kb.store(vector::ExtractOp::create(kb.b, weights, l), w, {r, kb.idx(l)});
  }

  /// Steps 2-4 with the choice given: pick j is replay[r, j] (0 when
  /// outside [0, E): checkRouteReplay has reported it); sel[j] = its weight
  /// source (the softmax score from step 1, or the logit's elementwise score
  /// computed here).
  void emitReplay(Value r, Value s, Value sel) {
    if (!fromLogits && spec.scoring != RouteSpec::Scoring::Softmax &&
        spec.k <= kLanes) {
      emitReplayInLanes(r, sel);
      return;
    }
    Value numExperts64 = kb.castInt(numExperts, kb.i64());
    kb.forLoop(kb.idx(0), kb.idx(spec.k), kb.idx(1), [&](Value j) {
      Value index =
          routeReplayPick(kb, kb.load(replay, {r, j}), numExperts64).expert;
      Value e = kb.castInt(index, kb.index());
      Value value;
      if (fromLogits)
        value = kb.loadF(x, {r, e});
      else if (spec.scoring == RouteSpec::Scoring::Softmax)
        value = kb.load(s, {e});
      else
        value = routeScore(kb, spec, kb.loadF(x, {r, e}), Value(), Value());
      kb.store(kb.asElementOf(index, idx), idx, {r, j});
      kb.store(value, sel, {j});
    });
  }

  /// The same for an elementwise score and k <= 16 (every router's): the k
  /// given logits in the lanes of one vector, scored by the vector
  /// polynomials of step 1 instead of k scalar libm calls.
  void emitReplayInLanes(Value r, Value sel) {
    Value numExperts64 = kb.castInt(numExperts, kb.i64());
    Value vals = pickedLogits(
        r, 0.0, [&](Value j) { return storeReplayPick(r, j, numExperts64); });
    Value scores = routeScore(kb, spec, vals, Value(), Value());
    for (int64_t l = 0; l < spec.k; ++l)
      kb.store(vector::ExtractOp::create(kb.b, scores, l), sel, {kb.idx(l)});
  }

  /// Step 5 (routeWeights) over the picks in `sel`, one by one in pick
  /// order; the scores after the selection overwrite them.
  void emitWeights(Value r, Value sel) {
    auto load = [&](Value j) { return kb.load(sel, {j}); };
    auto storeWeight = [&](Value j, Value v) { kb.store(v, w, {r, j}); };
    auto storeScore = [&](Value j, Value v) { kb.store(v, sel, {j}); };
    RoutePicks picks{kb.idx(0), kb.idx(1), load, storeWeight, storeScore};
    routeWeights(kb, spec, picks);
  }
};

} // namespace

template <>
LogicalResult CPUKernel<RouteOp>::emit(RouteOp op, CpuKernelBuilder &kb,
                                       PatternRewriter &rw) const {
  if (failed(checkRouteReplay(rw, op)))
    return failure();
  KernelScope kernel(kb, routeInputs(op),
                     KernelScope::outsOf(op, routeResultSizes(kb, op)));
  emitRouteKernel(kb, opts, op, kernel.out(0), kernel.out(1));
  kernel.replace(rw, op);
  return success();
}

SmallVector<Value> routeInputs(RouteOp op) {
  return {op.getLogits(), op.getBias(), op.getReplay()};
}

LogicalResult checkRouteReplay(PatternRewriter &rw, RouteOp op) {
  if (!op.getReplay())
    return success();
  Value numExperts = tensor::DimOp::create(rw, op.getLoc(), op.getLogits(), 1);
  return checkIndexOperand(rw, op, op.getReplay(), numExperts,
                           kMoEErrorRouteReplay);
}

SmallVector<SmallVector<Value>> routeResultSizes(CpuKernelBuilder &kb,
                                                 RouteOp op) {
  SmallVector<Value> sizes = {kb.sizes(op.getLogits())[0], kb.idx(op.getK())};
  return {sizes, sizes};
}

namespace {
/// Whether moe.route's rows run one per lane (the file header): every step
/// is then elementwise on the lanes.
bool routeFitsRowLanes(const RouteSpec &spec, RouteOp op) {
  auto logits = cast<ShapedType>(op.getLogits().getType());
  // One pick of E scores: the scores are most of the row's time either way,
  // and the per-row path's one vector max beats the transposes (E = 16, one
  // thread, the EPYC: 122 us per-row, 139 us a row per lane at T = 4096).
  if (spec.k == 1 && !spec.fromLogits())
    return false;
  // A custom score after the selection: the per-row path scores each pick as
  // a scalar, where math.tanh or math.log become libm calls, the lanes as
  // vectors, where they become polynomials; the two would round apart.
  // (sigmoid is the builder's own polynomial exp on both.)
  if (spec.scoring == RouteSpec::Scoring::Custom && !spec.scoreFirst)
    return false;
  return spec.scoring != RouteSpec::Scoring::Softmax && !op.getReplay() &&
         spec.groups <= 1 && fitsRowLanes(logits.getShape().back(), spec.k);
}

/// Rows [r0, r0 + lanes) of the flat [T * E] logits `x1`, one per lane of
/// `kb` (the target's width): steps 1, 2, 4 and 5 of the file header, written
/// to the flat [T * k] weights `w1` and indices `i1`.
/// `biasCols`: each expert's bias in every lane (empty: no bias), loaded
/// once for all blocks.
void emitRouteLaneBlock(CpuKernelBuilder &kb, const RouteSpec &spec, Value r0,
                        Value x1, ArrayRef<Value> biasCols, Value w1, Value i1,
                        int64_t numExperts) {
  SmallVector<Value> scores = loadColumns(kb, x1, r0, numExperts);
  if (!spec.fromLogits())
    for (Value &s : scores)
      s = routeElementwiseScore(kb, spec, s);
  LaneTopk picks = laneTopk(
      kb, spec.k, numExperts,
      [&](int64_t j) {
        Value b = biasCols.empty() ? Value() : biasCols[j];
        return orderedKey(kb, routeChoice(kb, scores[j], b));
      },
      [&](int64_t j) { return scores[j]; });
  // Step 5 as routeWeights runs it on a row: each pick's score after the
  // selection (topk_then_score: the elementwise score of the picked logit,
  // the same polynomial on a lane as on a scalar; else the source as it is),
  // their sum in pick order from 0, each weight routeWeight of its score.
  SmallVector<Value> picked;
  for (Value v : picks.vals)
    picked.push_back(routeSelectedScore(kb, spec, v, Value(), Value()));
  Value wSum;
  if (spec.renormalize) {
    wSum = kb.constLike(kb.vf32(), 0.0);
    for (Value v : picked)
      wSum = kb.fadd(wSum, v);
  }
  SmallVector<Value> weights;
  for (Value v : picked)
    weights.push_back(routeWeight(kb, spec, v, wSum));
  storeColumns(kb, weights, w1, r0);
  storeColumns(kb, picks.idxs, i1, r0);
}
} // namespace

void emitRouteKernel(CpuKernelBuilder &kb, const KernelOptions &opts, RouteOp op,
                     Value wBuf, Value iBuf,
                     function_ref<void(Value)> itemBegin,
                     function_ref<void(Value, Value, Value)> rowEnd) {
  Type f32 = kb.f32(), i32 = kb.i32(), i64 = kb.i64();
  RouteSpec spec = routeSpecOf(op);
  Value x = kb.buffer(op.getLogits());
  Value bias = op.getBias() ? kb.buffer(op.getBias()) : Value();
  Value replay = op.getReplay() ? kb.buffer(op.getReplay()) : Value();
  Value numRows = kb.dim(x, 0), numExperts = kb.dim(x, 1);

  RouteRow row(kb, spec, x, bias, replay, wBuf, iBuf);
  // The row-per-lane blocks: a builder of the target's lanes (this kernel's
  // per-row vectors are kLanes wide whatever the target).
  CpuKernelBuilder lb(kb.b, opts);
  int64_t laneRows = 0, laneExperts = 0;
  Value x1, w1, i1;
  SmallVector<Value> biasCols;
  if (routeFitsRowLanes(spec, op) && kRouteRowsPerItem % lb.lanes() == 0) {
    laneRows = lb.lanes();
    laneExperts = cast<ShapedType>(op.getLogits().getType()).getShape().back();
    x1 = flatten(kb, x);
    w1 = flatten(kb, wBuf);
    i1 = flatten(kb, iBuf);
    if (bias)
      for (int64_t j = 0; j < laneExperts; ++j)
        biasCols.push_back(lb.splat(lb.loadF(bias, {lb.idx(j)}), laneRows));
  }
  // Per-worker scratch: scores (16-lane chunks), candidates (8-lane chunks),
  // the k weight sources, the group candidates and kept flags.
  // A replayed renormalized softmax keeps its picks in registers
  // (RouteRow::usesScratch); a replayed choice has no candidates or groups.
  Value sAll = row.usesScratch()
                   ? kb.scratch(opts, MemRefType::get({kDyn}, f32),
                                {roundUp(kb, numExperts, kLanes)})
                   : Value();
  Value candAll =
      replay ? Value()
             : kb.scratch(opts, MemRefType::get({kDyn}, i64),
                          {roundUp(kb, numExperts, kb.candidateLanes())});
  Value selAll = row.usesScratch()
                     ? kb.scratch(opts, MemRefType::get({spec.k}, f32), {})
                     : Value();
  int64_t groups = spec.groups;
  Value gCandAll, gKeptAll;
  if (groups > 1 && !replay) {
    gCandAll = kb.scratch(opts, MemRefType::get({groups}, i64), {});
    gKeptAll = kb.scratch(opts, MemRefType::get({groups}, i32), {});
  }
  kb.workers(
      opts, kb.ceilDiv(numRows, kb.idx(kRouteRowsPerItem)),
      [&](Value item, Value worker) {
        Value s = sAll ? kb.workerSlice(sAll, worker) : Value();
        Value cand = candAll ? kb.workerSlice(candAll, worker) : Value();
        Value sel = selAll ? kb.workerSlice(selAll, worker) : Value();
        Value gCand = gCandAll ? kb.workerSlice(gCandAll, worker) : Value();
        Value gKept = gKeptAll ? kb.workerSlice(gKeptAll, worker) : Value();
        if (itemBegin)
          itemBegin(item);
        Value r0 = kb.mul(item, kb.idx(kRouteRowsPerItem));
        Value r1 = kb.mins(kb.add(r0, kb.idx(kRouteRowsPerItem)), numRows);
        if (laneRows) {
          // The item's whole blocks one per lane (an item is whole blocks:
          // kRouteRowsPerItem is a multiple of the lanes), then its rest.
          Value whole =
              kb.add(r0, kb.mul(kb.divu(kb.sub(r1, r0), kb.idx(laneRows)),
                                kb.idx(laneRows)));
          kb.forLoop(r0, whole, kb.idx(laneRows), [&](Value b0) {
            emitRouteLaneBlock(lb, spec, b0, x1, biasCols, w1, i1,
                               laneExperts);
            if (rowEnd)
              kb.forLoop(b0, kb.add(b0, kb.idx(laneRows)), kb.idx(1),
                         [&](Value r) { rowEnd(r, item, iBuf); });
          });
          r0 = whole;
        }
        kb.forLoop(r0, r1, kb.idx(1), [&](Value r) {
          row.emit(r, s, cand, sel, gCand, gKept);
          if (rowEnd)
            rowEnd(r, item, iBuf);
        });
      });
}

} // namespace mlir::moe::cpu_lowering
