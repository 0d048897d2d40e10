//===- MoECudaRuntime.cpp - The CUDA runtime of compiled moe code ---------===//
//
// Part of the MoE-MLIR project.
//
// The mgpu ABI over the CUDA driver API (see MoECudaRuntime.h). Written for
// this project: one primary context per device, pushed for the duration of
// every call; every driver call checked and reported by name.
//
//===----------------------------------------------------------------------===//

#include "MoECudaRuntime.h"

#include "MoE/Runtime/ErrorReporting.h"

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace {

//===----------------------------------------------------------------------===//
// The thread's state
//===----------------------------------------------------------------------===//

/// The functions this thread looked up, per (module, name). The host code
/// MLIR emits asks for its kernel's function at every launch (SelectObjectAttr
/// translates gpu.launch_func into mgpuModuleGetFunction + mgpuLaunchKernel),
/// with the module its constructor loaded and a pointer to the kernel name's
/// constant: a steady-state call needs no cuModuleGetFunction, a driver call
/// that looks the name up in the module under the driver's lock (issue 81
/// item 3). Per thread, so that a hit takes no lock; direct-mapped, a
/// collision only costs a lookup. An entry is valid while no module was
/// unloaded since it was made (moduleGeneration): a later module may get the
/// same handle. The name is keyed by its address: the callers of the mgpu
/// ABI (the generated host code, the tests) pass constants, and comparing the
/// text would cost as much as the rest of a hit together.
struct FunctionCacheEntry {
  const void *module = nullptr;
  const char *name = nullptr;
  uint64_t generation = 0;
  CUfunction function = nullptr;
};
constexpr size_t kFunctionCacheSize = 32;
constexpr unsigned kFunctionCacheBits = 5;
static_assert(kFunctionCacheSize == size_t(1) << kFunctionCacheBits);

/// What the runtime keeps per thread, in one trivially destructible
/// thread_local: in a shared library (libmoe_cuda_runtime.so is dlopen'ed)
/// every thread_local variable a function reads costs a call of
/// __tls_get_addr, which were a third of the runtime's instructions per op
/// call when each of these was a variable of its own (issue 81 item 3).
struct ThreadState {
  /// The caller's stream for its call (moeGpuSetStream).
  CUstream ambientStream = nullptr;
  /// True once a current context was seen during the call that set the
  /// ambient stream (moeGpuSetStream resets it at both ends of the call).
  /// Within that call only this runtime changes contexts, and its pushes are
  /// undone before it returns, so a context found current stays current: the
  /// later driver calls of the call skip cuCtxGetCurrent.
  bool contextSeenThisCall = false;
  /// A device allocation failed (see skipAfterFailedAllocation).
  bool allocationFailed = false;
  /// firstDriverError holds the first error not yet taken.
  bool driverError = false;
  int64_t skippedAfterFailedAllocation = 0;
  FunctionCacheEntry functionCache[kFunctionCacheSize];
};
static_assert(std::is_trivially_destructible_v<ThreadState>,
              "no thread_local wrapper, no exit handler per thread");
thread_local ThreadState threadState;

/// The first driver error of this thread not yet taken (moeGpuTakeDriverError).
thread_local std::string firstDriverError;

void noteDriverError(const std::string &text) {
  ThreadState &thread = threadState;
  if (thread.driverError)
    return;
  firstDriverError = text;
  thread.driverError = true;
}

//===----------------------------------------------------------------------===//
// Error reporting
//===----------------------------------------------------------------------===//

bool abortOnError() {
  static const bool value = [] {
    const char *env = std::getenv("MOE_CUDA_ABORT_ON_ERROR");
    return env && env[0] == '1';
  }();
  return value;
}

/// Checks one driver call; returns true on success.
bool check(CUresult result, const char *call) {
  if (result == CUDA_SUCCESS)
    return true;
  const char *name = "CUDA_ERROR_UNKNOWN";
  const char *text = "unknown error";
  cuGetErrorName(result, &name);
  cuGetErrorString(result, &text);
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), "%s failed: %s: %s", call,
                name ? name : "?", text ? text : "?");
  std::fprintf(stderr, "moe_cuda_runtime: %s\n", buffer);
  noteDriverError(buffer);
  if (abortOnError())
    std::abort();
  return false;
}

