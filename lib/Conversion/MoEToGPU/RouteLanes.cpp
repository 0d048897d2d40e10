//===- RouteLanes.cpp - moe.route on the GPU, route-map=lanes -------------===//
//
// Part of the MoE-MLIR project.
//
// The route kernel of issue #46 (route-map=lanes, the default). It
// follows SGLang's fused gate (moe_fused_gate.cu: a thread per group of
// DeepSeek-V3, 8 threads and 4 tokens a warp, each thread's 32 experts
// contiguous and loaded 16 bytes at a time) and reuses topk-rounds=list's
// selection (emitListTopk) for the top-k:
//
// 1. W lanes a token (routeLanesMapOf: 8 for E = 256, so 4 tokens a warp;
//    more for larger E, up to 32), lane l holding the P experts
//    [l*P, l*P + P), loaded 16 bytes at a time where the rows and the bias
//    are aligned (4-byte loads otherwise), with the bias;
// 2. each expert scored once in registers (softmax from butterfly max/sum
//    over the W lanes; sigmoid as ex2.approx + rcp.approx: 2 MUFU, no IEEE
//    division), its weight source (the score, or the logit for
//    topk_then_score) kept in shared memory for the epilogue, its choice
//    value (score + bias) as an ordered 32-bit key;
// 3. groups: a lane holds r whole groups, or a group spans q lanes; each
//    group's top-2 keys (or top-1) in registers, merged over its q lanes by
//    butterflies, its score packed as a key; every holder then sees every
//    other group's key with one shuffle each (H - 1 shuffles of r keys, H =
//    W / q holders: 7 for DeepSeek-V3) and keeps its group when fewer than
//    topk_group groups rank before it (higher key, or equal and lower
//    group); the experts of dropped groups become empty keys;
// 4. the top-k: emitListTopk over the W lanes (each lane's best few keys
//    sorted once, a round = two 32-bit butterflies and a pop), ties to the
//    lower index;
// 5. the weights: pick lane + s*W's weight source read back from shared
//    memory by the lane that stores it (a warp-synchronous read of its
//    token's row: never global memory), scored after the selection
//    (topk_then_score), renormalized over the W lanes, scaled, stored with
//    the index: consecutive lanes, consecutive picks.
//
// With `replay` (the choice given) steps 3-4 are skipped: pick j's index is
// read from the given indices into the slot the top-k would have put it in,
// and step 5 weighs it, so that a routing's own choice replayed gives its
// weights bit for bit (the same scores, sums and butterflies).
//
// How it differs from SGLang's: any E up to 4096 (not only powers of two;
// 128 experts a lane above 2048) and groups of any size that split evenly
// over q lanes or fit whole on a lane (32 groups of 64: one a lane; 64 of
// 64: two) or, past the warp kernel's 1024 experts, spread over q lanes with
// the last slots empty (3 groups of 700: 8 lanes of 88 slots; positions of
// the lanes' layout map to experts only where indices are read or stored),
// the block halved until its shared memory and registers fit
// (routeLanesBlockSize), the scores' order and
// ties of the dialect (NaN first, lowest index: MoE/Kernels/TopK.h), and the
// top-k by candidate lists rather than k rounds over every element. The
// maths of each step is MoE/Kernels/Route.h's, as in Route.cpp's warp kernel;
// only sigmoid differs (the approximate exp2 and reciprocal: a few ulps,
// scores below 2^-126 flushed to 0).
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Reductions.h"
#include "RegisterTopk.h"
#include "Lowerings.h"

#include "MoE/Kernels/IndexErrors.h"
#include "MoE/Kernels/Route.h"
#include "MoE/Kernels/RowSoftmax.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

#include "llvm/Support/MathExtras.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

/// Experts a lane holds at most (registers: the keys stay live through the
/// rounds for the lists' refills). Up to 2048 experts a row, 64 a lane
/// suffice; 128 (a row of up to 4096 in one warp) costs about twice the
/// registers and shared memory, so fewer tokens are in flight per SM.
static constexpr int64_t kRouteLaneMaxExperts = 128;
/// Experts a lane is given where the mapping may choose (SGLang's 32).
static constexpr int64_t kRouteLaneExperts = 32;

