//===- KernelBuilder.cpp - Building blocks of the fast CPU kernels --------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe::cpu;

//===----------------------------------------------------------------------===//
// Constants
//===----------------------------------------------------------------------===//

Value CK::idx(int64_t v) { return arith::ConstantIndexOp::create(b, v); }
Value CK::cI32(int64_t v) {
  return arith::ConstantOp::create(b, b.getI32IntegerAttr(v));
}
Value CK::cI64(int64_t v) {
  return arith::ConstantOp::create(b, b.getI64IntegerAttr(v));
}
Value CK::cF32(double v) {
  return arith::ConstantOp::create(b, b.getF32FloatAttr(static_cast<float>(v)));
}
Value CK::cBool(bool v) { return arith::ConstantOp::create(b, b.getBoolAttr(v)); }

static Type elementOf(Type t) {
  if (auto v = dyn_cast<VectorType>(t))
    return v.getElementType();
  return t;
}

Value CK::constLike(Type type, double v) {
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

Value CK::negInfLike(Type type) {
  return constLike(type, -std::numeric_limits<double>::infinity());
}

Value CK::splat(Value scalar, int64_t n) {
  return vector::BroadcastOp::create(
      b, VectorType::get({n}, scalar.getType()), scalar);
}

Value CK::iota(Value base, int64_t n) {
  Type elt = base.getType();
  auto vt = VectorType::get({n}, elt);
  SmallVector<Attribute> lanes;
  for (int64_t i = 0; i < n; ++i)
    lanes.push_back(elt.isIndex() ? Attribute(b.getIndexAttr(i))
                                  : Attribute(b.getIntegerAttr(elt, i)));
  Value steps =
      arith::ConstantOp::create(b, DenseElementsAttr::get(vt, lanes));
  return add(splat(base, n), steps);
}

//===----------------------------------------------------------------------===//
// Arithmetic
//===----------------------------------------------------------------------===//

Value CK::add(Value x, Value y) { return arith::AddIOp::create(b, x, y); }
Value CK::sub(Value x, Value y) { return arith::SubIOp::create(b, x, y); }
Value CK::mul(Value x, Value y) { return arith::MulIOp::create(b, x, y); }
Value CK::divu(Value x, Value y) { return arith::DivUIOp::create(b, x, y); }
Value CK::remu(Value x, Value y) { return arith::RemUIOp::create(b, x, y); }
Value CK::ceilDiv(Value x, Value y) {
  return arith::CeilDivUIOp::create(b, x, y);
}
Value CK::mins(Value x, Value y) { return arith::MinSIOp::create(b, x, y); }
Value CK::maxs(Value x, Value y) { return arith::MaxSIOp::create(b, x, y); }
Value CK::cmpi(arith::CmpIPredicate p, Value x, Value y) {
  return arith::CmpIOp::create(b, p, x, y);
}
Value CK::andI(Value x, Value y) { return arith::AndIOp::create(b, x, y); }
Value CK::orI(Value x, Value y) { return arith::OrIOp::create(b, x, y); }
Value CK::xorI(Value x, Value y) { return arith::XOrIOp::create(b, x, y); }
Value CK::notI1(Value x) { return xorI(x, constLike(x.getType(), 1)); }
Value CK::shl(Value x, Value y) { return arith::ShLIOp::create(b, x, y); }
Value CK::shrs(Value x, Value y) { return arith::ShRSIOp::create(b, x, y); }

Value CK::castInt(Value x, Type to) {
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

Value CK::fadd(Value x, Value y) { return arith::AddFOp::create(b, x, y); }
Value CK::fsub(Value x, Value y) { return arith::SubFOp::create(b, x, y); }
Value CK::fmul(Value x, Value y) { return arith::MulFOp::create(b, x, y); }
Value CK::fdiv(Value x, Value y) { return arith::DivFOp::create(b, x, y); }
Value CK::fma(Value a, Value bv, Value c) {
  if (isa<VectorType>(a.getType()))
    return vector::FMAOp::create(b, a, bv, c);
  return math::FmaOp::create(b, a, bv, c);
}
Value CK::fmax(Value x, Value y) { return arith::MaximumFOp::create(b, x, y); }
Value CK::fmin(Value x, Value y) { return arith::MinimumFOp::create(b, x, y); }
Value CK::fabs(Value x) { return math::AbsFOp::create(b, x); }
Value CK::cmpf(arith::CmpFPredicate p, Value x, Value y) {
  return arith::CmpFOp::create(b, p, x, y);
}
Value CK::isNaN(Value x) { return cmpf(arith::CmpFPredicate::UNO, x, x); }
Value CK::select(Value c, Value x, Value y) {
  return arith::SelectOp::create(b, c, x, y);
}
Value CK::sitofp(Value x) {
  Type to = f32();
  if (auto vt = dyn_cast<VectorType>(x.getType()))
    to = VectorType::get(vt.getShape(), f32());
  return arith::SIToFPOp::create(b, to, x);
}
Value CK::bitcast(Value x, Type to) { return arith::BitcastOp::create(b, to, x); }

Value CK::exp(Value x) {
  Type t = x.getType();
  Type intType = b.getI32Type();
  if (auto vt = dyn_cast<VectorType>(t))
    intType = VectorType::get(vt.getShape(), b.getI32Type());
  auto c = [&](double v) { return constLike(t, v); };
  auto ci = [&](int64_t v) { return constLike(intType, static_cast<double>(v)); };
  // Clamp (NaN passes through the ordered compares and is restored below):
  // below -104 the result rounds to 0, above 89 it overflows to +inf.
  Value xc = select(cmpf(arith::CmpFPredicate::OLT, x, c(-104.0)), c(-104.0), x);
  xc = select(cmpf(arith::CmpFPredicate::OGT, xc, c(89.0)), c(89.0), xc);
  // n = round(x / ln2), r = x - n ln2 (ln2 split in two for exactness).
  Value fx = math::FloorOp::create(
      b, fma(xc, c(1.44269504088896341), c(0.5)));
  Value r = fma(fx, c(-0.693359375), xc);
  r = fma(fx, c(2.12194440e-4), r);
  Value z = fmul(r, r);
  Value y = c(1.9875691500e-4);
  for (double coeff : {1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                       1.6666665459e-1, 5.0000001201e-1})
    y = fma(y, r, c(coeff));
  y = fma(y, z, fadd(r, c(1.0)));
  // 2^n as two factors 2^(n>>1) and 2^(n - (n>>1)), each a normal number.
  Value n = arith::FPToSIOp::create(b, intType, fx);
  Value n1 = shrs(n, ci(1));
  Value n2 = sub(n, n1);
  auto pow2 = [&](Value e) {
    return bitcast(shl(add(e, ci(127)), ci(23)), t);
  };
  Value result = fmul(fmul(y, pow2(n1)), pow2(n2));
  return select(isNaN(x), x, result);
}

Value CK::log(Value x) { return math::LogOp::create(b, x); }

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

Value CK::sum(Value v) {
  // Reassociation lets LLVM reduce as a tree; the tree is fixed at compile
  // time, so the result is still deterministic.
  return vector::ReductionOp::create(b, vector::CombiningKind::ADD, v,
                                     arith::FastMathFlags::reassoc);
}
Value CK::maxf(Value v) {
  return vector::ReductionOp::create(b, vector::CombiningKind::MAXIMUMF, v);
}
Value CK::maxsi(Value v) {
  return vector::ReductionOp::create(b, vector::CombiningKind::MAXSI, v);
}
Value CK::anyTrue(Value v) {
  return vector::ReductionOp::create(b, vector::CombiningKind::OR, v);
}

//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

Value CK::dim(Value memref, int64_t d) {
  return memref::DimOp::create(b, memref, d);
}
Value CK::load(Value memref, ValueRange indices) {
  return memref::LoadOp::create(b, memref, indices);
}
Value CK::loadF(Value memref, ValueRange indices) {
  Value v = load(memref, indices);
  if (!v.getType().isF32())
    v = arith::ExtFOp::create(b, f32(), v);
  return v;
}
void CK::store(Value v, Value memref, ValueRange indices) {
  memref::StoreOp::create(b, v, memref, indices);
}

static Type memrefElement(Value memref) {
  return cast<MemRefType>(memref.getType()).getElementType();
}

Value CK::vload(Value memref, ValueRange indices, int64_t n) {
  Type elt = memrefElement(memref);
  Value v = vector::LoadOp::create(b, VectorType::get({n}, elt), memref, indices);
  if (!elt.isF32() && isa<FloatType>(elt))
    v = arith::ExtFOp::create(b, vf32(n), v);
  return v;
}

Value CK::vloadMasked(Value memref, ValueRange indices, Value count, double pad,
                      int64_t n) {
  Type elt = memrefElement(memref);
  auto vt = VectorType::get({n}, elt);
  Value mask = vector::CreateMaskOp::create(
      b, VectorType::get({n}, b.getI1Type()), ValueRange{count});
  Value v = vector::MaskedLoadOp::create(b, vt, memref, indices, mask,
                                         constLike(vt, pad));
  if (!elt.isF32() && isa<FloatType>(elt))
    v = arith::ExtFOp::create(b, vf32(n), v);
  return v;
}

void CK::vstore(Value v, Value memref, ValueRange indices) {
  vector::StoreOp::create(b, v, memref, indices);
}

void CK::vstoreMasked(Value v, Value memref, ValueRange indices, Value count) {
  int64_t n = cast<VectorType>(v.getType()).getNumElements();
  Value mask = vector::CreateMaskOp::create(
      b, VectorType::get({n}, b.getI1Type()), ValueRange{count});
  vector::MaskedStoreOp::create(b, memref, indices, mask, v);
}

//===----------------------------------------------------------------------===//
// Control flow
//===----------------------------------------------------------------------===//

void CK::forLoop(Value lb, Value ub, Value step,
                 function_ref<void(Value iv)> body) {
  scf::ForOp::create(b, lb, ub, step, ValueRange{},
                     [&](OpBuilder &nb, Location, Value iv, ValueRange) {
                       OpBuilder::InsertionGuard g(b);
                       b.setInsertionPoint(nb.getInsertionBlock(),
                                           nb.getInsertionPoint());
                       body(iv);
                       scf::YieldOp::create(b);
                     });
}

SmallVector<Value>
CK::forLoop(Value lb, Value ub, Value step, ValueRange init,
            function_ref<SmallVector<Value>(Value iv, ValueRange args)> body) {
  auto op = scf::ForOp::create(
      b, lb, ub, step, init,
      [&](OpBuilder &nb, Location, Value iv, ValueRange args) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        SmallVector<Value> next = body(iv, args);
        scf::YieldOp::create(b, next);
      });
  return SmallVector<Value>(op.getResults());
}

void CK::ifThen(Value cond, function_ref<void()> then) {
  scf::IfOp::create(b, cond, [&](OpBuilder &nb, Location) {
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
    then();
    scf::YieldOp::create(b);
  });
}

SmallVector<Value> CK::ifElse(Value cond, TypeRange types,
                              function_ref<SmallVector<Value>()> then,
                              function_ref<SmallVector<Value>()> otherwise) {
  auto op = scf::IfOp::create(
      b, cond,
      [&](OpBuilder &nb, Location) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        scf::YieldOp::create(b, then());
      },
      [&](OpBuilder &nb, Location) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        scf::YieldOp::create(b, otherwise());
      });
  (void)types;
  return SmallVector<Value>(op.getResults());
}