#define MOE_CU(call) check((call), #call)

/// True (and counts the skip) when work must not run after a failed
/// allocation. A device allocation of this thread that failed makes
/// mgpuMemAlloc return null, which the compiled host code passes on to its
/// kernels and copies. Until the caller takes the error
/// (moeGpuTakeDriverError), launches, copies and memsets of this thread are
/// skipped instead of running on a null pointer; each skipped one is counted
/// in the message.
bool skipAfterFailedAllocation(const char *what) {
  ThreadState &thread = threadState;
  if (!thread.allocationFailed)
    return false;
  if (thread.skippedAfterFailedAllocation++ == 0)
    std::fprintf(stderr,
                 "moe_cuda_runtime: %s skipped: an earlier device allocation "
                 "failed (further skips are not printed)\n",
                 what);
  return true;
}

//===----------------------------------------------------------------------===//
// Devices and contexts
//===----------------------------------------------------------------------===//

int32_t defaultDevice = 0;
std::mutex contextMutex;
std::vector<CUcontext> primaryContexts;

/// Initializes the driver once; false when there is no usable driver.
bool initDriver() {
  static const bool ok = MOE_CU(cuInit(0));
  return ok;
}

CUcontext primaryContext(int32_t ordinal) {
  if (!initDriver())
    return nullptr;
  std::lock_guard<std::mutex> lock(contextMutex);
  if (primaryContexts.empty()) {
    int count = 0;
    if (!MOE_CU(cuDeviceGetCount(&count)))
      return nullptr;
    primaryContexts.assign(count, nullptr);
  }
  if (ordinal < 0 || ordinal >= static_cast<int32_t>(primaryContexts.size())) {
    std::fprintf(stderr, "moe_cuda_runtime: no CUDA device %d (%zu present)\n",
                 ordinal, primaryContexts.size());
    noteDriverError("no such CUDA device");
    return nullptr;
  }
  if (!primaryContexts[ordinal]) {
    CUdevice device;
    if (!MOE_CU(cuDeviceGet(&device, ordinal)))
      return nullptr;
    CUcontext context = nullptr;
    if (!MOE_CU(cuDevicePrimaryCtxRetain(&context, device)))
      return nullptr;
    primaryContexts[ordinal] = context;
  }
  return primaryContexts[ordinal];
}

/// Makes the primary context of the default device current for one call; a
/// context the caller already made current (e.g. PyTorch's) is kept.
class ScopedContext {
public:
  ScopedContext() {
    ThreadState &thread = threadState;
    if (thread.contextSeenThisCall)
      return;
    CUcontext current = nullptr;
    if (initDriver() && cuCtxGetCurrent(&current) == CUDA_SUCCESS && current) {
      thread.contextSeenThisCall = thread.ambientStream != nullptr;
      return;
    }
    CUcontext context = primaryContext(defaultDevice);
    if (context && MOE_CU(cuCtxPushCurrent(context)))
      pushed = true;
  }
  ~ScopedContext() {
    if (pushed) {
      CUcontext popped;
      MOE_CU(cuCtxPopCurrent(&popped));
    }
  }

private:
  bool pushed = false;
};

//===----------------------------------------------------------------------===//
// The device error word
//===----------------------------------------------------------------------===//

constexpr size_t kErrorWords = 5; // flag, op, position, value, bound

/// The error word of each device, in device memory: kernels record the first
/// out-of-range element with a compare-and-swap on word 0.
std::vector<CUdeviceptr> errorWords;

CUdeviceptr errorWordOfCurrentDevice() {
  CUdevice device;
  if (!MOE_CU(cuCtxGetDevice(&device)))
    return 0;
  std::lock_guard<std::mutex> lock(contextMutex);
  if (errorWords.size() <= static_cast<size_t>(device))
    errorWords.resize(device + 1, 0);
  if (!errorWords[device]) {
    CUdeviceptr words = 0;
    if (!MOE_CU(cuMemAlloc(&words, kErrorWords * sizeof(int64_t))))
      return 0;
    if (!MOE_CU(cuMemsetD32(words, 0, kErrorWords * 2)))
      return 0;
    errorWords[device] = words;
  }
  return errorWords[device];
}

