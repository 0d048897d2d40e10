//===- RegisterTopk.cpp - Top-k of a row held in registers ----------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "RegisterTopk.h"
#include "Reductions.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

/// The epilogue of a register top-k: each lane turns the raw values it stored
/// (rounds r with r % width == lane) into weights.
static void rescaleOwnEntries(GpuKernelBuilder &kb,
                              const RegisterTopkParams &p, Value v0,
                              Value selSum) {
  const TopkOutputs &out = p.out;
  const TopkSpec &spec = out.spec;
  Value weights = out.weights, row = out.row;
  if (!spec.logits && !spec.renormalize)
    return; // raw probabilities: the stored values are the weights
  kb.ifThen(out.active, [&] {
    kb.forLoop(p.lane, kb.idx(spec.k), kb.idx(p.width), [&](Value r) {
      Value v = kb.load(weights, {row, r});
      kb.store(
          topkWeight(kb, spec, v, v0, selSum, out.denseMax, out.denseSum),
          weights, {row, r});
    });
  });
}

/// redux.sync `kind` of an i32 over the lanes of `mask`.
static Value redux(GpuKernelBuilder &kb, Value v, NVVM::ReduxKind kind,
                   Value mask) {
  return NVVM::ReduxOp::create(kb.b, v.getType(), v, kind, mask).getRes();
}

/// The lanes of this lane's group of `width` in its warp, as a member mask.
static Value groupMask(GpuKernelBuilder &kb, int64_t width) {
  if (width == kWarp)
    return kb.cI32(-1);
  Value warpLane = kb.castInt(kb.remu(kb.threadId(), kb.idx(kWarp)), kb.i32());
  Value first = kb.mul(kb.divu(warpLane, kb.cI32(width)), kb.cI32(width));
  return kb.shl(kb.cI32((int64_t(1) << width) - 1), first);
}

/// The k rounds of TopkRounds::Redux: stores round r's value and index by lane
/// r % width; returns {v0, selSum} as the butterfly rounds do.
static SmallVector<Value>
emitReduxRounds(GpuKernelBuilder &kb, const RegisterTopkParams &p,
                const RegisterRow &layout) {
  ArrayRef<Value> vals = p.vals;
  Value lane = p.lane;
  const int64_t numElements = p.numElements;
  const TopkSpec &spec = p.out.spec;
  Value weights = p.out.weights, indices = p.out.indices, row = p.out.row,
        active = p.out.active;
  const int64_t vpt = vals.size();
  const int64_t width = layout.width;
  Value gone = kb.cI32(std::numeric_limits<int32_t>::min());
  Value noIndex = kb.cI32(std::numeric_limits<int32_t>::max());
  Value laneBase = layout.laneBase(kb, kb.castInt(lane, kb.i32()));
  SmallVector<Value> index, init;
  for (auto [m, v] : llvm::enumerate(vals)) {
    index.push_back(layout.index(kb, m, laneBase));
    Value key = orderedKey(kb, v);
    if (layout.mayPad(m, numElements))
      key = kb.select(kb.lt(index.back(), kb.cI32(numElements)), key, gone);
    init.push_back(key);
  }
  init.push_back(kb.cF32(0.0)); // v0
  init.push_back(kb.cF32(0.0)); // selSum
  Value mask = groupMask(kb, width);
  Value widthIdx = kb.idx(width);
  SmallVector<Value> done = kb.forLoop(
      kb.idx(0), kb.idx(spec.k), kb.idx(1), init,
      [&](Value r, ValueRange args) -> SmallVector<Value> {
        ValueRange keys = args.take_front(vpt);
        Value best = keys[0];
        for (Value key : keys.drop_front())
          best = kb.maxs(best, key);
        best = redux(kb, best, NVVM::ReduxKind::MAX, mask);
        // Ties: the lowest index holding the best key.
        Value mine = noIndex;
        for (int64_t m = 0; m < vpt; ++m)
          mine = kb.mins(mine, kb.select(kb.eq(keys[m], best), index[m], noIndex));
        Value winner = redux(kb, mine, NVVM::ReduxKind::MIN, mask);
        SmallVector<Value> next;
        for (int64_t m = 0; m < vpt; ++m)
          next.push_back(kb.select(kb.eq(index[m], winner), gone, keys[m]));
        Value v = keyToFloat(kb, best);
        TopkPickState pick = topkPickState(kb, spec, r, v, args[vpt]);
        Value writer = kb.andI(active, kb.eq(kb.remu(r, widthIdx), lane));
        kb.ifThen(writer, [&] {
          kb.store(v, weights, {row, r});
          kb.store(kb.asElementOf(winner, indices), indices, {row, r});
        });
        next.push_back(pick.v0);
        next.push_back(kb.fadd(args[vpt + 1], pick.term));
        return next;
      });
  return {done[vpt], done[vpt + 1]};
}

