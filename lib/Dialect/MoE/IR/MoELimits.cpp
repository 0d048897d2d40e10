//===- MoELimits.cpp - The sizes the kernels support ----------------------===//
//
// Part of the MoE-MLIR project.
//
// One place for the size limits every lowering shares, checked at compile
// time (moe-legalize-shapes, run first by every pipeline) so that an input
// the kernels cannot index is a diagnostic naming the limit, never a wrapped
// index at run time.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"

#include "llvm/Support/MathExtras.h"

using namespace mlir;

/// The number of elements of `type`'s static dimensions (a dynamic one counts
/// as 1: only what is known at compile time is checked), or std::nullopt on
/// int64 overflow.
static std::optional<int64_t> staticElements(RankedTensorType type) {
  int64_t count = 1;
  for (int64_t size : type.getShape()) {
    if (ShapedType::isDynamic(size))
      continue;
    if (llvm::MulOverflow(count, size, count))
      return std::nullopt;
  }
  return count;
}

LogicalResult mlir::moe::checkKernelLimits(Operation *op, int64_t maxElements) {
  auto check = [&](Value value, StringRef kind,
                   unsigned index) -> LogicalResult {
    auto type = dyn_cast<RankedTensorType>(value.getType());
    if (!type)
      return success();
    std::optional<int64_t> count = staticElements(type);
    if (count && *count <= maxElements)
      return success();
    InFlightDiagnostic diag = op->emitOpError()
                              << kind << " #" << index << " (" << type
                              << ") has ";
    if (count)
      diag << *count;
    else
      diag << "more than 2^63";
    diag << " elements, more than the kernels support: at most "
                << maxElements
                << " per tensor (2^31 - 1: the kernels index with i32 and "
                   "the index results are i32)";
    return failure();
  };
  for (OpOperand &operand : op->getOpOperands())
    if (failed(check(operand.get(), "operand", operand.getOperandNumber())))
      return failure();
  for (OpResult result : op->getResults())
    if (failed(check(result, "result", result.getResultNumber())))
      return failure();
  return success();
}
