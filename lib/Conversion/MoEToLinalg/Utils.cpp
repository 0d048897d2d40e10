//===- Utils.cpp - Helpers shared by the moe -> linalg patterns -----------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/MoEToLinalg/Utils.h"

#include "MoE/Kernels/OnlineSoftmax.h"
#include "MoE/Kernels/TopK.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::linalg_lowering;

//===----------------------------------------------------------------------===//
// Scalars
//===----------------------------------------------------------------------===//

Value mlir::moe::linalg_lowering::f32Const(OpBuilder &b, Location loc,
                                           double value) {
  return arith::ConstantOp::create(b, loc,
                                   b.getF32FloatAttr(static_cast<float>(value)));
}

Value mlir::moe::linalg_lowering::i32Const(OpBuilder &b, Location loc,
                                           int32_t value) {
  return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(value));
}

Value mlir::moe::linalg_lowering::indexConst(OpBuilder &b, Location loc,
                                             int64_t value) {
  return arith::ConstantIndexOp::create(b, loc, value);
}

Value mlir::moe::linalg_lowering::negInf(OpBuilder &b, Location loc) {
  return f32Const(b, loc, -std::numeric_limits<double>::infinity());
}

Value mlir::moe::linalg_lowering::isNaN(OpBuilder &b, Location loc, Value x) {
  return arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO, x, x);
}

Value mlir::moe::linalg_lowering::toIndex(OpBuilder &b, Location loc, Value v) {
  if (v.getType().isIndex())
    return v;
  return arith::IndexCastOp::create(b, loc, b.getIndexType(), v);
}

Value mlir::moe::linalg_lowering::indexTo(OpBuilder &b, Location loc, Value iv,
                                          Type type) {
  if (type.isIndex())
    return iv;
  return arith::IndexCastOp::create(b, loc, type, iv);
}

Value mlir::moe::linalg_lowering::ranksBefore(OpBuilder &b, Location loc,
                                              Value a, Value ai, Value c,
                                              Value ci, bool descending) {
  // The one order of every top-k (MoE/Kernels/TopK.h), shared with the CPU
  // and GPU kernels; a comparison of (value, index) pairs, so the result does
  // not depend on the order in which a reduction visits the elements.
  ImplicitLocOpBuilder ib(loc, b);
  kernels::KernelBuilder kb(ib);
  return kernels::ranksBefore(kb, a, ai, c, ci, descending);
}

//===----------------------------------------------------------------------===//
// Tensors
//===----------------------------------------------------------------------===//

SmallVector<OpFoldResult>
mlir::moe::linalg_lowering::sizesOf(OpBuilder &b, Location loc, Value tensor) {
  return tensor::getMixedSizes(b, loc, tensor);
}

RankedTensorType
mlir::moe::linalg_lowering::tensorTypeOf(ArrayRef<OpFoldResult> sizes,
                                         Type elementType) {
  SmallVector<int64_t> shape;
  for (OpFoldResult size : sizes)
    shape.push_back(getConstantIntValue(size).value_or(ShapedType::kDynamic));
  return RankedTensorType::get(shape, elementType);
}

Value mlir::moe::linalg_lowering::filled(OpBuilder &b, Location loc,
                                         ArrayRef<OpFoldResult> sizes,
                                         Value value) {
  Value empty = tensor::EmptyOp::create(b, loc, sizes, value.getType());
  return linalg::FillOp::create(b, loc, ValueRange{value}, ValueRange{empty})
      .getResult(0);
}

Value mlir::moe::linalg_lowering::loopScratch(OpBuilder &b, Location loc,
                                              ArrayRef<OpFoldResult> sizes,
                                              Type elementType) {
  SmallVector<Value> dynamic;
  SmallVector<int64_t> shape;
  dispatchIndexOpFoldResults(sizes, dynamic, shape);
  return bufferization::AllocTensorOp::create(
      b, loc, RankedTensorType::get(shape, elementType), dynamic);
}

Value mlir::moe::linalg_lowering::loopFilled(OpBuilder &b, Location loc,
                                             ArrayRef<OpFoldResult> sizes,
                                             Value value) {
  Value init = loopScratch(b, loc, sizes, value.getType());
  return linalg::FillOp::create(b, loc, ValueRange{value}, ValueRange{init})
      .getResult(0);
}