/// Reads the error word without synchronizing the context (a blocking copy
/// on the legacy default stream: it waits for that stream and the blocking
/// streams only) and, when a kernel recorded an error, clears it and reports
/// it through moeReportIndexError. True when there was one.
bool takeErrorWord(CUdeviceptr words) {
  int64_t host[kErrorWords] = {0};
  if (!MOE_CU(cuMemcpyDtoH(host, words, sizeof(host))) || host[0] == 0)
    return false;
  MOE_CU(cuMemsetD32(words, 0, kErrorWords * 2));
  moeReportIndexError(static_cast<int32_t>(host[1]), host[2], host[3], host[4]);
  return true;
}
} // namespace

//===----------------------------------------------------------------------===//
// Modules and launches
//===----------------------------------------------------------------------===//

namespace {
/// JIT-compiles PTX text into a module of the current context (null and the
/// JIT log on stderr on failure).
CUmodule loadPtx(const void *ptx, int optLevel) {
  CUmodule module = nullptr;
  char log[4096] = {0};
  CUjit_option options[] = {CU_JIT_OPTIMIZATION_LEVEL, CU_JIT_ERROR_LOG_BUFFER,
                            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *values[] = {reinterpret_cast<void *>(static_cast<intptr_t>(optLevel)),
                    log, reinterpret_cast<void *>(sizeof(log))};
  if (!MOE_CU(cuModuleLoadDataEx(&module, ptx, 3, options, values)) && log[0])
    std::fprintf(stderr, "moe_cuda_runtime: PTX JIT log:\n%s\n", log);
  return module;
}

/// The key of an embedded binary: FNV-1a 64 of its bytes, as
/// tools/moe-aot/moe-aot.py names its PTX fallback (moe-<key>.ptx).
uint64_t binaryKey(const void *data, size_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto *bytes = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < size; ++i)
    h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

/// The PTX fallback of a binary from the folders of MOE_CUDA_PTX_DIR
/// (colon-separated); empty when there is none. `name` gets the file name.
std::string fallbackPtx(const void *data, size_t size, std::string &name) {
  char file[64];
  std::snprintf(file, sizeof(file), "moe-%016llx.ptx",
                static_cast<unsigned long long>(binaryKey(data, size)));
  name = file;
  const char *dirs = std::getenv("MOE_CUDA_PTX_DIR");
  if (!dirs || !size)
    return {};
  std::string list = dirs;
  for (size_t begin = 0; begin <= list.size();) {
    size_t end = list.find(':', begin);
    if (end == std::string::npos)
      end = list.size();
    std::string path = list.substr(begin, end - begin) + "/" + file;
    if (FILE *f = std::fopen(path.c_str(), "rb")) {
      std::string text;
      char chunk[65536];
      size_t n;
      while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0)
        text.append(chunk, n);
      std::fclose(f);
      name = path;
      return text;
    }
    begin = end + 1;
  }
  return {};
}
} // namespace

namespace {
/// Set by an exit handler registered with the first module load. The compiled
/// libraries unload their modules from global destructors, which run after
/// exit handlers, when PyTorch may have torn its context down and the driver
/// answers CUDA_ERROR_UNKNOWN: at exit the modules are left to the driver.
std::atomic<bool> processExiting{false};

void noteModuleLoaded() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit([] { processExiting = true; }); });
}
} // namespace

