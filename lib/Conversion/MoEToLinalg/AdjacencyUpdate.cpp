//===- AdjacencyUpdate.cpp - moe.adjacency_update -> linalg ---------------===//
//
// Part of the MoE-MLIR project.
//
// S[t,j] = 1[j ∈ idx[t,:]] is a linalg.generic "any" reduction over the k
// slots (a repeated index sets the same bit once; an out-of-range one matches
// no expert, so it is skipped, and a loop reports it). The co-selection counts
// C = Sᵀ S are an i32 linalg.matmul after a linalg.transpose, exact whatever
// the order. Then the row/column sums and a_next = beta·a + (1−beta)·Norm(C).
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

using utils::IteratorType;

void mlir::moe::linalg_lowering::finishAdjacencyUpdate(PatternRewriter &rw,
                                                       AdjacencyUpdateOp op,
                                                       Value a, Value c,
                                                       OpFoldResult e) {
  Location loc = op.getLoc();
  MLIRContext *ctx = rw.getContext();
  Value zeroI = i32Const(rw, loc, 0);
  bool includeSelf = op.getIncludeSelf();
  // C[j,m] with the diagonal dropped when include_self = false.
  auto count = [&](OpBuilder &gb, Location gl, Value cjm) -> Value {
    if (includeSelf)
      return cjm;
    Value row = loopIndex(gb, gl, 0);
    Value col = loopIndex(gb, gl, 1);
    Value diag =
        arith::CmpIOp::create(gb, gl, arith::CmpIPredicate::eq, row, col);
    return arith::SelectOp::create(gb, gl, diag, i32Const(gb, gl, 0), cjm);
  };

  AffineMap jm = dimsMap(ctx, 2, {0, 1}), j = dimsMap(ctx, 2, {0}),
            m = dimsMap(ctx, 2, {1});
  AdjacencyNorm norm = op.getNorm();
  SmallVector<Value> ins = {a, c};
  SmallVector<AffineMap> maps = {jm, jm};
  if (norm != AdjacencyNorm::none) {
    // Row sums (norm = row) or column sums (norm = col) of C, in i32.
    AffineMap sumMap = norm == AdjacencyNorm::row ? j : m;
    SmallVector<IteratorType> iters =
        norm == AdjacencyNorm::row ? SmallVector<IteratorType>{kPar, kRed}
                                   : SmallVector<IteratorType>{kRed, kPar};
    Value sums = generic(rw, loc, c, filled(rw, loc, {e}, zeroI), {jm, sumMap},
                         iters,
                         [&](OpBuilder &gb, Location gl, ValueRange args) {
                           return SmallVector<Value>{arith::AddIOp::create(
                               gb, gl, args[1], count(gb, gl, args[0]))};
                         })
                     .front();
    ins.push_back(sums);
    maps.push_back(sumMap);
  }
  maps.push_back(jm);

  float beta = op.getBeta().convertToFloat();
  float oneMinusBeta = 1.0f - beta;
  Value next =
      generic(rw, loc, ins,
              Value(tensor::EmptyOp::create(rw, loc, {e, e}, rw.getF32Type())), maps,
              {kPar, kPar},
              [&](OpBuilder &gb, Location gl, ValueRange args) {
                Type f32 = gb.getF32Type();
                Value n = arith::SIToFPOp::create(gb, gl, f32,
                                                  count(gb, gl, args[1]));
                if (norm != AdjacencyNorm::none) {
                  // An all-zero row/column stays zero.
                  Value isZero = arith::CmpIOp::create(
                      gb, gl, arith::CmpIPredicate::eq, args[2],
                      i32Const(gb, gl, 0));
                  Value total = arith::SIToFPOp::create(gb, gl, f32, args[2]);
                  n = arith::SelectOp::create(
                      gb, gl, isZero, f32Const(gb, gl, 0.0),
                      arith::DivFOp::create(gb, gl, n, total));
                }
                Value keep = arith::MulFOp::create(
                    gb, gl, f32Const(gb, gl, beta), args[0]);
                Value add = arith::MulFOp::create(
                    gb, gl, f32Const(gb, gl, oneMinusBeta), n);
                return SmallVector<Value>{
                    arith::AddFOp::create(gb, gl, keep, add)};
              })
          .front();
  replaceWithCasts(rw, op, next);
}

LogicalResult linalg_lowering::lowerAdjacencyUpdate(AdjacencyUpdateOp op,
                                                    PatternRewriter &rw) {
  Location loc = op.getLoc();
  MLIRContext *ctx = rw.getContext();
  Type i32 = rw.getI32Type();
  Value a = promoteToF32(rw, loc, op.getA());
  Value idx = op.getIdx();
  Type idxType = cast<RankedTensorType>(idx.getType()).getElementType();

  auto aType = cast<RankedTensorType>(a.getType());
  OpFoldResult e = aType.isDynamicDim(0)
                       ? tensor::getMixedSize(rw, loc, a, 1)
                       : tensor::getMixedSize(rw, loc, a, 0);
  OpFoldResult t = tensor::getMixedSize(rw, loc, idx, 0);
  if (failed(emitIndexCheck(rw, op, idx,
                            getValueOrCreateConstantIndexOp(rw, loc, e),
                            kMoEErrorAdjacencyUpdateIdx)))
    return rw.notifyMatchFailure(op, "needs an enclosing module to declare "
                                     "moeReportIndexError");

  // S[t,j] (i32 0/1): dims (t, j, slot).
  Value zeroI = i32Const(rw, loc, 0);
  Value s =
      generic(rw, loc, idx, filled(rw, loc, {t, e}, zeroI),
              {dimsMap(ctx, 3, {0, 2}), dimsMap(ctx, 3, {0, 1})},
              {kPar, kPar, kRed},
              [&](OpBuilder &gb, Location gl, ValueRange args) {
                Value j = indexTo(gb, gl, loopIndex(gb, gl, 1), idxType);
                Value hit = arith::CmpIOp::create(
                    gb, gl, arith::CmpIPredicate::eq, args[0], j);
                return SmallVector<Value>{arith::SelectOp::create(
                    gb, gl, hit, i32Const(gb, gl, 1), args[1])};
              })
          .front();

  // C = Sᵀ S.
  Value st = linalg::TransposeOp::create(
                 rw, loc, s, tensor::EmptyOp::create(rw, loc, {e, t}, i32),
                 ArrayRef<int64_t>{1, 0})
                 .getResult()
                 .front();
  Value init = filled(rw, loc, {e, e}, zeroI);
  Value c = linalg::MatmulOp::create(rw, loc, TypeRange{init.getType()},
                                     ValueRange{st, s}, ValueRange{init})
                .getResult(0);

  finishAdjacencyUpdate(rw, op, a, c, e);
  return success();
}
