//===- Route.cpp - moe.route on the GPU -----------------------------------===//
//
// Part of the MoE-MLIR project.
//
// One group of W = min(32, pow2ceil(E)) lanes per token (several tokens per
// warp for small E, as moe.topk_renorm's register kernel); lane `lane` holds
// the experts m*W + lane, m < ceil(E / W), in registers. Per token:
//
// 1. scores: softmax (a butterfly max and Σ exp over the row) or sigmoid,
//    then the choice values c = s + bias (or the logits + bias for
//    topk_then_score) packed as (ordered key, index) candidates, TopK.h's
//    order: NaN first, larger values, lower index;
// 2. groups (n_group > 1): each group's best one or two candidates by
//    butterfly maxes, its score (their sum, or the best), then the topk_group
//    best groups as a bit mask that every lane computes alike from the same
//    values; candidates of the other groups become "none" (below every
//    candidate: at least k experts are kept, so none is ever chosen). When a
//    group spans whole lane columns (E/G a multiple of W, DeepSeek-V3: 32
//    experts a group, W = 32) its members are known at compile time;
// 3. k rounds: the butterfly max of the candidates strictly below the
//    previous pick; lane j % W stores pick j's index and its weight source,
//    the logit reloaded (L1) and scored again (the same operations on the
//    same value: the score the choice was made on, bit for bit);
// 4. each lane turns its own picks into weights with the shared formulas of
//    MoE/Kernels/Route.h (post-selection score, renormalization, scaling);
//    the selection's max and sums are butterflies over the group.
//
// With `replay` (the choice given) steps 1-3 are the softmax statistics (a
// softmax score only) and one pass of lane j % W over the given index of pick
// j, checked against E (an index outside [0, E) is reported through the error
// word and read as expert 0). Where route-map=lanes routes the shape, its
// kernel replays too (RouteLanes.cpp: the weights of a routing's own choice
// replayed come out bit for bit only from the kernel that made it).
//
// The maths of every step is MoE/Kernels/Route.h's (routeScore, routeChoice,
// routeGroupCandidate, routeKeepGroups, routeRounds, routeWeights), shared
// with the CPU kernel; this file holds the lane layout and the butterflies.
//
// The SGLang/vLLM fused routers (biased_grouped_topk) use the same layout
// idea: one warp per token, the group maxima by warp reductions.
//
// The loop kernel (`route_loop`, past the register kernel's 1024 experts
// where route-map=lanes has no layout: groups needing more than 128 slots a
// lane, more than 4096 experts) takes the same steps with W = 32 and a warp
// a block, but holds nothing in registers: each step is an scf.for over the
// lane's values m that loads the logit (L1) and scores it again, a group's
// members a loop over its range of m, the groups a loop whose candidates lane
// g % 32 keeps for the kept groups' butterfly rounds. No limit on E; a score
// per value and step.
//
// A moe.dispatch_plan of the route's indices (the first in the block, no
// capacity) is lowered here too, in the same host code: its results and
// scratch are allocated before the route kernel, its three kernels
// (DispatchPlan.cpp) launched right after it, so route + plan is one chain
// of four launches with nothing on the host between them (route-map=warp
// and lanes alike).
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Reductions.h"
#include "Lowerings.h"

#include "MoE/Kernels/IndexErrors.h"
#include "MoE/Kernels/Route.h"
#include "MoE/Kernels/RowSoftmax.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

namespace {
/// Largest expert count of the register kernel (32 values per lane); past it
/// the lanes kernel or the loop kernel.
constexpr int64_t kRouteMaxExperts = 1024;
/// Largest n_group: the kept groups are the bits of an i64.
constexpr int64_t kRouteMaxGroups = 64;

/// The kernel of one token per group of `width` lanes (the file header).
class RouteWarpKernel {
public:
  /// `loop`: the lane's values in loops, computed again where a step reads
  /// them, instead of in registers (the loop kernel of the file header).
  RouteWarpKernel(GpuKernelBuilder &kb, const RouteSpec &spec,
                  int64_t numExperts, int64_t width, int64_t blockSize,
                  bool loop = false)
      : kb(kb), spec(spec), numExperts(numExperts), width(width),
        blockSize(blockSize), vpt(llvm::divideCeil(numExperts, width)),
        loop(loop) {}

