//===- DispatchPlan.cpp - moe.dispatch_plan -> scf ------------------------===//
//
// Part of the MoE-MLIR project.
//
// A counting sort in three sequential scf.for loops over tensors (in place
// after bufferization): count the assignments of every expert; scan the
// counts into the offsets, the padded offsets and the block -> expert map;
// place every assignment at its expert's cursor, which is what makes the
// order stable. O(T·k + E + blocks) work, deterministic by construction.
// Out-of-range indices are reported through moeReportIndexError and skipped.
//
// With a capacity, a first loop decides which assignments are kept (keepMask)
// and the counting sort then skips the dropped ones exactly like out-of-range
// ones: by position, one pass in the priority order (slot j, then token t)
// with a cursor per expert, O(T·k); by probability, each assignment's rank
// among its expert's assignments is counted directly, O((T·k)²): the obvious
// reference for the CPU kernel, not a fast path.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

#include <array>
#include <functional>
#include <tuple>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

namespace {
/// Builds index and i32 arithmetic with less noise.
struct Ints {
  OpBuilder &b;
  Location loc;

  Value idx(int64_t v) { return indexConst(b, loc, v); }
  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubIOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return arith::DivUIOp::create(b, loc, x, y); }
  Value i32(Value indexValue) {
    return indexTo(b, loc, indexValue, b.getI32Type());
  }
  Value at(Value tensor, Value i) {
    return toIndex(b, loc, tensor::ExtractOp::create(b, loc, tensor, i));
  }
  Value put(Value tensor, Value i, Value indexValue) {
    return tensor::InsertOp::create(b, loc, i32(indexValue), tensor, i);
  }
  /// ⌈x / m⌉ · m for x ≥ 0.
  Value roundUp(Value x, Value m) {
    return mul(div(add(x, sub(m, idx(1))), m), m);
  }
};

/// scf.for over [lb, ub) carrying `init`; `body` returns the new values.
ValueRange forLoop(OpBuilder &b, Location loc, Value lb, Value ub,
                   ValueRange init,
                   function_ref<SmallVector<Value>(OpBuilder &, Location, Value,
                                                   ValueRange)>
                       body) {
  return scf::ForOp::create(
             b, loc, lb, ub, indexConst(b, loc, 1), init,
             [&](OpBuilder &lb2, Location ll, Value iv, ValueRange iter) {
               scf::YieldOp::create(lb2, ll, body(lb2, ll, iv, iter));
             })
      .getResults();
}

/// `then()` when `cond`, else `otherwise()`, as one scf.if.
ValueRange ifElse(
    OpBuilder &b, Location loc, Value cond,
    function_ref<SmallVector<Value>(OpBuilder &, Location)> then,
    function_ref<SmallVector<Value>(OpBuilder &, Location)> otherwise) {
  return scf::IfOp::create(
             b, loc, cond,
             [&](OpBuilder &tb, Location tl) {
               scf::YieldOp::create(tb, tl, then(tb, tl));
             },
             [&](OpBuilder &eb, Location el) {
               scf::YieldOp::create(eb, el, otherwise(eb, el));
             })
      .getResults();
}

/// `then(iter)` when `cond`, else `iter` unchanged, as one scf.if.
ValueRange ifThen(OpBuilder &b, Location loc, Value cond, ValueRange iter,
                  function_ref<SmallVector<Value>(OpBuilder &, Location)> then) {
  return ifElse(b, loc, cond, then, [&](OpBuilder &, Location) {
    return SmallVector<Value>(iter);
  });
}

/// The expert of assignment i (an index) and whether it is planned (i1).
using ExpertOf = std::function<std::pair<Value, Value>(Ints &, Value i)>;