Value mlir::moe::linalg_lowering::promoteToF32(OpBuilder &b, Location loc,
                                               Value tensor) {
  auto type = cast<RankedTensorType>(tensor.getType());
  if (type.getElementType().isF32())
    return tensor;
  int64_t rank = type.getRank();
  Value init = tensor::EmptyOp::create(b, loc, sizesOf(b, loc, tensor),
                                       b.getF32Type());
  AffineMap id = b.getMultiDimIdentityMap(rank);
  SmallVector<utils::IteratorType> iters(rank, utils::IteratorType::parallel);
  return generic(b, loc, tensor, init, {id, id}, iters,
                 [](OpBuilder &nb, Location nl, ValueRange args) {
                   return SmallVector<Value>{arith::ExtFOp::create(
                       nb, nl, nb.getF32Type(), args[0])};
                 })
      .front();
}

Value mlir::moe::linalg_lowering::extractF32(OpBuilder &b, Location loc,
                                             Value tensor, ValueRange indices) {
  Value v = tensor::ExtractOp::create(b, loc, tensor, indices);
  if (v.getType().isF32())
    return v;
  return arith::ExtFOp::create(b, loc, b.getF32Type(), v);
}

Value mlir::moe::linalg_lowering::castTo(OpBuilder &b, Location loc,
                                         Value value, Type type) {
  if (value.getType() == type)
    return value;
  // i32 indices for a result written as i64 (moe.topk_renorm, moe.route):
  // sign-extended elementwise, then cast to the result's static sizes.
  auto from = cast<RankedTensorType>(value.getType());
  auto to = cast<RankedTensorType>(type);
  if (from.getElementType() != to.getElementType()) {
    assert(from.getElementType().isInteger(32) &&
           to.getElementType().isInteger(64) && "only i32 -> i64 indices");
    int64_t rank = from.getRank();
    Value init = tensor::EmptyOp::create(b, loc, sizesOf(b, loc, value),
                                         to.getElementType());
    AffineMap id = b.getMultiDimIdentityMap(rank);
    SmallVector<utils::IteratorType> iters(rank, utils::IteratorType::parallel);
    value = generic(b, loc, value, init, {id, id}, iters,
                    [&](OpBuilder &nb, Location nl, ValueRange args) {
                      return SmallVector<Value>{arith::ExtSIOp::create(
                          nb, nl, to.getElementType(), args[0])};
                    })
                .front();
    if (value.getType() == type)
      return value;
  }
  return tensor::CastOp::create(b, loc, type, value);
}

void mlir::moe::linalg_lowering::replaceWithCasts(RewriterBase &rw,
                                                  Operation *op,
                                                  ValueRange values) {
  SmallVector<Value> replacements;
  for (auto [value, result] : llvm::zip_equal(values, op->getResults()))
    replacements.push_back(castTo(rw, op->getLoc(), value, result.getType()));
  rw.replaceOp(op, replacements);
}

Value mlir::moe::linalg_lowering::rowDotKey(OpBuilder &b, Location loc,
                                            Value rows, Value key,
                                            Value scratch) {
  MLIRContext *ctx = b.getContext();
  Value zeroed = linalg::FillOp::create(b, loc, ValueRange{f32Const(b, loc, 0.0)},
                                        ValueRange{scratch})
                     .getResult(0);
  return generic(b, loc, ValueRange{rows, key}, zeroed,
                 {dimsMap(ctx, 3, {0, 1, 2}), dimsMap(ctx, 3, {0, 2}),
                  dimsMap(ctx, 3, {0, 1})},
                 {utils::IteratorType::parallel, utils::IteratorType::parallel,
                  utils::IteratorType::reduction},
                 mulAddBody)
      .front();
}