void mlir::moe::gpu_lowering::emitRegisterTopk(GpuKernelBuilder &kb,
                                               const RegisterTopkParams &p) {
  RegisterRow layout{p.width, p.run};
  if (p.rounds == TopkRounds::Redux) {
    SmallVector<Value> sel = emitReduxRounds(kb, p, layout);
    rescaleOwnEntries(kb, p, sel[0], sel[1]);
    return;
  }
  ArrayRef<Value> vals = p.vals;
  Value lane = p.lane;
  const int64_t width = p.width, numElements = p.numElements;
  const TopkSpec &spec = p.out.spec;
  Value weights = p.out.weights, indices = p.out.indices, row = p.out.row,
        active = p.out.active;
  // Candidates are computed once; the rounds only compare and reduce.
  Value laneBase = layout.laneBase(kb, kb.castInt(lane, kb.i32()));
  SmallVector<Value> cands;
  for (auto [m, v] : llvm::enumerate(vals)) {
    Value index = layout.index(kb, m, laneBase);
    Value cand = packCandidate(kb, orderedKey(kb, v), index);
    if (layout.mayPad(m, numElements))
      cand = kb.select(kb.lt(index, kb.cI32(numElements)), cand,
                      noCandidate(kb, kb.i64()));
    cands.push_back(cand);
  }

  Value none = noCandidate(kb, kb.i64());
  Value widthIdx = kb.idx(width);
  SmallVector<Value> init = {kb.cI64(std::numeric_limits<int64_t>::max()),
                             kb.cF32(0.0), kb.cF32(0.0)};
  SmallVector<Value> done =
      kb.forLoop(kb.idx(0), kb.idx(spec.k), kb.idx(1), init,
                [&](Value r, ValueRange args) -> SmallVector<Value> {
                  Value prev = args[0];
                  // Best candidate of this lane strictly below the previous
                  // winner.
                  Value best = none;
                  for (Value cand : cands)
                    best = bestBelow(kb, best, cand, prev, none);
                  best = subgroupReduce(kb, best, ReduceKind::MaxI64, width);
                  Value key = candidateKey(kb, best);
                  Value index = candidateIndex(kb, best);
                  Value v = keyToFloat(kb, key);
                  TopkPickState pick = topkPickState(kb, spec, r, v, args[1]);
                  Value selSum = kb.fadd(args[2], pick.term);
                  Value writer =
                      kb.andI(active, kb.eq(kb.remu(r, widthIdx), lane));
                  kb.ifThen(writer, [&] {
                    kb.store(v, weights, {row, r});
                    kb.store(kb.asElementOf(index, indices), indices, {row, r});
                  });
                  return {best, pick.v0, selSum};
                });

  rescaleOwnEntries(kb, p, done[1], done[2]);
}