/// Whether the assignment of priority (wa, ja, ta) claims a place before the
/// one of (wb, jb, tb) under drop(probability): the larger weight first, NaN
/// before any number, equal weights (-0.0 = 0.0, NaN = NaN) in the position
/// order (slot j, then token t).
Value claimsBefore(Ints &in, Value wa, Value ja, Value ta, Value wb, Value jb,
                   Value tb) {
  OpBuilder &b = in.b;
  Location loc = in.loc;
  auto cmpf = [&](arith::CmpFPredicate p, Value x, Value y) -> Value {
    return arith::CmpFOp::create(b, loc, p, x, y);
  };
  auto cmpi = [&](arith::CmpIPredicate p, Value x, Value y) -> Value {
    return arith::CmpIOp::create(b, loc, p, x, y);
  };
  auto andI = [&](Value x, Value y) -> Value {
    return arith::AndIOp::create(b, loc, x, y);
  };
  auto orI = [&](Value x, Value y) -> Value {
    return arith::OrIOp::create(b, loc, x, y);
  };
  Value nanA = isNaN(b, loc, wa), nanB = isNaN(b, loc, wb);
  Value notNanB = cmpf(arith::CmpFPredicate::ORD, wb, wb);
  Value larger = orI(andI(nanA, notNanB), cmpf(arith::CmpFPredicate::OGT, wa, wb));
  Value equal = orI(andI(nanA, nanB), cmpf(arith::CmpFPredicate::OEQ, wa, wb));
  Value earlier =
      orI(cmpi(arith::CmpIPredicate::ult, ja, jb),
          andI(cmpi(arith::CmpIPredicate::eq, ja, jb),
               cmpi(arith::CmpIPredicate::ult, ta, tb)));
  return orI(larger, andI(equal, earlier));
}

/// Which in-range assignments keep their place under op's capacity C: keep
/// [N] (i32, 1 = kept, 0 = dropped or out of range) and dropped [E] (i32).
std::pair<Value, Value> keepMask(PatternRewriter &rw, DispatchPlanOp op,
                                 Value n, Value k, const ExpertOf &expertOf) {
  Location loc = op.getLoc();
  Ints in{rw, loc};
  Value numExperts = in.idx(op.getNumExperts());
  Value capacity = in.idx(static_cast<int64_t>(*op.getCapacity()));
  Value zero32 = i32Const(rw, loc, 0), one32 = i32Const(rw, loc, 1);
  Value c0 = in.idx(0);
  Value keep0 = loopFilled(rw, loc, {getAsOpFoldResult(n)}, zero32);
  Value dropped0 = loopFilled(rw, loc, {getAsOpFoldResult(numExperts)}, zero32);
  Value rowsT = tensor::DimOp::create(rw, loc, op.getIndices(), 0);

  // Marks assignment i of expert e kept when `kept`, else counts it dropped.
  auto decide = [&](Ints &t, Value i, Value e, Value kept, Value keep,
                    Value dropped) -> SmallVector<Value> {
    return SmallVector<Value>(ifElse(
        t.b, t.loc, kept,
        [&](OpBuilder &kb, Location kl) -> SmallVector<Value> {
          return {tensor::InsertOp::create(kb, kl, one32, keep, i), dropped};
        },
        [&](OpBuilder &db, Location dl) -> SmallVector<Value> {
          Ints d{db, dl};
          return {keep, d.put(dropped, e, d.add(d.at(dropped, e), d.idx(1)))};
        }));
  };

  if (op.getDrop() == CapacityDrop::position) {
    // One pass in the priority order with a cursor per expert.
    Value claimed0 =
        loopFilled(rw, loc, {getAsOpFoldResult(numExperts)}, zero32);
    ValueRange slots = forLoop(
        rw, loc, c0, k, ValueRange{keep0, dropped0, claimed0},
        [&](OpBuilder &b, Location l, Value j, ValueRange it) {
          return SmallVector<Value>(forLoop(
              b, l, c0, rowsT, it,
              [&](OpBuilder &tb, Location tl, Value t, ValueRange iter) {
                Ints ti{tb, tl};
                Value i = ti.add(ti.mul(t, k), j);
                // Plain variables, not structured bindings: the lambda
                // below captures them (C++20 only for bindings).
                Value e, valid;
                std::tie(e, valid) = expertOf(ti, i);
                return SmallVector<Value>(ifThen(
                    tb, tl, valid, iter,
                    [&](OpBuilder &vb, Location vl) -> SmallVector<Value> {
                      Ints v{vb, vl};
                      Value place = v.at(iter[2], e);
                      Value kept = arith::CmpIOp::create(
                          vb, vl, arith::CmpIPredicate::ult, place, capacity);
                      SmallVector<Value> next =
                          decide(v, i, e, kept, iter[0], iter[1]);
                      next.push_back(
                          v.put(iter[2], e, v.add(place, v.idx(1))));
                      return next;
                    }));
              }));
        });
    return {slots[0], slots[1]};
  }

  // By probability: the rank of i among its expert's assignments.
  Value weights = op.getWeights();
  auto priority = [&](Ints &t, Value i) -> std::array<Value, 3> {
    Value row = t.div(i, k), slot = t.sub(i, t.mul(row, k));
    return {extractF32(t.b, t.loc, weights, ValueRange{row, slot}), slot, row};
  };
  ValueRange decided = forLoop(
      rw, loc, c0, n, ValueRange{keep0, dropped0},
      [&](OpBuilder &b, Location l, Value i, ValueRange iter) {
        Ints ib{b, l};
        Value e, valid; // captured below: not structured bindings (C++20)
        std::tie(e, valid) = expertOf(ib, i);
        return SmallVector<Value>(ifThen(
            b, l, valid, iter,
            [&](OpBuilder &vb, Location vl) -> SmallVector<Value> {
              Ints v{vb, vl};
              std::array<Value, 3> wjt = priority(v, i);
              Value w = wjt[0], j = wjt[1], t = wjt[2];
              Value rank = forLoop(
                  vb, vl, c0, n, ValueRange{c0},
                  [&](OpBuilder &mb, Location ml, Value m, ValueRange r) {
                    Ints mi{mb, ml};
                    auto [em, validM] = expertOf(mi, m);
                    auto [wm, jm, tm] = priority(mi, m);
                    Value ahead = arith::AndIOp::create(
                        mb, ml,
                        arith::AndIOp::create(
                            mb, ml, validM,
                            arith::CmpIOp::create(
                                mb, ml, arith::CmpIPredicate::eq, em, e)),
                        claimsBefore(mi, wm, jm, tm, w, j, t));
                    Value step = arith::SelectOp::create(mb, ml, ahead,
                                                         mi.idx(1), mi.idx(0));
                    return SmallVector<Value>{mi.add(r[0], step)};
                  })[0];
              Value kept = arith::CmpIOp::create(
                  vb, vl, arith::CmpIPredicate::ult, rank, capacity);
              return decide(v, i, e, kept, iter[0], iter[1]);
            }));
      });
  return {decided[0], decided[1]};
}

} // namespace

