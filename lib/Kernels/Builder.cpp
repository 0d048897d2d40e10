//===- Builder.cpp - The target-neutral kernel builder --------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "MoE/Kernels/Builder.h"

#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::kernels;

static Type elementOf(Type t) {
  if (auto v = dyn_cast<VectorType>(t))
    return v.getElementType();
  return t;
}

Type KernelBuilder::shapedLike(Type like, Type elt) {
  if (auto v = dyn_cast<VectorType>(like))
    return VectorType::get(v.getShape(), elt);
  return elt;
}

//===----------------------------------------------------------------------===//
// Constants
//===----------------------------------------------------------------------===//

Value KernelBuilder::idx(int64_t v) {
  return arith::ConstantIndexOp::create(b, v);
}
Value KernelBuilder::cI32(int64_t v) {
  return arith::ConstantIntOp::create(b, v, 32);
}
Value KernelBuilder::cI64(int64_t v) {
  return arith::ConstantIntOp::create(b, v, 64);
}
Value KernelBuilder::cF32(double v) {
  return arith::ConstantFloatOp::create(b, b.getF32Type(),
                                        APFloat(static_cast<float>(v)));
}
Value KernelBuilder::cBool(bool v) {
  return arith::ConstantIntOp::create(b, v, 1);
}

Value KernelBuilder::constLike(Type type, double v) {
  Type elt = elementOf(type);
  TypedAttr attr;
  if (isa<FloatType>(elt))
    attr = b.getFloatAttr(elt, v);
  else if (elt.isIndex())
    attr = b.getIndexAttr(static_cast<int64_t>(v));
  else
    attr = b.getIntegerAttr(elt, static_cast<int64_t>(v));
  if (auto vt = dyn_cast<VectorType>(type))
    return arith::ConstantOp::create(b, DenseElementsAttr::get(vt, attr));
  return arith::ConstantOp::create(b, attr);
}

Value KernelBuilder::negInfLike(Type type) {
  return constLike(type, -std::numeric_limits<double>::infinity());
}

Value KernelBuilder::broadcastLike(Value scalar, Type like) {
  if (!isa<VectorType>(like) || isa<VectorType>(scalar.getType()))
    return scalar;
  return vector::BroadcastOp::create(b, shapedLike(like, scalar.getType()),
                                     scalar);
}

//===----------------------------------------------------------------------===//
// Integers
//===----------------------------------------------------------------------===//

Value KernelBuilder::cmpi(arith::CmpIPredicate p, Value x, Value y) {
  return arith::CmpIOp::create(b, p, x, y);
}
Value KernelBuilder::notI1(Value x) {
  return xorI(x, constLike(x.getType(), 1));
}

Value KernelBuilder::castInt(Value x, Type to) {
  Type from = x.getType();
  if (from == to)
    return x;
  if (elementOf(from).isIndex() || elementOf(to).isIndex())
    return arith::IndexCastOp::create(b, to, x);
  if (elementOf(from).getIntOrFloatBitWidth() <
      elementOf(to).getIntOrFloatBitWidth())
    return arith::ExtSIOp::create(b, to, x);
  return arith::TruncIOp::create(b, to, x);
}
Value KernelBuilder::asElementOf(Value x, Value memref) {
  Type elt = cast<MemRefType>(memref.getType()).getElementType();
  if (auto vec = dyn_cast<VectorType>(x.getType()))
    return castInt(x, VectorType::get(vec.getShape(), elt));
  return castInt(x, elt);
}
Value KernelBuilder::extu(Value x, Type to) {
  return arith::ExtUIOp::create(b, to, x);
}
Value KernelBuilder::trunc(Value x, Type to) {
  return arith::TruncIOp::create(b, to, x);
}

//===----------------------------------------------------------------------===//
// Floats
//===----------------------------------------------------------------------===//

