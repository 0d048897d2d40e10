//===- HyperRouter.cpp - moe.hyper_router -> linalg -----------------------===//
//
// Part of the MoE-MLIR project.
//
// Two linalg.matvec (the frozen hypernetwork), a generic for bias + ReLU and
// one for the output bias, then the row-major [E, D+1] view of the output
// (tensor.expand_shape) split into w = out[:, :D] and b = out[:, D].
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

Value mlir::moe::linalg_lowering::hyperRouterAffine(OpBuilder &b, Location loc,
                                                    Value matrix, Value vector,
                                                    Value bias, bool relu) {
  OpFoldResult rows = tensor::getMixedSize(b, loc, matrix, 0);
  Value init = filled(b, loc, {rows}, f32Const(b, loc, 0.0));
  Value prod = linalg::MatvecOp::create(b, loc, TypeRange{init.getType()},
                                        ValueRange{matrix, vector},
                                        ValueRange{init})
                   .getResult(0);
  AffineMap id = b.getMultiDimIdentityMap(1);
  return generic(b, loc, bias, prod, {id, id}, {IteratorType::parallel},
                 [&](OpBuilder &gb, Location gl, ValueRange a) {
                   Value y = arith::AddFOp::create(gb, gl, a[1], a[0]);
                   if (relu)
                     y = arith::MaximumFOp::create(gb, gl, y,
                                                   f32Const(gb, gl, 0.0));
                   return SmallVector<Value>{y};
                 })
      .front();
}

void mlir::moe::linalg_lowering::finishHyperRouter(PatternRewriter &rw,
                                                   HyperRouterOp op,
                                                   Value out) {
  Location loc = op.getLoc();
  // [E·(D+1)] -> [E, D+1], row-major.
  int64_t numExperts = op.getNumExperts();
  // Static only when the output length is (a static group of an
  // expand_shape needs a static source); the final cast refines the rest.
  auto outType = cast<RankedTensorType>(out.getType());
  OpFoldResult cols;
  if (!outType.isDynamicDim(0)) {
    cols = rw.getIndexAttr(outType.getDimSize(0) / numExperts);
  } else {
    Value total = tensor::DimOp::create(rw, loc, out, 0);
    cols = arith::DivUIOp::create(rw, loc, total,
                                  indexConst(rw, loc, numExperts))
               .getResult();
  }
  OpFoldResult e = rw.getIndexAttr(numExperts);
  Value table = tensor::ExpandShapeOp::create(
      rw, loc, tensorTypeOf({e, cols}, rw.getF32Type()), out, {{0, 1}},
      {e, cols});

  OpFoldResult zero = rw.getIndexAttr(0), one = rw.getIndexAttr(1);
  OpFoldResult d;
  if (std::optional<int64_t> c = getConstantIntValue(cols))
    d = rw.getIndexAttr(*c - 1);
  else
    d = arith::SubIOp::create(rw, loc, cast<Value>(cols),
                              indexConst(rw, loc, 1))
            .getResult();
  Value w = tensor::ExtractSliceOp::create(
      rw, loc, tensorTypeOf({e, d}, rw.getF32Type()), table, {zero, zero},
      {e, d}, {one, one});
  Value bias = tensor::ExtractSliceOp::create(
      rw, loc, tensorTypeOf({e}, rw.getF32Type()), table, {zero, d},
      {e, one}, {one, one});
  replaceWithCasts(rw, op, {w, bias});
}

LogicalResult linalg_lowering::lowerHyperRouter(HyperRouterOp op,
                                                PatternRewriter &rw) {
  Location loc = op.getLoc();
  auto f32 = [&](Value v) { return promoteToF32(rw, loc, v); };
  Value hidden = hyperRouterAffine(rw, loc, f32(op.getW1()), f32(op.getEmb()),
                                   f32(op.getB1()), /*relu=*/true);
  Value out = hyperRouterAffine(rw, loc, f32(op.getW2()), hidden,
                                f32(op.getB2()), /*relu=*/false);

  finishHyperRouter(rw, op, out);
  return success();
}