  void emit(Value x, Value bias, Value weights, Value indices,
            Value replay = Value(), Value word = Value()) {
    this->x = x;
    this->bias = bias;
    RouteTokenLanes t = routeTokenLanes(kb, x, width, blockSize);
    lane = t.lane;
    active = t.active;
    row = t.row;
    none = noCandidate(kb, kb.i64());

    if (replay) {
      // Only a softmax before the choice needs the whole row.
      if (!spec.fromLogits() && spec.scoring == RouteSpec::Scoring::Softmax)
        loop ? loopRowStats() : (void)loadRow();
      replayPicks(replay, word, weights, indices);
      epilogue(weights);
      return;
    }
    if (loop) {
      loopRowStats();
      if (spec.groups > 1)
        loopDropGroups();
      loopRounds(weights, indices);
      epilogue(weights);
      return;
    }
    loadCandidates(bias);
    if (spec.groups > 1)
      dropGroups();
    rounds(weights, indices);
    epilogue(weights);
  }

private:
  GpuKernelBuilder &kb;
  const RouteSpec &spec;
  int64_t numExperts, width, blockSize, vpt;
  bool loop;
  Value x, bias, lane, active, row, none;
  Value rowMax, rowSum;
  /// The loop kernel's kept groups (bits of an i64; null: every group).
  Value keptGroups;
  /// Per value m of this lane: the expert (i32), whether it exists (null when
  /// it always does), the packed candidate.
  SmallVector<Value> expert, inRange, cand;

  Value reduce(Value v, ReduceKind kind) {
    return subgroupReduce(kb, v, kind, width);
  }

  /// Element `col` of `memref` (row `r`, or 1-D when `r` is null) widened to
  /// f32, or `pad` past the last expert.
  Value loadOrPad(Value memref, Value r, int64_t m, double pad) {
    Value col = kb.add(kb.idx(m * width), lane);
    auto at = [&](Value c) {
      return r ? kb.loadF(memref, {r, c}) : kb.loadF(memref, {c});
    };
    if (!inRange[m])
      return at(col);
    Value safe = kb.select(inRange[m], col, kb.idx(numExperts - 1));
    return kb.select(inRange[m], at(safe), kb.cF32(pad));
  }

  /// This lane's logits of the row (-inf past E) and, for a softmax before
  /// the choice, the row's max and Σ exp (rowMax, rowSum).
  SmallVector<Value> loadRow() {
    Value laneI32 = kb.castInt(lane, kb.i32());
    for (int64_t m = 0; m < vpt; ++m) {
      expert.push_back(kb.add(kb.cI32(m * width), laneI32));
      inRange.push_back((m + 1) * width <= numExperts
                            ? Value()
                            : kb.lt(expert.back(), kb.cI32(numExperts)));
    }
    constexpr double kInf = std::numeric_limits<double>::infinity();
    SmallVector<Value> xs;
    for (int64_t m = 0; m < vpt; ++m)
      xs.push_back(loadOrPad(x, row, m, -kInf));
    RowSoftmaxStats stats =
        routeRowStats(kb, spec, xs, [&](Value v, ReduceKind kind) {
          return reduce(v, kind);
        });
    rowMax = stats.max;
    rowSum = stats.sum;
    return xs;
  }

  // The loop kernel: value m of the lane is expert m * W + lane, m < vpt, as
  // in registers, but each step runs a loop over m that loads the logit (L1)
  // and computes its score and candidate again: no limit on E, at the cost
  // of a score per value and step (the groups' two passes, k rounds).

  /// Expert m * W + lane (index), whether it exists, the column read in its
  /// place (the last one past E), and its logit (-inf past E).
  struct LoopValue {
    Value col, inRange, safe, logit;
  };
  LoopValue loopValue(Value m) {
    Value col = kb.add(kb.mul(m, kb.idx(width)), lane);
    Value inRange = kb.lt(col, kb.idx(numExperts));
    Value safe = kb.select(inRange, col, kb.idx(numExperts - 1));
    constexpr double kInf = std::numeric_limits<double>::infinity();
    return {col, inRange, safe,
            kb.select(inRange, kb.loadF(x, {row, safe}), kb.cF32(-kInf))};
  }

