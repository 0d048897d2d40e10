//===- KernelOp.cpp - moe.kernel: builder and verifiers --------------------===//
//
// Part of the MoE-MLIR project.
//
// The op is declared in MoEKernelOp.td; its bufferization is in
// KernelOpBufferize.cpp.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"

#include "mlir/IR/TypeUtilities.h"
#include "mlir/Transforms/RegionUtils.h"

using namespace mlir;
using namespace mlir::moe;

/// The identity-layout memref of a ranked tensor type: the block argument
/// type of an operand.
static MemRefType bufferTypeOf(Type tensorType) {
  auto t = cast<RankedTensorType>(tensorType);
  return MemRefType::get(t.getShape(), t.getElementType());
}

void KernelOp::build(OpBuilder &b, OperationState &state, ValueRange inputs,
                     ValueRange outputs) {
  state.addOperands(inputs);
  state.addOperands(outputs);
  state.getOrAddProperties<Properties>().operandSegmentSizes = {
      static_cast<int32_t>(inputs.size()),
      static_cast<int32_t>(outputs.size())};
  state.addTypes(outputs.getTypes());
  Region *body = state.addRegion();
  Block *block = new Block();
  body->push_back(block);
  for (Value v : llvm::concat<const Value>(inputs, outputs))
    block->addArgument(bufferTypeOf(v.getType()), state.location);
  KernelOp::ensureTerminator(*body, b, state.location);
}

LogicalResult KernelOp::verify() {
  Block &block = getBlock();
  if (block.getNumArguments() != getNumOperands())
    return emitOpError("expected ")
           << getNumOperands() << " block arguments (one per operand), got "
           << block.getNumArguments();
  for (auto [i, operand, arg] :
       llvm::enumerate(getOperands(), block.getArguments())) {
    auto tensor = cast<RankedTensorType>(operand.getType());
    auto memref = dyn_cast<MemRefType>(arg.getType());
    // Compatible shapes, not equal ones: canonicalization may refine an
    // operand's type (a tensor.cast folded into it) after the body is built.
    if (!memref || !memref.getLayout().isIdentity() ||
        failed(verifyCompatibleShape(memref.getShape(), tensor.getShape())) ||
        memref.getElementType() != tensor.getElementType())
      return emitOpError("block argument #")
             << i << " must be an identity-layout memref of a shape compatible with operand #" << i
             << " and its element type (" << bufferTypeOf(tensor)
             << " in some memory space), got " << arg.getType();
  }
  return success();
}

LogicalResult KernelOp::verifyRegions() {
  // All memory the body reaches goes through its block arguments (or is its
  // own): a tensor or buffer from above would be a read or write that
  // bufferization does not see.
  std::optional<InFlightDiagnostic> diag;
  visitUsedValuesDefinedAbove(getBody(), [&](OpOperand *use) {
    if (diag || !isa<TensorType, BaseMemRefType>(use->get().getType()))
      return;
    diag.emplace(use->getOwner()->emitOpError(
        "uses a tensor or memref defined outside its enclosing moe.kernel; "
        "pass it as an operand of the kernel instead"));
  });
  if (diag)
    return failure();
  return success();
}
