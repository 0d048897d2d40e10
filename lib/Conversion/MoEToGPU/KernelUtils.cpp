//===- KernelUtils.cpp - Building blocks of the moe GPU kernels -----------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "KernelUtils.h"
#include "Limits.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;
using namespace mlir::moe::kernels;

//===----------------------------------------------------------------------===//
// GpuKernelBuilder
//===----------------------------------------------------------------------===//

Value GpuKernelBuilder::threadId(gpu::Dimension d) {
  return gpu::ThreadIdOp::create(b, d);
}
Value GpuKernelBuilder::blockId(gpu::Dimension d) {
  return gpu::BlockIdOp::create(b, d);
}
Value GpuKernelBuilder::gridDim(gpu::Dimension d) {
  return gpu::GridDimOp::create(b, d);
}
void GpuKernelBuilder::barrier() { gpu::BarrierOp::create(b); }
Value GpuKernelBuilder::shuffleXor(Value v, int64_t offset) {
  return gpu::ShuffleOp::create(b, v, cI32(offset), cI32(kWarp),
                                gpu::ShuffleMode::XOR)
      .getShuffleResult();
}
Value GpuKernelBuilder::shuffleIdx(Value v, Value srcLane) {
  return gpu::ShuffleOp::create(b, v, srcLane, cI32(kWarp),
                                gpu::ShuffleMode::IDX)
      .getShuffleResult();
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

static Value combine(GpuKernelBuilder &kb, Value x, Value y, ReduceKind kind) {
  switch (kind) {
  case ReduceKind::Sum:
    return kb.fadd(x, y);
  case ReduceKind::Max:
    return kb.fmax(x, y);
  case ReduceKind::MaxI64:
    return kb.maxs(x, y);
  }
  llvm_unreachable("reduce kind");
}

Value mlir::moe::gpu_lowering::subgroupReduce(GpuKernelBuilder &kb, Value v,
                                              ReduceKind kind, int64_t width) {
  if (kind != ReduceKind::MaxI64) {
    // gpu.subgroup_reduce, lowered by upstream's patterns
    // (lowerSubgroupReductions).
    auto op = kind == ReduceKind::Sum ? gpu::AllReduceOperation::ADD
                                      : gpu::AllReduceOperation::MAXIMUMF;
    std::optional<uint32_t> cluster;
    if (width < kWarp)
      cluster = static_cast<uint32_t>(width);
    return gpu::SubgroupReduceOp::create(kb.b, v, op, /*uniform=*/true, cluster);
  }
  // The packed i64 candidates of the top-k: upstream's shuffle lowering
  // takes values no wider than a shuffle (32 bits), so the two halves travel
  // separately here.
  for (int64_t offset = width / 2; offset >= 1; offset /= 2) {
    Value lo = kb.trunc(v, kb.i32());
    Value hi = kb.trunc(kb.shru(v, kb.cI64(32)), kb.i32());
    Value olo = kb.extu(kb.shuffleXor(lo, offset), kb.i64());
    Value ohi = kb.extu(kb.shuffleXor(hi, offset), kb.i64());
    v = combine(kb, v, kb.orI(kb.shl(ohi, kb.cI64(32)), olo), kind);
  }
  return v;
}

LogicalResult
mlir::moe::gpu_lowering::lowerSubgroupReductions(gpu::GPUModuleOp kernels) {
  SmallVector<Operation *> ops;
  kernels.walk([&](gpu::SubgroupReduceOp op) { ops.push_back(op); });
  if (ops.empty())
    return success();
  RewritePatternSet patterns(kernels.getContext());
  populateGpuLowerSubgroupReduceToShufflePatterns(patterns, kWarp);
  populateGpuLowerClusteredSubgroupReduceToShufflePatterns(patterns, kWarp);
  // Only these ops, and nothing folded: the rest lowers as written.
  GreedyRewriteConfig config;
  config.setStrictness(GreedyRewriteStrictness::ExistingAndNewOps)
      .enableFolding(false)
      .enableConstantCSE(false);
  bool changed = false;
  if (failed(applyOpPatternsGreedily(ops, std::move(patterns), config,
                                     &changed)))
    return failure();
  // Every reduction must be gone (a pattern that does not apply leaves it).
  WalkResult left = kernels.walk([](gpu::SubgroupReduceOp op) {
    op.emitOpError("was not lowered to shuffles");
    return WalkResult::interrupt();
  });
  return failure(left.wasInterrupted());
}

Value mlir::moe::gpu_lowering::blockReduce(GpuKernelBuilder &kb, Value v,
                                           ReduceKind kind, int64_t threads,
                                           Value scratch) {
  int64_t warps = threads / kWarp;
  v = subgroupReduce(kb, v, kind, kWarp);
  if (warps == 1)
    return v;
  Value tid = kb.threadId();
  Value warp = kb.divu(tid, kb.idx(kWarp));
  Value lane = kb.remu(tid, kb.idx(kWarp));
  kb.ifThen(kb.eq(lane, kb.idx(0)), [&] { kb.store(v, scratch, {warp}); });
  kb.barrier();
  Value r = kb.load(scratch, {kb.idx(0)});
  for (int64_t w = 1; w < warps; ++w)
    r = combine(kb, r, kb.load(scratch, {kb.idx(w)}), kind);
  // The scratch may be reused right after: everybody has read it first.
  kb.barrier();
  return r;
}

//===----------------------------------------------------------------------===//
// Register top-k
//===----------------------------------------------------------------------===//

/// The epilogue of a register top-k: each lane turns the raw values it stored
/// (rounds r with r % width == lane) into weights.
static void rescaleOwnEntries(GpuKernelBuilder &kb, const TopkSpec &spec,
                              Value lane, int64_t width, Value weights,
                              Value row, Value active, Value v0, Value selSum,
                              Value denseMax, Value denseSum) {
  if (!spec.logits && !spec.renormalize)
    return; // raw probabilities: the stored values are the weights
  kb.ifThen(active, [&] {
    kb.forLoop(lane, kb.idx(spec.k), kb.idx(width), [&](Value r) {
      Value v = kb.load(weights, {row, r});
      kb.store(topkWeight(kb, spec, v, v0, selSum, denseMax, denseSum), weights,
              {row, r});
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
emitReduxRounds(GpuKernelBuilder &kb, ArrayRef<Value> vals, Value lane,
                const RegisterRow &layout, int64_t numElements,
                const TopkSpec &spec, Value weights, Value indices, Value row,
                Value active) {
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
          kb.store(winner, indices, {row, r});
        });
        next.push_back(pick.v0);
        next.push_back(kb.fadd(args[vpt + 1], pick.term));
        return next;
      });
  return {done[vpt], done[vpt + 1]};
}

void mlir::moe::gpu_lowering::emitRegisterTopk(
    GpuKernelBuilder &kb, ArrayRef<Value> vals, Value lane, int64_t width,
    int64_t numElements, const TopkSpec &spec, Value weights, Value indices,
    Value row, Value active, Value denseMax, Value denseSum, TopkRounds rounds,
    int64_t run) {
  RegisterRow layout{width, run};
  if (rounds == TopkRounds::Redux) {
    SmallVector<Value> sel =
        emitReduxRounds(kb, vals, lane, layout, numElements, spec, weights,
                        indices, row, active);
    rescaleOwnEntries(kb, spec, lane, width, weights, row, active, sel[0],
                      sel[1], denseMax, denseSum);
    return;
  }
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
                    kb.store(index, indices, {row, r});
                  });
                  return {best, pick.v0, selSum};
                });

  rescaleOwnEntries(kb, spec, lane, width, weights, row, active, done[1],
                    done[2], denseMax, denseSum);
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