  /// The row's softmax statistics where the score needs them (two loops).
  void loopRowStats() {
    if (spec.fromLogits() || spec.scoring != RouteSpec::Scoring::Softmax)
      return;
    RowSoftmaxStats stats = rowSoftmaxStatsLoop(
        kb, kb.f32(), kb.idx(0), kb.idx(vpt), kb.idx(1),
        [&](Value m) { return loopValue(m).logit; },
        [&](Value v) { return reduce(v, ReduceKind::Max); },
        [&](Value v) { return reduce(v, ReduceKind::Sum); });
    rowMax = stats.max;
    rowSum = stats.sum;
  }

  /// Value m's packed candidate (none past E, outside `member` where given,
  /// or in a dropped group).
  Value loopCandidate(Value m, function_ref<Value(Value col)> member) {
    LoopValue v = loopValue(m);
    Value score = routeScore(kb, spec, v.logit, rowMax, rowSum);
    Value b;
    if (bias)
      b = kb.select(v.inRange, kb.loadF(bias, {v.safe}), kb.cF32(0.0));
    Value expertI32 = kb.castInt(v.col, kb.i32());
    Value packed =
        packCandidate(kb, orderedKey(kb, routeChoice(kb, score, b)), expertI32);
    Value keep = v.inRange;
    if (member)
      keep = kb.andI(keep, member(v.col));
    if (keptGroups) {
      Value g = kb.extu(kb.divu(expertI32, kb.cI32(numExperts / spec.groups)),
                        kb.i64());
      Value bit = kb.andI(kb.shru(keptGroups, g), kb.cI64(1));
      keep = kb.andI(keep, kb.notI1(kb.eq(bit, kb.cI64(0))));
    }
    return kb.select(keep, packed, none);
  }

  /// The best candidate of values [lo, hi) ranking strictly below `prev`
  /// (null: the best) and passing `member` (null: all), over the token.
  Value loopBestBelow(Value lo, Value hi, Value prev,
                      function_ref<Value(Value col)> member = nullptr) {
    Value best = kb.forLoop(
        lo, hi, kb.idx(1), {none},
        [&](Value m, ValueRange acc) -> SmallVector<Value> {
          Value c = loopCandidate(m, member);
          return {prev ? bestBelow(kb, acc[0], c, prev, none)
                       : kb.maxs(acc[0], c)};
        })[0];
    return reduce(best, ReduceKind::MaxI64);
  }

  /// Step 2: keep the topk_group best groups (keptGroups); group g's values
  /// are those of its experts [g S, (g + 1) S), m in [g S / W, (g + 1) S / W].
  /// The groups are a loop too: lane g % W keeps group g's candidate (two a
  /// lane at 64 groups, where the register kernel's every lane holds all: 128
  /// registers, spilled), and a round of the kept groups is a butterfly over
  /// the lanes' best.
  void loopDropGroups() {
    int64_t groups = spec.groups, groupSize = numExperts / groups;
    Value S = kb.idx(groupSize), W = kb.idx(width);
    SmallVector<Value> init(llvm::divideCeil(groups, width), none);
    SmallVector<Value> held = kb.forLoop(
        kb.idx(0), kb.idx(groups), kb.idx(1), init,
        [&](Value g, ValueRange h) -> SmallVector<Value> {
          Value first = kb.mul(g, S), end = kb.add(first, S);
          auto member = [&](Value col) {
            return kb.andI(kb.notI1(kb.lt(col, first)), kb.lt(col, end));
          };
          Value gc = routeGroupCandidate(
              kb, spec, kb.castInt(g, kb.i32()), [&](Value below) {
                return loopBestBelow(kb.divu(first, W), kb.ceilDiv(end, W),
                                     below, member);
              });
          SmallVector<Value> next;
          for (auto [i, v] : llvm::enumerate(h))
            next.push_back(kb.select(
                kb.eq(g, kb.add(lane, kb.idx(int64_t(i) * width))), gc, v));
          return next;
        });
    keptGroups = keepGroups([&](Value prev) {
      Value best = none;
      for (Value h : held)
        best = bestBelow(kb, best, h, prev, none);
      return reduce(best, ReduceKind::MaxI64);
    });
  }