LogicalResult linalg_lowering::lowerDispatchPlan(DispatchPlanOp op,
                                                 PatternRewriter &rw) {
  Location loc = op.getLoc();
  Ints in{rw, loc};
  Value indices = op.getIndices();
  Value numExperts = in.idx(op.getNumExperts());
  Value block = in.idx(op.getBlockSize());
  if (failed(emitIndexCheck(rw, op, indices, numExperts,
                            kMoEErrorDispatchPlanIndices)))
    return rw.notifyMatchFailure(op, "needs an enclosing module");

  Value rowsT = tensor::DimOp::create(rw, loc, indices, 0);
  Value k = tensor::DimOp::create(rw, loc, indices, 1);
  Value n = in.mul(rowsT, k);
  Value paddedSize =
      in.add(n, in.mul(numExperts, in.sub(block, in.idx(1))));
  Value numBlocks = in.div(in.roundUp(paddedSize, block), block);

  // Loop seeds (each updated in place by its loop) stay distinct under CSE.
  auto i32Filled = [&](Value size, Value fill) {
    return loopFilled(rw, loc, {getAsOpFoldResult(size)}, fill);
  };
  Value zero32 = i32Const(rw, loc, 0), minus1 = i32Const(rw, loc, -1);
  Value c0 = in.idx(0);

  // The expert of assignment i = t·k + j, and whether it is in range.
  ExpertOf expertOf = [indices, k, numExperts](Ints &ib,
                                               Value i) -> std::pair<Value, Value> {
    Value t = ib.div(i, k), j = ib.sub(i, ib.mul(t, k));
    Value e = tensor::ExtractOp::create(ib.b, ib.loc, indices,
                                        ValueRange{t, j});
    Value e64 = e.getType().isInteger(64)
                    ? e
                    : arith::ExtSIOp::create(ib.b, ib.loc,
                                             ib.b.getI64Type(), e);
    Value bound = arith::IndexCastOp::create(ib.b, ib.loc, ib.b.getI64Type(),
                                             numExperts);
    Value zero = arith::ConstantOp::create(ib.b, ib.loc,
                                           ib.b.getI64IntegerAttr(0));
    // Sequenced: argument evaluation order is unspecified in C++.
    Value nonNegative = arith::CmpIOp::create(
        ib.b, ib.loc, arith::CmpIPredicate::sge, e64, zero);
    Value below = arith::CmpIOp::create(ib.b, ib.loc,
                                        arith::CmpIPredicate::slt, e64, bound);
    Value valid = arith::AndIOp::create(ib.b, ib.loc, nonNegative, below);
    return {toIndex(ib.b, ib.loc, e), valid};
  };

  // With a capacity: keep [N] (i32 1 = kept) and dropped [E].
  Value keep, dropped;
  if (op.getCapacity()) {
    std::tie(keep, dropped) = keepMask(rw, op, n, k, expertOf);
    // Only kept assignments are planned: a dropped one counts as out of range.
    auto inRange = expertOf;
    expertOf = [inRange, keep](Ints &ib, Value i) -> std::pair<Value, Value> {
      auto [e, valid] = inRange(ib, i);
      Value kept = arith::CmpIOp::create(
          ib.b, ib.loc, arith::CmpIPredicate::ne,
          tensor::ExtractOp::create(ib.b, ib.loc, keep, i),
          i32Const(ib.b, ib.loc, 0));
      return {e, arith::AndIOp::create(ib.b, ib.loc, valid, kept)};
    };
  }

  // A loop over the assignments i in increasing order that runs `update` on
  // the planned ones (with their expert e) and carries `init`.
  auto forInRange = [&](ValueRange init,
                        function_ref<SmallVector<Value>(Ints &, Value i,
                                                        Value e, ValueRange)>
                            update) {
    return forLoop(
        rw, loc, c0, n, init,
        [&](OpBuilder &b, Location l, Value i, ValueRange iter) {
          Ints ib{b, l};
          auto [e, valid] = expertOf(ib, i);
          return SmallVector<Value>(
              ifThen(b, l, valid, iter, [&](OpBuilder &tb, Location tl) {
                Ints t{tb, tl};
                return update(t, i, e, iter);
              }));
        });
  };

  // 1. counts.
  Value counts = forInRange(
      i32Filled(numExperts, zero32),
      [&](Ints &t, Value, Value e, ValueRange iter) {
        return SmallVector<Value>{
            t.put(iter[0], e, t.add(t.at(iter[0], e), t.idx(1)))};
      })[0];

  // 2. offsets, padded offsets, block -> expert map.
  Value numOffsets = in.add(numExperts, in.idx(1));
  ValueRange scan = forLoop(
      rw, loc, c0, numExperts,
      ValueRange{i32Filled(numOffsets, zero32), i32Filled(numOffsets, zero32),
                 i32Filled(numBlocks, minus1)},
      [&](OpBuilder &b, Location l, Value e, ValueRange iter) {
        Ints ib{b, l};
        Value next = ib.add(e, ib.idx(1));
        Value count = ib.at(counts, e);
        Value off = ib.add(ib.at(iter[0], e), count);
        Value start = ib.at(iter[1], e);
        Value end = ib.add(start, ib.roundUp(count, block));
        Value blocks = forLoop(
            b, l, ib.div(start, block), ib.div(end, block), iter[2],
            [&](OpBuilder &bb, Location bl, Value blk, ValueRange it) {
              return SmallVector<Value>{Ints{bb, bl}.put(it[0], blk, e)};
            })[0];
        return SmallVector<Value>{ib.put(iter[0], next, off),
                                  ib.put(iter[1], next, end), blocks};
      });
  Value offsets = scan[0], paddedOffsets = scan[1], blockExperts = scan[2];

  // 3. placement at each expert's cursor (stable: i ascending).
  Value cursor0 = tensor::ExtractSliceOp::create(
      rw, loc, offsets, ArrayRef<OpFoldResult>{rw.getIndexAttr(0)},
      ArrayRef<OpFoldResult>{getAsOpFoldResult(numExperts)},
      ArrayRef<OpFoldResult>{rw.getIndexAttr(1)});
  ValueRange placed = forInRange(
      ValueRange{cursor0, i32Filled(n, minus1), i32Filled(n, minus1),
                 i32Filled(paddedSize, in.i32(n))},
      [&](Ints &t, Value i, Value e, ValueRange iter) {
        Value p = t.at(iter[0], e);
        Value q =
            t.add(t.at(paddedOffsets, e), t.sub(p, t.at(offsets, e)));
        return SmallVector<Value>{t.put(iter[0], e, t.add(p, t.idx(1))),
                                  t.put(iter[1], p, i), t.put(iter[2], i, p),
                                  t.put(iter[3], q, i)};
      });

  Value numPadded = tensor::ExtractSliceOp::create(
      rw, loc, paddedOffsets, ArrayRef<OpFoldResult>{getAsOpFoldResult(numExperts)},
      ArrayRef<OpFoldResult>{rw.getIndexAttr(1)},
      ArrayRef<OpFoldResult>{rw.getIndexAttr(1)});
  SmallVector<Value> results = {counts,    offsets,      placed[1],
                                placed[2], placed[3],    blockExperts,
                                numPadded};
  if (dropped)
    results.push_back(dropped);
  replaceWithCasts(rw, op, results);
  return success();
}
