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
// Out-of-range indices are reported (lowering::emitIndexCheck, as in the
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

#include "Kernels.h"
#include "Route.h"

#include "../MoEToLinalg/Utils.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace mlir::moe::cpu {

namespace {
/// Whether expert value `v` (an element of `indices`) is in [0, E).
Value inRange(CK &k, Value v, int64_t numExperts) {
  Type elt = v.getType();
  Value zero = k.castInt(k.idx(0), elt), bound = k.castInt(k.idx(numExperts), elt);
  return k.andI(k.cmpi(arith::CmpIPredicate::sge, v, zero), k.lt(v, bound));
}

/// Runs body(n, e) for the planned assignments of row `row` (n = row·K + j,
/// e the expert as an index): in range and, with a capacity mask `keep` [N]
/// (i32, 0 = dropped), kept; and otherwise(n) for the others.
void eachAssignment(CK &k, Value indices, Value row, int64_t numExperts,
                    function_ref<void(Value n, Value e)> body,
                    function_ref<void(Value n)> otherwise = nullptr,
                    Value keep = nullptr) {
  Value width = k.dim(indices, 1);
  k.forLoop(k.idx(0), width, k.idx(1), [&](Value j) {
    Value n = k.add(k.mul(row, width), j);
    Value v = k.load(indices, {row, j});
    Value ok = inRange(k, v, numExperts);
    if (keep)
      ok = k.andI(ok, k.cmpi(arith::CmpIPredicate::ne, k.load(keep, {n}),
                             k.cI32(0)));
    k.ifThen(ok, [&] { body(n, k.castInt(v, k.index())); });
    if (otherwise)
      k.ifThen(k.notI1(ok), [&] { otherwise(n); });
  });
}

Value numItems(CK &k, Value numRows) {
  return k.ceilDiv(numRows, k.idx(kRouteRowsPerItem));
}

void fill(CK &k, Value buffer, Value size, Value v) {
  k.forLoop(k.idx(0), size, k.idx(1), [&](Value i) { k.store(v, buffer, {i}); });
}

/// The 63-bit priority key of drop(probability) for weight `w` (f32) at
/// position rank `rank` (j·T + t, an index < 2^31): larger keys claim first.
/// High 32 bits: the weight's bits ordered as unsigned integers (negative
/// floats flipped, positive ones with the sign bit set; -0.0 counted as 0.0;
/// every NaN above +inf, so NaN ranks first); low 31 bits: 2^31 - 1 - rank,
/// so equal weights go in the position order. Keys are unique and >= 0.
Value priorityKey(CK &k, Value w, Value rank) {
  Value canonical = k.fadd(w, k.cF32(0.0)); // -0.0 + 0.0 = +0.0
  Value bits = k.bitcast(canonical, k.i32());
  Value ordered =
      k.select(k.lt(bits, k.cI32(0)), k.xorI(bits, k.cI32(-1)),
               k.orI(bits, k.cI32(std::numeric_limits<int32_t>::min())));
  ordered = k.select(k.isNaN(w), k.cI32(-1), ordered);
  Value high = k.shl(k.extu(ordered, k.i64()), k.cI64(31));
  Value low = k.sub(k.cI64(0x7FFFFFFF), k.castInt(rank, k.i64()));
  return k.orI(high, low);
}

/// Phase 0 of a plan with a capacity: `keep` [N] (i32, 1 = kept) and
/// `dropped` [E] (i32), sequentially (see the file comment).
void emitCapacityPhase(CK &k, DispatchPlanOp op, Value indices, Value weights,
                       Value keep, Value dropped) {
  int64_t numExperts = op.getNumExperts();
  // At most T·k < 2^31 assignments claim an expert: larger capacities keep
  // everything, as 2^31 - 1 does.
  int64_t capacity = std::min<int64_t>(static_cast<int64_t>(*op.getCapacity()),
                                       std::numeric_limits<int32_t>::max());
  Value rows = k.dim(indices, 0), width = k.dim(indices, 1);
  Value n = k.mul(rows, width), e = k.idx(numExperts);
  Value cap = k.cI32(capacity);
  fill(k, keep, n, k.cI32(0));
  // demand[e]: the in-range assignments of e (by position: so far).
  Value demand = k.alloc(MemRefType::get({numExperts}, k.i32()), ValueRange{});
  fill(k, demand, e, k.cI32(0));
  auto eachSlotMajor = [&](function_ref<void(Value n, Value x, Value t,
                                             Value j)> body) {
    k.forLoop(k.idx(0), width, k.idx(1), [&](Value j) {
      k.forLoop(k.idx(0), rows, k.idx(1), [&](Value t) {
        Value v = k.load(indices, {t, j});
        k.ifThen(inRange(k, v, numExperts), [&] {
          body(k.add(k.mul(t, width), j), k.castInt(v, k.index()), t, j);
        });
      });
    });
  };
  auto finishDropped = [&] {
    k.forLoop(k.idx(0), e, k.idx(1), [&](Value x) {
      Value d = k.load(demand, {x});
      k.store(k.sub(d, k.select(k.lt(d, cap), d, cap)), dropped, {x});
    });
  };

  if (op.getDrop() == CapacityDrop::position) {
    eachSlotMajor([&](Value nv, Value x, Value, Value) {
      Value place = k.load(demand, {x});
      k.ifThen(k.lt(place, cap), [&] { k.store(k.cI32(1), keep, {nv}); });
      k.store(k.add(place, k.cI32(1)), demand, {x});
    });
    finishDropped();
    return;
  }

  // drop(probability): the keys, then the bisection of every overloaded
  // expert's C-th largest key (lo: count(key >= lo) >= C; hi + 1: < C).
  Value keys = k.alloc(MemRefType::get({ShapedType::kDynamic}, k.i64()), {n});
  eachSlotMajor([&](Value nv, Value x, Value t, Value j) {
    Value w = k.loadF(weights, {t, j});
    k.store(priorityKey(k, w, k.add(k.mul(j, rows), t)), keys, {nv});
    k.store(k.add(k.load(demand, {x}), k.cI32(1)), demand, {x});
  });
  finishDropped();
  if (capacity == 0)
    return; // everything dropped: keep stays 0
  auto i64Buffer = [&] {
    return k.alloc(MemRefType::get({numExperts}, k.i64()), ValueRange{});
  };
  Value lo = i64Buffer(), hi = i64Buffer(), mid = i64Buffer();
  Value above = k.alloc(MemRefType::get({numExperts}, k.i32()), ValueRange{});
  fill(k, lo, e, k.cI64(0));
  fill(k, hi, e, k.cI64(std::numeric_limits<int64_t>::max()));
  auto eachKey = [&](function_ref<void(Value nv, Value x)> body) {
    k.forLoop(k.idx(0), rows, k.idx(1), [&](Value t) {
      eachAssignment(k, indices, t, numExperts, body);
    });
  };
  k.forLoop(k.idx(0), k.idx(63), k.idx(1), [&](Value) {
    k.forLoop(k.idx(0), e, k.idx(1), [&](Value x) {
      Value l = k.load(lo, {x}), span = k.sub(k.load(hi, {x}), l);
      // lo + ceil(span / 2), no overflow: span < 2^63.
      k.store(k.add(l, k.add(k.shru(span, k.cI64(1)), k.andI(span, k.cI64(1)))),
              mid, {x});
      k.store(k.cI32(0), above, {x});
    });
    eachKey([&](Value nv, Value x) {
      k.ifThen(k.cmpi(arith::CmpIPredicate::sge, k.load(keys, {nv}),
                      k.load(mid, {x})),
               [&] { k.store(k.add(k.load(above, {x}), k.cI32(1)), above, {x}); });
    });
    k.forLoop(k.idx(0), e, k.idx(1), [&](Value x) {
      Value m = k.load(mid, {x});
      Value enough = k.cmpi(arith::CmpIPredicate::sge, k.load(above, {x}), cap);
      k.store(k.select(enough, m, k.load(lo, {x})), lo, {x});
      k.store(k.select(enough, k.load(hi, {x}), k.sub(m, k.cI64(1))), hi, {x});
    });
  });
  // An expert within its capacity keeps everything (its bisection found 0).
  eachKey([&](Value nv, Value x) {
    Value within = k.cmpi(arith::CmpIPredicate::sle, k.load(demand, {x}), cap);
    Value high = k.cmpi(arith::CmpIPredicate::sge, k.load(keys, {nv}),
                        k.load(lo, {x}));
    k.ifThen(k.orI(within, high), [&] { k.store(k.cI32(1), keep, {nv}); });
  });
}

struct DispatchPlanKernel
    : KernelPattern<DispatchPlanOp, /*TargetLanes=*/false> {
  using KernelPattern::KernelPattern;

  LogicalResult emit(DispatchPlanOp op, CK &k,
                     PatternRewriter &rw) const override {
    // Left to the fused kernel of its route (the greedy driver may visit the
    // plan first).
    if (auto route = op.getIndices().getDefiningOp<RouteOp>())
      if (fusableDispatchPlan(route) == op)
        return rw.notifyMatchFailure(op, "fused with its moe.route");
    int64_t numExperts = op.getNumExperts();
    if (failed(checkIndexOperand(rw, op, op.getIndices(), numExperts,
                                 lowering::IndexErrorOp::DispatchPlanIndices)))
      return failure();
    SmallVector<Value> sizes = k.sizes(op.getIndices());
    KernelScope kernel(
        k, {op.getIndices(), op.getWeights()},
        KernelScope::outsOf(op, planResultSizes(k, op, sizes[0], sizes[1])));
    Value indices = k.buffer(op.getIndices());
    Value keep;
    if (op.getCapacity()) {
      keep = k.alloc(MemRefType::get({ShapedType::kDynamic}, k.i32()),
                     {k.mul(sizes[0], sizes[1])});
      emitCapacityPhase(k, op, indices,
                        op.getWeights() ? k.buffer(op.getWeights()) : Value(),
                        keep, kernel.out(7));
    }
    Value hist = allocPlanHistogram(k, k.dim(indices, 0), numExperts);
    k.workers(opts, numItems(k, k.dim(indices, 0)), [&](Value item, Value) {
      clearPlanItem(k, hist, item, numExperts);
      Value r0 = k.mul(item, k.idx(kRouteRowsPerItem));
      Value r1 = k.mins(k.add(r0, k.idx(kRouteRowsPerItem)), k.dim(indices, 0));
      k.forLoop(r0, r1, k.idx(1), [&](Value r) {
        countPlanRow(k, indices, hist, r, item, numExperts, keep);
      });
    });
    emitPlanFromHistogram(k, opts, op, indices, hist, kernel.outs(), keep);
    kernel.replace(rw, op);
    return success();
  }
};
} // namespace

