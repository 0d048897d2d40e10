//===- moe-opt.cpp - The optimizer driver of the moe dialect --------------===//
//
// Part of the MoE-MLIR project.
//
// mlir-opt plus the moe dialect and its passes. The LLVM IR translations are
// registered too: upstream `gpu-module-to-binary` translates gpu.module bodies
// to LLVM IR and fails without them.
//
//===----------------------------------------------------------------------===//

#include "MoE/Conversion/Passes.h"
#include "MoE/IR/MoEDialect.h"
#include "MoE/Pipelines/Pipelines.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::registerAllPasses();
  mlir::moe::registerMoEConversionPasses();
  mlir::moe::registerMoEPipelines();
  mlir::moe::registerMoEGPUPipelines();
  mlir::moe::registerMoETransformsPasses();

  mlir::DialectRegistry registry;
  registry.insert<mlir::moe::MoEDialect>();
  mlir::registerAllDialects(registry);
  mlir::registerAllExtensions(registry);
  mlir::registerAllToLLVMIRTranslations(registry);

  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "MoE-MLIR optimizer driver\n", registry));
}
