//===- DispatchPlan.cpp - moe.dispatch_plan -> fast CPU kernel ------------===//
//
// Part of the MoE-MLIR project.
//
// The portable lowering is one sequential counting sort. Here the tokens are
// cut into items of kRouteRowsPerItem rows and the sort runs in three phases,
// of which the two O(T·k) ones are parallel and the result is still the
// stable order (so it is identical to the portable lowering's, whatever the
// thread count):
//
// 1. (workers) each item counts its in-range assignments per expert into its
//    row of a [items, E] histogram;
// 2. (sequential, O(E·items)) per expert, the histogram becomes each item's
//    first position in the expert-sorted order (an exclusive scan over the
//    items on top of the expert's offset); counts, offsets, the block-padded
//    offsets and the block -> expert map follow;
// 3. (workers) each item places its assignments, in increasing n = t·k + j, at
//    its own cursors: order, inverse and padded_order. Items write disjoint
//    positions: no atomics.
//
// Out-of-range indices are reported (linalg_lowering::emitIndexCheck, as in the
// portable lowering) and left out of every result (inverse entry -1).
//
// With a capacity, a sequential phase 0 marks the kept assignments (keep [N])
// and counts the dropped ones, and phases 1-3 skip the others exactly like
// out-of-range ones. By position: one pass in the priority order (slot, then
// token) with a cursor per expert. By probability: every assignment gets a
// unique 63-bit priority key (the ordered bits of its weight, then its
// position), and a bisection over the key range, all experts at once (63
// passes over the keys), finds each overloaded expert's C-th largest key: the
// expert keeps the keys at or above it, exactly C. O(63·T·k), no sort, and
// the result is a pure function of the inputs (any thread count).
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "Route.h"

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace mlir::moe::cpu_lowering {

namespace {
/// Whether expert value `v` (an element of `indices`) is in [0, E).
Value inRange(CpuKernelBuilder &kb, Value v, int64_t numExperts) {
  Type elt = v.getType();
  Value zero = kb.castInt(kb.idx(0), elt), bound = kb.castInt(kb.idx(numExperts), elt);
  return kb.andI(kb.cmpi(arith::CmpIPredicate::sge, v, zero), kb.lt(v, bound));
}

/// Runs body(n, e) for the planned assignments of row `row` (n = row·K + j,
/// e the expert as an index): in range and, with a capacity mask `keep` [N]
/// (i32, 0 = dropped), kept; and otherwise(n) for the others.
void eachAssignment(CpuKernelBuilder &kb, Value indices, Value row, int64_t numExperts,
                    function_ref<void(Value n, Value e)> body,
                    function_ref<void(Value n)> otherwise = nullptr,
                    Value keep = nullptr) {
  Value width = kb.dim(indices, 1);
  kb.forLoop(kb.idx(0), width, kb.idx(1), [&](Value j) {
    Value n = kb.add(kb.mul(row, width), j);
    Value v = kb.load(indices, {row, j});
    Value ok = inRange(kb, v, numExperts);
    if (keep)
      ok = kb.andI(ok, kb.cmpi(arith::CmpIPredicate::ne, kb.load(keep, {n}),
                             kb.cI32(0)));
    kb.ifThen(ok, [&] { body(n, kb.castInt(v, kb.index())); });
    if (otherwise)
      kb.ifThen(kb.notI1(ok), [&] { otherwise(n); });
  });
}

Value numItems(CpuKernelBuilder &kb, Value numRows) {
  return kb.ceilDiv(numRows, kb.idx(kRouteRowsPerItem));
}

void fill(CpuKernelBuilder &kb, Value buffer, Value size, Value v) {
  kb.forLoop(kb.idx(0), size, kb.idx(1), [&](Value i) { kb.store(v, buffer, {i}); });
}

/// The 63-bit priority key of drop(probability) for weight `w` (f32) at
/// position rank `rank` (j·T + t, an index < 2^31): larger keys claim first.
/// High 32 bits: the weight's bits ordered as unsigned integers (negative
/// floats flipped, positive ones with the sign bit set; -0.0 counted as 0.0;
/// every NaN above +inf, so NaN ranks first); low 31 bits: 2^31 - 1 - rank,
/// so equal weights go in the position order. Keys are unique and >= 0.
Value priorityKey(CpuKernelBuilder &kb, Value w, Value rank) {
  Value canonical = kb.fadd(w, kb.cF32(0.0)); // -0.0 + 0.0 = +0.0
  Value bits = kb.bitcast(canonical, kb.i32());
  Value ordered =
      kb.select(kb.lt(bits, kb.cI32(0)), kb.xorI(bits, kb.cI32(-1)),
               kb.orI(bits, kb.cI32(std::numeric_limits<int32_t>::min())));
  ordered = kb.select(kb.isNaN(w), kb.cI32(-1), ordered);
  Value high = kb.shl(kb.extu(ordered, kb.i64()), kb.cI64(31));
  Value low = kb.sub(kb.cI64(0x7FFFFFFF), kb.castInt(rank, kb.i64()));
  return kb.orI(high, low);
}

/// Phase 0 of a plan with a capacity: `keep` [N] (i32, 1 = kept) and
/// `dropped` [E] (i32), sequentially (see the file comment).
void emitCapacityPhase(CpuKernelBuilder &kb, DispatchPlanOp op, Value indices, Value weights,
                       Value keep, Value dropped) {
  int64_t numExperts = op.getNumExperts();
  // At most T·k < 2^31 assignments claim an expert: larger capacities keep
  // everything, as 2^31 - 1 does.
  int64_t capacity = std::min<int64_t>(static_cast<int64_t>(*op.getCapacity()),
                                       std::numeric_limits<int32_t>::max());
  Value rows = kb.dim(indices, 0), width = kb.dim(indices, 1);
  Value n = kb.mul(rows, width), e = kb.idx(numExperts);
  Value cap = kb.cI32(capacity);
  fill(kb, keep, n, kb.cI32(0));
  // demand[e]: the in-range assignments of e (by position: so far).
  Value demand = kb.alloc(MemRefType::get({numExperts}, kb.i32()), ValueRange{});
  fill(kb, demand, e, kb.cI32(0));
  auto eachSlotMajor = [&](function_ref<void(Value n, Value x, Value t,
                                             Value j)> body) {
    kb.forLoop(kb.idx(0), width, kb.idx(1), [&](Value j) {
      kb.forLoop(kb.idx(0), rows, kb.idx(1), [&](Value t) {
        Value v = kb.load(indices, {t, j});
        kb.ifThen(inRange(kb, v, numExperts), [&] {
          body(kb.add(kb.mul(t, width), j), kb.castInt(v, kb.index()), t, j);
        });
      });
    });
  };
  auto finishDropped = [&] {
    kb.forLoop(kb.idx(0), e, kb.idx(1), [&](Value x) {
      Value d = kb.load(demand, {x});
      kb.store(kb.sub(d, kb.select(kb.lt(d, cap), d, cap)), dropped, {x});
    });
  };

  if (op.getDrop() == CapacityDrop::position) {
    eachSlotMajor([&](Value nv, Value x, Value, Value) {
      Value place = kb.load(demand, {x});
      kb.ifThen(kb.lt(place, cap), [&] { kb.store(kb.cI32(1), keep, {nv}); });
      kb.store(kb.add(place, kb.cI32(1)), demand, {x});
    });
    finishDropped();
    return;
  }

  // drop(probability): the keys, then the bisection of every overloaded
  // expert's C-th largest key (lo: count(key >= lo) >= C; hi + 1: < C).
  Value keys = kb.alloc(MemRefType::get({ShapedType::kDynamic}, kb.i64()), {n});
  eachSlotMajor([&](Value nv, Value x, Value t, Value j) {
    Value w = kb.loadF(weights, {t, j});
    kb.store(priorityKey(kb, w, kb.add(kb.mul(j, rows), t)), keys, {nv});
    kb.store(kb.add(kb.load(demand, {x}), kb.cI32(1)), demand, {x});
  });
  finishDropped();
  if (capacity == 0)
    return; // everything dropped: keep stays 0
  auto i64Buffer = [&] {
    return kb.alloc(MemRefType::get({numExperts}, kb.i64()), ValueRange{});
  };
  Value lo = i64Buffer(), hi = i64Buffer(), mid = i64Buffer();
  Value above = kb.alloc(MemRefType::get({numExperts}, kb.i32()), ValueRange{});
  fill(kb, lo, e, kb.cI64(0));
  fill(kb, hi, e, kb.cI64(std::numeric_limits<int64_t>::max()));
  auto eachKey = [&](function_ref<void(Value nv, Value x)> body) {
    kb.forLoop(kb.idx(0), rows, kb.idx(1), [&](Value t) {
      eachAssignment(kb, indices, t, numExperts, body);
    });
  };
  kb.forLoop(kb.idx(0), kb.idx(63), kb.idx(1), [&](Value) {
    kb.forLoop(kb.idx(0), e, kb.idx(1), [&](Value x) {
      Value l = kb.load(lo, {x}), span = kb.sub(kb.load(hi, {x}), l);
      // lo + ceil(span / 2), no overflow: span < 2^63.
      kb.store(kb.add(l, kb.add(kb.shru(span, kb.cI64(1)), kb.andI(span, kb.cI64(1)))),
              mid, {x});
      kb.store(kb.cI32(0), above, {x});
    });
    eachKey([&](Value nv, Value x) {
      kb.ifThen(kb.cmpi(arith::CmpIPredicate::sge, kb.load(keys, {nv}),
                      kb.load(mid, {x})),
               [&] { kb.store(kb.add(kb.load(above, {x}), kb.cI32(1)), above, {x}); });
    });
    kb.forLoop(kb.idx(0), e, kb.idx(1), [&](Value x) {
      Value m = kb.load(mid, {x});
      Value enough = kb.cmpi(arith::CmpIPredicate::sge, kb.load(above, {x}), cap);
      kb.store(kb.select(enough, m, kb.load(lo, {x})), lo, {x});
      kb.store(kb.select(enough, kb.load(hi, {x}), kb.sub(m, kb.cI64(1))), hi, {x});
    });
  });
  // An expert within its capacity keeps everything (its bisection found 0).
  eachKey([&](Value nv, Value x) {
    Value within = kb.cmpi(arith::CmpIPredicate::sle, kb.load(demand, {x}), cap);
    Value high = kb.cmpi(arith::CmpIPredicate::sge, kb.load(keys, {nv}),
                        kb.load(lo, {x}));
    kb.ifThen(kb.orI(within, high), [&] { kb.store(kb.cI32(1), keep, {nv}); });
  });
}

} // namespace

template <>
LogicalResult CPUKernel<DispatchPlanOp>::emit(DispatchPlanOp op,
                                              CpuKernelBuilder &kb,
                                              PatternRewriter &rw) const {
  // Left to the fused kernel of its route (the greedy driver may visit the
  // plan first).
  if (auto route = op.getIndices().getDefiningOp<RouteOp>())
    if (fusableDispatchPlan(route) == op)
      return rw.notifyMatchFailure(op, "fused with its moe.route");
  int64_t numExperts = op.getNumExperts();
  if (failed(checkIndexOperand(rw, op, op.getIndices(), numExperts,
                               kMoEErrorDispatchPlanIndices)))
    return failure();
  SmallVector<Value> sizes = kb.sizes(op.getIndices());
  KernelScope kernel(
      kb, {op.getIndices(), op.getWeights()},
      KernelScope::outsOf(op, planResultSizes(kb, op, sizes[0], sizes[1])));
  Value indices = kb.buffer(op.getIndices());
  Value keep;
  if (op.getCapacity()) {
    keep = kb.alloc(MemRefType::get({ShapedType::kDynamic}, kb.i32()),
                   {kb.mul(sizes[0], sizes[1])});
    emitCapacityPhase(kb, op, indices,
                      op.getWeights() ? kb.buffer(op.getWeights()) : Value(),
                      keep, kernel.out(7));
  }
  Value hist = allocPlanHistogram(kb, kb.dim(indices, 0), numExperts);
  kb.workers(opts, numItems(kb, kb.dim(indices, 0)), [&](Value item, Value) {
    clearPlanItem(kb, hist, item, numExperts);
    Value r0 = kb.mul(item, kb.idx(kRouteRowsPerItem));
    Value r1 = kb.mins(kb.add(r0, kb.idx(kRouteRowsPerItem)), kb.dim(indices, 0));
    kb.forLoop(r0, r1, kb.idx(1), [&](Value r) {
      countPlanRow(kb, indices, hist, r, item, numExperts, keep);
    });
  });
  emitPlanFromHistogram(kb, opts, op, indices, hist, kernel.outs(), keep);
  kernel.replace(rw, op);
  return success();
}

Value allocPlanHistogram(CpuKernelBuilder &kb, Value numRows, int64_t numExperts) {
  return kb.alloc(MemRefType::get({ShapedType::kDynamic, numExperts}, kb.i32()),
                 {numItems(kb, numRows)});
}

void clearPlanItem(CpuKernelBuilder &kb, Value hist, Value item, int64_t numExperts) {
  kb.forLoop(kb.idx(0), kb.idx(numExperts), kb.idx(1),
            [&](Value e) { kb.store(kb.cI32(0), hist, {item, e}); });
}

void countPlanRow(CpuKernelBuilder &kb, Value indices, Value hist, Value row, Value item,
                  int64_t numExperts, Value keep) {
  eachAssignment(
      kb, indices, row, numExperts,
      [&](Value, Value e) {
        kb.store(kb.add(kb.load(hist, {item, e}), kb.cI32(1)), hist, {item, e});
      },
      nullptr, keep);
}

SmallVector<SmallVector<Value>> planResultSizes(CpuKernelBuilder &kb, DispatchPlanOp op,
                                                Value rows, Value slots) {
  int64_t numExperts = op.getNumExperts(), block = op.getBlockSize();
  Value n = kb.mul(rows, slots);
  Value paddedSize = kb.add(n, kb.idx(numExperts * (block - 1)));
  // counts [E], offsets [E + 1], order and inverse [n], padded_order
  // [paddedSize], block_experts [ceil(paddedSize / B)], num_padded [1];
  // with a capacity, dropped [E].
  SmallVector<SmallVector<Value>> sizes = {{kb.idx(numExperts)},
                                           {kb.idx(numExperts + 1)},
                                           {n},
                                           {n},
                                           {paddedSize},
                                           {kb.ceilDiv(paddedSize, kb.idx(block))},
                                           {kb.idx(1)}};
  if (op.getCapacity())
    sizes.push_back({kb.idx(numExperts)});
  return sizes;
}

void emitPlanFromHistogram(CpuKernelBuilder &kb, const KernelOptions &opts, DispatchPlanOp op,
                           Value indices, Value hist, ValueRange results,
                           Value keep) {
  int64_t numExperts = op.getNumExperts(), block = op.getBlockSize();
  Value e = kb.idx(numExperts), blk = kb.idx(block);
  Value n = kb.mul(kb.dim(indices, 0), kb.dim(indices, 1));
  Value paddedSize = kb.add(n, kb.idx(numExperts * (block - 1)));
  Value numBlocks = kb.ceilDiv(paddedSize, blk);
  Value items = numItems(kb, kb.dim(indices, 0));
  Value counts = results[0], offsets = results[1], order = results[2];
  Value inverse = results[3], padded = results[4], blocks = results[5];
  Value numPadded = results[6];
  Value paddedOffsets =
      kb.alloc(MemRefType::get({numExperts}, kb.i32()), ValueRange{});
  auto i32 = [&](Value v) { return kb.castInt(v, kb.i32()); };
  auto asIndex = [&](Value v) { return kb.castInt(v, kb.index()); };

  // Phase 2: the scan over experts (and, per expert, over the items).
  fill(kb, blocks, numBlocks, kb.cI32(-1));
  fill(kb, padded, paddedSize, i32(n));
  kb.store(kb.cI32(0), offsets, {kb.idx(0)});
  SmallVector<Value> ends = kb.forLoop(
      kb.idx(0), e, kb.idx(1), ValueRange{kb.idx(0), kb.idx(0)},
      [&](Value x, ValueRange it) -> SmallVector<Value> {
        Value start = it[0], pStart = it[1];
        Value end = kb.forLoop(
            kb.idx(0), items, kb.idx(1), ValueRange{start},
            [&](Value item, ValueRange at) -> SmallVector<Value> {
              Value c = asIndex(kb.load(hist, {item, x}));
              kb.store(i32(at[0]), hist, {item, x});
              return {kb.add(at[0], c)};
            })[0];
        Value count = kb.sub(end, start);
        Value pEnd = kb.add(pStart, kb.mul(kb.ceilDiv(count, blk), blk));
        kb.store(i32(count), counts, {x});
        kb.store(i32(end), offsets, {kb.add(x, kb.idx(1))});
        kb.store(i32(pStart), paddedOffsets, {x});
        kb.forLoop(kb.divu(pStart, blk), kb.divu(pEnd, blk), kb.idx(1),
                  [&](Value bi) { kb.store(i32(x), blocks, {bi}); });
        return {end, pEnd};
      });
  kb.store(i32(ends[1]), numPadded, {kb.idx(0)});
  // Positions past the in-range assignments (left out) hold -1.
  kb.forLoop(ends[0], n, kb.idx(1),
            [&](Value p) { kb.store(kb.cI32(-1), order, {p}); });

  // Phase 3: placement at the item's cursors, n ascending.
  kb.workers(opts, items, [&](Value item, Value) {
    Value r0 = kb.mul(item, kb.idx(kRouteRowsPerItem));
    Value r1 = kb.mins(kb.add(r0, kb.idx(kRouteRowsPerItem)), kb.dim(indices, 0));
    kb.forLoop(r0, r1, kb.idx(1), [&](Value r) {
      eachAssignment(
          kb, indices, r, numExperts,
          [&](Value nv, Value x) {
            Value p = asIndex(kb.load(hist, {item, x}));
            kb.store(i32(kb.add(p, kb.idx(1))), hist, {item, x});
            kb.store(i32(nv), order, {p});
            kb.store(i32(p), inverse, {nv});
            Value q = kb.add(asIndex(kb.load(paddedOffsets, {x})),
                            kb.sub(p, asIndex(kb.load(offsets, {x}))));
            kb.store(i32(nv), padded, {q});
          },
          [&](Value nv) { kb.store(kb.cI32(-1), inverse, {nv}); }, keep);
    });
  });
}

} // namespace mlir::moe::cpu_lowering
