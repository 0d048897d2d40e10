//===- HostCode.cpp - The host side of a GPU lowering ---------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "HostCode.h"
#include "Limits.h"

#include "MoE/IR/MoEOps.h"

#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

gpu::GPUModuleOp
mlir::moe::gpu_lowering::getOrCreateKernelModule(ModuleOp module,
                                                 OpBuilder &b) {
  constexpr StringLiteral name = "moe_kernels";
  if (auto existing = module.lookupSymbol<gpu::GPUModuleOp>(name))
    return existing;
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(module.getBody());
  return gpu::GPUModuleOp::create(b, module.getLoc(), name);
}

/// A new kernel `<base>_<n>` in @moe_kernels of `h`'s module with the given
/// argument types, workgroup buffers and known block size; `kb` gets the
/// listener of `h`'s rewriter and is left at the start of the kernel's body
/// (a gpu.return is already there).
static gpu::GPUFuncOp createKernel(HostCode &h, StringRef base,
                                   TypeRange argTypes, TypeRange workgroupTypes,
                                   std::array<int64_t, 3> blockSize,
                                   ImplicitLocOpBuilder &kb) {
  kb.setListener(h.b.getListener());
  gpu::GPUModuleOp kernels = getOrCreateKernelModule(h.module, kb);
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

GPUKernel::GPUKernel(HostCode &h, StringRef name, ValueRange operands,
                     TypeRange workgroupTypes, std::array<int64_t, 3> blockSize,
                     Location loc)
    : b(loc, h.b.getContext()), kb(b),
      func(createKernel(h, name, operands.getTypes(), workgroupTypes, blockSize,
                        b)),
      host(h), operands(operands), blockSize(blockSize) {}

Value GPUKernel::arg(unsigned i) {
  return func.getBody().front().getArgument(i);
}

Value GPUKernel::workgroup(unsigned i) {
  return func.getWorkgroupAttributions()[i];
}

Value GPUKernel::globalId() {
  return kb.add(kb.mul(kb.blockId(), kb.idx(blockSize[0])), kb.threadId());
}

void GPUKernel::forItem(Value count, function_ref<void(Value item)> body) {
  Value item = globalId();
  kb.ifThen(kb.lt(item, count), [&] { body(item); });
}

void GPUKernel::forRowsOfColumn(Value inRange, Value rows,
                                function_ref<void(Value row)> body) {
  kb.ifThen(inRange, [&] {
    kb.forLoop(kb.blockId(gpu::Dimension::y), rows, kb.gridDim(gpu::Dimension::y),
              body);
  });
}

void GPUKernel::launch(std::array<Value, 3> grid, Value dynamicSharedBytes) {
  host.launch(func, grid, blockSize, operands, dynamicSharedBytes);
}

void GPUKernel::launchOver(Value count) {
  GpuKernelBuilder &hk = host.kb;
  launch({hk.ceilDiv(count, hk.idx(blockSize[0])), hk.idx(1), hk.idx(1)});
}

void GPUKernel::launchColumns(Value cols, Value rows) {
  GpuKernelBuilder &hk = host.kb;
  launch({hk.ceilDiv(cols, hk.idx(blockSize[0])),
          hk.minu(rows, hk.idx(kMaxGridDim[1])), hk.idx(1)});
}

//===----------------------------------------------------------------------===//
// Host code
//===----------------------------------------------------------------------===//

/// The identity-layout memref of a ranked tensor type: the type of a kernel
/// block argument (KernelOp's builder).
static MemRefType bufferTypeOf(RankedTensorType type) {
  return MemRefType::get(type.getShape(), type.getElementType());
}

/// The body's block, in the placeholder or in the kernel.
static Block &blockOf(Operation *op) { return op->getRegion(0).front(); }

HostCode::HostCode(RewriterBase &rewriter, Operation *op)
    : rewriter(rewriter), b(op->getLoc(), rewriter),
      module(op->getParentOfType<ModuleOp>()), kb(b) {
  b.setInsertionPoint(op);
  body = KernelOp::create(b, ValueRange{}, ValueRange{});
  b.setInsertionPoint(blockOf(body).getTerminator());
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::WaitOp::create(b, tokenType, ValueRange{}).getAsyncToken();
}

Value HostCode::buffer(Value tensor) {
  Block &block = blockOf(body);
  for (auto [i, in] : llvm::enumerate(ins))
    if (in == tensor)
      return block.getArgument(i);
  // Ins come before the outs in the block's arguments.
  ins.push_back(tensor);
  return block.insertArgument(
      ins.size() - 1, bufferTypeOf(cast<RankedTensorType>(tensor.getType())),
      b.getLoc());
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
  SmallVector<Value> sizes;
  for (Value size : dynamicSizes)
    sizes.push_back(hoist(size));
  OpBuilder::InsertionGuard guard(rewriter);
  rewriter.setInsertionPoint(body);
  outs.push_back(
      bufferization::AllocTensorOp::create(rewriter, b.getLoc(), type, sizes));
  return blockOf(body).addArgument(bufferTypeOf(type), b.getLoc());
}

Value HostCode::hoist(Value v) {
  if (!body->getRegion(0).isAncestor(v.getParentRegion()))
    return v;
  if (Value done = hoisted.lookupOrNull(v))
    return done;
  Operation *def = v.getDefiningOp();
  if (!def)
    llvm::report_fatal_error("HostCode: a size of a result is a block "
                             "argument of the host code");
  Value result;
  if (auto dim = dyn_cast<memref::DimOp>(def)) {
    Value index = hoist(dim.getIndex());
    OpBuilder::InsertionGuard guard(rewriter);
    rewriter.setInsertionPoint(body);
    Value source = dim.getSource();
    auto arg = dyn_cast<BlockArgument>(source);
    if (arg && arg.getOwner() == &blockOf(body)) {
      // The dim of an in or an out is the dim of its tensor.
      unsigned i = arg.getArgNumber();
      Value t = i < ins.size() ? ins[i] : outs[i - ins.size()];
      result = tensor::DimOp::create(rewriter, dim.getLoc(), t, index);
    } else if (auto alloc = source.getDefiningOp<gpu::AllocOp>()) {
      // A temporary's dim: its static size or its dynamic size operand.
      std::optional<int64_t> d = getConstantIntValue(index);
      MemRefType type = alloc.getType();
      if (d && !type.isDynamicDim(*d)) {
        result = arith::ConstantIndexOp::create(rewriter, dim.getLoc(),
                                                type.getDimSize(*d));
      } else if (d) {
        // hoist() sets its own insertion point.
        result = hoist(alloc.getDynamicSizes()[type.getDynamicDimIndex(*d)]);
      }
    }
  } else if (def->getNumRegions() == 0 && isMemoryEffectFree(def)) {
    // Arithmetic on sizes (and its constants).
    for (Value operand : def->getOperands())
      hoist(operand);
    OpBuilder::InsertionGuard guard(rewriter);
    rewriter.setInsertionPoint(body);
    Operation *clone = rewriter.clone(*def, hoisted);
    result = clone->getResult(cast<OpResult>(v).getResultNumber());
  }
  if (!result)
    llvm::report_fatal_error(
        llvm::Twine("HostCode: a size of a result depends on '") +
        def->getName().getStringRef() +
        "', which cannot be computed outside the host code (sizes may use "
        "dims of buffer()s, outs and gpu.allocs, and arithmetic)");
  hoisted.map(v, result);
  return result;
}

void HostCode::fill32(Value buffer, Value value) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::MemsetOp::create(b, tokenType, ValueRange{token}, buffer, value)
              .getAsyncToken();
}