/// An scf.while built through `kb` (its regions on kb's builder): `before`
/// returns {condition, values passed on}, `after` the values yielded back.
static SmallVector<Value>
whileLoop(GpuKernelBuilder &kb, ValueRange init,
          function_ref<std::pair<Value, SmallVector<Value>>(ValueRange)> before,
          function_ref<SmallVector<Value>(ValueRange)> after) {
  auto loop = scf::WhileOp::create(
      kb.b, init.getTypes(), init,
      [&](OpBuilder &nb, Location, ValueRange args) {
        OpBuilder::InsertionGuard guard(kb.b);
        kb.b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        auto [cond, values] = before(args);
        scf::ConditionOp::create(kb.b, cond, values);
      },
      [&](OpBuilder &nb, Location, ValueRange args) {
        OpBuilder::InsertionGuard guard(kb.b);
        kb.b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        scf::YieldOp::create(kb.b, after(args));
      });
  return SmallVector<Value>(loop.getResults());
}

void mlir::moe::gpu_lowering::emitListTopk(
    GpuKernelBuilder &kb, ArrayRef<Value> keys, ArrayRef<int64_t> positions,
    Value laneBase, Value lane, int64_t width, int64_t listLength,
    const TopkSpec &spec, Value weights, Value indices, Value row, Value active,
    Value denseMax, Value denseSum,
    function_ref<void(const ListPicks &)> epilogue) {
  const int64_t n = keys.size();
  const int64_t t = listLength;
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
    SmallVector<Value> res = whileLoop(
        kb, init.flat(),
        [&](ValueRange args) -> std::pair<Value, SmallVector<Value>> {
          return {kb.lt(args[0], kb.cI32(spec.k)), SmallVector<Value>(args)};
        },
        [&](ValueRange args) {
          SmallVector<Value> rounds = whileLoop(
              kb, args,
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

  if (epilogue) {
    ListPicks picks;
    picks.keys = done.slotKeys;
    picks.indices = done.slotIndices;
    for (int64_t s = 0; s < slots; ++s)
      picks.valid.push_back((s + 1) * width <= spec.k
                                ? kb.cBool(true)
                                : kb.lt(laneI32, kb.cI32(spec.k - s * width)));
    epilogue(picks);
    return;
  }
  // Weights, once per pick, by the lane that kept it; stores of a group's
  // picks are consecutive (lane l writes pick l + s * width).
  Value v0Key = done.slotKeys[0];
  if (width > 1) {
    Value warpLane = kb.castInt(kb.remu(kb.threadId(), kb.idx(kWarp)), kb.i32());
    v0Key = kb.shuffleIdx(v0Key, kb.sub(warpLane, laneI32));
  }
  Value v0 = keyToFloat(kb, v0Key);
  SmallVector<Value> vals, valid;
  for (int64_t s = 0; s < slots; ++s) {
    vals.push_back(keyToFloat(kb, done.slotKeys[s]));
    valid.push_back((s + 1) * width <= spec.k
                        ? kb.cBool(true)
                        : kb.lt(laneI32, kb.cI32(spec.k - s * width)));
  }
  Value selSum;
  if (spec.renormalize) {
    Value zero = kb.cF32(0.0);
    selSum = zero;
    for (int64_t s = 0; s < slots; ++s)
      selSum = kb.fadd(selSum, kb.select(valid[s],
                                         topkSelectionTerm(kb, spec, vals[s], v0),
                                         zero));
    if (width > 1)
      selSum = subgroupReduce(kb, selSum, ReduceKind::Sum, width);
  }
  for (int64_t s = 0; s < slots; ++s) {
    Value w = topkWeight(kb, spec, vals[s], v0, selSum, denseMax, denseSum);
    kb.ifThen(kb.andI(active, valid[s]), [&] {
      Value r = kb.add(lane, kb.idx(s * width));
      kb.store(w, weights, {row, r});
      kb.store(done.slotIndices[s], indices, {row, r});
    });
  }
}

static Value toF32(GpuKernelBuilder &kb, Value v) {
  return v.getType().isF32() ? v : arith::ExtFOp::create(kb.b, kb.f32(), v);
}

/// The 16 bytes at `address` (an index: a generic address of global memory,
/// 16-byte aligned) as the f32 values of its 16 / sizeof(elt) elements: one
/// ld.global.nc.v4.b32 (LDG.E.128.CONSTANT; the scores are read-only in the
/// kernel), written as inline assembly because LLVM splits a <4 x float>
/// load whose uses are extracts into scalar loads (VectorCombine) and then
/// merges them with the unaligned path's identical scalar loads, losing the
/// alignment the 128-bit load needs. Side effects declared so that nothing
/// hoists it out of the aligned branch.
SmallVector<Value>
mlir::moe::gpu_lowering::loadGlobal16(GpuKernelBuilder &kb, Value address,
                                      Type elt) {
  MLIRContext *ctx = kb.b.getContext();
  Type i32 = kb.i32();
  auto words = LLVM::LLVMStructType::getLiteral(ctx, {i32, i32, i32, i32});
  auto load = LLVM::InlineAsmOp::create(
      kb.b, TypeRange{words}, ValueRange{kb.castInt(address, kb.i64())},
      "{ .reg .u64 g; cvta.to.global.u64 g, $4; "
      "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [g]; }",
      "=r,=r,=r,=r,l", /*has_side_effects=*/true, /*is_align_stack=*/false,
      LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
      ArrayAttr());
  SmallVector<Value> out;
  for (int64_t w = 0; w < 4; ++w) {
    Value word = LLVM::ExtractValueOp::create(kb.b, load.getResult(0), w);
    if (elt.isF32()) {
      out.push_back(kb.bitcast(word, kb.f32()));
      continue;
    }
    // Two 16-bit elements, the lower index in the low half (little endian).
    Type i16 = kb.b.getI16Type();
    for (Value half : {word, kb.shru(word, kb.cI32(16))})
      out.push_back(toF32(kb, kb.bitcast(kb.trunc(half, i16), elt)));
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

gpu::GPUModuleOp
mlir::moe::gpu_lowering::getOrCreateKernelModule(ModuleOp module,
                                                 OpBuilder &b) {
  constexpr StringLiteral name = "moe_kernels";
  if (auto existing = module.lookupSymbol<gpu::GPUModuleOp>(name))
    return existing;
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(module.getBody());
  return gpu::GPUModuleOp::create(b, module.getLoc(), name);
}

/// A new kernel `<base>_<n>` in @moe_kernels of `h`'s module with the given
/// argument types, workgroup buffers and known block size; `kb` gets the
/// listener of `h`'s rewriter and is left at the start of the kernel's body
/// (a gpu.return is already there).
static gpu::GPUFuncOp createKernel(HostCode &h, StringRef base,
                                   TypeRange argTypes, TypeRange workgroupTypes,
                                   std::array<int64_t, 3> blockSize,
                                   ImplicitLocOpBuilder &kb) {
  kb.setListener(h.b.getListener());
  gpu::GPUModuleOp kernels = getOrCreateKernelModule(h.module, kb);
  SymbolTable symbols(kernels);
  std::string name;
  for (unsigned n = 0;; ++n) {
    name = (base + "_" + Twine(n)).str();
    if (!symbols.lookup(name))
      break;
  }
  kb.setInsertionPointToEnd(kernels.getBody());
  auto type = kb.getFunctionType(argTypes, {});
  auto func = gpu::GPUFuncOp::create(kb, name, type, workgroupTypes);
  func->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), kb.getUnitAttr());
  func.setKnownBlockSizeAttr(kb.getDenseI32ArrayAttr(
      {static_cast<int32_t>(blockSize[0]), static_cast<int32_t>(blockSize[1]),
       static_cast<int32_t>(blockSize[2])}));
  Block &entry = func.getBody().front();
  kb.setInsertionPointToEnd(&entry);
  auto ret = gpu::ReturnOp::create(kb);
  kb.setInsertionPoint(ret);
  return func;
}

GPUKernel::GPUKernel(HostCode &h, StringRef name, ValueRange operands,
                     TypeRange workgroupTypes, std::array<int64_t, 3> blockSize,
                     Location loc)
    : b(loc, h.b.getContext()), kb(b),
      func(createKernel(h, name, operands.getTypes(), workgroupTypes, blockSize,
                        b)),
      host(h), operands(operands), blockSize(blockSize) {}

Value GPUKernel::arg(unsigned i) {
  return func.getBody().front().getArgument(i);
}

Value GPUKernel::workgroup(unsigned i) {
  return func.getWorkgroupAttributions()[i];
}

Value GPUKernel::globalId() {
  return kb.add(kb.mul(kb.blockId(), kb.idx(blockSize[0])), kb.threadId());
}

void GPUKernel::forItem(Value count, function_ref<void(Value item)> body) {
  Value item = globalId();
  kb.ifThen(kb.lt(item, count), [&] { body(item); });
}

void GPUKernel::forRowsOfColumn(Value inRange, Value rows,
                                function_ref<void(Value row)> body) {
  kb.ifThen(inRange, [&] {
    kb.forLoop(kb.blockId(gpu::Dimension::y), rows, kb.gridDim(gpu::Dimension::y),
              body);
  });
}

void GPUKernel::launch(std::array<Value, 3> grid, Value dynamicSharedBytes) {
  host.launch(func, grid, blockSize, operands, dynamicSharedBytes);
}

void GPUKernel::launchOver(Value count) {
  GpuKernelBuilder &hk = host.kb;
  launch({hk.ceilDiv(count, hk.idx(blockSize[0])), hk.idx(1), hk.idx(1)});
}

void GPUKernel::launchColumns(Value cols, Value rows) {
  GpuKernelBuilder &hk = host.kb;
  launch({hk.ceilDiv(cols, hk.idx(blockSize[0])),
          hk.minu(rows, hk.idx(kMaxGridDim[1])), hk.idx(1)});
}

MemRefType mlir::moe::gpu_lowering::workgroupMemRef(ArrayRef<int64_t> shape,
                                                    Type elementType) {
  auto space = gpu::AddressSpaceAttr::get(elementType.getContext(),
                                          gpu::AddressSpace::Workgroup);
  return MemRefType::get(shape, elementType, MemRefLayoutAttrInterface(),
                         space);
}

//===----------------------------------------------------------------------===//
// Host code
//===----------------------------------------------------------------------===//

/// The identity-layout memref of a ranked tensor type: the type of a kernel
/// block argument (KernelOp's builder).
static MemRefType bufferTypeOf(RankedTensorType type) {
  return MemRefType::get(type.getShape(), type.getElementType());
}

/// The body's block, in the placeholder or in the kernel.
static Block &blockOf(Operation *op) { return op->getRegion(0).front(); }

HostCode::HostCode(RewriterBase &rewriter, Operation *op)
    : rewriter(rewriter), b(op->getLoc(), rewriter),
      module(op->getParentOfType<ModuleOp>()), kb(b) {
  b.setInsertionPoint(op);
  body = KernelOp::create(b, ValueRange{}, ValueRange{});
  b.setInsertionPoint(blockOf(body).getTerminator());
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::WaitOp::create(b, tokenType, ValueRange{}).getAsyncToken();
}

Value HostCode::buffer(Value tensor) {
  Block &block = blockOf(body);
  for (auto [i, in] : llvm::enumerate(ins))
    if (in == tensor)
      return block.getArgument(i);
  // Ins come before the outs in the block's arguments.
  ins.push_back(tensor);
  return block.insertArgument(
      ins.size() - 1, bufferTypeOf(cast<RankedTensorType>(tensor.getType())),
      b.getLoc());
}

Value HostCode::alloc(MemRefType type, ValueRange dynamicSizes) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  auto op = gpu::AllocOp::create(b, type, tokenType, ValueRange{token},
                                 dynamicSizes, ValueRange{},
                                 /*hostShared=*/false);
  token = op.getAsyncToken();
  return op.getMemref();
}

Value HostCode::allocLike(RankedTensorType type, ValueRange dynamicSizes) {
  SmallVector<Value> sizes;
  for (Value size : dynamicSizes)
    sizes.push_back(hoist(size));
  OpBuilder::InsertionGuard guard(rewriter);
  rewriter.setInsertionPoint(body);
  outs.push_back(
      bufferization::AllocTensorOp::create(rewriter, b.getLoc(), type, sizes));
  return blockOf(body).addArgument(bufferTypeOf(type), b.getLoc());
}

Value HostCode::hoist(Value v) {
  if (!body->getRegion(0).isAncestor(v.getParentRegion()))
    return v;
  if (Value done = hoisted.lookupOrNull(v))
    return done;
  Operation *def = v.getDefiningOp();
  if (!def)
    llvm::report_fatal_error("HostCode: a size of a result is a block "
                             "argument of the host code");
  Value result;
  if (auto dim = dyn_cast<memref::DimOp>(def)) {
    Value index = hoist(dim.getIndex());
    OpBuilder::InsertionGuard guard(rewriter);
    rewriter.setInsertionPoint(body);
    Value source = dim.getSource();
    auto arg = dyn_cast<BlockArgument>(source);
    if (arg && arg.getOwner() == &blockOf(body)) {
      // The dim of an in or an out is the dim of its tensor.
      unsigned i = arg.getArgNumber();
      Value t = i < ins.size() ? ins[i] : outs[i - ins.size()];
      result = tensor::DimOp::create(rewriter, dim.getLoc(), t, index);
    } else if (auto alloc = source.getDefiningOp<gpu::AllocOp>()) {
      // A temporary's dim: its static size or its dynamic size operand.
      std::optional<int64_t> d = getConstantIntValue(index);
      MemRefType type = alloc.getType();
      if (d && !type.isDynamicDim(*d)) {
        result = arith::ConstantIndexOp::create(rewriter, dim.getLoc(),
                                                type.getDimSize(*d));
      } else if (d) {
        // hoist() sets its own insertion point.
        result = hoist(alloc.getDynamicSizes()[type.getDynamicDimIndex(*d)]);
      }
    }
  } else if (def->getNumRegions() == 0 && isMemoryEffectFree(def)) {
    // Arithmetic on sizes (and its constants).
    for (Value operand : def->getOperands())
      hoist(operand);
    OpBuilder::InsertionGuard guard(rewriter);
    rewriter.setInsertionPoint(body);
    Operation *clone = rewriter.clone(*def, hoisted);
    result = clone->getResult(cast<OpResult>(v).getResultNumber());
  }
  if (!result)
    llvm::report_fatal_error(
        llvm::Twine("HostCode: a size of a result depends on '") +
        def->getName().getStringRef() +
        "', which cannot be computed outside the host code (sizes may use "
        "dims of buffer()s, outs and gpu.allocs, and arithmetic)");
  hoisted.map(v, result);
  return result;
}

void HostCode::fill32(Value buffer, Value value) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::MemsetOp::create(b, tokenType, ValueRange{token}, buffer, value)
              .getAsyncToken();
}

void HostCode::launch(gpu::GPUFuncOp kernel, std::array<Value, 3> grid,
                      std::array<int64_t, 3> block, ValueRange args,
                      Value dynamicSharedBytes) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  gpu::KernelDim3 gridDim{grid[0], grid[1], grid[2]};
  gpu::KernelDim3 blockDim{kb.idx(block[0]), kb.idx(block[1]), kb.idx(block[2])};
  auto op = gpu::LaunchFuncOp::create(b, kernel, gridDim, blockDim,
                                      dynamicSharedBytes, args,
                                      tokenType, ValueRange{token});
  token = op.getAsyncToken();
}

