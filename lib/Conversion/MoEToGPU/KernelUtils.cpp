//===- KernelUtils.cpp - Building blocks of the moe GPU kernels -----------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "KernelUtils.h"

#include "mlir/IR/SymbolTable.h"

#include <limits>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

//===----------------------------------------------------------------------===//
// KB
//===----------------------------------------------------------------------===//

Value KB::cIdx(int64_t v) { return arith::ConstantIndexOp::create(b, v); }
Value KB::cI32(int64_t v) { return arith::ConstantIntOp::create(b, v, 32); }
Value KB::cI64(int64_t v) { return arith::ConstantIntOp::create(b, v, 64); }
Value KB::cF32(double v) {
  return arith::ConstantFloatOp::create(b, b.getF32Type(),
                                        APFloat(static_cast<float>(v)));
}
Value KB::cTrue() { return arith::ConstantIntOp::create(b, 1, 1); }

Value KB::add(Value x, Value y) { return arith::AddIOp::create(b, x, y); }
Value KB::sub(Value x, Value y) { return arith::SubIOp::create(b, x, y); }
Value KB::mul(Value x, Value y) { return arith::MulIOp::create(b, x, y); }
Value KB::divu(Value x, Value y) { return arith::DivUIOp::create(b, x, y); }
Value KB::remu(Value x, Value y) { return arith::RemUIOp::create(b, x, y); }
Value KB::ceilDiv(Value x, Value y) {
  return arith::CeilDivUIOp::create(b, x, y);
}
Value KB::minu(Value x, Value y) { return arith::MinUIOp::create(b, x, y); }
Value KB::maxs(Value x, Value y) { return arith::MaxSIOp::create(b, x, y); }
Value KB::mins(Value x, Value y) { return arith::MinSIOp::create(b, x, y); }
Value KB::cmp(arith::CmpIPredicate p, Value x, Value y) {
  return arith::CmpIOp::create(b, p, x, y);
}
Value KB::andI(Value x, Value y) { return arith::AndIOp::create(b, x, y); }
Value KB::orI(Value x, Value y) { return arith::OrIOp::create(b, x, y); }
Value KB::xorI(Value x, Value y) { return arith::XOrIOp::create(b, x, y); }
Value KB::shl(Value x, Value y) { return arith::ShLIOp::create(b, x, y); }
Value KB::shrs(Value x, Value y) { return arith::ShRSIOp::create(b, x, y); }
Value KB::shru(Value x, Value y) { return arith::ShRUIOp::create(b, x, y); }
Value KB::notI1(Value x) { return xorI(x, cTrue()); }
Value KB::cast(Value x, Type to) {
  if (x.getType() == to)
    return x;
  if (x.getType().isIndex() || to.isIndex())
    return arith::IndexCastOp::create(b, to, x);
  if (x.getType().getIntOrFloatBitWidth() < to.getIntOrFloatBitWidth())
    return arith::ExtSIOp::create(b, to, x);
  return arith::TruncIOp::create(b, to, x);
}
Value KB::extu(Value x, Type to) { return arith::ExtUIOp::create(b, to, x); }
Value KB::trunc(Value x, Type to) { return arith::TruncIOp::create(b, to, x); }

Value KB::fadd(Value x, Value y) { return arith::AddFOp::create(b, x, y); }
Value KB::fsub(Value x, Value y) { return arith::SubFOp::create(b, x, y); }
Value KB::fmul(Value x, Value y) { return arith::MulFOp::create(b, x, y); }
Value KB::fdiv(Value x, Value y) { return arith::DivFOp::create(b, x, y); }
Value KB::fmax(Value x, Value y) { return arith::MaximumFOp::create(b, x, y); }
Value KB::fmin(Value x, Value y) { return arith::MinimumFOp::create(b, x, y); }
Value KB::exp(Value x) { return math::ExpOp::create(b, x); }
Value KB::log(Value x) { return math::LogOp::create(b, x); }
Value KB::fabs(Value x) { return math::AbsFOp::create(b, x); }
Value KB::cmpf(arith::CmpFPredicate p, Value x, Value y) {
  return arith::CmpFOp::create(b, p, x, y);
}
Value KB::sitofp(Value x) {
  if (x.getType().isIndex())
    x = cast(x, i64());
  return arith::SIToFPOp::create(b, f32(), x);
}
Value KB::bitcast(Value x, Type to) { return arith::BitcastOp::create(b, to, x); }
Value KB::select(Value c, Value x, Value y) {
  return arith::SelectOp::create(b, c, x, y);
}