void HostCode::launch(gpu::GPUFuncOp kernel, std::array<Value, 3> grid,
                      std::array<int64_t, 3> block, ValueRange args,
                      Value dynamicSharedBytes) {
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  gpu::KernelDim3 gridDim{grid[0], grid[1], grid[2]};
  gpu::KernelDim3 blockDim{kb.idx(block[0]), kb.idx(block[1]), kb.idx(block[2])};
  auto op = gpu::LaunchFuncOp::create(b, kernel, gridDim, blockDim,
                                      dynamicSharedBytes, args,
                                      tokenType, ValueRange{token});
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
static LLVM::LLVMFuncOp declareRuntimeFunction(HostCode &h, StringRef name,
                                               Type result,
                                               ArrayRef<Type> params = {}) {
  if (auto f = h.module.lookupSymbol<LLVM::LLVMFuncOp>(name))
    return f;
  OpBuilder b(h.b);
  b.setInsertionPointToEnd(h.module.getBody());
  return LLVM::LLVMFuncOp::create(b, h.module.getLoc(), name,
                                  LLVM::LLVMFunctionType::get(result, params));
}

Value HostCode::errorWord() {
  auto f = declareRuntimeFunction(*this, "moeGpuErrorWord", b.getI64Type());
  return LLVM::CallOp::create(b, f, ValueRange{}).getResult();
}

void HostCode::finish(bool checkErrors) {
  closingWait = gpu::WaitOp::create(b, Type(), ValueRange{token});
  if (!checkErrors)
    return;
  auto f = declareRuntimeFunction(*this, "moeGpuCheckErrors", b.getI32Type());
  LLVM::CallOp::create(b, f, ValueRange{});
}

BlockArgument HostCode::outFor(Value buffer, RankedTensorType type) {
  Block &block = blockOf(kernel ? kernel : body);
  auto arg = dyn_cast<BlockArgument>(buffer);
  if (arg && arg.getOwner() == &block && arg.getArgNumber() >= ins.size())
    return arg;
  if (kernel || !closingWait)
    llvm::report_fatal_error("HostCode: a result that is not an out (see "
                             "allocLike) is copied into one between finish() "
                             "and the first tensor() or replace()");
  // A temporary, a view or an operand's buffer: copied into a new out at the
  // end of the stream, before the closing wait. (Results allocated with
  // allocLike are written in place: no copy.)
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(closingWait);
  SmallVector<Value> sizes;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (type.isDynamicDim(d))
      sizes.push_back(kb.dim(buffer, d));
  auto out = cast<BlockArgument>(allocLike(type, sizes));
  auto tokenType = b.getType<gpu::AsyncTokenType>();
  token = gpu::MemcpyOp::create(b, tokenType, ValueRange{token}, out, buffer)
              .getAsyncToken();
  // A temporary of the host code is dead once copied.
  if (buffer.getDefiningOp<gpu::AllocOp>())
    release(buffer);
  rewriter.modifyOpInPlace(closingWait,
                           [&] { closingWait->setOperand(0, token); });
  return out;
}

void HostCode::makeKernelOp() {
  if (!closingWait)
    llvm::report_fatal_error("HostCode: tensor() or replace() before finish()");
  // The placeholder cannot gain results: a new op takes its region.
  OperationState state(body->getLoc(), KernelOp::getOperationName());
  state.addOperands(ins);
  state.addOperands(outs);
  state.getOrAddProperties<KernelOp::Properties>().operandSegmentSizes = {
      static_cast<int32_t>(ins.size()), static_cast<int32_t>(outs.size())};
  state.addTypes(ValueRange(outs).getTypes());
  state.addRegion();
  OpBuilder::InsertionGuard guard(rewriter);
  rewriter.setInsertionPoint(body);
  kernel = rewriter.create(state);
  Region &region = kernel->getRegion(0);
  rewriter.inlineRegionBefore(body->getRegion(0), region, region.end());
  rewriter.eraseOp(body);
  body = nullptr;
  b.setInsertionPointAfter(kernel);
}

Value HostCode::resultOf(BlockArgument out, RankedTensorType type) {
  if (!kernel)
    makeKernelOp();
  Value result = kernel->getResult(out.getArgNumber() - ins.size());
  if (result.getType() != type)
    result = tensor::CastOp::create(b, type, result);
  return result;
}

Value HostCode::tensor(Value buffer, RankedTensorType type) {
  return resultOf(outFor(buffer, type), type);
}

void HostCode::replace(Operation *op, ValueRange buffers) {
  replace(ArrayRef<Operation *>{op}, buffers);
}

void HostCode::replace(ArrayRef<Operation *> ops, ValueRange buffers) {
  // Every out first: the kernel's results are fixed once it is made.
  SmallVector<Value> opResults;
  for (Operation *op : ops)
    llvm::append_range(opResults, op->getResults());
  SmallVector<std::pair<BlockArgument, RankedTensorType>> results;
  for (auto [result, buffer] : llvm::zip_equal(opResults, buffers)) {
    auto type = cast<RankedTensorType>(result.getType());
    results.push_back({outFor(buffer, type), type});
  }
  SmallVector<Value> tensors;
  for (auto [out, type] : results)
    tensors.push_back(resultOf(out, type));
  ArrayRef<Value> rest = tensors;
  for (Operation *op : ops) {
    rewriter.replaceOp(op, rest.take_front(op->getNumResults()));
    rest = rest.drop_front(op->getNumResults());
  }
}

SmallVector<Value>
mlir::moe::gpu_lowering::dynamicSizesFrom(GpuKernelBuilder &kb,
                                          RankedTensorType type, Value like) {
  SmallVector<Value> sizes;
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (type.isDynamicDim(d))
      sizes.push_back(kb.dim(like, d));
  return sizes;
}
