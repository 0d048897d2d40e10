//===- Executor.cpp - Compile and run moe functions on the CPU ------------===//
//
// Part of the MoE-MLIR project.
//
// The calling convention: buildLowerToLLVMPipeline gives every function a
// `_mlir_ciface_<fn>` wrapper that takes a pointer to its results (one memref
// descriptor, or a struct of them for several results) followed by a pointer
// to the descriptor of every argument. The ExecutionEngine wraps that once
// more into `_mlir__mlir_ciface_<fn>(void **args)`, args[i] pointing at the
// i-th (pointer) argument. A ranked memref descriptor is
// {allocated, aligned, offset, sizes[rank], strides[rank]}: 8-byte words.
//
//===----------------------------------------------------------------------===//

#include "MoE/Runtime/Executor.h"
#include "CompileSupport.h"
#include "MoE/IR/MoEDialect.h"
#include "MoE/Pipelines/Pipelines.h"
#include "MoE/Runtime/ErrorReporting.h"
#include "MoE/Support/NestingDepth.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/InitAllDialects.h"
#include "mlir/InitAllExtensions.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Target/LLVMIR/Dialect/All.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ExecutionEngine/Orc/Mangling.h"
#include "llvm/Support/CrashRecoveryContext.h"
#include "llvm/Support/DynamicLibrary.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"

#include <dlfcn.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>

using namespace mlir;
using namespace mlir::moe;
using compile_support::codeGenLevel;
using compile_support::DiagnosticCollector;
using llvm::Error;
using llvm::Expected;

#ifndef MOE_MLIR_LIBRARY_DIR
#define MOE_MLIR_LIBRARY_DIR "/usr/lib/llvm-22/lib"
#endif

static_assert(kDynamicSize == ShapedType::kDynamic,
              "kDynamicSize must match ShapedType::kDynamic");

//===----------------------------------------------------------------------===//
// DType, HostTensor, Tensor
//===----------------------------------------------------------------------===//

namespace {
/// What the execution API knows of an element type: its MLIR spelling and its
/// size in bytes (i1 is stored as one byte).
struct DTypeInfo {
  DType dtype;
  const char *name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "f32", 4}, {DType::F16, "f16", 2}, {DType::BF16, "bf16", 2},
    {DType::F64, "f64", 8}, {DType::I1, "i1", 1},   {DType::I8, "i8", 1},
    {DType::I32, "i32", 4}, {DType::I64, "i64", 8}};
static_assert(std::size(kDTypes) == size_t(DType::I64) + 1,
              "one row per DType");

const DTypeInfo &info(DType dtype) {
  for (const DTypeInfo &row : kDTypes)
    if (row.dtype == dtype)
      return row;
  llvm_unreachable("unknown dtype");
}
} // namespace

size_t mlir::moe::dtypeSize(DType dtype) { return info(dtype).size; }

llvm::StringRef mlir::moe::dtypeName(DType dtype) { return info(dtype).name; }

static int64_t product(llvm::ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape)
    n *= s;
  return n;
}

static std::string shapeStr(llvm::ArrayRef<int64_t> shape) {
  std::string s = "[";
  llvm::raw_string_ostream os(s);
  llvm::interleave(
      shape, os,
      [&](int64_t d) {
        if (d == kDynamicSize)
          os << "?";
        else
          os << d;
      },
      ", ");
  os << "]";
  return s;
}

int64_t HostTensor::numElements() const { return product(shape); }

std::string HostTensor::str() const {
  return (dtypeName(dtype) + shapeStr(shape)).str();
}

Tensor::Tensor(DType dtype, llvm::ArrayRef<int64_t> shape)
    : dtype_(dtype), shape_(shape.begin(), shape.end()) {
  storage_.assign((sizeInBytes() + 7) / 8, 0);
}

int64_t Tensor::numElements() const { return product(shape_); }

//===----------------------------------------------------------------------===//
// Compilation
//===----------------------------------------------------------------------===//