std::optional<RouteLanesMap>
mlir::moe::gpu_lowering::routeLanesMapOf(int64_t E, const RouteSpec &spec,
                                         Type elt, bool padGroups) {
  RouteLanesMap m;
  m.vec = 16 / (elt.getIntOrFloatBitWidth() / 8);
  m.groupStride = spec.groups > 1 ? E / spec.groups : E;
  auto pow2 = [](int64_t v) {
    return static_cast<int64_t>(llvm::PowerOf2Ceil(std::max<int64_t>(1, v)));
  };
  if (spec.groups > 1) {
    int64_t G = spec.groups, S = E / G;
    // A group over q lanes (a power of two dividing S) of S / q experts each,
    // at most 32 a lane where the groups' lanes fit a warp; otherwise whole
    // groups a lane.
    m.groupLanes = 1;
    for (int64_t q = pow2(llvm::divideCeil(S, kRouteLaneExperts)); q > 1;
         q /= 2)
      if (S % q == 0 && q * pow2(G) <= kWarp) {
        m.groupLanes = q;
        break;
      }
    if (m.groupLanes > 1) {
      m.groupsPerLane = 1;
      m.perLane = S / m.groupLanes;
      m.width = m.groupLanes * pow2(G);
    } else {
      // Whole groups a lane: as many as fit 32 experts, then the lanes to
      // hold them all (at most a warp), then the groups spread evenly (32
      // groups of 64 experts: one a lane; 64 of 64: two a lane).
      int64_t r = std::max<int64_t>(1, kRouteLaneExperts / S);
      m.width = std::min<int64_t>(kWarp, pow2(llvm::divideCeil(G, r)));
      m.groupsPerLane = llvm::divideCeil(G, m.width);
      m.perLane = m.groupsPerLane * S;
    }
    // Groups of more than 128 experts that no power of two q <= 32 / G
    // divides (3 groups of 700): with padGroups, a group over q lanes of
    // ceil(S / q) slots each (8 of 88), the slots past the group's end empty
    // (the group's stride in the lanes' layout is q * ceil(S / q): 704).
    int64_t q = std::min<int64_t>(pow2(llvm::divideCeil(S, kRouteLaneExperts)),
                                  kWarp / pow2(G));
    if (padGroups && m.perLane > kRouteLaneMaxExperts && q > 1) {
      m.groupLanes = q;
      m.groupsPerLane = 1;
      m.perLane = llvm::divideCeil(S, q);
      m.groupStride = q * m.perLane;
      m.width = q * pow2(G);
    }
  } else {
    // 8 lanes a token up to 320 experts (4 tokens a warp), then as many as
    // keep at most 40 experts a lane; never more lanes than the row has
    // vectors. Fewer lanes make fewer rounds a token (a round costs every
    // lane of the token the same): at E = 288, k = 32, 8 lanes of 36 give
    // 1795 warp instructions a token and 50 shuffles against 16 lanes of
    // 20's 1987 and 134 (sm_90, refills counted).
    m.groupLanes = 1;
    m.groupsPerLane = 1;
    int64_t width = std::max<int64_t>(8, pow2(llvm::divideCeil(E, 40)));
    width = std::min<int64_t>(
        width, static_cast<int64_t>(llvm::bit_floor(
                   static_cast<uint64_t>(std::max<int64_t>(1, E / m.vec)))));
    m.width = std::min<int64_t>(width, kWarp);
    m.perLane = llvm::divideCeil(E, m.width);
    if (E % m.vec == 0)
      m.perLane = llvm::alignTo(m.perLane, m.vec);
  }
  if (m.perLane > kRouteLaneMaxExperts || m.width * m.perLane < E)
    return std::nullopt;
  // The lanes that hold the kept groups' experts: at least topk_group / r
  // holders of q lanes (all W without groups). A lane wins about k / lanes
  // picks; 3 more entries keep the refills rare (test_route_lanes_model.py).
  int64_t lanes =
      spec.groups > 1
          ? std::min<int64_t>(
                m.width, llvm::divideCeil(spec.topkGroup, m.groupsPerLane) *
                             m.groupLanes)
          : m.width;
  m.listLength = std::min<int64_t>(
      {m.perLane, spec.k,
       std::max<int64_t>(3, llvm::divideCeil(spec.k, lanes) + 3)});
  return m;
}