void HostCode::release(Value buffer) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::DeallocOp::create(b, tokenType, ValueRange{token}, buffer)
              .getAsyncToken();
}

/// Runtime entry points are declared as llvm.func (not func.func) so that the
/// C-interface wrappers requested for the public functions do not apply to
/// them: the runtime exports the plain C symbols.
static LLVM::LLVMFuncOp declareRuntimeFunction(HostCode &h, StringRef name,
                                               Type result) {
  if (auto f = h.module.lookupSymbol<LLVM::LLVMFuncOp>(name))
    return f;
  OpBuilder b(h.b);
  b.setInsertionPointToEnd(h.module.getBody());
  return LLVM::LLVMFuncOp::create(b, h.module.getLoc(), name,
                                  LLVM::LLVMFunctionType::get(result, {}));
}

Value HostCode::errorWord() {
  auto f = declareRuntimeFunction(*this, "moeGpuErrorWord", b.getI64Type());
  return LLVM::CallOp::create(b, f, ValueRange{}).getResult();
}

void HostCode::finish(bool checkErrors) {
  closingWait = gpu::WaitOp::create(b, Type(), ValueRange{token});
  if (!checkErrors)
    return;
  auto f = declareRuntimeFunction(*this, "moeGpuCheckErrors", b.getI32Type());
  LLVM::CallOp::create(b, f, ValueRange{});
}

