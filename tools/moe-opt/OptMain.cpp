//===- OptMain.cpp - moe-opt's driver, as a function ----------------------===//
//
// Part of the MoE-MLIR project.
//
// moeOptMain (MoE/Tools/OptMain.h): mlir-opt plus the moe dialect and its
// passes. A function so that two executables share it: moe-opt itself
// (linked against Debian's shared LLVM/MLIR) and the wheel's moe-opt, a
// launcher of libmoe_compiler.so, which holds LLVM and MLIR. The LLVM IR
// translations are registered too: upstream `gpu-module-to-binary` translates
// gpu.module bodies to LLVM IR and fails without them. The input is checked for
// nesting deeper than the parser can recurse (MoE/Support/NestingDepth.h)
// before it is parsed: a diagnostic, not a stack overflow. With
// --kernel-key=<key> the input is the kernel module of a torch op's kernel
// key (MoE/IR/KernelKey.h) instead of a file: the module the kernel cache
// compiles, for lit tests and for reproducing a kernel.
//
//===----------------------------------------------------------------------===//

#include "MoE/Tools/OptMain.h"

#include "MoE/Conversion/Passes.h"
#include "MoE/IR/KernelKey.h"
#include "MoE/IR/MoEDialect.h"
#include "MoE/Pipelines/GPUPipeline.h"
#include "MoE/Pipelines/Pipelines.h"
#include "MoE/Support/NestingDepth.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

namespace {
llvm::cl::opt<std::string> kernelKey(
    "kernel-key",
    llvm::cl::desc("Take as the input the kernel module of this torch op's "
                   "kernel key (op|attr=value|...|in:name:elem:dims|...) "
                   "instead of a file"),
    llvm::cl::value_desc("key"), llvm::cl::init(""));

/// The kernel module of --kernel-key as text, or null after printing the
/// diagnostics.
std::unique_ptr<llvm::MemoryBuffer>
kernelKeyInput(const mlir::DialectRegistry &registry) {
  mlir::MLIRContext context(registry);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::moe::buildKernelModule(&context, kernelKey);
  if (!module)
    return nullptr;
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  return llvm::MemoryBuffer::getMemBufferCopy(text, "<kernel key>");
}
} // namespace

extern "C" int moeOptMain(int argc, char **argv) {
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

  // MlirOptMain(argc, argv, ...) split in its parts (upstream's documented
  // way to act between option parsing and processing) for the depth check.
  llvm::InitLLVM init(argc, argv);
  // --version names this project's release after LLVM's: the one of
  // python/moe_mlir/_version.py, as the Python package does.
  llvm::cl::AddExtraVersionPrinter([](llvm::raw_ostream &os) {
    os << "MoE-MLIR version " MOE_MLIR_VERSION "\n";
  });
  auto [inputFilename, outputFilename] = mlir::registerAndParseCLIOptions(
      argc, argv, "MoE-MLIR optimizer driver\n", registry);
  mlir::MlirOptMainConfig config =
      mlir::MlirOptMainConfig::createFromCLOptions();
  if (config.shouldShowDialects()) {
    llvm::outs() << "Available Dialects: ";
    llvm::interleave(registry.getDialectNames(), llvm::outs(), ",");
    llvm::outs() << "\n";
    return 0;
  }
  if (config.shouldListPasses()) {
    mlir::printRegisteredPasses();
    return 0;
  }

  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> input;
  if (!kernelKey.empty()) {
    if (!(input = kernelKeyInput(registry)))
      return 1;
  } else if (!(input = mlir::openInputFile(inputFilename, &error))) {
    llvm::errs() << error << "\n";
    return 1;
  }
  if (std::optional<size_t> at =
          mlir::moe::findExcessiveNesting(input->getBuffer())) {
    llvm::SourceMgr sources;
    llvm::SMLoc loc =
        llvm::SMLoc::getFromPointer(input->getBufferStart() + *at);
    sources.AddNewSourceBuffer(std::move(input), llvm::SMLoc());
    sources.PrintMessage(loc, llvm::SourceMgr::DK_Error,
                         llvm::Twine("brackets nested deeper than ") +
                             llvm::Twine(mlir::moe::kMaxNestingDepth) +
                             " levels: the MLIR parser recurses once per level "
                             "and would overflow its stack");
    return 1;
  }
  std::unique_ptr<llvm::ToolOutputFile> output =
      mlir::openOutputFile(outputFilename, &error);
  if (!output) {
    llvm::errs() << error << "\n";
    return 1;
  }
  if (mlir::failed(
          mlir::MlirOptMain(output->os(), std::move(input), registry, config)))
    return 1;
  output->keep();
  return 0;
}