/// 1 / x on the SFU (rcp.approx.ftz.f32: one MUFU.RCP).
static Value rcpApprox(GpuKernelBuilder &kb, Value x) {
  return LLVM::CallIntrinsicOp::create(
             kb.b, kb.f32(), kb.b.getStringAttr("llvm.nvvm.rcp.approx.ftz.f"),
             ValueRange{x})
      .getResult(0);
}

/// sigmoid(x) = 1 / (1 + 2^(-x log2 e)): -inf -> 0 (1 / inf), +inf -> 1,
/// NaN -> NaN, as kernels::sigmoid, within a few ulps of it (scores below
/// 2^-126, x < -87.3, flush to 0).
static Value fastSigmoid(GpuKernelBuilder &kb, Value x) {
  Value t = kb.fmul(x, kb.cF32(-1.4426950408889634));
  return rcpApprox(kb, kb.fadd(kb.cF32(1.0), exp2Approx(kb.b, t)));
}

Value mlir::moe::gpu_lowering::routeLanesScore(GpuKernelBuilder &kb,
                                               const kernels::RouteSpec &spec,
                                               Value x, Value rowMax,
                                               Value rowSum) {
  return !spec.fromLogits() && spec.scoring == RouteSpec::Scoring::Sigmoid
             ? fastSigmoid(kb, x)
             : routeScore(kb, spec, x, rowMax, rowSum);
}

RouteTokenLanes gpu_lowering::routeTokenLanes(GpuKernelBuilder &kb, Value x,
                                              int64_t width,
                                              int64_t blockSize) {
  RouteTokenLanes t;
  Value tid = t.tid = kb.threadId();
  t.lane = kb.remu(tid, kb.idx(width));
  Value numTokens = kb.dim(x, 0);
  Value token = kb.add(kb.mul(kb.blockId(), kb.idx(blockSize / width)),
                       kb.divu(tid, kb.idx(width)));
  t.active = kb.lt(token, numTokens);
  t.row = kb.select(t.active, token, kb.sub(numTokens, kb.idx(1)));
  return t;
}

RouteReplayPick gpu_lowering::routeReplayPickReported(
    GpuKernelBuilder &kb, Value replay, Value word, Value row, Value at,
    Value j, Value k, int64_t numExperts,
    function_ref<Value(const RouteReplayPick &)> reportIf) {
  RouteReplayPick pick =
      routeReplayPick(kb, kb.load(replay, {row, at}), kb.cI64(numExperts));
  kb.ifThen(reportIf(pick), [&] {
    Value position = kb.castInt(kb.add(kb.mul(row, k), j), kb.i64());
    emitRecordIndexError(kb, word, kMoEErrorRouteReplay, position, pick.given,
                         kb.cI64(numExperts));
  });
  return pick;
}

RowSoftmaxStats
gpu_lowering::routeRowStats(GpuKernelBuilder &kb, const RouteSpec &spec,
                            ArrayRef<Value> xs,
                            function_ref<Value(Value, ReduceKind)> reduce) {
  if (spec.fromLogits() || spec.scoring != RouteSpec::Scoring::Softmax)
    return {};
  return rowSoftmaxStats(
      kb, xs, [&](Value v) { return reduce(v, ReduceKind::Max); },
      [&](Value v) { return reduce(v, ReduceKind::Sum); });
}

namespace {
/// The kernel of route-map=lanes (the file header).
class RouteLanesKernel {
public:
  RouteLanesKernel(GpuKernelBuilder &kb, const RouteSpec &spec,
                   const RouteLanesMap &map, int64_t numExperts,
                   int64_t blockSize)
      : kb(kb), spec(spec), map(map), E(numExperts), W(map.width),
        P(map.perLane), blockSize(blockSize),
        S(spec.groups > 1 ? numExperts / spec.groups : numExperts),
        padded(map.groupStride != S) {}