BlockArgument HostCode::outFor(Value buffer, RankedTensorType type) {
  Block &block = blockOf(kernel ? kernel : body);
  auto arg = dyn_cast<BlockArgument>(buffer);
  if (arg && arg.getOwner() == &block && arg.getArgNumber() >= ins.size())
    return arg;
  if (kernel || !closingWait)
    llvm::report_fatal_error("HostCode: a result that is not an out (see "
                             "allocLike) is copied into one between finish() "
                             "and the first tensor() or replace()");
  // A temporary, a view or an operand's buffer: copied into a new out at the
  // end of the stream, before the closing wait. (Results allocated with
  // allocLike are written in place: no copy.)
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(closingWait);
  SmallVector<Value> sizes;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (type.isDynamicDim(d))
      sizes.push_back(kb.dim(buffer, d));
  auto out = cast<BlockArgument>(allocLike(type, sizes));
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::MemcpyOp::create(b, tokenType, ValueRange{token}, out, buffer)
              .getAsyncToken();
  // A temporary of the host code is dead once copied.
  if (buffer.getDefiningOp<gpu::AllocOp>())
    release(buffer);
  rewriter.modifyOpInPlace(closingWait,
                           [&] { closingWait->setOperand(0, token); });
  return out;
}

void HostCode::makeKernelOp() {
  if (!closingWait)
    llvm::report_fatal_error("HostCode: tensor() or replace() before finish()");
  // The placeholder cannot gain results: a new op takes its region.
  OperationState state(body->getLoc(), KernelOp::getOperationName());
  state.addOperands(ins);
  state.addOperands(outs);
  state.getOrAddProperties<KernelOp::Properties>().operandSegmentSizes = {
      static_cast<int32_t>(ins.size()), static_cast<int32_t>(outs.size())};
  state.addTypes(ValueRange(outs).getTypes());
  state.addRegion();
  OpBuilder::InsertionGuard guard(rewriter);
  rewriter.setInsertionPoint(body);
  kernel = rewriter.create(state);
  Region &region = kernel->getRegion(0);
  rewriter.inlineRegionBefore(body->getRegion(0), region, region.end());
  rewriter.eraseOp(body);
  body = nullptr;
  b.setInsertionPointAfter(kernel);
}