void CK::workers(const KernelOptions &opts, Value numItems,
                 function_ref<void(Value item, Value worker)> body) {
  auto inline_ = [&] {
    Value w = idx(0);
    forLoop(idx(0), numItems, idx(1), [&](Value item) { body(item, w); });
  };
  if (opts.numThreads <= 1)
    return inline_();
  auto parallel = [&] {
    Value n = mins(idx(opts.numThreads), numItems);
    auto par = scf::ParallelOp::create(
        b, ValueRange{idx(0)}, ValueRange{n}, ValueRange{idx(1)},
        [&](OpBuilder &nb, Location, ValueRange ivs) {
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
          Value w = ivs.front();
          forLoop(w, numItems, n, [&](Value item) { body(item, w); });
        });
    Block *parBody = par.getBody();
    if (!parBody->mightHaveTerminator()) {
      OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToEnd(parBody);
      scf::ReduceOp::create(b);
    }
  };
  // Few items (decode sizes): waking the pool costs more than the work, so
  // they run on the calling thread (the body is emitted twice).
  constexpr int64_t kInlineItems = 4;
  scf::IfOp::create(
      b, cmpi(arith::CmpIPredicate::ule, numItems, idx(kInlineItems)),
      [&](OpBuilder &nb, Location) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        inline_();
        scf::YieldOp::create(b);
      },
      [&](OpBuilder &nb, Location) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        parallel();
        scf::YieldOp::create(b);
      });
}