Value mlir::moe::linalg_lowering::sliceAlong(OpBuilder &b, Location loc,
                                             Value tensor, int64_t dim,
                                             OpFoldResult pos) {
  auto type = cast<RankedTensorType>(tensor.getType());
  int64_t rank = type.getRank();
  SmallVector<OpFoldResult> offsets(rank, b.getIndexAttr(0));
  SmallVector<OpFoldResult> sizes = sizesOf(b, loc, tensor);
  SmallVector<OpFoldResult> strides(rank, b.getIndexAttr(1));
  offsets[dim] = pos;
  sizes[dim] = b.getIndexAttr(1);
  SmallVector<int64_t> shape(type.getShape());
  shape.erase(shape.begin() + dim);
  auto resultType = RankedTensorType::get(shape, type.getElementType());
  return tensor::ExtractSliceOp::create(b, loc, resultType, tensor, offsets,
                                        sizes, strides);
}

Value mlir::moe::linalg_lowering::insertAlong(OpBuilder &b, Location loc,
                                              Value slice, Value dest,
                                              int64_t dim, OpFoldResult pos) {
  int64_t rank = cast<RankedTensorType>(dest.getType()).getRank();
  SmallVector<OpFoldResult> offsets(rank, b.getIndexAttr(0));
  SmallVector<OpFoldResult> sizes = sizesOf(b, loc, dest);
  SmallVector<OpFoldResult> strides(rank, b.getIndexAttr(1));
  offsets[dim] = pos;
  sizes[dim] = b.getIndexAttr(1);
  return tensor::InsertSliceOp::create(b, loc, slice, dest, offsets, sizes,
                                       strides);
}

//===----------------------------------------------------------------------===//
// linalg.generic
//===----------------------------------------------------------------------===//

AffineMap mlir::moe::linalg_lowering::dimsMap(MLIRContext *ctx,
                                              unsigned numDims,
                                              ArrayRef<unsigned> dims) {
  SmallVector<AffineExpr> exprs;
  for (unsigned d : dims)
    exprs.push_back(getAffineDimExpr(d, ctx));
  return AffineMap::get(numDims, 0, exprs, ctx);
}

SmallVector<Value>
mlir::moe::linalg_lowering::generic(OpBuilder &b, Location loc, ValueRange ins,
                                    ValueRange outs, ArrayRef<AffineMap> maps,
                                    ArrayRef<utils::IteratorType> iterators,
                                    GenericBody body) {
  auto op = linalg::GenericOp::create(
      b, loc, TypeRange(outs), ins, outs, maps, iterators,
      [&](OpBuilder &nb, Location nl, ValueRange args) {
        linalg::YieldOp::create(nb, nl, body(nb, nl, args));
      });
  return SmallVector<Value>(op.getResults());
}

SmallVector<Value> mlir::moe::linalg_lowering::kernelGeneric(
    OpBuilder &b, Location loc, ValueRange ins, ValueRange outs,
    ArrayRef<AffineMap> maps, ArrayRef<utils::IteratorType> iterators,
    KernelBody body) {
  return generic(b, loc, ins, outs, maps, iterators,
                 [&](OpBuilder &gb, Location gl, ValueRange args) {
                   ImplicitLocOpBuilder ib(gl, gb);
                   kernels::KernelBuilder kb(ib);
                   return body(kb, args);
                 });
}

RowMaps::RowMaps(MLIRContext *ctx, int64_t rank) {
  SmallVector<unsigned> leadDims;
  for (unsigned d = 0; d + 1 < rank; ++d)
    leadDims.push_back(d);
  all = AffineMap::getMultiDimIdentityMap(rank, ctx);
  lead = dimsMap(ctx, rank, leadDims);
  parallel.assign(rank, kPar);
  reduce = parallel;
  reduce.back() = kRed;
}

RowMaps::RowMaps(Value tensor)
    : RowMaps(tensor.getContext(),
              cast<RankedTensorType>(tensor.getType()).getRank()) {}

SmallVector<Value> mlir::moe::linalg_lowering::mulAddBody(OpBuilder &b,
                                                          Location loc,
                                                          ValueRange args) {
  Value prod = arith::MulFOp::create(b, loc, args[0], args[1]);
  return {arith::AddFOp::create(b, loc, args[2], prod)};
}

