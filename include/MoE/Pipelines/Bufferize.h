//===- Bufferize.h - The bufferization step of the pipelines ----*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// The one bufferization step moe-lower-to-llvm and moe-lower-to-nvvm share.
// Header-only, so that the GPU conversion's pipeline uses it without linking
// the CPU pipelines.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_PIPELINES_BUFFERIZE_H
#define MOE_PIPELINES_BUFFERIZE_H

#include "MoE/Transforms/Passes.h"

#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"

namespace mlir {
namespace moe {
/// Tensors -> buffers by one-shot bufferization across function boundaries,
/// with identity layouts there: the public functions take and return plain
/// memrefs, what the ExecutionEngine, the AOT libraries and ctypes pass;
/// then moe-order-constant-globals.
inline void addOneShotBufferizeAcrossFunctions(OpPassManager &pm) {
  bufferization::OneShotBufferizePassOptions bufferize;
  bufferize.bufferizeFunctionBoundaries = true;
  bufferize.functionBoundaryTypeConversion =
      bufferization::LayoutMapOption::IdentityLayoutMap;
  pm.addPass(bufferization::createOneShotBufferizePass(bufferize));
  // Its constant globals in an order that does not depend on addresses.
  pm.addPass(createMoEOrderConstantGlobals());
}
} // namespace moe
} // namespace mlir

#endif // MOE_PIPELINES_BUFFERIZE_H
