//===- HyperRouterGrad.cpp - moe.hyper_router_grad -> linalg --------------===//
//
// Part of the MoE-MLIR project.
//
// The backward of the frozen hypernetwork (MoEGradOps.td): the forward's
// hidden layer h = relu(w1 · emb + b1) recomputed with the forward's own
// lowering (hyperRouterAffine), the cotangent of out assembled from dw and db
// (the forward's [E, D+1] split undone), then two linalg.vecmat (w2^T · dout,
// w1^T · da), two outer products and the ReLU mask as generics. Everything is
// named linalg on tensors, so the dense CPU pipeline tiles and vectorizes the
// products, and a gradient the caller does not use (d_w1, d_w2 of a frozen
// hypernetwork) is dead code after the rewrite.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

namespace {
using utils::IteratorType;

/// `a + c` as a size (folded when `a` is static).
OpFoldResult addSize(OpBuilder &b, Location loc, OpFoldResult a, int64_t c) {
  if (std::optional<int64_t> s = getConstantIntValue(a))
    return b.getIndexAttr(*s + c);
  return arith::AddIOp::create(b, loc, cast<Value>(a), indexConst(b, loc, c))
      .getResult();
}

/// outer[r, c] = col[r] · row[c] ([R], [C] -> [R, C], f32).
Value outer(OpBuilder &b, Location loc, Value col, Value row) {
  SmallVector<OpFoldResult> sizes{tensor::getMixedSize(b, loc, col, 0),
                                  tensor::getMixedSize(b, loc, row, 0)};
  Value init = tensor::EmptyOp::create(b, loc, sizes, b.getF32Type());
  MLIRContext *ctx = b.getContext();
  return generic(b, loc, {col, row}, init,
                 {dimsMap(ctx, 2, {0}), dimsMap(ctx, 2, {1}),
                  b.getMultiDimIdentityMap(2)},
                 {IteratorType::parallel, IteratorType::parallel},
                 [](OpBuilder &gb, Location gl, ValueRange a) {
                   return SmallVector<Value>{
                       arith::MulFOp::create(gb, gl, a[0], a[1])};
                 })
      .front();
}

/// y[n] = Σ_m x[m] · matrix[m, n] (matrixᵀ · x), accumulated in f32.
Value transposedMatvec(OpBuilder &b, Location loc, Value x, Value matrix) {
  Value init = filled(b, loc, {tensor::getMixedSize(b, loc, matrix, 1)},
                      f32Const(b, loc, 0.0));
  return linalg::VecmatOp::create(b, loc, TypeRange{init.getType()},
                                  ValueRange{x, matrix}, ValueRange{init})
      .getResult(0);
}

} // namespace

LogicalResult linalg_lowering::lowerHyperRouterGrad(HyperRouterGradOp op,
                                                    PatternRewriter &rw) {
  Location loc = op.getLoc();
  auto f32 = [&](Value v) { return promoteToF32(rw, loc, v); };
  Value emb = f32(op.getEmb()), w1 = f32(op.getW1()), w2 = f32(op.getW2());
  Value hidden = hyperRouterAffine(rw, loc, w1, emb, f32(op.getB1()),
                                   /*relu=*/true);

  // dout = [dw | db] as [E, D+1], row-major [E·(D+1)]: the cotangent of the
  // forward's out before its split into w and b.
  Value dw = op.getDw();
  OpFoldResult e = tensor::getMixedSize(rw, loc, dw, 0);
  OpFoldResult d = tensor::getMixedSize(rw, loc, dw, 1);
  OpFoldResult zero = rw.getIndexAttr(0), one = rw.getIndexAttr(1);
  Value table = tensor::EmptyOp::create(
      rw, loc, SmallVector<OpFoldResult>{e, addSize(rw, loc, d, 1)},
      rw.getF32Type());
  table = tensor::InsertSliceOp::create(rw, loc, dw, table, {zero, zero},
                                        {e, d}, {one, one});
  table = insertAlong(rw, loc, op.getDb(), table, /*dim=*/1, d);
  Value dout = tensor::CollapseShapeOp::create(
      rw, loc, table, SmallVector<ReassociationIndices>{{0, 1}});

  // Through the output layer: d_w2 = dout ⊗ h, dh = w2ᵀ · dout.
  Value dw2 = outer(rw, loc, dout, hidden);
  Value dh = transposedMatvec(rw, loc, dout, w2);
  // The ReLU: no gradient where h = relu(a) is 0 (a <= 0); a NaN `a` (h NaN)
  // passes dh like PyTorch's threshold_backward (unordered compare).
  AffineMap id = rw.getMultiDimIdentityMap(1);
  Value da =
      generic(rw, loc, {dh, hidden}, dh, {id, id, id},
              {IteratorType::parallel},
              [](OpBuilder &gb, Location gl, ValueRange a) {
                Value open = arith::CmpFOp::create(
                    gb, gl, arith::CmpFPredicate::UGT, a[1],
                    f32Const(gb, gl, 0.0));
                return SmallVector<Value>{arith::SelectOp::create(
                    gb, gl, open, a[0], f32Const(gb, gl, 0.0))};
              })
          .front();
  // Through the hidden layer: d_w1 = da ⊗ emb, d_emb = w1ᵀ · da.
  Value dw1 = outer(rw, loc, da, emb);
  Value demb = transposedMatvec(rw, loc, da, w1);

  SmallVector<Value> results{demb, dw1, da, dw2, dout};
  replaceWithCasts(rw, op, results);
  return success();
}