  /// Step 3 of the loop kernel: k rounds over the lane's values.
  void loopRounds(Value weights, Value indices) {
    routeRounds(
        kb, spec,
        [&](Value prev) {
          return loopBestBelow(kb.idx(0), kb.idx(vpt), prev);
        },
        [&](Value j, Value best) { storePick(j, best, weights, indices); });
  }

  /// Steps 1-3 with the choice given: lane j % W reads pick j's index from
  /// `replay` (reporting one outside [0, E) and reading expert 0 instead)
  /// and stores it with its weight source, as step 3 stores a pick.
  void replayPicks(Value replay, Value word, Value weights, Value indices) {
    Value k = kb.idx(spec.k);
    kb.forLoop(lane, k, kb.idx(width), [&](Value j) {
      kb.ifThen(active, [&] {
        RouteReplayPick pick = routeReplayPickReported(
            kb, replay, word, row, j, j, k, numExperts,
            [&](const RouteReplayPick &p) { return kb.notI1(p.inRange); });
        Value index = pick.expert;
        Value logit = kb.loadF(x, {row, kb.castInt(index, kb.index())});
        Value score = routeScore(kb, spec, logit, rowMax, rowSum);
        kb.store(score, weights, {row, j});
        kb.store(kb.asElementOf(index, indices), indices, {row, j});
      });
    });
  }

  /// Step 1: the row's scores and the candidates of the choice values.
  void loadCandidates(Value bias) {
    SmallVector<Value> xs = loadRow();
    for (int64_t m = 0; m < vpt; ++m) {
      Value score = routeScore(kb, spec, xs[m], rowMax, rowSum);
      Value b = bias ? loadOrPad(bias, Value(), m, 0.0) : Value();
      Value c = routeChoice(kb, score, b);
      Value packed = packCandidate(kb, orderedKey(kb, c), expert[m]);
      cand.push_back(inRange[m] ? kb.select(inRange[m], packed, none) : packed);
    }
  }

  /// Step 2: keep the topk_group best groups.
  void dropGroups() {
    int64_t groups = spec.groups, groupSize = numExperts / groups;
    // A group spans whole lane columns: value m of every lane is in group
    // m*W / groupSize. Otherwise each value computes its group.
    bool columns = groupSize % width == 0;
    SmallVector<Value> groupOf;
    if (!columns)
      for (int64_t m = 0; m < vpt; ++m)
        groupOf.push_back(kb.divu(expert[m], kb.cI32(groupSize)));
    auto isStaticMember = [&](int64_t m, int64_t g) {
      return (m * width) / groupSize == g;
    };

    SmallVector<Value> groupCand;
    for (int64_t g = 0; g < groups; ++g) {
      // Members of g: a compile-time subset of the values, or a compare.
      auto groupBest = [&](Value below) {
        Value best = none;
        for (int64_t m = 0; m < vpt; ++m) {
          if (columns && !isStaticMember(m, g))
            continue;
          Value c = cand[m];
          if (below)
            c = candidateBelow(kb, c, below, none);
          if (!columns)
            c = kb.select(kb.eq(groupOf[m], kb.cI32(g)), c, none);
          best = kb.maxs(best, c);
        }
        return reduce(best, ReduceKind::MaxI64);
      };
      groupCand.push_back(routeGroupCandidate(kb, spec, kb.cI32(g), groupBest));
    }

    Value kept = keepGroups([&](Value prev) {
      Value best = none;
      for (Value gc : groupCand)
        best = bestBelow(kb, best, gc, prev, none);
      return best;
    });
    for (int64_t m = 0; m < vpt; ++m) {
      Value g = columns ? kb.cI64((m * width) / groupSize)
                        : kb.extu(groupOf[m], kb.i64());
      Value bit = kb.andI(kb.shru(kept, g), kb.cI64(1));
      cand[m] = kb.select(kb.eq(bit, kb.cI64(0)), none, cand[m]);
    }
  }