  /// `replay` (null: route): the choice given, and the error word an index
  /// outside [0, E) is reported through.
  void emit(Value x, Value bias, Value weights, Value indices, Value smem,
            Value replay = Value(), Value word = Value()) {
    RouteTokenLanes t = routeTokenLanes(kb, x, W, blockSize);
    lane = t.lane;
    active = t.active;
    row = t.row;
    Value tid = t.tid;
    laneI32 = kb.castInt(lane, kb.i32());
    laneBase = kb.mul(laneI32, kb.cI32(P));
    if (padded) {
      // The lane's first expert in the row, and its first slot's position in
      // its group (the slots from S - inGroup on are padding).
      Value q = kb.idx(map.groupLanes);
      inGroup = kb.mul(kb.remu(lane, q), kb.idx(P));
      realBase = kb.add(kb.mul(kb.divu(lane, q), kb.idx(S)), inGroup);
    }
    // This lane's run in its token's shared row: tid * (P + 1) (a lane's
    // stride P + 1 is odd: the lanes' stores fall in distinct banks).
    smemBase = kb.mul(tid, kb.idx(P + 1));
    this->smem = smem;

    SmallVector<Value> keys = loadAndKey(x, bias);
    if (replay) {
      storeWeights(replayPicks(replay, word), weights, indices);
      return;
    }
    if (spec.groups > 1)
      dropGroups(keys);
    SmallVector<int64_t> positions;
    for (int64_t m = 0; m < P; ++m)
      positions.push_back(m);
    TopkSpec topk;
    topk.k = spec.k;
    emitListTopk(kb, {.keys = keys,
                      .positions = positions,
                      .laneBase = laneBase,
                      .lane = lane,
                      .width = W,
                      .listLength = map.listLength,
                      .out = {.spec = topk,
                              .weights = weights,
                              .indices = indices,
                              .row = row,
                              .active = active},
                      .epilogue = [&](const ListPicks &picks) {
                        storeWeights(picks, weights, indices);
                      }});
  }

private:
  GpuKernelBuilder &kb;
  const RouteSpec &spec;
  const RouteLanesMap &map;
  int64_t E, W, P, blockSize;
  /// Experts a group (E without groups); `padded`: a group's slots in the
  /// lanes' layout (map.groupStride) are more than its experts.
  int64_t S;
  bool padded;
  Value lane, laneI32, laneBase, active, row, smemBase, smem;
  /// With `padded`: the lane's first expert and its first slot's position in
  /// its group (index).
  Value realBase, inGroup;

  /// Whether slot m of some lane holds no expert: past the last expert, or
  /// (padded) past the end of its group or in a lane past the last group.
  bool mayPad(int64_t m) const {
    if (!padded)
      return (W - 1) * P + m >= E;
    return (map.groupLanes - 1) * P + m >= S || W > spec.groups * map.groupLanes;
  }

  /// Whether slot m of this lane holds an expert (padded layout, index
  /// comparisons).
  Value paddedSlotValid(int64_t m) {
    Value in = kb.lt(kb.add(inGroup, kb.idx(m)), kb.idx(S));
    if (W > spec.groups * map.groupLanes)
      in = kb.andI(in, kb.lt(lane, kb.idx(spec.groups * map.groupLanes)));
    return in;
  }

  /// The expert of position `v` of the lanes' layout (i32), and back: the
  /// identity unless `padded`, where a group's S experts take groupStride
  /// positions.
  Value toExpert(Value v) {
    return padded ? regroup(v, map.groupStride, S) : v;
  }
  Value toPosition(Value e) {
    return padded ? regroup(e, S, map.groupStride) : e;
  }
  /// (v / from) * to + v % from (i32), built in that order.
  Value regroup(Value v, int64_t from, int64_t to) {
    Value group = kb.divu(v, kb.cI32(from));
    Value start = kb.mul(group, kb.cI32(to));
    Value offset = kb.remu(v, kb.cI32(from));
    return kb.add(start, offset);
  }

  Value reduce(Value v, ReduceKind kind) {
    return W > 1 ? subgroupReduce(kb, v, kind, W) : v;
  }