extern "C" void *mgpuModuleLoad(void *data, size_t gpuBlobSize) {
  noteModuleLoaded();
  ScopedContext scope;
  static const bool forcePtx = [] {
    const char *env = std::getenv("MOE_CUDA_FORCE_PTX");
    return env && env[0] == '1';
  }();
  CUmodule module = nullptr;
  CUresult result = CUDA_ERROR_NOT_SUPPORTED;
  if (!forcePtx) {
    result = cuModuleLoadData(&module, data);
    if (result == CUDA_SUCCESS)
      return module;
  }
  // The driver rejected the binary (older than the toolkit that built it, a
  // chip it has no code for), or MOE_CUDA_FORCE_PTX=1: JIT the PTX fallback.
  std::string name;
  std::string ptx = fallbackPtx(data, gpuBlobSize, name);
  if (!ptx.empty()) {
    module = loadPtx(ptx.c_str(), /*optLevel=*/4);
    if (module) {
      std::fprintf(stderr, "moe_cuda_runtime: %s; JIT-compiled the PTX %s\n",
                   forcePtx ? "MOE_CUDA_FORCE_PTX=1"
                            : "the driver rejected the binary",
                   name.c_str());
      return module;
    }
    return nullptr; // reported by loadPtx
  }
  if (forcePtx) {
    std::fprintf(stderr,
                 "moe_cuda_runtime: MOE_CUDA_FORCE_PTX=1 but no %s in "
                 "MOE_CUDA_PTX_DIR\n",
                 name.c_str());
    noteDriverError("no PTX fallback " + name);
    return nullptr;
  }
  if (check(result, "cuModuleLoadData"))
    return module;
  std::fprintf(stderr,
               "moe_cuda_runtime: (no PTX fallback: put %s, from moe-aot.py "
               "--ptx-fallback, in a folder named by MOE_CUDA_PTX_DIR)\n",
               name.c_str());
  return nullptr;
}

extern "C" void *mgpuModuleLoadJIT(void *data, int optLevel) {
  noteModuleLoaded();
  ScopedContext scope;
  return loadPtx(data, optLevel);
}

namespace {
std::atomic<uint64_t> moduleGeneration{1};

FunctionCacheEntry &functionCacheEntry(const void *module, const char *name) {
  // Fibonacci hashing: the top bits of the product mix every bit of the
  // names' addresses, which differ in a few low bits only.
  uint64_t key = (reinterpret_cast<uintptr_t>(module) << 1) ^
                 reinterpret_cast<uintptr_t>(name);
  return threadState.functionCache[(key * 0x9E3779B97F4A7C15ull) >>
                                   (64 - kFunctionCacheBits)];
}
} // namespace

extern "C" void mgpuModuleUnload(void *module) {
  if (!module || processExiting)
    return;
  // Before the unload: no thread may hand out this module's functions after.
  moduleGeneration.fetch_add(1, std::memory_order_acq_rel);
  ScopedContext scope;
  MOE_CU(cuModuleUnload(static_cast<CUmodule>(module)));
}

extern "C" void *mgpuModuleGetFunction(void *module, const char *name) {
  if (!module) {
    std::fprintf(stderr,
                 "moe_cuda_runtime: kernel '%s' requested from a module that "
                 "failed to load\n",
                 name);
    return nullptr;
  }
  FunctionCacheEntry &entry = functionCacheEntry(module, name);
  uint64_t generation = moduleGeneration.load(std::memory_order_acquire);
  if (entry.module == module && entry.name == name &&
      entry.generation == generation)
    return entry.function;
  ScopedContext scope;
  CUfunction function = nullptr;
  if (!MOE_CU(
          cuModuleGetFunction(&function, static_cast<CUmodule>(module), name)))
    std::fprintf(stderr, "moe_cuda_runtime: (kernel '%s')\n", name);
  else
    entry = {module, name, generation, function};
  return function;
}