Value KB::load(Value memref, ValueRange indices) {
  return memref::LoadOp::create(b, memref, indices);
}
Value KB::loadF(Value memref, ValueRange indices) {
  Value v = load(memref, indices);
  if (!v.getType().isF32())
    v = arith::ExtFOp::create(b, f32(), v);
  return v;
}
void KB::store(Value v, Value memref, ValueRange indices) {
  memref::StoreOp::create(b, v, memref, indices);
}
Value KB::dim(Value memref, int64_t d) {
  return memref::DimOp::create(b, memref, d);
}

void KB::forLoop(Value lb, Value ub, Value step,
                 function_ref<void(Value)> body) {
  auto loop = scf::ForOp::create(b, lb, ub, step);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(loop.getBody()->getTerminator());
  body(loop.getInductionVar());
}

SmallVector<Value>
KB::forLoop(Value lb, Value ub, Value step, ValueRange init,
            function_ref<SmallVector<Value>(Value, ValueRange)> body) {
  auto loop = scf::ForOp::create(b, lb, ub, step, init);
  {
    OpBuilder::InsertionGuard guard(b);
    Block *block = loop.getBody();
    if (!block->empty())
      b.setInsertionPoint(block->getTerminator());
    else
      b.setInsertionPointToEnd(block);
    SmallVector<Value> next = body(loop.getInductionVar(), loop.getRegionIterArgs());
    if (!block->empty() && isa<scf::YieldOp>(block->back()))
      block->back().erase();
    b.setInsertionPointToEnd(block);
    scf::YieldOp::create(b, next);
  }
  return SmallVector<Value>(loop.getResults());
}