  /// Step 1: this lane's P logits (and biases), -inf (0) past the last
  /// expert: 16-byte loads where every operand read so is aligned (a
  /// uniform branch on the base pointers: rows are E elements apart), else
  /// one element a load.
  ///
  /// Then steps 1-2's keys (scoreAndKey). With f32 logits and a bias, more
  /// than 64 experts a lane, 64 slots at a time: the branch yields 128
  /// floats, not 2P, whose keys are formed before the next chunk loads
  /// (ptxas spilled 88-180 bytes of the 2P at E = 4096, sm_80/sm_90; 16-bit
  /// logits, held two a register, did not). A softmax's statistics come
  /// first, from the logits' chunks read twice more (L1), folded in the
  /// order rowSoftmaxStats folds them: the same max and sum.
  SmallVector<Value> loadAndKey(Value x, Value bias) {
    bool f32 = cast<MemRefType>(x.getType()).getElementTypeBitWidth() == 32;
    if (!bias || !f32 || P <= kKeyChunk) {
      SmallVector<Value> xs, bs;
      loadLane(x, bias, 0, P, xs, bs);
      return scoreAndKey(xs, bs);
    }
    // A softmax's row statistics first, from the logits' chunks loaded
    // again for the max and for the sum (L1), in routeRowStats's order.
    Value rowMax, rowSum;
    if (!spec.fromLogits() && spec.scoring == RouteSpec::Scoring::Softmax) {
      RowSoftmaxStats stats = rowSoftmaxStatsChunked(
          kb, llvm::divideCeil(P, kKeyChunk),
          [&](int64_t c) {
            SmallVector<Value> xs, bs;
            loadLane(x, Value(), c * kKeyChunk,
                     std::min(P, (c + 1) * kKeyChunk), xs, bs);
            return xs;
          },
          [&](Value v) { return reduce(v, ReduceKind::Max); },
          [&](Value v) { return reduce(v, ReduceKind::Sum); });
      rowMax = stats.max;
      rowSum = stats.sum;
    }
    // Then the keys a chunk at a time.
    SmallVector<Value> keys;
    for (int64_t lo = 0; lo < P; lo += kKeyChunk) {
      SmallVector<Value> xs, bs;
      loadLane(x, bias, lo, std::min(P, lo + kKeyChunk), xs, bs);
      llvm::append_range(keys, keysOf(xs, bs, lo, rowMax, rowSum));
    }
    return keys;
  }
  static constexpr int64_t kKeyChunk = 64;

  /// Slots [lo, hi) of step 1.
  void loadLane(Value x, Value bias, int64_t lo, int64_t hi,
                SmallVector<Value> &xs, SmallVector<Value> &bs) {
    constexpr double kInf = std::numeric_limits<double>::infinity();
    Value laneCol = padded ? realBase : kb.mul(lane, kb.idx(P));
    auto scalar = [&](Value mem, Value r, double pad) {
      SmallVector<Value> out;
      for (int64_t m = lo; m < hi; ++m) {
        Value col = kb.add(laneCol, kb.idx(m));
        auto at = [&](Value c) {
          return r ? kb.loadF(mem, {r, c}) : kb.loadF(mem, {c});
        };
        if (!mayPad(m)) {
          out.push_back(at(col));
          continue;
        }
        Value in = padded ? paddedSlotValid(m) : kb.lt(col, kb.idx(E));
        Value safe = kb.select(in, col, kb.idx(0));
        out.push_back(kb.select(in, at(safe), kb.cF32(pad)));
      }
      return out;
    };
    auto vectorOK = [&](Value mem) {
      // A padded layout's runs start anywhere in the row: one element a load.
      if (!mem || padded)
        return false;
      int64_t vec =
          16 / (cast<MemRefType>(mem.getType()).getElementTypeBitWidth() / 8);
      return E % vec == 0 && P % vec == 0;
    };
    auto vector = [&](Value mem, Value r, double pad) {
      Type elt = cast<MemRefType>(mem.getType()).getElementType();
      int64_t bytes = elt.getIntOrFloatBitWidth() / 8, vec = 16 / bytes;
      Value base = memref::ExtractAlignedPointerAsIndexOp::create(kb.b, mem);
      if (r)
        base = kb.add(base, kb.mul(r, kb.idx(E * bytes)));
      SmallVector<Value> out;
      for (int64_t c = lo / vec; c < hi / vec; ++c) {
        Value col = kb.add(laneCol, kb.idx(c * vec));
        // E % vec == 0: a vector is wholly inside the row or wholly past it.
        Value in = mayPad(c * vec) ? kb.lt(col, kb.idx(E)) : Value();
        if (in)
          col = kb.select(in, col, kb.idx(0));
        for (Value v :
             loadGlobal16(kb, kb.add(base, kb.mul(col, kb.idx(bytes))), elt))
          out.push_back(in ? kb.select(in, v, kb.cF32(pad)) : v);
      }
      return out;
    };
    bool vecX = vectorOK(x), vecB = vectorOK(bias);
    if (!vecX && !vecB) {
      xs = scalar(x, row, -kInf);
      if (bias)
        bs = scalar(bias, Value(), 0.0);
      return;
    }
    Value aligned = kb.cBool(true);
    for (Value mem : {vecX ? x : Value(), vecB ? bias : Value()}) {
      if (!mem)
        continue;
      Value base = memref::ExtractAlignedPointerAsIndexOp::create(kb.b, mem);
      aligned = kb.andI(aligned, kb.eq(kb.andI(base, kb.idx(15)), kb.idx(0)));
    }
    int64_t n = bias ? 2 * (hi - lo) : hi - lo;
    SmallVector<Type> types(n, kb.f32());
    auto both = [&](bool wide) {
      SmallVector<Value> out =
          wide && vecX ? vector(x, row, -kInf) : scalar(x, row, -kInf);
      if (bias)
        llvm::append_range(out, wide && vecB ? vector(bias, Value(), 0.0)
                                             : scalar(bias, Value(), 0.0));
      return out;
    };
    SmallVector<Value> all = kb.ifElse(
        aligned, types, [&] { return both(true); },
        [&] { return both(false); });
    xs.assign(all.begin(), all.begin() + (hi - lo));
    if (bias)
      bs.assign(all.begin() + (hi - lo), all.end());
  }