namespace {
/// Kernels with more than 48 KiB of dynamic shared memory must opt in.
void allowSharedMemory(CUfunction function, int32_t smem) {
  if (smem <= 48 * 1024)
    return;
  MOE_CU(cuFuncSetAttribute(
      function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
}
} // namespace

extern "C" void mgpuLaunchKernel(void *function, intptr_t gridX, intptr_t gridY,
                                 intptr_t gridZ, intptr_t blockX,
                                 intptr_t blockY, intptr_t blockZ, int32_t smem,
                                 void *stream, void **params, void **extra,
                                 size_t /*paramsCount*/) {
  if (!function)
    return; // reported when it was looked up
  if (gridX == 0 || gridY == 0 || gridZ == 0)
    return; // an empty problem (e.g. zero tokens): nothing to launch
  if (skipAfterFailedAllocation("kernel launch"))
    return;
  ScopedContext scope;
  auto fn = static_cast<CUfunction>(function);
  allowSharedMemory(fn, smem);
  MOE_CU(cuLaunchKernel(fn, gridX, gridY, gridZ, blockX, blockY, blockZ, smem,
                        static_cast<CUstream>(stream), params, extra));
}

extern "C" void mgpuLaunchClusterKernel(void *function, intptr_t clusterX,
                                        intptr_t clusterY, intptr_t clusterZ,
                                        intptr_t gridX, intptr_t gridY,
                                        intptr_t gridZ, intptr_t blockX,
                                        intptr_t blockY, intptr_t blockZ,
                                        int32_t smem, void *stream,
                                        void **params, void **extra) {
  if (!function || gridX == 0 || gridY == 0 || gridZ == 0)
    return;
  if (skipAfterFailedAllocation("kernel launch"))
    return;
  ScopedContext scope;
  auto fn = static_cast<CUfunction>(function);
  allowSharedMemory(fn, smem);
  if (clusterX * clusterY * clusterZ > 8)
    MOE_CU(cuFuncSetAttribute(
        fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
  CUlaunchAttribute attribute;
  std::memset(&attribute, 0, sizeof(attribute));
  attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attribute.value.clusterDim.x = clusterX;
  attribute.value.clusterDim.y = clusterY;
  attribute.value.clusterDim.z = clusterZ;
  CUlaunchConfig config;
  std::memset(&config, 0, sizeof(config));
  config.gridDimX = gridX;
  config.gridDimY = gridY;
  config.gridDimZ = gridZ;
  config.blockDimX = blockX;
  config.blockDimY = blockY;
  config.blockDimZ = blockZ;
  config.sharedMemBytes = smem;
  config.hStream = static_cast<CUstream>(stream);
  config.attrs = &attribute;
  config.numAttrs = 1;
  MOE_CU(cuLaunchKernelEx(&config, fn, params, extra));
}

//===----------------------------------------------------------------------===//
// Streams and events
//===----------------------------------------------------------------------===//

namespace {
/// `arg` as the driver takes it: a device pointer as CUdeviceptr, an opaque
/// handle as CUstream/CUevent, a number as is.
template <typename Param, typename Arg> Param toDriver(Arg arg) {
  if constexpr (std::is_pointer_v<Arg> && std::is_integral_v<Param>)
    return reinterpret_cast<Param>(arg);
  else
    return static_cast<Param>(arg);
}

/// The driver call `fn` on `args` (the values of the mgpu ABI, toDriver) in
/// the primary context; errors reported under `name`.
template <typename... Params, typename... Args>
void callInContext(const char *name, CUresult (*fn)(Params...), Args... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "one value per param");
  ScopedContext scope;
  check(fn(toDriver<Params>(args)...), name);
}
} // namespace

#define MOE_CU_IN_CONTEXT(fn, ...) callInContext(#fn, fn, __VA_ARGS__)

extern "C" void *mgpuStreamCreate() {
  if (CUstream ambient = threadState.ambientStream)
    return ambient;
  ScopedContext scope;
  CUstream stream = nullptr;
  MOE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  return stream;
}

extern "C" void mgpuStreamDestroy(void *stream) {
  if (!stream || stream == threadState.ambientStream)
    return; // the ambient stream belongs to the caller
  MOE_CU_IN_CONTEXT(cuStreamDestroy, stream);
}

extern "C" void mgpuStreamSynchronize(void *stream) {
  MOE_CU_IN_CONTEXT(cuStreamSynchronize, stream);
}

extern "C" void mgpuStreamWaitEvent(void *stream, void *event) {
  MOE_CU_IN_CONTEXT(cuStreamWaitEvent, stream, event, 0);
}

extern "C" void *mgpuEventCreate() {
  ScopedContext scope;
  CUevent event = nullptr;
  MOE_CU(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  return event;
}

extern "C" void mgpuEventDestroy(void *event) {
  MOE_CU_IN_CONTEXT(cuEventDestroy, event);
}

extern "C" void mgpuEventSynchronize(void *event) {
  MOE_CU_IN_CONTEXT(cuEventSynchronize, event);
}

extern "C" void mgpuEventRecord(void *event, void *stream) {
  MOE_CU_IN_CONTEXT(cuEventRecord, event, stream);
}

//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

namespace {
/// Freed stream-ordered memory the device's default pool keeps for the next
/// allocations ($MOE_CUDA_POOL_KEEP_BYTES, default 256 MiB). The driver's
/// default is 0: every synchronization hands the kernels' temporaries back to
/// the OS and the next call pays a real cuMemAlloc (about 0.1 ms per call on
/// an H200, measured through torch.ops.moe.* with a sync after each call).
uint64_t poolKeepBytes() {
  static const uint64_t bytes = [] {
    const char *env = std::getenv("MOE_CUDA_POOL_KEEP_BYTES");
    return env ? std::strtoull(env, nullptr, 10) : uint64_t(256) << 20;
  }();
  return bytes;
}

/// Sets the release threshold of the current device's default pool once per
/// device. Best effort: a driver without pools keeps its behaviour.
void keepFreedPoolMemory() {
  static std::atomic<uint64_t> done{0};
  CUdevice device;
  if (cuCtxGetDevice(&device) != CUDA_SUCCESS || device < 0 || device >= 64)
    return;
  uint64_t bit = uint64_t(1) << device;
  if (done.fetch_or(bit) & bit)
    return;
  CUmemoryPool pool;
  if (cuDeviceGetDefaultMemPool(&pool, device) != CUDA_SUCCESS)
    return;
  cuuint64_t keep = poolKeepBytes();
  (void)cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
}
} // namespace

extern "C" void *mgpuMemAlloc(uint64_t sizeBytes, void *stream,
                              bool isHostShared) {
  if (sizeBytes == 0)
    return nullptr; // empty tensors: never dereferenced
  ScopedContext scope;
  keepFreedPoolMemory();
  CUdeviceptr ptr = 0;
  if (isHostShared) {
    if (!MOE_CU(cuMemAllocManaged(&ptr, sizeBytes, CU_MEM_ATTACH_GLOBAL)) ||
        !ptr) {
      threadState.allocationFailed = true;
      return nullptr;
    }
    return reinterpret_cast<void *>(ptr);
  }
  // Stream-ordered when the pools are supported (every sm_70+ driver), so an
  // allocation does not synchronize the device.
  CUresult result =
      cuMemAllocAsync(&ptr, sizeBytes, static_cast<CUstream>(stream));
  if (result == CUDA_ERROR_NOT_SUPPORTED)
    result = cuMemAlloc(&ptr, sizeBytes);
  if (!check(result, "cuMemAlloc") || !ptr) {
    // The generated host code has no way to test the pointer: stop every
    // later launch/copy of this thread from using it (see
    // skipAfterFailedAllocation).
    threadState.allocationFailed = true;
    return nullptr;
  }
  return reinterpret_cast<void *>(ptr);
}

extern "C" void mgpuMemFree(void *ptr, void *stream) {
  if (!ptr)
    return;
  ScopedContext scope;
  CUresult result = cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(ptr),
                                   static_cast<CUstream>(stream));
  if (result == CUDA_ERROR_NOT_SUPPORTED)
    result = cuMemFree(reinterpret_cast<CUdeviceptr>(ptr));
  check(result, "cuMemFree");
}

extern "C" void moeGpuFree(void *ptr) {
  if (!ptr)
    return;
  ScopedContext scope;
  MOE_CU(cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)));
}

extern "C" void mgpuMemcpy(void *dst, void *src, size_t sizeBytes,
                           void *stream) {
  if (sizeBytes == 0 || skipAfterFailedAllocation("copy"))
    return;
  ScopedContext scope;
  MOE_CU(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                       reinterpret_cast<CUdeviceptr>(src), sizeBytes,
                       static_cast<CUstream>(stream)));
}

