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
//===----------------------------------------------------------------------===//

#include "Patterns.h"
#include "Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::lowering;

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

/// `then(iter)` when `cond`, else `iter` unchanged, as one scf.if.
ValueRange ifThen(OpBuilder &b, Location loc, Value cond, ValueRange iter,
                  function_ref<SmallVector<Value>(OpBuilder &, Location)> then) {
  return scf::IfOp::create(
             b, loc, cond,
             [&](OpBuilder &tb, Location tl) {
               scf::YieldOp::create(tb, tl, then(tb, tl));
             },
             [&](OpBuilder &eb, Location el) {
               scf::YieldOp::create(eb, el, iter);
             })
      .getResults();
}

} // namespace

LogicalResult mlir::moe::lowering::lowerDispatchPlan(DispatchPlanOp op,
                                                     PatternRewriter &rw) {
  Location loc = op.getLoc();
  Ints in{rw, loc};
  Value indices = op.getIndices();
  Value numExperts = in.idx(op.getNumExperts());
  Value block = in.idx(op.getBlockSize());
  if (failed(emitIndexCheck(rw, op, indices, numExperts,
                            IndexErrorOp::DispatchPlanIndices)))
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
  auto expertOf = [&](Ints &ib, Value i) -> std::pair<Value, Value> {
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

  // A loop over the assignments i in increasing order that runs `update` on
  // the in-range ones (with their expert e) and carries `init`.
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
  replaceWithCasts(rw, op, results);
  return success();
}
