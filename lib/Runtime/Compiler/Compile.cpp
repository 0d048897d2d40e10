//===- Compile.cpp - MLIR text to a loadable shared object, in process ----===//
//
// Part of the MoE-MLIR project.
//
// moeCompileKernel (include/MoE/Runtime/KernelCompiler.h): the steps the
// kernel cache ran as three processes (moe-opt, mlir-translate, clang -O3
// -shared), in one call: parse, the moe pass pipeline, translation to LLVM
// IR, LLVM's default per-module pipeline at the requested level (the
// parallel kernels hold coroutines that only the middle end lowers), code
// generation for the host into an object, and lld's ELF linker, linked into
// this library, for the shared object the caller then loads with dlopen: a
// process that only loads cached kernels never maps LLVM.
//
//===----------------------------------------------------------------------===//

#include "../CompileSupport.h"
#include "ErrorBuffer.h"
#include "MoE/Runtime/KernelCompiler.h"

#include "MoE/Conversion/Passes.h"
#include "MoE/IR/MoEDialect.h"
#include "MoE/Pipelines/GPUPipeline.h"
#include "MoE/Pipelines/Pipelines.h"
#include "MoE/Support/NestingDepth.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Target/LLVMIR/Export.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Plugins/PassPlugin.h"
#include "llvm/Support/CrashRecoveryContext.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/TargetParser/Host.h"

#include "lld/Common/Driver.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>

using namespace mlir;

// The ELF driver of lld, the one this library links in.
LLD_HAS_DRIVER(elf)

// lld's LTO code (never run: kernels are linked from native objects) names
// the Polly plugin, which Debian's LLVM links into its tools but ships no
// static library of: an empty plugin.
llvm::PassPluginLibraryInfo getPollyPluginInfo() {
  return {LLVM_PLUGIN_API_VERSION, "Polly (not linked in)", "", nullptr};
}

namespace {

/// The passes and dialects moe-opt registers, once per process.
const DialectRegistry &registry() {
  static DialectRegistry *registry = [] {
    registerAllPasses();
    moe::registerMoEConversionPasses();
    moe::registerMoEPipelines();
    moe::registerMoEGPUPipelines();
    moe::registerMoETransformsPasses();
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    // gpu-module-to-binary translates the device code itself.
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    auto *r = new DialectRegistry();
    r->insert<moe::MoEDialect>();
    registerAllDialects(*r);
    registerAllExtensions(*r);
    registerAllToLLVMIRTranslations(*r);
    return r;
  }();
  return *registry;
}

/// The host target machine for `cpu` ("native" or an LLVM CPU name) at
/// `optLevel`, position-independent (the object goes into a shared object).
llvm::Expected<std::unique_ptr<llvm::TargetMachine>>
hostTargetMachine(llvm::StringRef cpu, int optLevel) {
  moe::CpuTarget target;
  std::string error;
  if (!moe::resolveCpuTarget(cpu, target, error))
    return llvm::createStringError(error);
  llvm::Triple triple(llvm::sys::getProcessTriple());
  const llvm::Target *t = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!t)
    return llvm::createStringError("no LLVM target for " + triple.str() + ": " +
                                   error);
  llvm::CodeGenOptLevel level =
      moe::compile_support::codeGenLevel(std::max(optLevel, 0));
  llvm::TargetOptions options;
  // Constructors in .init_array, which the dynamic loader runs (.ctors
  // needs crtbegin, which no kernel links): the CUDA kernels load their
  // device code from one.
  options.UseInitArray = true;
  std::unique_ptr<llvm::TargetMachine> tm(t->createTargetMachine(
      triple, target.cpu, llvm::join(target.features, ","), options,
      llvm::Reloc::PIC_, std::nullopt, level));
  if (!tm)
    return llvm::createStringError("cannot create a target machine for " +
                                   triple.str() + " (" + target.cpu + ")");
  return tm;
}

using Clock = std::chrono::steady_clock;

/// Seconds since `start`, which moves to now.
double lap(Clock::time_point &start) {
  Clock::time_point now = Clock::now();
  double s = std::chrono::duration<double>(now - start).count();
  start = now;
  return s;
}

/// Links `object` and `linkArgs` (libraries, archives, run paths) into the
/// shared object `path` with lld's ELF driver, on one thread.
bool linkSharedObject(llvm::StringRef object,
                      llvm::ArrayRef<const char *> linkArgs,
                      llvm::StringRef path, std::string &error) {
  std::string objectPath = (path + ".o").str();
  {
    std::error_code ec;
    llvm::raw_fd_ostream out(objectPath, ec, llvm::sys::fs::OF_None);
    if (ec) {
      error = "cannot write " + objectPath + ": " + ec.message();
      return false;
    }
    out << object;
  }
  std::string outPath = path.str();
  std::vector<const char *> args = {
      "ld.lld", "-shared",       "--threads=1",     "--eh-frame-hdr",
      "-o",     outPath.c_str(), objectPath.c_str()};
  args.insert(args.end(), linkArgs.begin(), linkArgs.end());
  std::string messages;
  llvm::raw_string_ostream diag(messages);
  lld::Result result =
      lld::lldMain(args, diag, diag, {{lld::Gnu, &lld::elf::link}});
  llvm::sys::fs::remove(objectPath);
  if (result.retCode != 0) {
    error = "linking the shared object failed: " + messages;
    return false;
  }
  return true;
}

