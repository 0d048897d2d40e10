//===- BiasUpdate.cpp - moe.bias_update -> scf + linalg -------------------===//
//
// Part of the MoE-MLIR project.
//
// new_bias[e] = bias[e] + u · sign(Σ counts − E · counts[e]): the sum of the
// counts in f64, in index order (one scf.for: exact for integer counts, and
// the same rounding on every run for float ones), then one elementwise
// linalg.generic. O(E) work: there is no faster CPU kernel to write.
//
//===----------------------------------------------------------------------===//

#include "Lowerings.h"
#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::linalg_lowering;

namespace {
/// A count (i32, i64 or f32) as f64: exact.
Value countToF64(OpBuilder &b, Location loc, Value count) {
  Type f64 = b.getF64Type();
  if (isa<FloatType>(count.getType()))
    return arith::ExtFOp::create(b, loc, f64, count);
  return arith::SIToFPOp::create(b, loc, f64, count);
}
} // namespace

LogicalResult linalg_lowering::lowerBiasUpdate(BiasUpdateOp op,
                                               PatternRewriter &rw) {
  Location loc = op.getLoc();
  Value counts = op.getCounts();
  Value size = tensor::DimOp::create(rw, loc, counts, 0);
  Value zero = arith::ConstantOp::create(rw, loc, rw.getF64FloatAttr(0.0));
  Value total =
      scf::ForOp::create(
          rw, loc, indexConst(rw, loc, 0), size, indexConst(rw, loc, 1),
          ValueRange{zero},
          [&](OpBuilder &b, Location l, Value e, ValueRange acc) {
            Value c = countToF64(b, l, tensor::ExtractOp::create(b, l, counts, e));
            scf::YieldOp::create(b, l,
                                 ValueRange{arith::AddFOp::create(b, l, acc[0], c)});
          })
          .getResult(0);
  Value numExperts = arith::UIToFPOp::create(
      rw, loc, rw.getF64Type(),
      arith::IndexCastUIOp::create(rw, loc, rw.getI64Type(), size));
  Value rate = f32Const(rw, loc, op.getRate().convertToDouble());

  Value bias = promoteToF32(rw, loc, op.getBias());
  Value init =
      tensor::EmptyOp::create(rw, loc, sizesOf(rw, loc, bias), rw.getF32Type());
  AffineMap id = rw.getMultiDimIdentityMap(1);
  Value result =
      generic(rw, loc, ValueRange{bias, counts}, ValueRange{init}, {id, id, id},
              {utils::IteratorType::parallel},
              [&](OpBuilder &b, Location l, ValueRange args) -> SmallVector<Value> {
                // d = Σc − E·c_e, exact for integer counts; its sign (0 for
                // NaN, as torch.sign's (0 < d) − (d < 0)) times u, added in
                // f32.
                Value d = arith::SubFOp::create(
                    b, l, total,
                    arith::MulFOp::create(b, l, numExperts,
                                          countToF64(b, l, args[1])));
                Value up = arith::CmpFOp::create(b, l, arith::CmpFPredicate::OGT,
                                                 d, zero);
                Value down = arith::CmpFOp::create(
                    b, l, arith::CmpFPredicate::OLT, d, zero);
                Value sign = arith::SelectOp::create(
                    b, l, up, f32Const(b, l, 1.0),
                    arith::SelectOp::create(b, l, down, f32Const(b, l, -1.0),
                                            f32Const(b, l, 0.0)));
                return {arith::AddFOp::create(
                    b, l, args[0], arith::MulFOp::create(b, l, rate, sign))};
              })[0];
  replaceWithCasts(rw, op, result);
  return success();
}