  /// Step 2: scores (the weight sources to shared memory) and the choice
  /// values' keys (empty past the last expert).
  SmallVector<Value> scoreAndKey(ArrayRef<Value> xs, ArrayRef<Value> bs) {
    RowSoftmaxStats stats =
        routeRowStats(kb, spec, xs, [&](Value v, ReduceKind kind) {
          return reduce(v, kind);
        });
    return keysOf(xs, bs, 0, stats.max, stats.sum);
  }

  /// The scores (to shared memory) and keys of slots first, first + 1, ...
  /// holding xs (and bs), given the row's softmax statistics (null: none
  /// needed).
  SmallVector<Value> keysOf(ArrayRef<Value> xs, ArrayRef<Value> bs,
                            int64_t first, Value rowMax, Value rowSum) {
    Value gone = emptyListKey(kb, kb.i32());
    SmallVector<Value> keys;
    for (int64_t i = 0, e = xs.size(); i < e; ++i) {
      int64_t m = first + i;
      Value score = routeLanesScore(kb, spec, xs[i], rowMax, rowSum);
      kb.store(score, smem, {kb.add(smemBase, kb.idx(m))});
      Value key =
          orderedKey(kb, routeChoice(kb, score, bs.empty() ? Value() : bs[i]));
      if (mayPad(m))
        key = kb.select(padded ? paddedSlotValid(m)
                               : kb.lt(kb.add(laneBase, kb.cI32(m)), kb.cI32(E)),
                        key, gone);
      keys.push_back(key);
    }
    return keys;
  }