Value allocPlanHistogram(CK &k, Value numRows, int64_t numExperts) {
  return k.alloc(MemRefType::get({ShapedType::kDynamic, numExperts}, k.i32()),
                 {numItems(k, numRows)});
}

void clearPlanItem(CK &k, Value hist, Value item, int64_t numExperts) {
  k.forLoop(k.idx(0), k.idx(numExperts), k.idx(1),
            [&](Value e) { k.store(k.cI32(0), hist, {item, e}); });
}

void countPlanRow(CK &k, Value indices, Value hist, Value row, Value item,
                  int64_t numExperts, Value keep) {
  eachAssignment(
      k, indices, row, numExperts,
      [&](Value, Value e) {
        k.store(k.add(k.load(hist, {item, e}), k.cI32(1)), hist, {item, e});
      },
      nullptr, keep);
}

SmallVector<SmallVector<Value>> planResultSizes(CK &k, DispatchPlanOp op,
                                                Value rows, Value slots) {
  int64_t numExperts = op.getNumExperts(), block = op.getBlockSize();
  Value n = k.mul(rows, slots);
  Value paddedSize = k.add(n, k.idx(numExperts * (block - 1)));
  // counts [E], offsets [E + 1], order and inverse [n], padded_order
  // [paddedSize], block_experts [ceil(paddedSize / B)], num_padded [1];
  // with a capacity, dropped [E].
  SmallVector<SmallVector<Value>> sizes = {{k.idx(numExperts)},
                                           {k.idx(numExperts + 1)},
                                           {n},
                                           {n},
                                           {paddedSize},
                                           {k.ceilDiv(paddedSize, k.idx(block))},
                                           {k.idx(1)}};
  if (op.getCapacity())
    sizes.push_back({k.idx(numExperts)});
  return sizes;
}

