//===- GpuKernelBuilder.cpp - One GPU thread's code -----------------------===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//

#include "GpuKernelBuilder.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::gpu_lowering;

//===----------------------------------------------------------------------===//
// GpuKernelBuilder
//===----------------------------------------------------------------------===//

Value GpuKernelBuilder::threadId(gpu::Dimension d) {
  return gpu::ThreadIdOp::create(b, d);
}
Value GpuKernelBuilder::blockId(gpu::Dimension d) {
  return gpu::BlockIdOp::create(b, d);
}
Value GpuKernelBuilder::gridDim(gpu::Dimension d) {
  return gpu::GridDimOp::create(b, d);
}
void GpuKernelBuilder::barrier() { gpu::BarrierOp::create(b); }
Value GpuKernelBuilder::shuffleXor(Value v, int64_t offset) {
  return gpu::ShuffleOp::create(b, v, cI32(offset), cI32(kWarp),
                                gpu::ShuffleMode::XOR)
      .getShuffleResult();
}
Value GpuKernelBuilder::shuffleIdx(Value v, Value srcLane) {
  return gpu::ShuffleOp::create(b, v, srcLane, cI32(kWarp),
                                gpu::ShuffleMode::IDX)
      .getShuffleResult();
}

MemRefType mlir::moe::gpu_lowering::workgroupMemRef(ArrayRef<int64_t> shape,
                                                    Type elementType) {
  auto space = gpu::AddressSpaceAttr::get(elementType.getContext(),
                                          gpu::AddressSpace::Workgroup);
  return MemRefType::get(shape, elementType, MemRefLayoutAttrInterface(),
                         space);
}

static Value toF32(GpuKernelBuilder &kb, Value v) {
  return v.getType().isF32() ? v : arith::ExtFOp::create(kb.b, kb.f32(), v);
}

Value mlir::moe::gpu_lowering::exp2Approx(ImplicitLocOpBuilder &b, Value x) {
  return LLVM::CallIntrinsicOp::create(
             b, b.getF32Type(), b.getStringAttr("llvm.nvvm.ex2.approx.ftz.f"),
             ValueRange{x})
      .getResult(0);
}

/// The 16 bytes at `address` (an index: a generic address of global memory,
/// 16-byte aligned) as the f32 values of its 16 / sizeof(elt) elements: one
/// ld.global.nc.v4.b32 (LDG.E.128.CONSTANT; the scores are read-only in the
/// kernel), written as inline assembly because LLVM splits a <4 x float>
/// load whose uses are extracts into scalar loads (VectorCombine) and then
/// merges them with the unaligned path's identical scalar loads, losing the
/// alignment the 128-bit load needs. Side effects declared so that nothing
/// hoists it out of the aligned branch.
SmallVector<Value>
mlir::moe::gpu_lowering::loadGlobal16(GpuKernelBuilder &kb, Value address,
                                      Type elt) {
  MLIRContext *ctx = kb.b.getContext();
  Type i32 = kb.i32();
  auto words = LLVM::LLVMStructType::getLiteral(ctx, {i32, i32, i32, i32});
  auto load = LLVM::InlineAsmOp::create(
      kb.b, TypeRange{words}, ValueRange{kb.castInt(address, kb.i64())},
      "{ .reg .u64 g; cvta.to.global.u64 g, $4; "
      "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [g]; }",
      "=r,=r,=r,=r,l", /*has_side_effects=*/true, /*is_align_stack=*/false,
      LLVM::tailcallkind::TailCallKind::None, LLVM::AsmDialectAttr(),
      ArrayAttr());
  SmallVector<Value> out;
  for (int64_t w = 0; w < 4; ++w) {
    Value word = LLVM::ExtractValueOp::create(kb.b, load.getResult(0), w);
    if (elt.isF32()) {
      out.push_back(kb.bitcast(word, kb.f32()));
      continue;
    }
    // Two 16-bit elements, the lower index in the low half (little endian).
    Type i16 = kb.b.getI16Type();
    for (Value half : {word, kb.shru(word, kb.cI32(16))})
      out.push_back(toF32(kb, kb.bitcast(kb.trunc(half, i16), elt)));
  }
  return out;
}

void mlir::moe::gpu_lowering::emitRecordIndexError(GpuKernelBuilder &kb,
                                                   Value word, int64_t opCode,
                                                   Value position, Value value,
                                                   Value bound) {
  ImplicitLocOpBuilder &b = kb.b;
  auto ptrType = LLVM::LLVMPointerType::get(b.getContext(), /*addressSpace=*/1);
  Value base = LLVM::IntToPtrOp::create(b, ptrType, word);
  auto cas = LLVM::AtomicCmpXchgOp::create(b, base, kb.cI64(0), kb.cI64(1),
                                           LLVM::AtomicOrdering::monotonic,
                                           LLVM::AtomicOrdering::monotonic);
  Value won = LLVM::ExtractValueOp::create(b, cas.getResult(), 1);
  kb.ifThen(won, [&] {
    auto put = [&](int64_t slot, Value v) {
      Value addr = LLVM::GEPOp::create(
          b, ptrType, b.getI64Type(), base,
          ArrayRef<LLVM::GEPArg>{static_cast<int32_t>(slot)});
      LLVM::StoreOp::create(b, kb.castInt(v, kb.i64()), addr);
    };
    put(1, kb.cI64(opCode));
    put(2, position);
    put(3, value);
    put(4, bound);
  });
}

Value Exp2SoftmaxBuilder::softmaxWeight(Value d) {
  return exp2Approx(b, fmul(d, cF32(1.4426950408889634)));
}

SmallVector<Value> mlir::moe::gpu_lowering::whileLoop(
    ImplicitLocOpBuilder &b, ValueRange init, TypeRange forwarded,
    function_ref<std::pair<Value, SmallVector<Value>>(ValueRange)> before,
    function_ref<SmallVector<Value>(ValueRange)> after) {
  auto op = scf::WhileOp::create(b, forwarded, init);
  OpBuilder::InsertionGuard guard(b);
  Block *first = b.createBlock(&op.getBefore(), {}, init.getTypes(),
                               SmallVector<Location>(init.size(), b.getLoc()));
  auto [cond, values] = before(first->getArguments());
  scf::ConditionOp::create(b, cond, values);
  Block *second =
      b.createBlock(&op.getAfter(), {}, forwarded,
                    SmallVector<Location>(forwarded.size(), b.getLoc()));
  scf::YieldOp::create(b, after(second->getArguments()));
  return SmallVector<Value>(op.getResults());
}