  /// Step 3: keep the topk_group best groups; the others' keys become empty.
  void dropGroups(SmallVector<Value> &keys) {
    // A group's slots: its S experts, or (padded) more, the last of which
    // hold empty keys.
    const int64_t G = spec.groups, stride = map.groupStride;
    const int64_t q = map.groupLanes, r = map.groupsPerLane, H = W / q;
    Value gone = emptyListKey(kb, kb.i32());
    // Each of the lane's groups: its best two keys, over its q lanes.
    SmallVector<Value> groupKey;
    for (int64_t i = 0; i < r; ++i) {
      Value t1 = gone, t2 = gone;
      for (int64_t m = i * stride / q; m < std::min(P, (i + 1) * stride / q);
           ++m) {
        if (spec.top2)
          t2 = kb.maxs(t2, kb.mins(t1, keys[m]));
        t1 = kb.maxs(t1, keys[m]);
      }
      for (int64_t off = 1; off < q; off *= 2) {
        Value o1 = kb.shuffleXor(t1, off);
        if (spec.top2) {
          Value o2 = kb.shuffleXor(t2, off);
          t2 = kb.maxs(kb.mins(t1, o1), kb.maxs(t2, o2));
        }
        t1 = kb.maxs(t1, o1);
      }
      // routeGroupCandidate's score: the best, plus the second best.
      Value score = keyToFloat(kb, t1);
      if (spec.top2)
        score = kb.fadd(score, keyToFloat(kb, t2));
      groupKey.push_back(orderedKey(kb, score));
    }
    // Groups past the last (W * r / q > G): below every group.
    Value holder = kb.divu(laneI32, kb.cI32(q));
    if (H * r > G)
      for (int64_t i = 0; i < r; ++i) {
        Value g = kb.add(kb.mul(holder, kb.cI32(r)), kb.cI32(i));
        groupKey[i] = kb.select(kb.lt(g, kb.cI32(G)), groupKey[i], gone);
      }
    // Ranks: the groups before each of this lane's (a higher key, or an equal
    // one of a lower group: routeKeepGroups' order). Holder h ^ j's groups
    // are lower than h's exactly when h ^ j < h.
    Value one = kb.cI32(1), zero = kb.cI32(0);
    SmallVector<Value> before(r, zero);
    auto count = [&](int64_t i, Value other, Value lowerGroup) {
      Value mine = groupKey[i];
      Value beats = kb.cmpi(arith::CmpIPredicate::sgt, other, mine);
      Value tie = kb.andI(kb.eq(other, mine), lowerGroup);
      before[i] = kb.add(before[i], kb.select(kb.orI(beats, tie), one, zero));
    };
    for (int64_t i = 0; i < r; ++i)
      for (int64_t o = 0; o < r; ++o)
        if (o != i)
          count(i, groupKey[o], kb.cBool(o < i));
    for (int64_t j = 1; j < H; ++j) {
      Value lower = kb.cmpi(arith::CmpIPredicate::ult,
                            kb.xorI(holder, kb.cI32(j)), holder);
      for (int64_t o = 0; o < r; ++o) {
        Value other = kb.shuffleXor(groupKey[o], j * q);
        for (int64_t i = 0; i < r; ++i)
          count(i, other, lower);
      }
    }
    for (int64_t m = 0; m < P; ++m) {
      Value kept = kb.lt(before[m * q / stride], kb.cI32(spec.topkGroup));
      keys[m] = kb.select(kept, keys[m], gone);
    }
  }

  /// Steps 3-4 with the choice given: slot s of a lane holds pick lane + s*W
  /// as the top-k places it, its index read from `replay` (one outside
  /// [0, E) reported and read as expert 0: kernels::routeReplayPick). Step 5
  /// then weighs the picks from the same scores, in the same slots and
  /// butterflies, as a routing by this kernel: its own choice replayed gives
  /// its weights bit for bit.
  ListPicks replayPicks(Value replay, Value word) {
    ListPicks picks;
    Value k = kb.idx(spec.k);
    const int64_t slots = llvm::divideCeil(spec.k, W);
    for (int64_t s = 0; s < slots; ++s) {
      Value j = kb.add(lane, kb.idx(s * W));
      Value valid = (s + 1) * W <= spec.k ? kb.cBool(true) : kb.lt(j, k);
      Value safe = kb.select(valid, j, kb.idx(0));
      RouteReplayPick pick = routeReplayPickReported(
          kb, replay, word, row, safe, j, k, E, [&](const RouteReplayPick &p) {
            return kb.andI(kb.andI(active, valid), kb.notI1(p.inRange));
          });
      picks.keys.push_back(pick.expert);
      picks.indices.push_back(toPosition(pick.expert));
      picks.valid.push_back(valid);
    }
    return picks;
  }