void KB::ifThen(Value cond, function_ref<void()> then) {
  auto op = scf::IfOp::create(b, cond, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(op.thenBlock()->getTerminator());
  then();
}

SmallVector<Value> KB::ifElse(Value cond, TypeRange types,
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

Value KB::threadId(gpu::Dimension d) { return gpu::ThreadIdOp::create(b, d); }
Value KB::blockId(gpu::Dimension d) { return gpu::BlockIdOp::create(b, d); }
void KB::barrier() { gpu::BarrierOp::create(b); }
Value KB::shuffleXor(Value v, int64_t offset) {
  return gpu::ShuffleOp::create(b, v, cI32(offset), cI32(kWarp),
                                gpu::ShuffleMode::XOR)
      .getShuffleResult();
}
Value KB::shuffleIdx(Value v, Value srcLane) {
  return gpu::ShuffleOp::create(b, v, srcLane, cI32(kWarp),
                                gpu::ShuffleMode::IDX)
      .getShuffleResult();
}

//===----------------------------------------------------------------------===//
// Reductions
//===----------------------------------------------------------------------===//

static Value combine(KB &k, Value x, Value y, ReduceKind kind) {
  switch (kind) {
  case ReduceKind::Sum:
    return k.fadd(x, y);
  case ReduceKind::Max:
    return k.fmax(x, y);
  case ReduceKind::MaxI64:
    return k.maxs(x, y);
  }
  llvm_unreachable("reduce kind");
}

Value mlir::moe::gpu_lowering::subgroupReduce(KB &k, Value v, ReduceKind kind,
                                              int64_t width) {
  for (int64_t offset = width / 2; offset >= 1; offset /= 2) {
    Value other;
    if (kind == ReduceKind::MaxI64) {
      // Shuffles move 32 bits: the two halves travel separately.
      Value lo = k.trunc(v, k.i32());
      Value hi = k.trunc(k.shru(v, k.cI64(32)), k.i32());
      Value olo = k.extu(k.shuffleXor(lo, offset), k.i64());
      Value ohi = k.extu(k.shuffleXor(hi, offset), k.i64());
      other = k.orI(k.shl(ohi, k.cI64(32)), olo);
    } else {
      other = k.shuffleXor(v, offset);
    }
    v = combine(k, v, other, kind);
  }
  return v;
}

Value mlir::moe::gpu_lowering::blockReduce(KB &k, Value v, ReduceKind kind,
                                           int64_t threads, Value scratch) {
  int64_t warps = threads / kWarp;
  v = subgroupReduce(k, v, kind, kWarp);
  if (warps == 1)
    return v;
  Value tid = k.threadId();
  Value warp = k.divu(tid, k.cIdx(kWarp));
  Value lane = k.remu(tid, k.cIdx(kWarp));
  k.ifThen(k.eq(lane, k.cIdx(0)), [&] { k.store(v, scratch, {warp}); });
  k.barrier();
  Value r = k.load(scratch, {k.cIdx(0)});
  for (int64_t w = 1; w < warps; ++w)
    r = combine(k, r, k.load(scratch, {k.cIdx(w)}), kind);
  // The scratch may be reused right after: everybody has read it first.
  k.barrier();
  return r;
}

//===----------------------------------------------------------------------===//
// Top-k keys
//===----------------------------------------------------------------------===//

Value mlir::moe::gpu_lowering::orderedKey(KB &k, Value f) {
  // -0 + 0 = +0: equal floats get equal keys.
  Value canon = k.fadd(f, k.cF32(0.0));
  Value bits = k.bitcast(canon, k.i32());
  Value flipped = k.xorI(bits, k.cI32(0x7fffffff));
  Value key = k.select(k.lt(bits, k.cI32(0)), flipped, bits);
  Value isNan = k.cmpf(arith::CmpFPredicate::UNO, f, f);
  return k.select(isNan, k.cI32(std::numeric_limits<int32_t>::max()), key);
}

Value mlir::moe::gpu_lowering::keyToFloat(KB &k, Value key) {
  Value flipped = k.xorI(key, k.cI32(0x7fffffff));
  Value bits = k.select(k.lt(key, k.cI32(0)), flipped, key);
  return k.bitcast(bits, k.f32());
}

Value mlir::moe::gpu_lowering::packCandidate(KB &k, Value key, Value index) {
  // low half: INT32_MAX - index, so a smaller index is a larger candidate and
  // the largest candidate stays below INT64_MAX (the "no threshold" value).
  Value hi = k.shl(k.cast(key, k.i64()), k.cI64(32));
  Value lo = k.extu(k.sub(k.cI32(std::numeric_limits<int32_t>::max()), index),
                    k.i64());
  return k.orI(hi, lo);
}

Value mlir::moe::gpu_lowering::candidateKey(KB &k, Value packed) {
  return k.trunc(k.shrs(packed, k.cI64(32)), k.i32());
}

Value mlir::moe::gpu_lowering::candidateIndex(KB &k, Value packed) {
  Value lo = k.trunc(packed, k.i32());
  return k.sub(k.cI32(std::numeric_limits<int32_t>::max()), lo);
}

Value mlir::moe::gpu_lowering::noCandidate(KB &k) {
  return k.cI64(std::numeric_limits<int64_t>::min());
}

Value mlir::moe::gpu_lowering::topkWeight(KB &k, const TopkSpec &spec, Value v,
                                          Value v0, Value selSum,
                                          Value denseMax, Value denseSum) {
  Value zero = k.cF32(0.0);
  Value negInf = k.cF32(-std::numeric_limits<double>::infinity());
  if (spec.logits && spec.renormalize) {
    // softmax over the selected logits; a row of -inf yields zeros.
    Value w = k.fdiv(k.exp(k.fsub(v, v0)), selSum);
    return k.select(k.cmpf(arith::CmpFPredicate::OEQ, v0, negInf), zero, w);
  }
  if (spec.logits) {
    Value w = k.fdiv(k.exp(k.fsub(v, denseMax)), denseSum);
    return k.select(k.cmpf(arith::CmpFPredicate::OEQ, denseMax, negInf), zero,
                    w);
  }
  if (spec.renormalize) {
    Value w = k.fdiv(v, selSum);
    return k.select(k.cmpf(arith::CmpFPredicate::OEQ, selSum, zero), zero, w);
  }
  return v;
}

void mlir::moe::gpu_lowering::emitRegisterTopk(
    KB &k, ArrayRef<Value> vals, Value lane, int64_t width,
    int64_t numElements, const TopkSpec &spec, Value weights, Value indices,
    Value row, Value active, Value denseMax, Value denseSum) {
  // Candidates are computed once; the rounds only compare and reduce.
  Value laneI32 = k.cast(lane, k.i32());
  SmallVector<Value> cands;
  for (auto [m, v] : llvm::enumerate(vals)) {
    Value index = k.add(k.cI32(static_cast<int64_t>(m) * width), laneI32);
    Value cand = packCandidate(k, orderedKey(k, v), index);
    if (static_cast<int64_t>(m + 1) * width > numElements)
      cand = k.select(k.lt(index, k.cI32(numElements)), cand, noCandidate(k));
    cands.push_back(cand);
  }

  Value none = noCandidate(k);
  Value widthIdx = k.cIdx(width);
  SmallVector<Value> init = {k.cI64(std::numeric_limits<int64_t>::max()),
                             k.cF32(0.0), k.cF32(0.0)};
  SmallVector<Value> done = k.forLoop(
      k.cIdx(0), k.cIdx(spec.k), k.cIdx(1), init,
      [&](Value r, ValueRange args) -> SmallVector<Value> {
        Value prev = args[0];
        // Best candidate of this lane strictly below the previous winner.
        Value best = none;
        for (Value cand : cands)
          best = k.maxs(best, k.select(k.lt(cand, prev), cand, none));
        best = subgroupReduce(k, best, ReduceKind::MaxI64, width);
        Value key = candidateKey(k, best);
        Value index = candidateIndex(k, best);
        Value v = keyToFloat(k, key);
        Value first = k.eq(r, k.cIdx(0));
        Value v0 = k.select(first, v, args[1]);
        Value term = spec.logits ? k.exp(k.fsub(v, v0)) : v;
        Value selSum = k.fadd(args[2], term);
        Value writer = k.andI(active, k.eq(k.remu(r, widthIdx), lane));
        k.ifThen(writer, [&] {
          k.store(v, weights, {row, r});
          k.store(index, indices, {row, r});
        });
        return {best, v0, selSum};
      });

  if (!spec.logits && !spec.renormalize)
    return; // raw probabilities: the stored values are the weights
  // Each lane rescales the entries it stored itself.
  k.ifThen(active, [&] {
    k.forLoop(lane, k.cIdx(spec.k), widthIdx, [&](Value r) {
      Value v = k.load(weights, {row, r});
      k.store(topkWeight(k, spec, v, done[1], done[2], denseMax, denseSum),
              weights, {row, r});
    });
  });
}

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

gpu::GPUModuleOp mlir::moe::gpu_lowering::getOrCreateKernelModule(
    ModuleOp module) {
  constexpr StringLiteral name = "moe_kernels";
  if (auto existing = module.lookupSymbol<gpu::GPUModuleOp>(name))
    return existing;
  module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                  UnitAttr::get(module.getContext()));
  OpBuilder b(module.getContext());
  b.setInsertionPointToStart(module.getBody());
  return gpu::GPUModuleOp::create(b, module.getLoc(), name);
}

gpu::GPUFuncOp mlir::moe::gpu_lowering::createKernel(
    ModuleOp module, StringRef base, TypeRange argTypes,
    TypeRange workgroupTypes, std::array<int64_t, 3> blockSize,
    ImplicitLocOpBuilder &kb) {
  gpu::GPUModuleOp kernels = getOrCreateKernelModule(module);
  SymbolTable symbols(kernels);
  std::string name;
  for (unsigned n = 0;; ++n) {
    name = (base + "_" + Twine(n)).str();
    if (!symbols.lookup(name))
      break;
  }
  kb.setInsertionPointToEnd(kernels.getBody());
  auto type = kb.getFunctionType(argTypes, {});
  auto func = gpu::GPUFuncOp::create(kb, name, type, workgroupTypes);
  func->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), kb.getUnitAttr());
  func.setKnownBlockSizeAttr(kb.getDenseI32ArrayAttr(
      {static_cast<int32_t>(blockSize[0]), static_cast<int32_t>(blockSize[1]),
       static_cast<int32_t>(blockSize[2])}));
  Block &entry = func.getBody().front();
  kb.setInsertionPointToEnd(&entry);
  auto ret = gpu::ReturnOp::create(kb);
  kb.setInsertionPoint(ret);
  return func;
}