Value HostCode::resultOf(BlockArgument out, RankedTensorType type) {
  if (!kernel)
    makeKernelOp();
  Value result = kernel->getResult(out.getArgNumber() - ins.size());
  if (result.getType() != type)
    result = tensor::CastOp::create(b, type, result);
  return result;
}

Value HostCode::tensor(Value buffer, RankedTensorType type) {
  return resultOf(outFor(buffer, type), type);
}

void HostCode::replace(Operation *op, ValueRange buffers) {
  replace(ArrayRef<Operation *>{op}, buffers);
}

void HostCode::replace(ArrayRef<Operation *> ops, ValueRange buffers) {
  // Every out first: the kernel's results are fixed once it is made.
  SmallVector<Value> opResults;
  for (Operation *op : ops)
    llvm::append_range(opResults, op->getResults());
  SmallVector<std::pair<BlockArgument, RankedTensorType>> results;
  for (auto [result, buffer] : llvm::zip_equal(opResults, buffers)) {
    auto type = cast<RankedTensorType>(result.getType());
    results.push_back({outFor(buffer, type), type});
  }
  SmallVector<Value> tensors;
  for (auto [out, type] : results)
    tensors.push_back(resultOf(out, type));
  ArrayRef<Value> rest = tensors;
  for (Operation *op : ops) {
    rewriter.replaceOp(op, rest.take_front(op->getNumResults()));
    rest = rest.drop_front(op->getNumResults());
  }
}

