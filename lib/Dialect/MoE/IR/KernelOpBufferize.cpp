//===- KernelOpBufferize.cpp - One-shot bufferization of moe.kernel -------===//
//
// Part of the MoE-MLIR project.
//
// BufferizableOpInterface of moe.kernel (declared in MoEKernelOp.td): the ins
// are read, the outs are written and not read, result i is the buffer of
// out i. Bufferizing the op inlines its body with the operands' buffers in
// place of the block arguments.
//
//===----------------------------------------------------------------------===//

#include "MoE/IR/MoEOps.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::bufferization;

bool KernelOp::bufferizesToMemoryRead(OpOperand &operand,
                                      const AnalysisState &) {
  return isDpsInput(&operand);
}

bool KernelOp::bufferizesToMemoryWrite(OpOperand &operand,
                                       const AnalysisState &) {
  return isDpsInit(&operand);
}

AliasingValueList KernelOp::getAliasingValues(OpOperand &operand,
                                              const AnalysisState &) {
  if (!isDpsInit(&operand))
    return {};
  return {{getTiedOpResult(&operand), BufferRelation::Equivalent,
           /*isDefinite=*/true}};
}

/// True when a buffer of type `from` may be used as one of type `to` through
/// a memref.cast that cannot fail at run time: both have the identity layout
/// (they differ in static sizes only).
static bool castAlwaysValid(MemRefType from, MemRefType to) {
  return from.getLayout().isIdentity() && to.getLayout().isIdentity() &&
         from.getMemorySpace() == to.getMemorySpace() &&
         memref::CastOp::areCastCompatible(from, to);
}

LogicalResult KernelOp::bufferize(RewriterBase &rewriter,
                                  const BufferizationOptions &options,
                                  BufferizationState &state) {
  OpBuilder::InsertionGuard guard(rewriter);
  rewriter.setInsertionPoint(*this);
  Location loc = getLoc();
  Block &block = getBlock();

  SmallVector<Value> args, results;
  // Outs whose buffer has another layout: the body writes a new buffer that
  // is copied into the out's afterwards.
  SmallVector<std::pair<Value, Value>> copyBack;
  for (OpOperand &operand : getOperation()->getOpOperands()) {
    FailureOr<Value> buffer =
        getBuffer(rewriter, operand.get(), options, state);
    if (failed(buffer))
      return failure();
    auto from = cast<MemRefType>(buffer->getType());
    auto to = cast<MemRefType>(
        block.getArgument(operand.getOperandNumber()).getType());
    Value arg = *buffer;
    if (from != to && castAlwaysValid(from, to)) {
      arg = memref::CastOp::create(rewriter, loc, to, *buffer);
    } else if (from != to && isDpsInput(&operand)) {
      FailureOr<Value> copy =
          castOrReallocMemRefValue(rewriter, *buffer, to, options);
      if (failed(copy))
        return emitOpError("cannot pass a buffer of type ")
               << from << " as " << to;
      arg = *copy;
    } else if (from != to) {
      if (from.getMemorySpace() != to.getMemorySpace() ||
          from.getElementType() != to.getElementType())
        return emitOpError("cannot pass a buffer of type ")
               << from << " as " << to;
      SmallVector<Value> dynamicSizes;
      for (int64_t d = 0; d < to.getRank(); ++d)
        if (to.isDynamicDim(d))
          dynamicSizes.push_back(memref::DimOp::create(rewriter, loc, *buffer, d));
      FailureOr<Value> alloc =
          options.createAlloc(rewriter, loc, to, dynamicSizes);
      if (failed(alloc))
        return failure();
      arg = *alloc;
      copyBack.push_back({arg, *buffer});
    }
    args.push_back(arg);
    if (isDpsInit(&operand))
      results.push_back(*buffer);
  }

  rewriter.eraseOp(block.getTerminator());
  rewriter.inlineBlockBefore(&block, *this, args);
  for (auto [written, out] : copyBack)
    if (failed(options.createMemCpy(rewriter, loc, written, out)))
      return failure();
  replaceOpWithBufferizedValues(rewriter, *this, results);
  return success();
}
