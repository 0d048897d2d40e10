//===- Compile.cpp - MLIR text to a host object, in process ---------------===//
//
// Part of the MoE-MLIR project.
//
// moeJitCompile (include/MoE/Runtime/KernelJIT.h): the steps the kernel cache
// ran as three processes (moe-opt, mlir-translate, clang -O3 or llc), in one
// call: parse, the moe pass pipeline, translation to LLVM IR, LLVM's default
// per-module pipeline at the requested level (the parallel kernels hold
// coroutines that only the middle end lowers) and code generation for the
// host into an object file.
//
// A loaded object runs no static constructors of its own (the JIT links it
// without a platform runtime), so they are gathered here into one exported
// function, `__moe_init`, in priority order, which the loader calls; the
// CUDA host code's constructor is the one that loads its embedded binary.
//
//===----------------------------------------------------------------------===//

#include "ErrorBuffer.h"
#include "MoE/Runtime/KernelJIT.h"

#include "MoE/Conversion/MoEToGPU/MoEToGPU.h"
#include "MoE/Conversion/Passes.h"
#include "MoE/IR/MoEDialect.h"
#include "MoE/Pipelines/Pipelines.h"
#include "MoE/Support/NestingDepth.h"
#include "MoE/Transforms/Passes.h"

#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/InitAllPasses.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"
#include "mlir/Target/LLVMIR/Export.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/CrashRecoveryContext.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/Transforms/Utils/ModuleUtils.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>

using namespace mlir;

namespace {

/// Every diagnostic of a compilation, in order, for the caller's message.
struct DiagnosticCollector {
  explicit DiagnosticCollector(MLIRContext &context)
      : handler(&context, [this](Diagnostic &diag) {
          llvm::raw_string_ostream os(messages);
          os << "\n" << diag.getLocation() << ": " << diag;
          for (Diagnostic &note : diag.getNotes())
            os << "\n  note: " << note.getLocation() << ": " << note;
          return success();
        }) {}
  std::string messages;
  ScopedDiagnosticHandler handler;
};

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

/// Replaces the module's `global` (llvm.global_ctors or llvm.global_dtors)
/// with an exported function `name` that calls its entries in priority order
/// (always defined, so the loader can call it unconditionally).
void gatherStructors(llvm::Module &module, llvm::StringRef global,
                     llvm::StringRef name) {
  llvm::LLVMContext &ctx = module.getContext();
  auto *fnType = llvm::FunctionType::get(llvm::Type::getVoidTy(ctx), false);
  llvm::Function *gathered = llvm::Function::Create(
      fnType, llvm::GlobalValue::ExternalLinkage, name, module);
  llvm::IRBuilder<> b(llvm::BasicBlock::Create(ctx, "entry", gathered));
  if (llvm::GlobalVariable *list = module.getGlobalVariable(global)) {
    std::vector<std::pair<uint64_t, llvm::Function *>> entries;
    if (auto *init = llvm::dyn_cast_or_null<llvm::ConstantArray>(
            list->hasInitializer() ? list->getInitializer() : nullptr)) {
      for (llvm::Value *op : init->operands()) {
        auto *entry = llvm::cast<llvm::ConstantStruct>(op);
        auto *priority = llvm::cast<llvm::ConstantInt>(entry->getOperand(0));
        if (auto *fn = llvm::dyn_cast<llvm::Function>(
                entry->getOperand(1)->stripPointerCasts()))
          entries.emplace_back(priority->getZExtValue(), fn);
      }
    }
    std::stable_sort(entries.begin(), entries.end(),
                     [](auto &a, auto &b) { return a.first < b.first; });
    for (auto &[priority, fn] : entries)
      b.CreateCall(fn->getFunctionType(), fn);
    list->eraseFromParent();
  }
  b.CreateRetVoid();
}

/// The host target machine for `cpu` ("native" or an LLVM CPU name) at
/// `optLevel`, position-independent (the JIT places the object anywhere).
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
  llvm::CodeGenOptLevel level = optLevel <= 0   ? llvm::CodeGenOptLevel::None
                                : optLevel == 1 ? llvm::CodeGenOptLevel::Less
                                : optLevel == 2
                                    ? llvm::CodeGenOptLevel::Default
                                    : llvm::CodeGenOptLevel::Aggressive;
  llvm::TargetOptions options;
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

int32_t compile(llvm::StringRef text, llvm::StringRef pipeline,
                llvm::StringRef cpu, int optLevel, llvm::StringRef path,
                double stages[4], std::string &error) {
  Clock::time_point start = Clock::now();
  MLIRContext context(registry(), MLIRContext::Threading::DISABLED);
  DiagnosticCollector diagnostics(context);
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
  gatherStructors(*llvmModule, "llvm.global_ctors", "__moe_init");
  gatherStructors(*llvmModule, "llvm.global_dtors", "__moe_fini");
  if (llvm::verifyModule(*llvmModule, &llvm::errs())) {
    error = "the translated module is not valid LLVM IR";
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
  std::error_code ec;
  llvm::raw_fd_ostream out(path, ec, llvm::sys::fs::OF_None);
  if (ec) {
    error = "cannot write " + path.str() + ": " + ec.message();
    return 1;
  }
  out.write(object.data(), object.size());
  out.close();
  if (out.has_error()) {
    error = "cannot write " + path.str() + ": " + out.error().message();
    out.clear_error();
    return 1;
  }
  stages[3] = lap(start);
  return 0;
}

} // namespace

extern "C" int32_t moeJitCompile(const char *mlir, int64_t len,
                                 const char *pipeline, const char *targetCpu,
                                 int32_t optLevel, const char *objectPath,
                                 double *seconds, char *err, int64_t errCap) {
  if (!mlir || len < 0 || !pipeline || !objectPath) {
    mlir::moe::writeErrorBuffer(err, errCap,
                                "moeJitCompile: null text, pipeline or path");
    return 1;
  }
  // One compilation at a time: the pass registry and the crash recovery
  // are process-wide.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  (void)registry();
  std::string error;
  int32_t rc = 1;
  double stages[4] = {0, 0, 0, 0};
  // A crash of a pass (a compiler bug) becomes an error of this compilation
  // instead of taking the host process down.
  llvm::CrashRecoveryContext::Enable();
  llvm::CrashRecoveryContext crashRecovery;
  if (!crashRecovery.RunSafely([&] {
        rc = compile(llvm::StringRef(mlir, static_cast<size_t>(len)), pipeline,
                     targetCpu && *targetCpu ? targetCpu : "native", optLevel,
                     objectPath, stages, error);
      })) {
    error = "the compiler crashed (a compiler bug; reproduce with moe-opt "
            "--pass-pipeline='builtin.module(" +
            std::string(pipeline) + ")')";
    rc = 1;
  }
  if (rc)
    mlir::moe::writeErrorBuffer(err, errCap, "moeJitCompile: " + error);
  if (seconds)
    std::copy(stages, stages + 4, seconds);
  return rc;
}