void emitPlanFromHistogram(CK &k, const KernelOptions &opts, DispatchPlanOp op,
                           Value indices, Value hist, ValueRange results,
                           Value keep) {
  int64_t numExperts = op.getNumExperts(), block = op.getBlockSize();
  Value e = k.idx(numExperts), blk = k.idx(block);
  Value n = k.mul(k.dim(indices, 0), k.dim(indices, 1));
  Value paddedSize = k.add(n, k.idx(numExperts * (block - 1)));
  Value numBlocks = k.ceilDiv(paddedSize, blk);
  Value items = numItems(k, k.dim(indices, 0));
  Value counts = results[0], offsets = results[1], order = results[2];
  Value inverse = results[3], padded = results[4], blocks = results[5];
  Value numPadded = results[6];
  Value paddedOffsets =
      k.alloc(MemRefType::get({numExperts}, k.i32()), ValueRange{});
  auto i32 = [&](Value v) { return k.castInt(v, k.i32()); };
  auto asIndex = [&](Value v) { return k.castInt(v, k.index()); };

  // Phase 2: the scan over experts (and, per expert, over the items).
  fill(k, blocks, numBlocks, k.cI32(-1));
  fill(k, padded, paddedSize, i32(n));
  k.store(k.cI32(0), offsets, {k.idx(0)});
  SmallVector<Value> ends = k.forLoop(
      k.idx(0), e, k.idx(1), ValueRange{k.idx(0), k.idx(0)},
      [&](Value x, ValueRange it) -> SmallVector<Value> {
        Value start = it[0], pStart = it[1];
        Value end = k.forLoop(
            k.idx(0), items, k.idx(1), ValueRange{start},
            [&](Value item, ValueRange at) -> SmallVector<Value> {
              Value c = asIndex(k.load(hist, {item, x}));
              k.store(i32(at[0]), hist, {item, x});
              return {k.add(at[0], c)};
            })[0];
        Value count = k.sub(end, start);
        Value pEnd = k.add(pStart, k.mul(k.ceilDiv(count, blk), blk));
        k.store(i32(count), counts, {x});
        k.store(i32(end), offsets, {k.add(x, k.idx(1))});
        k.store(i32(pStart), paddedOffsets, {x});
        k.forLoop(k.divu(pStart, blk), k.divu(pEnd, blk), k.idx(1),
                  [&](Value bi) { k.store(i32(x), blocks, {bi}); });
        return {end, pEnd};
      });
  k.store(i32(ends[1]), numPadded, {k.idx(0)});
  // Positions past the in-range assignments (left out) hold -1.
  k.forLoop(ends[0], n, k.idx(1),
            [&](Value p) { k.store(k.cI32(-1), order, {p}); });

  // Phase 3: placement at the item's cursors, n ascending.
  k.workers(opts, items, [&](Value item, Value) {
    Value r0 = k.mul(item, k.idx(kRouteRowsPerItem));
    Value r1 = k.mins(k.add(r0, k.idx(kRouteRowsPerItem)), k.dim(indices, 0));
    k.forLoop(r0, r1, k.idx(1), [&](Value r) {
      eachAssignment(
          k, indices, r, numExperts,
          [&](Value nv, Value x) {
            Value p = asIndex(k.load(hist, {item, x}));
            k.store(i32(k.add(p, k.idx(1))), hist, {item, x});
            k.store(i32(nv), order, {p});
            k.store(i32(p), inverse, {nv});
            Value q = k.add(asIndex(k.load(paddedOffsets, {x})),
                            k.sub(p, asIndex(k.load(offsets, {x}))));
            k.store(i32(nv), padded, {q});
          },
          [&](Value nv) { k.store(k.cI32(-1), inverse, {nv}); }, keep);
    });
  });
}

MOE_CPU_KERNEL_POPULATE(populateDispatchPlanKernel, DispatchPlanKernel)

} // namespace mlir::moe::cpu