int32_t compile(llvm::StringRef text, llvm::StringRef pipeline,
                llvm::StringRef cpu, int optLevel,
                llvm::ArrayRef<const char *> linkArgs, llvm::StringRef path,
                double stages[5], std::string &error) {
  Clock::time_point start = Clock::now();
  MLIRContext context(registry(), MLIRContext::Threading::DISABLED);
  moe::compile_support::DiagnosticCollector diagnostics(context);
  // The parser would overflow its stack on deeper nesting (NestingDepth.h).
  if (std::optional<size_t> at = moe::findExcessiveNesting(text)) {
    error = "cannot parse the module: brackets nested deeper than " +
            std::to_string(moe::kMaxNestingDepth) + " levels at offset " +
            std::to_string(*at);
    return 1;
  }
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(text, &context, "kernel.mlir");
  if (!module) {
    error = "cannot parse the module:" + diagnostics.messages;
    return 1;
  }
  PassManager pm(&context, ModuleOp::getOperationName());
  // The IR is verified once, after the whole pipeline, instead of after each
  // of its ~50 passes: the verifier after every pass was a quarter of this
  // stage's time (moe-opt on a similarity_inform_topk kernel: 0.78 -> 0.55 s
  // user), on every kernel a process builds. The passes are the same code
  // that moe-opt runs in lit with a verifier after each; a pass that left
  // invalid IR here still fails the build, at the end, or in translation.
  pm.enableVerifier(false);
  std::string pipelineError;
  llvm::raw_string_ostream pipelineErrors(pipelineError);
  if (failed(parsePassPipeline(pipeline, pm, pipelineErrors))) {
    error = "bad pass pipeline '" + pipeline.str() + "': " + pipelineError;
    return 1;
  }
  if (failed(pm.run(*module))) {
    error =
        "the pipeline " + pipeline.str() + " failed:" + diagnostics.messages;
    return 1;
  }
  if (failed(verify(*module))) {
    error = "the pipeline " + pipeline.str() +
            " left invalid IR (reproduce with moe-opt --pass-pipeline="
            "'builtin.module(...)', which verifies after each pass):" +
            diagnostics.messages;
    return 1;
  }
  stages[0] = lap(start);

  llvm::LLVMContext llvmContext;
  std::unique_ptr<llvm::Module> llvmModule =
      translateModuleToLLVMIR(*module, llvmContext, "kernel");
  if (!llvmModule) {
    error = "translation to LLVM IR failed:" + diagnostics.messages;
    return 1;
  }
  auto tm = hostTargetMachine(cpu, optLevel);
  if (!tm) {
    error = llvm::toString(tm.takeError());
    return 1;
  }
  llvmModule->setTargetTriple((*tm)->getTargetTriple());
  llvmModule->setDataLayout((*tm)->createDataLayout());
  std::string invalid;
  llvm::raw_string_ostream why(invalid);
  if (llvm::verifyModule(*llvmModule, &why)) {
    error = "the translated module is not valid LLVM IR: " + invalid;
    return 1;
  }
  stages[1] = lap(start);
  auto optimize = makeOptimizingTransformer(
      static_cast<unsigned>(std::clamp(optLevel, 0, 3)), /*sizeLevel=*/0,
      tm->get());
  if (llvm::Error e = optimize(llvmModule.get())) {
    error = "LLVM optimization failed: " + llvm::toString(std::move(e));
    return 1;
  }

  stages[2] = lap(start);
  llvm::SmallVector<char, 0> object;
  {
    llvm::raw_svector_ostream os(object);
    llvm::legacy::PassManager codegen;
    if ((*tm)->addPassesToEmitFile(codegen, os, nullptr,
                                   llvm::CodeGenFileType::ObjectFile)) {
      error = "the target cannot emit an object file";
      return 1;
    }
    codegen.run(*llvmModule);
  }
  stages[3] = lap(start);
  if (!linkSharedObject(llvm::StringRef(object.data(), object.size()), linkArgs,
                        path, error))
    return 1;
  stages[4] = lap(start);
  return 0;
}

} // namespace

extern "C" int32_t moeCompileKernel(
    const char *mlir, int64_t len, const char *pipeline, const char *targetCpu,
    int32_t optLevel, const char *const *linkArgs, int32_t numLinkArgs,
    const char *sharedObjectPath, double *seconds, char *err, int64_t errCap) {
  if (!mlir || len < 0 || !pipeline || !sharedObjectPath ||
      (numLinkArgs > 0 && !linkArgs)) {
    mlir::moe::writeErrorBuffer(
        err, errCap, "moeCompileKernel: null text, pipeline, path or list");
    return 1;
  }
  // One compilation at a time: the pass registry, lld and the crash
  // recovery are process-wide.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  (void)registry();
  std::string error;
  int32_t rc = 1;
  double stages[5] = {0, 0, 0, 0, 0};
  llvm::ArrayRef<const char *> link(
      linkArgs, static_cast<size_t>(std::max(0, numLinkArgs)));
  // A crash of a pass (a compiler bug) becomes an error of this compilation
  // instead of taking the host process down.
  llvm::CrashRecoveryContext::Enable();
  llvm::CrashRecoveryContext crashRecovery;
  if (!crashRecovery.RunSafely([&] {
        rc = compile(llvm::StringRef(mlir, static_cast<size_t>(len)), pipeline,
                     targetCpu && *targetCpu ? targetCpu : "native", optLevel,
                     link, sharedObjectPath, stages, error);
      })) {
    error = "the compiler crashed (a compiler bug; reproduce with moe-opt "
            "--pass-pipeline='builtin.module(" +
            std::string(pipeline) + ")')";
    rc = 1;
  }
  if (rc)
    mlir::moe::writeErrorBuffer(err, errCap, "moeCompileKernel: " + error);
  if (seconds)
    std::copy(stages, stages + 5, seconds);
  return rc;
}
