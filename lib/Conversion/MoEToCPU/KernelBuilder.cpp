//===- KernelBuilder.cpp - Building blocks of the fast CPU kernels --------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "KernelBuilder.h"

#include "MoE/Kernels/TopK.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::cpu_lowering;

//===----------------------------------------------------------------------===//
// Constants
//===----------------------------------------------------------------------===//

Value CpuKernelBuilder::splat(Value scalar, int64_t n) {
  return vector::BroadcastOp::create(b, VectorType::get({n}, scalar.getType()),
                                     scalar);
}

Value CpuKernelBuilder::iota(Value base, int64_t n) {
  Type elt = base.getType();
  auto vt = VectorType::get({n}, elt);
  SmallVector<Attribute> lanes;
  for (int64_t i = 0; i < n; ++i)
    lanes.push_back(elt.isIndex() ? Attribute(b.getIndexAttr(i))
                                  : Attribute(b.getIntegerAttr(elt, i)));
  Value steps = arith::ConstantOp::create(b, DenseElementsAttr::get(vt, lanes));
  return add(splat(base, n), steps);
}

Value CpuKernelBuilder::shuffle(Value a, Value c, ArrayRef<int64_t> mask) {
  return vector::ShuffleOp::create(b, a, c, mask);
}

Value CpuKernelBuilder::concat(ArrayRef<Value> parts) {
  assert(llvm::isPowerOf2_64(parts.size()) && "concat of 2^n parts");
  SmallVector<Value> level(parts);
  while (level.size() > 1) {
    int64_t n = cast<VectorType>(level[0].getType()).getNumElements();
    SmallVector<int64_t> mask = llvm::to_vector(llvm::seq<int64_t>(0, 2 * n));
    SmallVector<Value> next;
    for (size_t i = 0; i < level.size(); i += 2)
      next.push_back(shuffle(level[i], level[i + 1], mask));
    level = std::move(next);
  }
  return level[0];
}

//===----------------------------------------------------------------------===//
// Arithmetic
//===----------------------------------------------------------------------===//

Value CpuKernelBuilder::exp(Value x) {
  Type t = x.getType();
  Type intType = b.getI32Type();
  if (auto vt = dyn_cast<VectorType>(t))
    intType = VectorType::get(vt.getShape(), b.getI32Type());
  auto c = [&](double v) { return constLike(t, v); };
  auto ci = [&](int64_t v) {
    return constLike(intType, static_cast<double>(v));
  };
  // Below -104 the result rounds to 0: those lanes compute exp(0) and take 0
  // at the end (clamped to -104, the last multiply formed a subnormal, and
  // its microcode assist per instruction on x86 made the -inf padding lanes
  // of the top-k weights a third of topk_renorm's time). Above 89 it
  // overflows to +inf (clamp). NaN passes through the ordered compares and
  // is restored below.
  Value under = cmpf(arith::CmpFPredicate::OLT, x, c(-104.0));
  Value xc = select(under, c(0.0), x);
  xc = select(cmpf(arith::CmpFPredicate::OGT, xc, c(89.0)), c(89.0), xc);
  // n = round(x / ln2), r = x - n ln2 (ln2 split in two for exactness).
  Value fx = math::FloorOp::create(b, fma(xc, c(1.44269504088896341), c(0.5)));
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
  auto pow2 = [&](Value e) { return bitcast(shl(add(e, ci(127)), ci(23)), t); };
  Value result = fmul(fmul(y, pow2(n1)), pow2(n2));
  result = select(under, c(0.0), result);
  return select(isNaN(x), x, result);
}

Value CpuKernelBuilder::softmaxWeight(Value d) {
  Type type = d.getType();
  Value floor = constLike(type, -87.0);
  Value tiny = cmpf(arith::CmpFPredicate::OLT, d, floor);
  // exp of the clamped value: exp's own last multiply would otherwise form
  // the subnormal (and take the assist) before the select drops it.
  return select(tiny, constLike(type, 0.0), exp(select(tiny, floor, d)));
}