  /// Step 5: the picks' weights from their sources in shared memory,
  /// stored with their indices.
  void storeWeights(const ListPicks &picks, Value weights, Value indices) {
    // The sources were stored by the token's other lanes.
    NVVM::SyncWarpOp::create(kb.b, kb.cI32(-1));
    Value rowStart = kb.sub(smemBase, kb.mul(lane, kb.idx(P + 1)));
    const size_t slots = picks.keys.size();
    SmallVector<Value> src;
    for (size_t s = 0; s < slots; ++s) {
      Value e = kb.castInt(picks.indices[s], kb.index());
      Value at = kb.add(rowStart, kb.add(e, kb.divu(e, kb.idx(P))));
      src.push_back(kb.load(smem, {at}));
    }
    constexpr double kInf = std::numeric_limits<double>::infinity();
    Value selMax, selSum;
    if (!spec.scoreFirst && spec.scoring == RouteSpec::Scoring::Softmax) {
      SmallVector<Value> masked;
      for (size_t s = 0; s < slots; ++s)
        masked.push_back(kb.select(picks.valid[s], src[s], kb.cF32(-kInf)));
      RowSoftmaxStats stats = rowSoftmaxStats(
          kb, masked, [&](Value v) { return reduce(v, ReduceKind::Max); },
          [&](Value v) { return reduce(v, ReduceKind::Sum); });
      selMax = stats.max;
      selSum = stats.sum;
    }
    SmallVector<Value> w;
    for (size_t s = 0; s < slots; ++s)
      w.push_back(routeSelectedScore(kb, spec, src[s], selMax, selSum));
    Value wSum;
    if (spec.renormalize) {
      Value zero = kb.cF32(0.0);
      wSum = zero;
      for (size_t s = 0; s < slots; ++s)
        wSum = kb.fadd(wSum, kb.select(picks.valid[s], w[s], zero));
      wSum = reduce(wSum, ReduceKind::Sum);
    }
    for (size_t s = 0; s < slots; ++s) {
      Value weight = routeWeight(kb, spec, w[s], wSum);
      kb.ifThen(kb.andI(active, picks.valid[s]), [&] {
        Value j = kb.add(lane, kb.idx(s * W));
        kb.store(weight, weights, {row, j});
        kb.store(kb.asElementOf(toExpert(picks.indices[s]), indices), indices,
                 {row, j});
      });
    }
  }
};
} // namespace

int64_t mlir::moe::gpu_lowering::routeLanesBlockSize(
    const RouteLanesMap &map, int64_t blockSize, int64_t sharedMemoryBytes) {
  // A thread keeps P + 1 weight sources in shared memory and about 2P + 48
  // registers (110 at P = 64, sm_90): halve the block until both fit (a
  // 1024-thread block of DeepSeek-V3's 32 experts a lane would want 132 KiB
  // and more registers than an SM has), never below a warp.
  auto fits = [&](int64_t block) {
    return block * (map.perLane + 1) * 4 <= sharedMemoryBytes &&
           block * (2 * map.perLane + 48) <= 65536;
  };
  int64_t block = blockSize;
  while (block > kWarp && block % (2 * kWarp) == 0 && !fits(block))
    block /= 2;
  return block;
}

void mlir::moe::gpu_lowering::launchRouteLanes(
    HostCode &h, const RouteSpec &spec, const RouteLanesMap &map,
    int64_t numExperts, int64_t blockSize, Value x, Value bias, Value weights,
    Value indices, Value replay, Value word, Location loc) {
  SmallVector<Value> args = {x};
  if (bias)
    args.push_back(bias);
  size_t out = args.size();
  args.append({weights, indices});
  // Replay: the given indices and the error word after the outputs.
  if (replay)
    args.append({replay, word});
  Type f32 = h.b.getF32Type();
  GPUKernel kernel(h, "route_lanes", args,
                   {workgroupMemRef({blockSize * (map.perLane + 1)}, f32)},
                   {blockSize, 1, 1}, loc);
  RouteLanesKernel(kernel.kb, spec, map, numExperts, blockSize)
      .emit(kernel.arg(0), bias ? kernel.arg(1) : Value(), kernel.arg(out),
            kernel.arg(out + 1), kernel.workgroup(0),
            replay ? kernel.arg(out + 2) : Value(),
            replay ? kernel.arg(out + 3) : Value());
  GpuKernelBuilder &kb = h.kb;
  Value grid = kb.ceilDiv(kb.dim(x, 0), kb.idx(blockSize / map.width));
  kernel.launch({grid, kb.idx(1), kb.idx(1)});
}