namespace {
/// Sets `count` elements at `dst` to `value` on `stream` with the driver's
/// `fn` (cuMemsetD32Async, cuMemsetD16Async); nothing when empty or after a
/// failed allocation.
template <typename T>
void memsetAsync(const char *name,
                 CUresult (*fn)(CUdeviceptr, T, size_t, CUstream), void *dst,
                 T value, size_t count, void *stream) {
  if (count == 0 || skipAfterFailedAllocation("memset"))
    return;
  callInContext(name, fn, dst, value, count, stream);
}
} // namespace

extern "C" void mgpuMemset32(void *dst, unsigned int value, size_t count,
                             void *stream) {
  memsetAsync("cuMemsetD32Async", cuMemsetD32Async, dst, value, count, stream);
}

extern "C" void mgpuMemset16(void *dst, unsigned short value, size_t count,
                             void *stream) {
  memsetAsync("cuMemsetD16Async", cuMemsetD16Async, dst, value, count, stream);
}

namespace {
/// The extent of a ranked memref descriptor {allocated, aligned, offset,
/// sizes[rank], strides[rank]}: its first element and its size in bytes (0
/// and null when it has no elements).
struct MemRefExtent {
  void *begin = nullptr;
  size_t bytes = 0;
};
MemRefExtent memrefExtent(int64_t rank, void *descriptor,
                          int64_t elementSizeBytes) {
  auto *words = static_cast<int64_t *>(descriptor);
  char *aligned = reinterpret_cast<char *>(words[1]);
  int64_t offset = words[2];
  const int64_t *sizes = words + 3;
  const int64_t *strides = words + 3 + rank;
  int64_t last = 0;
  for (int64_t d = 0; d < rank; ++d) {
    if (sizes[d] == 0)
      return {};
    last += (sizes[d] - 1) * strides[d];
  }
  return {aligned + offset * elementSizeBytes,
          static_cast<size_t>(last + 1) * elementSizeBytes};
}
} // namespace