SmallVector<Value> mlir::moe::linalg_lowering::addBody(OpBuilder &b,
                                                       Location loc,
                                                       ValueRange args) {
  return {arith::AddFOp::create(b, loc, args[1], args[0])};
}

Value mlir::moe::linalg_lowering::loopIndex(OpBuilder &b, Location loc,
                                            int64_t dim) {
  return linalg::IndexOp::create(b, loc, dim);
}

//===----------------------------------------------------------------------===//
// Online softmax
//===----------------------------------------------------------------------===//

OnlineSoftmaxState mlir::moe::linalg_lowering::initOnlineSoftmax(
    OpBuilder &b, Location loc, OpFoldResult batch, OpFoldResult rows,
    OpFoldResult width) {
  Value zero = f32Const(b, loc, 0.0);
  return {loopFilled(b, loc, {batch, rows}, negInf(b, loc)),
          loopFilled(b, loc, {batch, rows}, zero),
          loopFilled(b, loc, {batch, rows, width}, zero)};
}

OnlineSoftmaxState mlir::moe::linalg_lowering::streamKeys(
    OpBuilder &b, Location loc, OpFoldResult batch, OpFoldResult rows,
    OpFoldResult width, Value numKeys, KeyLogits logitsOfKey,
    KeyValues valuesOfKey) {
  MLIRContext *ctx = b.getContext();
  Type f32 = b.getF32Type();
  SmallVector<OpFoldResult> rowShape = {batch, rows};
  OnlineSoftmaxState seed = initOnlineSoftmax(b, loc, batch, rows, width);
  // Per-key scratch rows, rewritten in place every iteration.
  Value logits0 = loopScratch(b, loc, rowShape, f32);
  Value alpha0 = loopScratch(b, loc, rowShape, f32);
  Value p0 = loopScratch(b, loc, rowShape, f32);
  Value valid0 = loopScratch(b, loc, rowShape, b.getI1Type());

  using utils::IteratorType;
  constexpr IteratorType par = IteratorType::parallel;
  AffineMap bi = dimsMap(ctx, 2, {0, 1});
  AffineMap bi3 = dimsMap(ctx, 3, {0, 1}), bc3 = dimsMap(ctx, 3, {0, 2}),
            bic3 = dimsMap(ctx, 3, {0, 1, 2});

  auto loop = scf::ForOp::create(
      b, loc, indexConst(b, loc, 0), numKeys, indexConst(b, loc, 1),
      ValueRange{seed.m, seed.l, seed.acc, logits0, alpha0, p0, valid0},
      [&](OpBuilder &lb, Location ll, Value j, ValueRange it) {
        Value logits = logitsOfKey(lb, ll, j, it[3]);
        SmallVector<Value> stats = kernelGeneric(
            lb, ll, logits, ValueRange{it[0], it[1], it[4], it[5], it[6]},
            {bi, bi, bi, bi, bi, bi}, {par, par},
            [](kernels::KernelBuilder &kb, ValueRange a) {
              kernels::SoftmaxTile s =
                  kernels::onlineSoftmaxKey(kb, {a[1], a[2]}, a[0]);
              // NaN counts as unmasked so that it propagates.
              Value valid = kb.cmpf(arith::CmpFPredicate::UNE, a[0],
                                    kb.negInfLike(kb.f32()));
              return SmallVector<Value>{s.next.max, s.next.sum, s.rescale,
                                        s.probs.front(), valid};
            });
        Value values = valuesOfKey(lb, ll, j);
        Value acc =
            generic(lb, ll, ValueRange{stats[2], stats[3], stats[4], values},
                    it[2], {bi3, bi3, bi3, bc3, bic3}, {par, par, par},
                    [](OpBuilder &gb, Location gl, ValueRange a) {
                      // Sequenced: argument evaluation order is unspecified.
                      Value kept = arith::MulFOp::create(gb, gl, a[4], a[0]);
                      Value added = arith::MulFOp::create(gb, gl, a[1], a[3]);
                      Value upd = arith::AddFOp::create(gb, gl, kept, added);
                      return SmallVector<Value>{
                          arith::SelectOp::create(gb, gl, a[2], upd, a[4])};
                    })
                .front();
        scf::YieldOp::create(lb, ll,
                             ValueRange{stats[0], stats[1], acc, logits,
                                        stats[2], stats[3], stats[4]});
      });
  return {loop.getResult(0), loop.getResult(1), loop.getResult(2)};
}