static std::optional<DType> toDType(Type type) {
  if (type.isF32())
    return DType::F32;
  if (type.isF16())
    return DType::F16;
  if (type.isBF16())
    return DType::BF16;
  if (type.isF64())
    return DType::F64;
  if (type.isSignlessInteger(1))
    return DType::I1;
  if (type.isSignlessInteger(8))
    return DType::I8;
  if (type.isSignlessInteger(32))
    return DType::I32;
  if (type.isSignlessInteger(64) || type.isIndex())
    return DType::I64;
  return std::nullopt;
}

static std::string typeToString(Type type) {
  std::string s;
  llvm::raw_string_ostream os(s);
  type.print(os);
  return s;
}

static TensorSignature toSignature(Type type) {
  TensorSignature sig;
  sig.typeStr = typeToString(type);
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor) {
    sig.unsupported = "only ranked tensors can be passed (got " + sig.typeStr +
                      ")";
    return sig;
  }
  sig.shape.assign(tensor.getShape().begin(), tensor.getShape().end());
  sig.dtype = toDType(tensor.getElementType());
  if (!sig.dtype)
    sig.unsupported = "element type of " + sig.typeStr + " is not supported";
  return sig;
}

namespace {
/// "error", "warning", "note" or "remark", as MLIR prints a diagnostic.
} // namespace