namespace {
/// The loop state of emitListTopk's rounds. The refill fields (more, last
/// pick, need) exist only when a list can run out (`refill`).
struct ListState {
  Value r;        // rounds done (i32: a 64-bit index costs the loop 3 more
                  // instructions a round)
  TopList list;   // the lane's best remaining candidates, best first
  Value more;     // i1: the list was full when filled: the lane may hold more
  SmallVector<Value> slotKeys, slotIndices; // picks lane + s * width (i32)
  Value lastKey, lastPosition; // the group's last pick; its position as
                               // numbered by this lane (winner - laneBase)
  Value need;     // i1: this lane's list ran out and it may hold more

  SmallVector<Value> flat() const {
    SmallVector<Value> v = {r};
    llvm::append_range(v, list.keys);
    llvm::append_range(v, list.positions);
    llvm::append_range(v, slotKeys);
    llvm::append_range(v, slotIndices);
    if (more)
      llvm::append_range(v, ArrayRef<Value>{more, lastKey, lastPosition, need});
    return v;
  }
  static ListState unflat(ValueRange v, int64_t t, int64_t slots, bool refill) {
    ListState st;
    st.r = v[0];
    size_t i = 1;
    auto take = [&](int64_t n) {
      SmallVector<Value> out(v.begin() + i, v.begin() + i + n);
      i += n;
      return out;
    };
    st.list.keys = take(t);
    st.list.positions = take(t);
    st.slotKeys = take(slots);
    st.slotIndices = take(slots);
    if (refill) {
      st.more = v[i];
      st.lastKey = v[i + 1];
      st.lastPosition = v[i + 2];
      st.need = v[i + 3];
    }
    return st;
  }
};
} // namespace

/// Whether slot `s` of a lane of a group of `width` holds a pick: pick
/// s · width + lane is one of the k.
static Value slotHoldsPick(GpuKernelBuilder &kb, Value laneI32, int64_t s,
                           int64_t width, int64_t k) {
  return (s + 1) * width <= k ? kb.cBool(true)
                              : kb.lt(laneI32, kb.cI32(k - s * width));
}

/// emitListTopk's stores: each pick's weight and index, from the lane
/// (`laneI32` in the group) that holds it in slot s (pick lane + s · width).
static void storeListPicks(GpuKernelBuilder &kb, const ListTopkParams &p,
                           ArrayRef<Value> slotKeys,
                           ArrayRef<Value> slotIndices, Value laneI32) {
  const TopkSpec &spec = p.out.spec;
  const int64_t width = p.width;
  const int64_t slots = slotKeys.size();
  Value lane = p.lane;
  // Weights, once per pick, by the lane that kept it; stores of a group's
  // picks are consecutive (lane l writes pick l + s * width).
  Value v0Key = slotKeys[0];
  if (width > 1) {
    Value warpLane =
        kb.castInt(kb.remu(kb.threadId(), kb.idx(kWarp)), kb.i32());
    v0Key = kb.shuffleIdx(v0Key, kb.sub(warpLane, laneI32));
  }
  Value v0 = keyToFloat(kb, v0Key);
  SmallVector<Value> vals, valid;
  for (int64_t s = 0; s < slots; ++s) {
    vals.push_back(keyToFloat(kb, slotKeys[s]));
    valid.push_back(slotHoldsPick(kb, laneI32, s, width, spec.k));
  }
  Value selSum;
  if (spec.renormalize) {
    Value zero = kb.cF32(0.0);
    selSum = zero;
    for (int64_t s = 0; s < slots; ++s)
      selSum = kb.fadd(
          selSum,
          kb.select(valid[s], topkSelectionTerm(kb, spec, vals[s], v0), zero));
    if (width > 1)
      selSum = subgroupReduce(kb, selSum, ReduceKind::Sum, width);
  }
  for (int64_t s = 0; s < slots; ++s) {
    Value w = topkWeight(kb, spec, vals[s], v0, selSum, p.out.denseMax,
                         p.out.denseSum);
    kb.ifThen(kb.andI(p.out.active, valid[s]), [&] {
      Value r = kb.add(lane, kb.idx(s * width));
      kb.store(w, p.out.weights, {p.out.row, r});
      kb.store(kb.asElementOf(slotIndices[s], p.out.indices), p.out.indices,
               {p.out.row, r});
    });
  }
}

