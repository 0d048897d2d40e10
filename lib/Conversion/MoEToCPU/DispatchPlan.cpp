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
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "Route.h"

#include "../MoEToLinalg/Utils.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"

namespace mlir::moe::cpu {

namespace {
/// Runs body(n, e) for the in-range assignments of row `row` (n = row·K + j,
/// e the expert as an index) and otherwise(n) for the others.
void eachAssignment(CK &k, Value indices, Value row, int64_t numExperts,
                    function_ref<void(Value n, Value e)> body,
                    function_ref<void(Value n)> otherwise = nullptr) {
  Value width = k.dim(indices, 1);
  Type elt = cast<MemRefType>(indices.getType()).getElementType();
  Value zero = k.castInt(k.idx(0), elt), bound = k.castInt(k.idx(numExperts), elt);
  k.forLoop(k.idx(0), width, k.idx(1), [&](Value j) {
    Value n = k.add(k.mul(row, width), j);
    Value v = k.load(indices, {row, j});
    Value ok = k.andI(k.cmpi(arith::CmpIPredicate::sge, v, zero),
                      k.lt(v, bound));
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
        k, {op.getIndices()},
        KernelScope::outsOf(op, planResultSizes(k, op, sizes[0], sizes[1])));
    Value indices = k.buffer(op.getIndices());
    Value hist = allocPlanHistogram(k, k.dim(indices, 0), numExperts);
    k.workers(opts, numItems(k, k.dim(indices, 0)), [&](Value item, Value) {
      clearPlanItem(k, hist, item, numExperts);
      Value r0 = k.mul(item, k.idx(kRouteRowsPerItem));
      Value r1 = k.mins(k.add(r0, k.idx(kRouteRowsPerItem)), k.dim(indices, 0));
      k.forLoop(r0, r1, k.idx(1), [&](Value r) {
        countPlanRow(k, indices, hist, r, item, numExperts);
      });
    });
    emitPlanFromHistogram(k, opts, op, indices, hist, kernel.outs());
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
                  int64_t numExperts) {
  eachAssignment(k, indices, row, numExperts, [&](Value, Value e) {
    k.store(k.add(k.load(hist, {item, e}), k.cI32(1)), hist, {item, e});
  });
}

SmallVector<SmallVector<Value>> planResultSizes(CK &k, DispatchPlanOp op,
                                                Value rows, Value slots) {
  int64_t numExperts = op.getNumExperts(), block = op.getBlockSize();
  Value n = k.mul(rows, slots);
  Value paddedSize = k.add(n, k.idx(numExperts * (block - 1)));
  // counts [E], offsets [E + 1], order and inverse [n], padded_order
  // [paddedSize], block_experts [ceil(paddedSize / B)], num_padded [1].
  return {{k.idx(numExperts)},
          {k.idx(numExperts + 1)},
          {n},
          {n},
          {paddedSize},
          {k.ceilDiv(paddedSize, k.idx(block))},
          {k.idx(1)}};
}

void emitPlanFromHistogram(CK &k, const KernelOptions &opts, DispatchPlanOp op,
                           Value indices, Value hist, ValueRange results) {
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
          [&](Value nv) { k.store(k.cI32(-1), inverse, {nv}); });
    });
  });
}

MOE_CPU_KERNEL_POPULATE(populateDispatchPlanKernel, DispatchPlanKernel)

} // namespace mlir::moe::cpu