Value CpuKernelBuilder::flushSubnormal(Value x) {
  Type type = x.getType();
  Value tiny = cmpf(arith::CmpFPredicate::OLT, fabs(x),
                    constLike(type, std::numeric_limits<float>::min()));
  return select(tiny, constLike(type, 0.0), x);
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

Value CpuKernelBuilder::sum(Value v) {
  // Reassociation lets LLVM reduce as a tree; the tree is fixed at compile
  // time, so the result is still deterministic.
  return vector::ReductionOp::create(b, vector::CombiningKind::ADD, v,
                                     arith::FastMathFlags::reassoc);
}
Value CpuKernelBuilder::maxf(Value v) {
  return vector::ReductionOp::create(b, vector::CombiningKind::MAXIMUMF, v);
}
Value CpuKernelBuilder::maxsi(Value v) {
  return vector::ReductionOp::create(b, vector::CombiningKind::MAXSI, v);
}
Value CpuKernelBuilder::anyTrue(Value v) {
  return vector::ReductionOp::create(b, vector::CombiningKind::OR, v);
}

//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

static Type memrefElement(Value memref) {
  return cast<MemRefType>(memref.getType()).getElementType();
}

Value CpuKernelBuilder::vload(Value memref, ValueRange indices, int64_t n) {
  n = n ? n : lanes_;
  Type elt = memrefElement(memref);
  Value v =
      vector::LoadOp::create(b, VectorType::get({n}, elt), memref, indices);
  if (!elt.isF32() && isa<FloatType>(elt))
    v = arith::ExtFOp::create(b, vf32(n), v);
  return v;
}

Value CpuKernelBuilder::vloadMasked(Value memref, ValueRange indices,
                                    Value count, double pad, int64_t n) {
  n = n ? n : lanes_;
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

void CpuKernelBuilder::vstore(Value v, Value memref, ValueRange indices) {
  vector::StoreOp::create(b, v, memref, indices);
}

void CpuKernelBuilder::vstoreMasked(Value v, Value memref, ValueRange indices,
                                    Value count) {
  int64_t n = cast<VectorType>(v.getType()).getNumElements();
  Value mask = vector::CreateMaskOp::create(
      b, VectorType::get({n}, b.getI1Type()), ValueRange{count});
  vector::MaskedStoreOp::create(b, memref, indices, mask, v);
}

Value CpuKernelBuilder::vloadPart(bool full, Value memref, ValueRange indices,
                                  Value count, double pad, int64_t n) {
  return full ? vload(memref, indices, n)
              : vloadMasked(memref, indices, count, pad, n);
}

void CpuKernelBuilder::vstorePart(bool full, Value v, Value memref,
                                  ValueRange indices, Value count) {
  if (full)
    vstore(v, memref, indices);
  else
    vstoreMasked(v, memref, indices, count);
}

void CpuKernelBuilder::splitFull(Value full, function_ref<void(bool)> body) {
  scf::IfOp::create(
      b, full,
      [&](OpBuilder &nb, Location) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        body(true);
        scf::YieldOp::create(b);
      },
      [&](OpBuilder &nb, Location) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(nb.getInsertionBlock(), nb.getInsertionPoint());
        body(false);
        scf::YieldOp::create(b);
      });
}

//===----------------------------------------------------------------------===//
// Workers
//===----------------------------------------------------------------------===//

void CpuKernelBuilder::workerRows(const KernelOptions &opts, Value numRows,
                                  int64_t rowsPerItem,
                                  function_ref<void(Value row)> body) {
  workers(opts, ceilDiv(numRows, idx(rowsPerItem)), [&](Value item, Value) {
    Value r0 = mul(item, idx(rowsPerItem));
    Value r1 = mins(add(r0, idx(rowsPerItem)), numRows);
    forLoop(r0, r1, idx(1), body);
  });
}