Value CK::scratch(const KernelOptions &opts, MemRefType type,
                  ValueRange dynamicSizes) {
  SmallVector<int64_t> shape = {std::max<int64_t>(opts.numThreads, 1)};
  llvm::append_range(shape, type.getShape());
  return alloc(MemRefType::get(shape, type.getElementType()), dynamicSizes);
}

//===----------------------------------------------------------------------===//
// Buffers
//===----------------------------------------------------------------------===//

Value CK::buffer(Value tensor) {
  auto type = cast<RankedTensorType>(tensor.getType());
  auto memref = MemRefType::get(type.getShape(), type.getElementType());
  return bufferization::ToBufferOp::create(b, memref, tensor,
                                           /*read_only=*/true);
}

Value CK::alloc(MemRefType type, ValueRange dynamicSizes) {
  return memref::AllocOp::create(b, type, dynamicSizes,
                                 b.getI64IntegerAttr(64));
}

Value CK::workerSlice(Value scratch, Value w) {
  auto type = cast<MemRefType>(scratch.getType());
  int64_t rank = type.getRank();
  SmallVector<OpFoldResult> offsets(rank, b.getIndexAttr(0));
  SmallVector<OpFoldResult> sizes, strides(rank, b.getIndexAttr(1));
  offsets[0] = w;
  sizes.push_back(b.getIndexAttr(1));
  for (int64_t d = 1; d < rank; ++d)
    sizes.push_back(type.isDynamicDim(d) ? OpFoldResult(dim(scratch, d))
                                         : OpFoldResult(b.getIndexAttr(
                                               type.getDimSize(d))));
  auto resultType = memref::SubViewOp::inferRankReducedResultType(
      type.getShape().drop_front(), type, offsets, sizes, strides);
  return memref::SubViewOp::create(b, cast<MemRefType>(resultType), scratch,
                                   offsets, sizes, strides);
}