static Error makeError(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

CompiledModule::CompiledModule() = default;
//===----------------------------------------------------------------------===//
// The MLIR async runtime (parallel kernels, see buildLowerToLLVMPipeline)
//===----------------------------------------------------------------------===//

namespace {
using CoroHandle = void *;
using CoroResume = void (*)(void *);

/// The async runtime's entry points, once the library is loaded.
struct AsyncRuntimeApi {
  void (*execute)(CoroHandle, CoroResume) = nullptr;
  int64_t (*numWorkerThreads)() = nullptr;
  /// What the library exports to JIT'd code (its
  /// __mlir_execution_engine_init: every mlirAsyncRuntime* entry point),
  /// bound in each engine by compile().
  llvm::StringMap<void *> symbols;
};

/// Loads libmlir_async_runtime.so into the process for good (once); null
/// when it cannot be loaded. With local visibility: in the global scope its
/// mlirAsyncRuntime* would take the calls of every kernel loaded later
/// without RTLD_DEEPBIND, such as the torch ops' (python/moe_mlir/runtime/
/// cache.py), whose tasks must go to libmoe_kernel_runtime.so's pool, the one
/// the torch extension lends its threads to (MoE/Runtime/KernelThreads.h).
const AsyncRuntimeApi *asyncRuntime() {
  static const AsyncRuntimeApi *api = []() -> const AsyncRuntimeApi * {
    std::string path =
        std::string(MOE_MLIR_LIBRARY_DIR) + "/libmlir_async_runtime.so";
    void *lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      return nullptr;
    using InitFn = void (*)(llvm::StringMap<void *> &);
    auto init =
        reinterpret_cast<InitFn>(dlsym(lib, "__mlir_execution_engine_init"));
    static AsyncRuntimeApi loaded;
    loaded.execute = reinterpret_cast<void (*)(CoroHandle, CoroResume)>(
        dlsym(lib, "mlirAsyncRuntimeExecute"));
    loaded.numWorkerThreads = reinterpret_cast<int64_t (*)()>(
        dlsym(lib, "mlirAsyncRuntimGetNumWorkerThreads"));
    if (!init || !loaded.execute || !loaded.numWorkerThreads)
      return nullptr;
    init(loaded.symbols);
    return &loaded;
  }();
  return api;
}

/// A barrier that the pool threads and the caller pass; heap-allocated and
/// freed by the last one out.
struct PoolBarrier {
  std::mutex mutex;
  std::condition_variable cv;
  int64_t expected = 0, arrived = 0, left = 0;
  std::atomic<int64_t> refs{0};
  void release() {
    if (refs.fetch_sub(1) == 1)
      delete this;
  }
};

void poolBarrierTask(void *arg) {
  auto *barrier = static_cast<PoolBarrier *>(arg);
  {
    std::unique_lock<std::mutex> lock(barrier->mutex);
    ++barrier->arrived;
    barrier->cv.notify_all();
    barrier->cv.wait(lock,
                     [&] { return barrier->arrived >= barrier->expected; });
    ++barrier->left;
    barrier->cv.notify_all();
  }
  barrier->release();
}

/// Returns once every thread of the async runtime's pool has finished the
/// task it was running. A worker of the parallel kernels signals its
/// completion (and so lets the caller return) a few instructions before it
/// leaves the JIT'd code; the JIT'd code must outlive that. One barrier task
/// per pool thread: each thread must take one, so each has left its previous
/// task.
void drainAsyncRuntime(const AsyncRuntimeApi &api) {
  int64_t threads = api.numWorkerThreads();
  if (threads <= 0)
    return;
  auto *barrier = new PoolBarrier();
  barrier->expected = threads;
  barrier->refs = threads + 1;
  for (int64_t i = 0; i < threads; ++i)
    api.execute(barrier, &poolBarrierTask);
  {
    std::unique_lock<std::mutex> lock(barrier->mutex);
    barrier->cv.wait(lock, [&] { return barrier->left >= threads; });
  }
  barrier->release();
}
} // namespace

/// Loads the CBLAS library of moe-linalg-to-blas (Debian's OpenBLAS) into the
/// process for good (once) and gives it `threads` threads; false when it
/// cannot be loaded (the pipeline then runs without blas). The pipeline
/// calls BLAS once per thread tile, from the async runtime's workers, so
/// OpenBLAS itself runs single-threaded (its spinning pool would compete
/// with those workers).
static bool loadBlas(int64_t threads) {
  static void (*setThreads)(int) = []() -> void (*)(int) {
    if (llvm::sys::DynamicLibrary::LoadLibraryPermanently("libopenblas.so.0"))
      return nullptr;
    if (!llvm::sys::DynamicLibrary::SearchForAddressOfSymbol("cblas_sgemm"))
      return nullptr;
    return reinterpret_cast<void (*)(int)>(
        llvm::sys::DynamicLibrary::SearchForAddressOfSymbol(
            "openblas_set_num_threads"));
  }();
  if (!setThreads)
    return false;
  setThreads(static_cast<int>(threads));
  return true;
}

/// memrefCopy of libmoe_kernel_runtime.so, the library beside the one that
/// holds moeReportIndexError (libmoe_cpu_runtime.so); null when absent.
static void *kernelRuntimeMemrefCopy() {
  static void *fn = []() -> void * {
    Dl_info info;
    if (!dladdr(reinterpret_cast<void *>(&moeReportIndexError), &info) ||
        !info.dli_fname)
      return nullptr;
    llvm::SmallString<256> path(info.dli_fname);
    llvm::sys::path::remove_filename(path);
    llvm::sys::path::append(path, "libmoe_kernel_runtime.so");
    void *lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    return lib ? dlsym(lib, "memrefCopy") : nullptr;
  }();
  return fn;
}

/// $name as a boolean: unset -> fallback; "0", "off", "false" -> false.
static bool envFlag(const char *name, bool fallback) {
  const char *value = std::getenv(name);
  if (!value || !*value)
    return fallback;
  llvm::StringRef v(value);
  return !(v == "0" || v.equals_insensitive("off") ||
           v.equals_insensitive("false"));
}

/// Set once some module was compiled for the async runtime.
static std::atomic<bool> asyncRuntimeUsed{false};

CompiledModule::~CompiledModule() {
  // Parallel code may have run on the async runtime's pool: let its threads
  // leave the code before the engine frees it.
  if (asyncRuntimeUsed.load())
    if (const AsyncRuntimeApi *api = asyncRuntime())
      drainAsyncRuntime(*api);
}

const FunctionSignature *CompiledModule::signature(llvm::StringRef fn) const {
  for (const FunctionSignature &sig : functions_)
    if (sig.name == fn)
      return &sig;
  return nullptr;
}

Expected<std::unique_ptr<CompiledModule>>
Executor::compile(llvm::StringRef mlirText, const CompileOptions &options) {
  static std::once_flag targetInit;
  std::call_once(targetInit, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  // The executor returns the compiled code's errors to its caller: no need to
  // also print them.
  moeSetErrorEcho(0);

  DialectRegistry registry;
  registry.insert<MoEDialect>();
  registerAllDialects(registry);
  registerAllExtensions(registry);
  registerAllToLLVMIRTranslations(registry);
  MLIRContext context(registry, MLIRContext::Threading::DISABLED);
  DiagnosticCollector diagnostics(context);

  // The parser would overflow its stack on deeper nesting (NestingDepth.h).
  if (std::optional<size_t> at = findExcessiveNesting(mlirText))
    return makeError("moe::Executor: cannot parse the module: brackets nested "
                     "deeper than " +
                     std::to_string(kMaxNestingDepth) + " levels at offset " +
                     std::to_string(*at));
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(mlirText, &context, "input");
  if (!module)
    return makeError("moe::Executor: cannot parse the module:" +
                     diagnostics.messages);

  auto compiled = std::unique_ptr<CompiledModule>(new CompiledModule());
  // Read the signatures before lowering, and keep the inputs read-only.
  for (auto func : module->getOps<func::FuncOp>()) {
    if (func.isExternal() || !func.isPublic())
      continue;
    FunctionSignature sig;
    sig.name = func.getSymName().str();
    for (Type t : func.getFunctionType().getInputs())
      sig.inputs.push_back(toSignature(t));
    for (Type t : func.getFunctionType().getResults())
      sig.results.push_back(toSignature(t));
    for (unsigned i = 0, e = func.getNumArguments(); i < e; ++i)
      if (isa<TensorType>(func.getArgument(i).getType()))
        func.setArgAttr(i, bufferization::BufferizationDialect::kWritableAttrName,
                        BoolAttr::get(&context, false));
    compiled->functions_.push_back(std::move(sig));
  }
  // Results with static shapes are computed in the caller's buffers
  // (results-to-out-params: no copy after the call, no allocation of a result
  // the compiled code would fill and free); a dynamic result shape is only
  // known after the call, so such modules return their results.
  compiled->outParams_ = llvm::all_of(
      compiled->functions_, [](const FunctionSignature &sig) {
        return llvm::all_of(sig.results, [](const TensorSignature &r) {
          return r.unsupported.empty() && r.dtype &&
                 llvm::none_of(r.shape, [](int64_t s) {
                   return s == kDynamicSize;
                 });
        });
      });

  PassManager pm(&context, ModuleOp::getOperationName());
  // The kernels' token loops run on defaultNumThreads() workers
  // ($MOE_NUM_THREADS, else $OMP_NUM_THREADS, else one per core), through
  // the MLIR async runtime loaded below when that is more than one.
  //
  // The runtime is loaded once, permanently, into the process (with local
  // visibility, asyncRuntime()), and its symbols are bound in each engine
  // (registerSymbols below); the module's destructor drains its pool
  // (drainAsyncRuntime). Passing it through
  // ExecutionEngineOptions::sharedLibPaths instead would make every
  // engine's destructor call the library's __mlir_execution_engine_destroy,
  // which deletes the process-wide default runtime: the next module (or any
  // other live one) would then crash.
  LowerToLLVMOptions pipelineOptions;
  pipelineOptions.numThreads = defaultNumThreads();
  if (pipelineOptions.numThreads > 1 && !asyncRuntime())
    pipelineOptions.numThreads = 1;
  if (pipelineOptions.numThreads > 1)
    asyncRuntimeUsed.store(true);
  // The dense strategy ($MOE_DENSE=0: plain loops) and BLAS for large
  // matmuls ($MOE_BLAS=0: generated code), see docs/Pipelines.md.
  pipelineOptions.dense = envFlag("MOE_DENSE", true);
  // $MOE_CPU_KERNELS=0: the portable lowering only (benchmarks of the
  // strategies, e.g. adjacency_update's counting against its one-hot
  // product).
  pipelineOptions.cpuKernels = envFlag("MOE_CPU_KERNELS", true);
  // The target ($MOE_TARGET_CPU): the kernels' vector width and the
  // functions' target-cpu/target-features, which the JIT compiles for.
  std::string targetCpu = options.targetCpu;
  if (targetCpu.empty())
    if (const char *env = std::getenv("MOE_TARGET_CPU"))
      targetCpu = env;
  if (targetCpu.empty())
    targetCpu = "native";
  CpuTarget target;
  std::string targetError;
  if (!resolveCpuTarget(targetCpu, target, targetError))
    return makeError("moe::Executor: " + targetError);
  std::vector<std::string> missing = missingHostFeatures(target);
  if (!missing.empty())
    return makeError("moe::Executor: target-cpu '" + targetCpu +
                     "' needs " + llvm::join(missing, ", ") +
                     ", which this CPU lacks");
  pipelineOptions.targetCpu = targetCpu;
  pipelineOptions.resultsToOutParams = compiled->outParams_;
  pipelineOptions.blas = envFlag("MOE_BLAS", true) &&
                         loadBlas(1);
  buildLowerToLLVMPipeline(pm, pipelineOptions);
  // Verified once after the pipeline instead of after each pass (as the
  // kernel compiler, lib/Runtime/Compiler/Compile.cpp): the verifier after
  // every pass was a quarter of the lowering's time, and changes no IR;
  // moe-opt, which lit runs on every pipeline, verifies after each pass.
  pm.enableVerifier(false);
  // A crash of a pass (a compiler bug) becomes an error of this compilation
  // instead of taking the host process down.
  llvm::CrashRecoveryContext::Enable();
  llvm::CrashRecoveryContext crashRecovery;
  LogicalResult lowered = failure();
  if (!crashRecovery.RunSafely([&] { lowered = pm.run(*module); }))
    return makeError("moe::Executor: the lowering pipeline crashed (a "
                     "compiler bug; reproduce with `moe-opt "
                     "--moe-lower-to-llvm`)" +
                     diagnostics.messages);
  if (failed(lowered))
    return makeError("moe::Executor: lowering to LLVM failed:" +
                     diagnostics.messages);
  if (failed(verify(*module)))
    return makeError("moe::Executor: lowering to LLVM left invalid IR (a "
                     "compiler bug; reproduce with `moe-opt "
                     "--moe-lower-to-llvm`, which verifies after each pass)" +
                     diagnostics.messages);
  if (options.dumpLoweredIR)
    module->print(llvm::errs());

  ExecutionEngineOptions engineOptions;
  auto transformer = makeOptimizingTransformer(std::min(options.optLevel, 3u),
                                               /*sizeLevel=*/0,
                                               /*targetMachine=*/nullptr);
  engineOptions.transformer = transformer;
  engineOptions.jitCodeGenOptLevel = codeGenLevel(options.optLevel);
  // memrefCopy and friends, for code that copies non-contiguous memrefs.
  static const std::string cRunnerUtils =
      std::string(MOE_MLIR_LIBRARY_DIR) + "/libmlir_c_runner_utils.so";
  llvm::SmallVector<llvm::StringRef, 1> libs;
  if (llvm::sys::fs::exists(cRunnerUtils))
    libs.push_back(cRunnerUtils);
  engineOptions.sharedLibPaths = libs;
  engineOptions.enableGDBNotificationListener = false;
  engineOptions.enablePerfNotificationListener = false;

  auto engine = ExecutionEngine::create(*module, engineOptions);
  if (!engine)
    return makeError("moe::Executor: JIT compilation failed: " +
                     llvm::toString(engine.takeError()) + diagnostics.messages);
  compiled->engine_ = std::move(*engine);

  // The run-time error ABI of compiled moe code: bind it to this process's
  // copy even when moe_cpu_runtime was loaded with local visibility. The
  // pipeline requests C wrappers for every func.func, declarations included,
  // so the lowered code calls `_mlir_ciface_moeReportIndexError`; with scalar
  // arguments only, that wrapper has the signature of the function itself.
  // Without upstream's runner utilities (an install that ships no LLVM:
  // the wheel), memrefCopy comes from the kernel runtime beside
  // libmoe_cpu_runtime.so, which implements the same ABI.
  // The async runtime, loaded with local visibility (asyncRuntime()), is
  // bound here for code with parallel loops.
  void *ownMemrefCopy = libs.empty() ? kernelRuntimeMemrefCopy() : nullptr;
  const AsyncRuntimeApi *async =
      pipelineOptions.numThreads > 1 ? asyncRuntime() : nullptr;
  compiled->engine_->registerSymbols(
      [ownMemrefCopy, async](llvm::orc::MangleAndInterner interner) {
        llvm::orc::SymbolMap map;
        if (async)
          for (const auto &entry : async->symbols)
            map[interner(entry.getKey())] = llvm::orc::ExecutorSymbolDef(
                llvm::orc::ExecutorAddr::fromPtr(entry.getValue()),
                llvm::JITSymbolFlags::Exported);
        auto report = llvm::orc::ExecutorSymbolDef(
            llvm::orc::ExecutorAddr::fromPtr(&moeReportIndexError),
            llvm::JITSymbolFlags::Exported);
        map[interner("moeReportIndexError")] = report;
        map[interner("_mlir_ciface_moeReportIndexError")] = report;
        if (ownMemrefCopy)
          map[interner("memrefCopy")] = llvm::orc::ExecutorSymbolDef(
              llvm::orc::ExecutorAddr::fromPtr(ownMemrefCopy),
              llvm::JITSymbolFlags::Exported);
        return map;
      });
  compiled->engine_->initialize();

  for (const FunctionSignature &sig : compiled->functions_) {
    auto entry = compiled->engine_->lookupPacked("_mlir_ciface_" + sig.name);
    if (!entry)
      return makeError("moe::Executor: no C interface for @" + sig.name +
                       ": " + llvm::toString(entry.takeError()));
    compiled->entries_.push_back(*entry);
  }
  return compiled;
}

//===----------------------------------------------------------------------===//
// Calls
//===----------------------------------------------------------------------===//

static std::string argName(bool isInput, unsigned i) {
  return llvm::formatv("{0} #{1}", isInput ? "input" : "output", i).str();
}

/// Checks `t` against `sig` (static sizes only when `checkDynamic` is false).
static Error checkTensor(llvm::StringRef fn, bool isInput, unsigned i,
                         const TensorSignature &sig, const HostTensor &t) {
  std::string where =
      ("@" + fn + ": " + argName(isInput, i) + " (" + sig.typeStr + ")").str();
  if (!sig.unsupported.empty())
    return makeError(where + ": " + sig.unsupported);
  if (t.dtype != *sig.dtype)
    return makeError(where + " has dtype " + dtypeName(t.dtype) +
                     ", expected " + dtypeName(*sig.dtype));
  if (t.rank() != static_cast<int64_t>(sig.shape.size()))
    return makeError(llvm::formatv("{0} has rank {1} (shape {2}), expected "
                                   "rank {3}",
                                   where, t.rank(), shapeStr(t.shape),
                                   sig.shape.size())
                         .str());
  for (auto [d, pair] : llvm::enumerate(llvm::zip(t.shape, sig.shape))) {
    auto [have, want] = pair;
    if (have < 0)
      return makeError(llvm::formatv("{0}: size {1} of dimension {2} is "
                                     "negative",
                                     where, have, d)
                           .str());
    if (want != kDynamicSize && have != want)
      return makeError(llvm::formatv("{0} has shape {1}: dimension {2} is {3}, "
                                     "expected {4}",
                                     where, shapeStr(t.shape), d, have, want)
                           .str());
  }
  // The kernels index with i32 (moe::checkKernelLimits rejects static shapes
  // past this at compile time; a dynamic size is only known here).
  constexpr int64_t kMaxElements = 2147483647;
  int64_t elements = 1;
  for (int64_t size : t.shape)
    if (llvm::MulOverflow(elements, size, elements) ||
        elements > kMaxElements)
      return makeError(llvm::formatv("{0} has shape {1}: more elements than "
                                     "the kernels support, at most {2} per "
                                     "tensor (2^31 - 1: they index with i32)",
                                     where, shapeStr(t.shape), kMaxElements)
                           .str());
  if (t.data == nullptr && t.numElements() > 0)
    return makeError(where + ": data pointer is null");
  return Error::success();
}

namespace {
/// A view of one ranked memref descriptor in a buffer of 8-byte words.
struct Descriptor {
  int64_t *words;
  int64_t rank;
  void *allocated() const { return reinterpret_cast<void *>(words[0]); }
  void *aligned() const { return reinterpret_cast<void *>(words[1]); }
  int64_t offset() const { return words[2]; }
  int64_t size(int64_t d) const { return words[3 + d]; }
  int64_t stride(int64_t d) const { return words[3 + rank + d]; }
  llvm::SmallVector<int64_t, 4> sizes() const {
    return llvm::SmallVector<int64_t, 4>(words + 3, words + 3 + rank);
  }
};

/// Copies the strided memref `src` into the dense row-major `dst`.
void copyOut(const Descriptor &src, size_t elemSize, void *dst) {
  int64_t n = product(src.sizes());
  if (n == 0)
    return;
  const char *base =
      static_cast<const char *>(src.aligned()) + src.offset() * elemSize;
  char *out = static_cast<char *>(dst);
  bool dense = true;
  for (int64_t d = src.rank - 1, expect = 1; d >= 0; --d) {
    if (src.size(d) != 1 && src.stride(d) != expect)
      dense = false;
    expect *= src.size(d);
  }
  if (dense) {
    std::memcpy(out, base, n * elemSize);
    return;
  }
  llvm::SmallVector<int64_t, 4> index(src.rank, 0);
  for (int64_t linear = 0; linear < n; ++linear) {
    int64_t off = 0;
    for (int64_t d = 0; d < src.rank; ++d)
      off += index[d] * src.stride(d);
    std::memcpy(out + linear * elemSize, base + off * elemSize, elemSize);
    for (int64_t d = src.rank - 1; d >= 0; --d) {
      if (++index[d] < src.size(d))
        break;
      index[d] = 0;
    }
  }
}
} // namespace

Error CompiledModule::invoke(const FunctionSignature &sig,
                             llvm::ArrayRef<HostTensor> inputs,
                             llvm::ArrayRef<HostTensor> *outputs,
                             std::vector<Tensor> *owned) const {
  const std::string &fn = sig.name;
  if (inputs.size() != sig.inputs.size())
    return makeError(llvm::formatv("@{0} takes {1} input(s), got {2}", fn,
                                   sig.inputs.size(), inputs.size())
                         .str());
  if (outputs && outputs->size() != sig.results.size())
    return makeError(llvm::formatv("@{0} returns {1} result(s), got {2} "
                                   "output(s)",
                                   fn, sig.results.size(), outputs->size())
                         .str());
  for (auto [i, t] : llvm::enumerate(inputs))
    if (Error err = checkTensor(fn, /*isInput=*/true, i, sig.inputs[i], t))
      return err;
  for (auto [i, r] : llvm::enumerate(sig.results)) {
    if (!r.unsupported.empty())
      return makeError(llvm::formatv("@{0}: result #{1}: {2}", fn, i,
                                     r.unsupported)
                           .str());
    if (outputs)
      if (Error err = checkTensor(fn, /*isInput=*/false, i, r, (*outputs)[i]))
        return err;
  }

  // Argument descriptors: dense row-major views of the caller's buffers
  // (the inputs, then the outputs when they are out-params).
  std::vector<std::vector<int64_t>> argWords;
  llvm::SmallVector<void *> argPtrs;
  argWords.reserve(inputs.size() + sig.results.size());
  auto addArgument = [&](void *data, llvm::ArrayRef<int64_t> shape) {
    int64_t rank = shape.size();
    std::vector<int64_t> &w = argWords.emplace_back(3 + 2 * rank, 0);
    w[0] = w[1] = reinterpret_cast<int64_t>(data);
    w[2] = 0;
    int64_t stride = 1;
    for (int64_t d = rank - 1; d >= 0; --d) {
      w[3 + d] = shape[d];
      w[3 + rank + d] = stride;
      stride *= shape[d];
    }
    argPtrs.push_back(w.data());
  };
  for (const HostTensor &t : inputs)
    addArgument(t.data, t.shape);
  if (outParams_) {
    if (owned) {
      owned->clear();
      for (const TensorSignature &r : sig.results)
        owned->emplace_back(*r.dtype, r.shape);
    }
    for (auto [i, r] : llvm::enumerate(sig.results)) {
      if (owned)
        addArgument((*owned)[i].data(), r.shape);
      else
        addArgument((*outputs)[i].data, (*outputs)[i].shape);
    }
  }
  // Returned results: their descriptors, back to back (all fields are 8-byte
  // words).
  llvm::SmallVector<int64_t> resultOffsets;
  int64_t resultWordCount = 0;
  if (!outParams_)
    for (const TensorSignature &r : sig.results) {
      resultOffsets.push_back(resultWordCount);
      resultWordCount += 3 + 2 * static_cast<int64_t>(r.shape.size());
    }
  std::vector<int64_t> resultWords(resultWordCount, 0);
  void *resultPtr = resultWords.data();

  llvm::SmallVector<void *> packed;
  if (!sig.results.empty() && !outParams_)
    packed.push_back(&resultPtr);
  for (void *&p : argPtrs)
    packed.push_back(&p);

  // Drop an error left over by an earlier call on this thread.
  char message[512];
  (void)moeTakeError(message, sizeof(message));

  void (*entry)(void **) = entries_[&sig - functions_.data()];
  entry(packed.data());

  std::string runtimeError;
  if (moeTakeError(message, sizeof(message)))
    runtimeError = message;

  // Returned results: copy them out, then free what the compiled code
  // allocated (never a caller's buffer, never twice). Out-params are written
  // already.
  Error result = Error::success();
  if (!outParams_) {
    llvm::DenseSet<void *> inputBuffers, freed;
    for (const HostTensor &t : inputs)
      inputBuffers.insert(t.data);
    if (owned)
      owned->clear();
    for (auto [i, r] : llvm::enumerate(sig.results)) {
      Descriptor desc{resultWords.data() + resultOffsets[i],
                      static_cast<int64_t>(r.shape.size())};
      if (runtimeError.empty() && !result) {
        size_t elemSize = dtypeSize(*r.dtype);
        llvm::SmallVector<int64_t, 4> sizes = desc.sizes();
        if (owned) {
          owned->emplace_back(*r.dtype, sizes);
          copyOut(desc, elemSize, owned->back().data());
        } else {
          const HostTensor &out = (*outputs)[i];
          if (llvm::ArrayRef<int64_t>(sizes) !=
              llvm::ArrayRef<int64_t>(out.shape))
            result = makeError(llvm::formatv("@{0}: result #{1} has shape "
                                             "{2}, but output #{1} has shape "
                                             "{3}",
                                             fn, i, shapeStr(sizes),
                                             shapeStr(out.shape))
                                   .str());
          else
            copyOut(desc, elemSize, out.data);
        }
      }
      void *allocated = desc.allocated();
      if (allocated && !inputBuffers.contains(allocated) &&
          freed.insert(allocated).second)
        std::free(allocated);
    }
  }
  if (!runtimeError.empty()) {
    if (owned)
      owned->clear();
    llvm::consumeError(std::move(result));
    return makeError("@" + fn + ": run-time error: " + runtimeError);
  }
  return result;
}

Error CompiledModule::call(llvm::StringRef fn,
                           llvm::ArrayRef<HostTensor> inputs,
                           llvm::ArrayRef<HostTensor> outputs) const {
  const FunctionSignature *sig = signature(fn);
  if (!sig)
    return makeError("no callable function @" + fn +
                     " in the module (a public func.func with a body)");
  return invoke(*sig, inputs, &outputs, nullptr);
}

Expected<std::vector<Tensor>>
CompiledModule::call(llvm::StringRef fn,
                     llvm::ArrayRef<HostTensor> inputs) const {
  const FunctionSignature *sig = signature(fn);
  if (!sig)
    return makeError("no callable function @" + fn +
                     " in the module (a public func.func with a body)");
  std::vector<Tensor> results;
  if (Error err = invoke(*sig, inputs, nullptr, &results))
    return std::move(err);
  return results;
}