void mlir::moe::gpu_lowering::emitRecordIndexError(GpuKernelBuilder &kb,
                                                   Value word, int64_t opCode,
                                                   Value position, Value value,
                                                   Value bound) {
  ImplicitLocOpBuilder &b = kb.b;
  auto ptrType = LLVM::LLVMPointerType::get(b.getContext(), /*addressSpace=*/1);
  Value base = LLVM::IntToPtrOp::create(b, ptrType, word);
  auto cas = LLVM::AtomicCmpXchgOp::create(b, base, kb.cI64(0), kb.cI64(1),
                                           LLVM::AtomicOrdering::monotonic,
                                           LLVM::AtomicOrdering::monotonic);
  Value won = LLVM::ExtractValueOp::create(b, cas.getResult(), 1);
  kb.ifThen(won, [&] {
    auto put = [&](int64_t slot, Value v) {
      Value addr = LLVM::GEPOp::create(
          b, ptrType, b.getI64Type(), base,
          ArrayRef<LLVM::GEPArg>{static_cast<int32_t>(slot)});
      LLVM::StoreOp::create(b, kb.castInt(v, kb.i64()), addr);
    };
    put(1, kb.cI64(opCode));
    put(2, position);
    put(3, value);
    put(4, bound);
  });
}

SmallVector<Value>
mlir::moe::gpu_lowering::dynamicSizesFrom(GpuKernelBuilder &kb,
                                          RankedTensorType type, Value like) {
  SmallVector<Value> sizes;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (type.isDynamicDim(d))
      sizes.push_back(kb.dim(like, d));
  return sizes;
}