MemRefType mlir::moe::gpu_lowering::workgroupMemRef(ArrayRef<int64_t> shape,
                                                    Type elementType) {
  auto space = gpu::AddressSpaceAttr::get(elementType.getContext(),
                                          gpu::AddressSpace::Workgroup);
  return MemRefType::get(shape, elementType, MemRefLayoutAttrInterface(),
                         space);
}

//===----------------------------------------------------------------------===//
// Host code
//===----------------------------------------------------------------------===//

HostCode::HostCode(ImplicitLocOpBuilder &b, ModuleOp module)
    : b(b), module(module), k(b) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::WaitOp::create(b, tokenType, ValueRange{}).getAsyncToken();
}

Value HostCode::buffer(Value tensor) {
  auto type = cast<RankedTensorType>(tensor.getType());
  auto memref = MemRefType::get(type.getShape(), type.getElementType());
  return bufferization::ToBufferOp::create(b, memref, tensor,
                                           /*read_only=*/true);
}

Value HostCode::alloc(MemRefType type, ValueRange dynamicSizes) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  auto op = gpu::AllocOp::create(b, type, tokenType, ValueRange{token},
                                 dynamicSizes, ValueRange{},
                                 /*hostShared=*/false);
  token = op.getAsyncToken();
  return op.getMemref();
}