void CpuKernelBuilder::workers(
    const KernelOptions &opts, Value numItems,
    function_ref<void(Value item, Value worker)> body, Value runInline) {
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
  if (!runInline)
    runInline = cmpi(arith::CmpIPredicate::ule, numItems, idx(kInlineItems));
  scf::IfOp::create(
      b, runInline,
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

Value CpuKernelBuilder::scratch(const KernelOptions &opts, MemRefType type,
                                ValueRange dynamicSizes) {
  SmallVector<int64_t> shape = {std::max<int64_t>(opts.numThreads, 1)};
  llvm::append_range(shape, type.getShape());
  return alloc(MemRefType::get(shape, type.getElementType()), dynamicSizes);
}

//===----------------------------------------------------------------------===//
// Buffers
//===----------------------------------------------------------------------===//

Value CpuKernelBuilder::buffer(Value tensor) {
  assert(inputs_ && inputs_->contains(tensor) &&
         "CpuKernelBuilder::buffer of a tensor that is not an input of the "
         "kernel");
  return inputs_->lookup(tensor);
}

Value CpuKernelBuilder::alloc(MemRefType type, ValueRange dynamicSizes) {
  return memref::AllocOp::create(b, type, dynamicSizes,
                                 b.getI64IntegerAttr(64));
}

Value CpuKernelBuilder::workerSlice(Value scratch, Value w) {
  auto type = cast<MemRefType>(scratch.getType());
  int64_t rank = type.getRank();
  SmallVector<OpFoldResult> offsets(rank, b.getIndexAttr(0));
  SmallVector<OpFoldResult> sizes, strides(rank, b.getIndexAttr(1));
  offsets[0] = w;
  sizes.push_back(b.getIndexAttr(1));
  for (int64_t d = 1; d < rank; ++d)
    sizes.push_back(type.isDynamicDim(d)
                        ? OpFoldResult(dim(scratch, d))
                        : OpFoldResult(b.getIndexAttr(type.getDimSize(d))));
  auto resultType = memref::SubViewOp::inferRankReducedResultType(
      type.getShape().drop_front(), type, offsets, sizes, strides);
  return memref::SubViewOp::create(b, cast<MemRefType>(resultType), scratch,
                                   offsets, sizes, strides);
}

SmallVector<Value> CpuKernelBuilder::sizes(Value shaped) {
  auto type = cast<ShapedType>(shaped.getType());
  SmallVector<Value> result;
  for (int64_t d = 0; d < type.getRank(); ++d) {
    if (!type.isDynamicDim(d))
      result.push_back(idx(type.getDimSize(d)));
    else if (isa<MemRefType>(type))
      result.push_back(dim(shaped, d));
    else
      result.push_back(tensor::DimOp::create(b, shaped, d));
  }
  return result;
}

//===----------------------------------------------------------------------===//
// The kernel op
//===----------------------------------------------------------------------===//

KernelScope::KernelScope(CpuKernelBuilder &kb, ArrayRef<Value> ins,
                         ArrayRef<Out> outs)
    : kb(kb) {
  SmallVector<Value> uniqueIns;
  for (Value v : ins)
    if (v && !llvm::is_contained(uniqueIns, v))
      uniqueIns.push_back(v);
  SmallVector<Value> dests;
  for (const Out &o : outs) {
    auto type = cast<RankedTensorType>(o.type);
    dests.push_back(tensor::EmptyOp::create(
        kb.b, type, CpuKernelBuilder::dynamicSizes(type.getShape(), o.sizes)));
  }
  auto op = KernelOp::create(kb.b, uniqueIns, dests);
  kernel = op;
  for (auto [v, arg] : llvm::zip(uniqueIns, op.getInputBuffers()))
    inputs.map(v, arg);
  kb.inputs_ = &inputs;
  after = OpBuilder::InsertPoint(kb.b.getInsertionBlock(),
                                 kb.b.getInsertionPoint());
  kb.b.setInsertionPoint(op.getBlock().getTerminator());
}

SmallVector<KernelScope::Out>
KernelScope::outsOf(Operation *op, ArrayRef<SmallVector<Value>> sizes) {
  SmallVector<Out> outs;
  for (auto [result, s] : llvm::zip_equal(op->getResults(), sizes))
    outs.push_back({result.getType(), s});
  return outs;
}

KernelScope KernelScope::gradientsOf(CpuKernelBuilder &kb, Operation *op,
                                     ArrayRef<Value> params,
                                     ArrayRef<Value> others) {
  SmallVector<SmallVector<Value>> sizes;
  for (Value v : params)
    sizes.push_back(kb.sizes(v));
  SmallVector<Value> ins(params);
  llvm::append_range(ins, others);
  return KernelScope(kb, ins, outsOf(op, sizes));
}

Value KernelScope::out(unsigned i) const { return outs()[i]; }

ValueRange KernelScope::outs() const {
  return cast<KernelOp>(kernel).getOutputBuffers();
}

ValueRange KernelScope::finish() {
  kb.inputs_ = nullptr;
  kb.b.restoreInsertionPoint(after);
  return kernel->getResults();
}

void KernelScope::replace(RewriterBase &rw, Operation *op) {
  rw.replaceOp(op, finish());
}

SmallVector<Value> CpuKernelBuilder::dynamicSizes(ArrayRef<int64_t> shape,
                                                  ArrayRef<Value> sizes) {
  SmallVector<Value> dyn;
  for (auto [s, v] : llvm::zip(shape, sizes))
    if (ShapedType::isDynamic(s))
      dyn.push_back(v);
  return dyn;
}

Value mlir::moe::cpu_lowering::bestCandidateBelow(
    CpuKernelBuilder &kb, Value cand, Value c0, Value c1, Value prev,
    function_ref<Value(Value)> laneMask) {
  const int64_t kCand = kb.candidateLanes();
  Value none = kernels::noCandidate(kb, VectorType::get({kCand}, kb.i64()));
  Value prevV = kb.splat(prev, kCand);
  Value best =
      kb.forLoop(c0, c1, kb.idx(1), ValueRange{none},
                [&](Value c, ValueRange acc) -> SmallVector<Value> {
                  Value base = kb.mul(c, kb.idx(kCand));
                  Value v = kb.vload(cand, {base}, kCand);
                  auto mask = [&] { return laneMask(base); };
                  return {kernels::bestBelow(
                      kb, acc[0], v, prevV, none,
                      laneMask ? function_ref<Value()>(mask) : nullptr)};
                })[0];
  return kb.maxsi(best);
}

Value mlir::moe::cpu_lowering::roundUp(CpuKernelBuilder &kb, Value x,
                                       int64_t m) {
  return kb.mul(kb.ceilDiv(x, kb.idx(m)), kb.idx(m));
}

Value mlir::moe::cpu_lowering::collapseRows(CpuKernelBuilder &kb,
                                            Value buffer) {
  auto type = cast<MemRefType>(buffer.getType());
  int64_t rank = type.getRank();
  if (rank == 2)
    return buffer;
  ReassociationIndices lead, last = {rank - 1};
  for (int64_t d = 0; d + 1 < rank; ++d)
    lead.push_back(d);
  return memref::CollapseShapeOp::create(
      kb.b, buffer, ArrayRef<ReassociationIndices>{lead, last});
}