  /// The topk_group best of the group candidates (ties to the lower group),
  /// as the bits of an i64. Where topk_group is a multiple of 8 the rounds
  /// are unrolled here instead of an scf.for: LLVM 22's LoopIdiomRecognize
  /// takes a one-block loop of 8, 16, ... 256 trips for a CRC and its
  /// HashRecognize walks the carried values back through the rounds' selects
  /// on every path, which never ends (64 groups, 8 kept: hours).
  /// `bestGroupBelow(prev)`: the best group candidate ranking strictly below
  /// `prev`, in every lane.
  Value keepGroups(function_ref<Value(Value prev)> bestGroupBelow) {
    auto keep = [&](Value best, ValueRange bits) -> SmallVector<Value> {
      Value g = kb.extu(candidateIndex(kb, best), kb.i64());
      return {kb.orI(bits[0], kb.shl(kb.cI64(1), g))};
    };
    if (spec.topkGroup % 8 != 0)
      return routeKeepGroups(kb, spec, {kb.cI64(0)}, bestGroupBelow, keep)[0];
    Value prev = kb.cI64(std::numeric_limits<int64_t>::max()), bits = kb.cI64(0);
    for (int64_t t = 0; t < spec.topkGroup; ++t) {
      prev = bestGroupBelow(prev);
      bits = keep(prev, bits)[0];
    }
    return bits;
  }

  /// Lane j % W stores pick j: its index and its weight source, the logit
  /// reloaded (L1) and scored again (the score the choice was made on).
  void storePick(Value j, Value best, Value weights, Value indices) {
    Value index = candidateIndex(kb, best);
    Value writer = kb.andI(active, kb.eq(kb.remu(j, kb.idx(width)), lane));
    kb.ifThen(writer, [&] {
      Value logit = kb.loadF(x, {row, kb.castInt(index, kb.index())});
      kb.store(routeScore(kb, spec, logit, rowMax, rowSum), weights, {row, j});
      kb.store(kb.asElementOf(index, indices), indices, {row, j});
    });
  }

  /// Step 3: k rounds; lane j % W stores pick j.
  void rounds(Value weights, Value indices) {
    routeRounds(
        kb, spec,
        [&](Value prev) {
          Value best = none;
          for (Value c : cand)
            best = bestBelow(kb, best, c, prev, none);
          return reduce(best, ReduceKind::MaxI64);
        },
        [&](Value j, Value best) { storePick(j, best, weights, indices); });
  }

  /// Step 4 (routeWeights): each lane its own picks, stored in `weights` by
  /// step 3; the selection's max and sums are butterflies over the group.
  void epilogue(Value weights) {
    if (routeWeightsAreSources(spec))
      return; // the stored scores are the weights
    auto load = [&](Value j) { return kb.load(weights, {row, j}); };
    auto store = [&](Value j, Value w) { kb.store(w, weights, {row, j}); };
    auto reduceMax = [&](Value v) { return reduce(v, ReduceKind::Max); };
    auto reduceSum = [&](Value v) { return reduce(v, ReduceKind::Sum); };
    auto inActiveRows = [&](function_ref<void()> body) {
      kb.ifThen(active, body);
    };
    RoutePicks picks{lane,    kb.idx(width), load,      store,
                     nullptr, reduceMax,     reduceSum, inActiveRows};
    routeWeights(kb, spec, picks);
  }
};
} // namespace

/// The moe.dispatch_plan that reads the indices of `op` and is lowered with
/// it (the first in its block, with no capacity: DispatchPlan.cpp lowers
/// the others, or refuses them, on their own).
static DispatchPlanOp dispatchPlanOfIndices(RouteOp op) {
  DispatchPlanOp first;
  for (Operation *user : op.getIndices().getUsers()) {
    auto plan = dyn_cast<DispatchPlanOp>(user);
    if (!plan || plan->getBlock() != op->getBlock() || plan.getCapacity() ||
        plan.getWeights())
      continue;
    if (!first || plan->isBeforeInBlock(first))
      first = plan;
  }
  return first;
}