Value HostCode::allocLike(RankedTensorType type, ValueRange dynamicSizes) {
  return alloc(MemRefType::get(type.getShape(), type.getElementType()),
               dynamicSizes);
}

void HostCode::fill32(Value buffer, Value value) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::MemsetOp::create(b, tokenType, ValueRange{token}, buffer, value)
              .getAsyncToken();
}

void HostCode::launch(gpu::GPUFuncOp kernel, std::array<Value, 3> grid,
                      std::array<int64_t, 3> block, ValueRange args) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  gpu::KernelDim3 gridDim{grid[0], grid[1], grid[2]};
  gpu::KernelDim3 blockDim{k.cIdx(block[0]), k.cIdx(block[1]),
                           k.cIdx(block[2])};
  auto op = gpu::LaunchFuncOp::create(b, kernel, gridDim, blockDim,
                                      /*dynamicSharedMemorySize=*/Value(),
                                      args, tokenType, ValueRange{token});
  token = op.getAsyncToken();
}

void HostCode::release(Value buffer) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::DeallocOp::create(b, tokenType, ValueRange{token}, buffer)
              .getAsyncToken();
}

/// Runtime entry points are declared as llvm.func (not func.func) so that the
/// C-interface wrappers requested for the public functions do not apply to
/// them: the runtime exports the plain C symbols.
static LLVM::LLVMFuncOp declareRuntimeFunction(ModuleOp module, StringRef name,
                                               Type result) {
  if (auto f = module.lookupSymbol<LLVM::LLVMFuncOp>(name))
    return f;
  OpBuilder b(module.getContext());
  b.setInsertionPointToEnd(module.getBody());
  return LLVM::LLVMFuncOp::create(b, module.getLoc(), name,
                                  LLVM::LLVMFunctionType::get(result, {}));
}

Value HostCode::errorWord() {
  auto f = declareRuntimeFunction(module, "moeGpuErrorWord", b.getI64Type());
  return LLVM::CallOp::create(b, f, ValueRange{}).getResult();
}

void HostCode::finish(bool checkErrors) {
  gpu::WaitOp::create(b, Type(), ValueRange{token});
  if (!checkErrors)
    return;
  auto f = declareRuntimeFunction(module, "moeGpuCheckErrors", b.getI32Type());
  LLVM::CallOp::create(b, f, ValueRange{});
}

Value HostCode::tensor(Value buffer, RankedTensorType type) {
  return bufferization::ToTensorOp::create(b, type, buffer,
                                           /*restrict=*/b.getUnitAttr(),
                                           /*writable=*/b.getUnitAttr());
}

void mlir::moe::gpu_lowering::emitRecordIndexError(KB &k, Value word,
                                                   int64_t opCode,
                                                   Value position, Value value,
                                                   Value bound) {
  ImplicitLocOpBuilder &b = k.b;
  auto ptrType = LLVM::LLVMPointerType::get(b.getContext(), /*addressSpace=*/1);
  Value base = LLVM::IntToPtrOp::create(b, ptrType, word);
  auto cas = LLVM::AtomicCmpXchgOp::create(
      b, base, k.cI64(0), k.cI64(1), LLVM::AtomicOrdering::monotonic,
      LLVM::AtomicOrdering::monotonic);
  Value won = LLVM::ExtractValueOp::create(b, cas.getResult(), 1);
  k.ifThen(won, [&] {
    auto put = [&](int64_t slot, Value v) {
      Value addr = LLVM::GEPOp::create(b, ptrType, b.getI64Type(), base,
                                       ArrayRef<LLVM::GEPArg>{slot});
      LLVM::StoreOp::create(b, k.cast(v, k.i64()), addr);
    };
    put(1, k.cI64(opCode));
    put(2, position);
    put(3, value);
    put(4, bound);
  });
}

SmallVector<Value> mlir::moe::gpu_lowering::dynamicSizesFrom(
    KB &k, RankedTensorType type, Value like) {
  SmallVector<Value> sizes;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (type.isDynamicDim(d))
      sizes.push_back(k.dim(like, d));
  return sizes;
}