extern "C" void mgpuMemHostRegisterMemRef(int64_t rank, void *descriptor,
                                          int64_t elementSizeBytes) {
  MemRefExtent extent = memrefExtent(rank, descriptor, elementSizeBytes);
  if (extent.bytes)
    MOE_CU_IN_CONTEXT(cuMemHostRegister, extent.begin, extent.bytes, 0);
}

extern "C" void mgpuMemHostUnregisterMemRef(int64_t rank, void *descriptor,
                                            int64_t elementSizeBytes) {
  MemRefExtent extent = memrefExtent(rank, descriptor, elementSizeBytes);
  if (extent.bytes)
    MOE_CU_IN_CONTEXT(cuMemHostUnregister, extent.begin);
}

extern "C" void mgpuSetDefaultDevice(int32_t device) { defaultDevice = device; }

//===----------------------------------------------------------------------===//
// moe controls
//===----------------------------------------------------------------------===//

extern "C" void moeGpuSetStream(void *stream) {
  ThreadState &thread = threadState;
  thread.ambientStream = static_cast<CUstream>(stream);
  thread.contextSeenThisCall = false;
}

extern "C" int64_t moeGpuErrorWord() {
  ScopedContext scope;
  return static_cast<int64_t>(errorWordOfCurrentDevice());
}

extern "C" int32_t moeGpuCheckErrors() {
  ScopedContext scope;
  CUdeviceptr words = errorWordOfCurrentDevice();
  if (!words)
    return 0;
  // With an ambient stream (e.g. PyTorch's) the op ran there: wait for that
  // stream only, not for the whole device. Without one, the op ran on a
  // stream of its own that is gone by now: wait for the context.
  CUstream ambientStream = threadState.ambientStream;
  if (!(ambientStream ? MOE_CU(cuStreamSynchronize(ambientStream))
                      : MOE_CU(cuCtxSynchronize())))
    return 0;
  return takeErrorWord(words) ? 1 : 0;
}

extern "C" int32_t moeGpuPollErrors() {
  ScopedContext scope;
  CUdeviceptr words = errorWordOfCurrentDevice();
  return words && takeErrorWord(words) ? 1 : 0;
}

extern "C" int32_t moeGpuTakeDriverError(char *message, int64_t capacity) {
  ThreadState &thread = threadState;
  if (!thread.driverError && !thread.allocationFailed)
    return 0;
  std::string text =
      thread.driverError ? firstDriverError : "a device allocation failed";
  if (thread.skippedAfterFailedAllocation)
    text += " (then " + std::to_string(thread.skippedAfterFailedAllocation) +
            " launches/copies skipped)";
  if (message && capacity > 0) {
    std::strncpy(message, text.c_str(), capacity - 1);
    message[capacity - 1] = '\0';
  }
  firstDriverError.clear();
  thread.driverError = false;
  thread.allocationFailed = false;
  thread.skippedAfterFailedAllocation = 0;
  return 1;
}

extern "C" uint64_t moeGpuBinaryKey(const void *data, size_t size) {
  return binaryKey(data, size);
}

extern "C" int32_t moeGpuDeviceCount() {
  if (cuInit(0) != CUDA_SUCCESS)
    return 0;
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_SUCCESS)
    return 0;
  return count;
}