template <>
LogicalResult
GPULowering<RouteOp>::lower(RouteOp op, OpAdaptor adaptor,
                            ConversionPatternRewriter &rewriter) const {
  auto logitsType = cast<RankedTensorType>(op.getLogits().getType());
  int64_t numExperts = logitsType.getDimSize(1);
  RouteSpec spec = routeSpecOf(op);
  std::optional<RouteLanesMap> lanes;
  if (options.routeMap == "lanes" && !ShapedType::isDynamic(numExperts) &&
      spec.groups <= kRouteMaxGroups)
    // Past the warp kernel's experts, groups that tile no power of two of
    // lanes are spread over lanes with empty slots (below it, the warp kernel
    // routes them as it always has).
    lanes = routeLanesMapOf(numExperts, spec, logitsType.getElementType(),
                            /*padGroups=*/numExperts > kRouteMaxExperts);
  if (ShapedType::isDynamic(numExperts))
    return op.emitOpError("GPU lowering needs a static expert count");
  // Past the register kernel's experts, a shape the lanes' layout does not
  // take (groups that need more than 128 slots a lane, or E > 4096) runs the
  // loop kernel.
  bool loop = !lanes && numExperts > kRouteMaxExperts;
  if (spec.groups > kRouteMaxGroups)
    return op.emitOpError("GPU lowering supports n_group <= ")
           << kRouteMaxGroups;

  HostCode h(rewriter, op);
  GpuKernelBuilder &kb = h.kb;
  Value x = h.buffer(adaptor.getLogits());
  Value bias = adaptor.getBias() ? h.buffer(adaptor.getBias()) : Value();
  auto weightsType = cast<RankedTensorType>(op.getWeights().getType());
  auto indicesType = cast<RankedTensorType>(op.getIndices().getType());
  Value weights =
      h.allocLike(weightsType, dynamicSizesFrom(kb, weightsType, x));
  Value indices =
      h.allocLike(indicesType, dynamicSizesFrom(kb, indicesType, x));
  // A dispatch plan of these indices is lowered here too: its allocations
  // come before the route kernel and its kernels right after it, so that the
  // host does nothing between the four launches.
  std::optional<DispatchPlanKernels> plan;
  DispatchPlanOp planOp = dispatchPlanOfIndices(op);
  if (planOp)
    plan.emplace(h, planOp, indices);
  auto finish = [&] {
    if (!plan) {
      h.finish();
      h.replace(op, {weights, indices});
      return;
    }
    plan->launch();
    h.finish(/*checkErrors=*/true);
    SmallVector<Value> buffers = {weights, indices};
    llvm::append_range(buffers, plan->results);
    h.replace({op.getOperation(), planOp.getOperation()}, buffers);
  };
  if (lanes) {
    Value replay =
        adaptor.getReplay() ? h.buffer(adaptor.getReplay()) : Value();
    launchRouteLanes(h, spec, *lanes, numExperts,
                     routeLanesBlockSize(*lanes, options.blockSize,
                                         options.sharedMemoryBytes),
                     x, bias, weights, indices, replay,
                     replay ? h.errorWord() : Value(), op.getLoc());
    finish();
    return success();
  }
  SmallVector<Value> args = {x};
  if (bias)
    args.push_back(bias);
  args.append({weights, indices});
  // Replay: the given indices and the error word (after the outputs, so the
  // selecting kernel's arguments are unchanged).
  if (adaptor.getReplay())
    args.append({h.buffer(adaptor.getReplay()), h.errorWord()});

  int64_t width = std::min<int64_t>(kWarp, llvm::PowerOf2Ceil(numExperts));
  // The loop kernel takes a warp a block: at 128 threads ptxas keeps it to 32
  // registers (a full SM of blocks) and spills what the group loop carries
  // past 32 groups; a block of 32 threads leaves it the 49-52 it needs.
  int64_t block = loop ? kWarp : options.blockSize;
  GPUKernel kernel(h, loop ? "route_loop" : "route_warp", args, {},
                   {block, 1, 1}, op.getLoc());
  size_t out = bias ? 2 : 1;
  Value replay = adaptor.getReplay() ? kernel.arg(out + 2) : Value();
  Value word = adaptor.getReplay() ? kernel.arg(out + 3) : Value();
  RouteWarpKernel(kernel.kb, spec, numExperts, width, block, loop)
      .emit(kernel.arg(0), bias ? kernel.arg(1) : Value(), kernel.arg(out),
            kernel.arg(out + 1), replay, word);
  Value grid = kb.ceilDiv(kb.dim(x, 0), kb.idx(block / width));
  kernel.launch({grid, kb.idx(1), kb.idx(1)});
  finish();
  return success();
}