Value KernelBuilder::fabs(Value x) { return math::AbsFOp::create(b, x); }
Value KernelBuilder::cmpf(arith::CmpFPredicate p, Value x, Value y) {
  return arith::CmpFOp::create(b, p, x, y);
}
Value KernelBuilder::isNaN(Value x) {
  return cmpf(arith::CmpFPredicate::UNO, x, x);
}
Value KernelBuilder::fma(Value a, Value bv, Value c) {
  if (isa<VectorType>(a.getType()))
    return vector::FMAOp::create(b, a, bv, c);
  return math::FmaOp::create(b, a, bv, c);
}
Value KernelBuilder::select(Value c, Value x, Value y) {
  return arith::SelectOp::create(b, c, x, y);
}
Value KernelBuilder::divOrZero(Value num, Value den) {
  assert(num.getType() == den.getType() && "divOrZero: one type");
  Value zero = constLike(den.getType(), 0.0);
  Value isZero = cmpf(arith::CmpFPredicate::OEQ, den, zero);
  return select(isZero, zero, fdiv(num, den));
}
Value KernelBuilder::sitofp(Value x) {
  if (elementOf(x.getType()).isIndex())
    x = castInt(x, shapedLike(x.getType(), i64()));
  return arith::SIToFPOp::create(b, shapedLike(x.getType(), f32()), x);
}
Value KernelBuilder::bitcast(Value x, Type to) {
  return arith::BitcastOp::create(b, to, x);
}
Value KernelBuilder::exp(Value x) { return math::ExpOp::create(b, x); }
Value KernelBuilder::log(Value x) { return math::LogOp::create(b, x); }

//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

Value KernelBuilder::dim(Value memref, int64_t d) {
  return memref::DimOp::create(b, memref, d);
}
Value KernelBuilder::load(Value memref, ValueRange indices) {
  return memref::LoadOp::create(b, memref, indices);
}
Value KernelBuilder::loadF(Value memref, ValueRange indices) {
  Value v = load(memref, indices);
  if (!v.getType().isF32())
    v = arith::ExtFOp::create(b, f32(), v);
  return v;
}
void KernelBuilder::store(Value v, Value memref, ValueRange indices) {
  memref::StoreOp::create(b, v, memref, indices);
}

//===----------------------------------------------------------------------===//
// Control flow
//===----------------------------------------------------------------------===//

void KernelBuilder::forLoop(Value lb, Value ub, Value step,
                            function_ref<void(Value iv)> body) {
  auto loop = scf::ForOp::create(b, lb, ub, step);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(loop.getBody()->getTerminator());
  body(loop.getInductionVar());
}

SmallVector<Value> KernelBuilder::forLoop(
    Value lb, Value ub, Value step, ValueRange init,
    function_ref<SmallVector<Value>(Value iv, ValueRange args)> body) {
  auto loop = scf::ForOp::create(
      b, lb, ub, step, init,
      [&](OpBuilder &nb, Location, Value iv, ValueRange args) {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        SmallVector<Value> next = body(iv, args);
        scf::YieldOp::create(b, next);
      });
  return SmallVector<Value>(loop.getResults());
}

void KernelBuilder::ifThen(Value cond, function_ref<void()> then) {
  auto op = scf::IfOp::create(b, cond, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(op.thenBlock()->getTerminator());
  then();
}

void KernelBuilder::ifThenElse(Value cond, function_ref<void()> then,
                               function_ref<void()> otherwise) {
  auto op = scf::IfOp::create(b, cond, /*withElseRegion=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(op.thenBlock()->getTerminator());
  then();
  b.setInsertionPoint(op.elseBlock()->getTerminator());
  otherwise();
}

SmallVector<Value>
KernelBuilder::ifElse(Value cond, TypeRange types,
                      function_ref<SmallVector<Value>()> then,
                      function_ref<SmallVector<Value>()> otherwise) {
  auto op = scf::IfOp::create(b, types, cond, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(op.thenBlock());
    scf::YieldOp::create(b, then());
    b.setInsertionPointToStart(op.elseBlock());
    scf::YieldOp::create(b, otherwise());
  }
  return SmallVector<Value>(op.getResults());
}