Value CK::tensor(Value buffer) {
  auto type = cast<MemRefType>(buffer.getType());
  auto tensorType =
      RankedTensorType::get(type.getShape(), type.getElementType());
  return bufferization::ToTensorOp::create(b, tensorType, buffer,
                                           /*restrict=*/b.getUnitAttr(),
                                           /*writable=*/b.getUnitAttr());
}

SmallVector<Value> CK::dynamicSizes(ArrayRef<int64_t> shape,
                                    ArrayRef<Value> sizes) {
  SmallVector<Value> dyn;
  for (auto [s, v] : llvm::zip(shape, sizes))
    if (ShapedType::isDynamic(s))
      dyn.push_back(v);
  return dyn;
}

Value mlir::moe::cpu::roundUp(CK &k, Value x, int64_t m) {
  return k.mul(k.ceilDiv(x, k.idx(m)), k.idx(m));
}

//===----------------------------------------------------------------------===//
// Top-k keys
//===----------------------------------------------------------------------===//

Value mlir::moe::cpu::orderedKey(CK &k, Value f) {
  Type t = f.getType();
  Type intType = k.i32();
  if (auto vt = dyn_cast<VectorType>(t))
    intType = VectorType::get(vt.getShape(), k.i32());
  // -0 == +0 in the dialect's order: map -0 to +0 first.
  Value isZero = k.cmpf(arith::CmpFPredicate::OEQ, f, k.constLike(t, 0.0));
  Value canon = k.select(isZero, k.constLike(t, 0.0), f);
  Value bits = k.bitcast(canon, intType);
  Value negative =
      k.cmpi(arith::CmpIPredicate::slt, bits, k.constLike(intType, 0));
  Value flipped = k.xorI(bits, k.constLike(intType, 0x7fffffff));
  Value key = k.select(negative, flipped, bits);
  return k.select(k.isNaN(f), k.constLike(intType, 0x7fffffff), key);
}

Value mlir::moe::cpu::packCandidate(CK &k, Value key, Value index) {
  Type t = key.getType();
  Type i64t = k.i64();
  if (auto vt = dyn_cast<VectorType>(t))
    i64t = VectorType::get(vt.getShape(), k.i64());
  Value hi = k.shl(k.castInt(key, i64t), k.constLike(i64t, 32));
  // Lower index = larger low word; indices are below 2^31.
  Value lo = k.sub(k.constLike(i64t, 0x7fffffff), k.castInt(index, i64t));
  return k.orI(hi, lo);
}

Value mlir::moe::cpu::candidateIndex(CK &k, Value packed) {
  Value lo = k.andI(packed, k.cI64(0xffffffff));
  return k.castInt(k.sub(k.cI64(0x7fffffff), lo), k.i32());
}
