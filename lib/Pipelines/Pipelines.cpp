//===- Pipelines.cpp - End-to-end lowering pipelines ----------------------===//
//
// Part of the MoE-MLIR project.
//
// Only upstream passes after our own conversion: bufferization, loops and the
// LLVM conversions are reused as they are.
//
//===----------------------------------------------------------------------===//

#include "MoE/Pipelines/Pipelines.h"
#include "MoE/Conversion/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

namespace {
/// Requests C wrappers (`_mlir_ciface_*`) for the functions this module
/// defines, so that callers outside pass plain memref descriptors. Unlike
/// upstream `llvm-request-c-wrappers`, external declarations are left alone:
/// a call to `moeReportIndexError` or `printI64` must reach the C symbol of
/// that name, not a `_mlir_ciface_` wrapper no library defines.
struct RequestCWrappersForDefinitions
    : PassWrapper<RequestCWrappersForDefinitions,
                  OperationPass<func::FuncOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(RequestCWrappersForDefinitions)
  StringRef getArgument() const override {
    return "moe-request-c-wrappers-for-definitions";
  }
  void runOnOperation() override {
    func::FuncOp fn = getOperation();
    if (!fn.isExternal())
      fn->setAttr(LLVM::LLVMDialect::getEmitCWrapperAttrName(),
                  UnitAttr::get(&getContext()));
  }
};
} // namespace

void mlir::moe::buildLowerToLLVMPipeline(OpPassManager &pm) {
  pm.addPass(moe::createConvertMoEToLinalg());
  pm.addPass(createCanonicalizerPass());

  // Tensors -> buffers, across function boundaries so that the public
  // functions take plain strided memrefs the ExecutionEngine can pass.
  bufferization::OneShotBufferizePassOptions bufferize;
  bufferize.bufferizeFunctionBoundaries = true;
  bufferize.functionBoundaryTypeConversion =
      bufferization::LayoutMapOption::IdentityLayoutMap;
  pm.addPass(bufferization::createOneShotBufferizePass(bufferize));
  bufferization::BufferDeallocationPipelineOptions dealloc;
  bufferization::buildBufferDeallocationPipeline(pm, dealloc);
  // A function that returns an argument or a folded constant keeps a
  // bufferization.clone for the caller to own; lower it to memref copies.
  pm.addPass(createConvertBufferizationToMemRefPass());

  pm.addNestedPass<func::FuncOp>(createConvertLinalgToLoopsPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createSCFToControlFlowPass());

  pm.addNestedPass<func::FuncOp>(
      std::make_unique<RequestCWrappersForDefinitions>());
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createConvertMathToLibmPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void mlir::moe::registerMoEPipelines() {
  PassPipelineRegistration<>(
      "moe-lower-to-llvm",
      "Lower tensor functions holding moe ops to the LLVM dialect (CPU)",
      buildLowerToLLVMPipeline);
}