Value mlir::moe::linalg_lowering::normalizeRows(OpBuilder &b, Location loc,
                                                const OnlineSoftmaxState &s) {
  MLIRContext *ctx = b.getContext();
  AffineMap bi3 = dimsMap(ctx, 3, {0, 1}), bic3 = dimsMap(ctx, 3, {0, 1, 2});
  Value init =
      tensor::EmptyOp::create(b, loc, sizesOf(b, loc, s.acc), b.getF32Type());
  using utils::IteratorType;
  constexpr IteratorType par = IteratorType::parallel;
  return kernelGeneric(b, loc, ValueRange{s.m, s.l, s.acc}, init,
                       {bi3, bi3, bic3, bic3}, {par, par, par},
                       [](kernels::KernelBuilder &kb, ValueRange a) {
                         return SmallVector<Value>{
                             kernels::softmaxNormalize(kb, {a[0], a[1]}, a[2])};
                       })
      .front();
}

//===----------------------------------------------------------------------===//
// Run-time index errors
//===----------------------------------------------------------------------===//

static constexpr llvm::StringLiteral kReportFn = "moeReportIndexError";

LogicalResult mlir::moe::linalg_lowering::emitIndexCheck(RewriterBase &rw,
                                                         Operation *anchor,
                                                         Value indices,
                                                         Value bound,
                                                         MoEErrorOp opCode) {
  auto module = anchor->getParentOfType<ModuleOp>();
  if (!module)
    return failure();
  Location loc = anchor->getLoc();
  Type i32 = rw.getI32Type(), i64 = rw.getI64Type();

  auto fn = module.lookupSymbol<func::FuncOp>(kReportFn);
  if (!fn) {
    OpBuilder::InsertionGuard guard(rw);
    rw.setInsertionPointToStart(module.getBody());
    fn = func::FuncOp::create(rw, loc, kReportFn,
                              rw.getFunctionType({i32, i64, i64, i64}, {}));
    fn.setPrivate();
  }

  auto type = cast<RankedTensorType>(indices.getType());
  SmallVector<Value> lbs, ubs, steps;
  for (int64_t d = 0; d < type.getRank(); ++d) {
    lbs.push_back(indexConst(rw, loc, 0));
    ubs.push_back(tensor::DimOp::create(rw, loc, indices, d));
    steps.push_back(indexConst(rw, loc, 1));
  }
  Value bound64 = arith::IndexCastOp::create(rw, loc, i64, bound);
  Value code = i32Const(rw, loc, static_cast<int32_t>(opCode));
  scf::buildLoopNest(
      rw, loc, lbs, ubs, steps,
      [&](OpBuilder &b, Location l, ValueRange ivs) {
        Value v = tensor::ExtractOp::create(b, l, indices, ivs);
        if (v.getType() != i64)
          v = arith::ExtSIOp::create(b, l, i64, v);
        Value zero64 = arith::ConstantOp::create(b, l, b.getI64IntegerAttr(0));
        Value negative =
            arith::CmpIOp::create(b, l, arith::CmpIPredicate::slt, v, zero64);
        Value tooLarge =
            arith::CmpIOp::create(b, l, arith::CmpIPredicate::sge, v, bound64);
        Value bad = arith::OrIOp::create(b, l, negative, tooLarge);
        scf::IfOp::create(b, l, bad, [&](OpBuilder &tb, Location tl) {
          // Row-major element number of the offending value.
          Value pos = ivs.front();
          for (size_t d = 1; d < ivs.size(); ++d)
            pos = arith::AddIOp::create(
                tb, tl, arith::MulIOp::create(tb, tl, pos, ubs[d]), ivs[d]);
          Value pos64 = arith::IndexCastOp::create(tb, tl, i64, pos);
          func::CallOp::create(tb, tl, fn, ValueRange{code, pos64, v, bound64});
          scf::YieldOp::create(tb, tl);
        });
      });
  return success();
}