void mlir::moe::gpu_lowering::emitListTopk(GpuKernelBuilder &kb,
                                           const ListTopkParams &p) {
  ArrayRef<Value> keys = p.keys;
  ArrayRef<int64_t> positions = p.positions;
  Value laneBase = p.laneBase, lane = p.lane;
  const int64_t width = p.width;
  const TopkSpec &spec = p.out.spec;
  const int64_t n = keys.size();
  const int64_t t = p.listLength;
  const int64_t slots = llvm::divideCeil(spec.k, width);
  // A lane wins at most min(k, n) rounds: a list that long never runs out.
  const bool refill = t < std::min<int64_t>(spec.k, n);
  Value gone = emptyListKey(kb, kb.i32());
  Value noIndex = kb.cI32(std::numeric_limits<int32_t>::max());
  Value laneI32 = kb.castInt(lane, kb.i32());
  Value all = kb.cI32(-1);

  // The lane's best t among its elements ranking after (prevKey, prevPos):
  // one pass in index order. The first fill passes "no pick yet".
  auto fill = [&](Value prevKey, Value prevPos) {
    TopList fresh;
    fresh.keys.assign(t, gone);
    fresh.positions.assign(t, kb.cI32(0));
    for (int64_t m = 0; m < n; ++m) {
      Value pos = kb.cI32(positions[m]);
      Value key = keys[m];
      if (prevKey)
        key = kb.select(ranksAfterPick(kb, key, pos, prevKey, prevPos), key,
                        gone);
      insertIntoTopList(kb, fresh, key, pos);
    }
    return fresh;
  };

  // One round: the group's best head, popped by its lane.
  auto round = [&](const ListState &st) {
    Value head = st.list.keys[0];
    Value headIndex = kb.add(st.list.positions[0], laneBase);
    Value best = head, winner;
    if (width == kWarp) {
      best = redux(kb, head, NVVM::ReduxKind::MAX, all);
    } else {
      for (int64_t off = width / 2; off >= 1; off /= 2)
        best = kb.maxs(best, kb.shuffleXor(best, off));
    }
    // Ties: the lowest index among the heads holding the best key. A lane's
    // other entries with that key have higher indices than its head, and an
    // empty head (gone) never equals the best: some element is left, k <= K.
    winner = kb.select(kb.eq(head, best), headIndex, noIndex);
    if (width == kWarp) {
      winner = redux(kb, winner, NVVM::ReduxKind::MIN, all);
    } else {
      for (int64_t off = width / 2; off >= 1; off /= 2)
        winner = kb.mins(winner, kb.shuffleXor(winner, off));
    }
    // Indices are unique in the group and the winner is a head: only the
    // winning lane matches (a stale position behind an empty head is one of
    // its own elements, never another lane's winner).
    Value won = kb.eq(headIndex, winner);
    ListState next = st;
    for (int64_t j = 0; j + 1 < t; ++j) {
      next.list.keys[j] = kb.select(won, st.list.keys[j + 1], st.list.keys[j]);
      next.list.positions[j] =
          kb.select(won, st.list.positions[j + 1], st.list.positions[j]);
    }
    next.list.keys[t - 1] = kb.select(won, gone, st.list.keys[t - 1]);
    // Pick r goes to lane r % width, slot r / width.
    Value rl = kb.sub(st.r, laneI32);
    for (int64_t s = 0; s < slots; ++s) {
      Value mine = kb.eq(rl, kb.cI32(s * width));
      next.slotKeys[s] = kb.select(mine, best, st.slotKeys[s]);
      next.slotIndices[s] = kb.select(mine, winner, st.slotIndices[s]);
    }
    if (refill) {
      Value emptied = t > 1 ? kb.eq(st.list.keys[1], gone) : kb.cBool(true);
      next.need = kb.andI(kb.andI(won, emptied), st.more);
      next.lastKey = best;
      next.lastPosition = kb.sub(winner, laneBase);
    }
    next.r = kb.add(st.r, kb.cI32(1));
    return next;
  };

  ListState init;
  init.r = kb.cI32(0);
  init.slotKeys.assign(slots, gone);
  init.slotIndices.assign(slots, kb.cI32(0));
  ListState done;
  if (!refill) {
    init.list = fill(nullptr, nullptr);
    SmallVector<Value> res = kb.forLoop(
        kb.idx(0), kb.idx(spec.k), kb.idx(1), init.flat(),
        [&](Value, ValueRange args) {
          return round(ListState::unflat(args, t, slots, false)).flat();
        });
    done = ListState::unflat(res, t, slots, false);
  } else {
    // The first fill takes every element (no filter); a list filled to its
    // end may leave elements behind (`more`).
    init.list = fill(nullptr, nullptr);
    init.more = kb.notI1(kb.eq(init.list.keys[t - 1], gone));
    init.lastKey = kb.cI32(std::numeric_limits<int32_t>::max());
    init.lastPosition = kb.cI32(-1);
    init.need = kb.cBool(false);
    // The rounds run in an inner loop as long as no lane's list runs out;
    // the refill is outside it, so the hot loop is the round alone. Both
    // loops' conditions are warp-uniform (k, and a vote over the warp), so
    // every lane reaches every shuffle, redux and vote.
    SmallVector<Value> initial = init.flat();
    SmallVector<Value> res = whileLoop(
        kb.b, initial, ValueRange(initial).getTypes(),
        [&](ValueRange args) -> std::pair<Value, SmallVector<Value>> {
          return {kb.lt(args[0], kb.cI32(spec.k)), SmallVector<Value>(args)};
        },
        [&](ValueRange args) {
          SmallVector<Value> rounds = whileLoop(
              kb.b, args, args.getTypes(),
              [&](ValueRange a) -> std::pair<Value, SmallVector<Value>> {
                ListState next = round(ListState::unflat(a, t, slots, true));
                Value anyNeed = NVVM::VoteSyncOp::create(
                    kb.b, kb.b.getI1Type(), all, next.need,
                    NVVM::VoteSyncKind::any);
                Value go = kb.andI(kb.lt(next.r, kb.cI32(spec.k)),
                                   kb.notI1(anyNeed));
                return {go, next.flat()};
              },
              [&](ValueRange a) { return SmallVector<Value>(a); });
          // The rounds stopped before k only for a lane whose list ran out
          // (rare: the refill is off the hot path, and off the warp's common
          // path). Lanes that need it take the list of their elements ranking
          // after their last pick (the group's last pick is theirs: they won
          // it).
          Value stopped = kb.lt(rounds[0], kb.cI32(spec.k));
          SmallVector<Type> types(ValueRange(rounds).getTypes());
          return kb.ifElse(
              stopped, types,
              [&] {
                ListState st = ListState::unflat(rounds, t, slots, true);
                TopList fresh = fill(st.lastKey, st.lastPosition);
                for (int64_t j = 0; j < t; ++j) {
                  st.list.keys[j] =
                      kb.select(st.need, fresh.keys[j], st.list.keys[j]);
                  st.list.positions[j] = kb.select(st.need, fresh.positions[j],
                                                   st.list.positions[j]);
                }
                st.more = kb.select(
                    st.need, kb.notI1(kb.eq(fresh.keys[t - 1], gone)), st.more);
                st.need = kb.cBool(false);
                return st.flat();
              },
              [&] { return rounds; });
        });
    done = ListState::unflat(res, t, slots, true);
  }

  if (p.epilogue) {
    ListPicks picks;
    picks.keys = done.slotKeys;
    picks.indices = done.slotIndices;
    for (int64_t s = 0; s < slots; ++s)
      picks.valid.push_back(slotHoldsPick(kb, laneI32, s, width, spec.k));
    p.epilogue(picks);
    return;
  }
  storeListPicks(kb, p, done.slotKeys, done.slotIndices, laneI32);
}
