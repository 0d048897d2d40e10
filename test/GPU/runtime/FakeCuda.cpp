//===- FakeCuda.cpp - A fake CUDA driver for the runtime's tests ----------===//
//
// Part of the MoE-MLIR project. See FakeCuda.h.
//
//===----------------------------------------------------------------------===//

#include "FakeCuda.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace fake_cuda {
State &state() {
  static State s;
  return s;
}
void reset() { state() = State(); }
} // namespace fake_cuda

using fake_cuda::state;

namespace {
CUcontext theContext = reinterpret_cast<CUcontext>(0xC0);
thread_local int pushed = 0;

CUresult note(const char *name) {
  ++state().callCount;
  if (state().record)
    state().calls.push_back(name);
  return CUDA_SUCCESS;
}
CUresult alloc(CUdeviceptr *dptr, size_t bytes, const char *name) {
  note(name);
  if (state().failAllocs > 0) {
    --state().failAllocs;
    *dptr = 0;
    return state().allocFailure;
  }
  // 256-byte aligned, as the driver's allocations are.
  size_t rounded = (bytes + 255) / 256 * 256;
  void *memory = std::aligned_alloc(256, rounded ? rounded : 256);
  std::memset(memory, 0, rounded);
  *dptr = reinterpret_cast<CUdeviceptr>(memory);
  return CUDA_SUCCESS;
}
void *ptr(CUdeviceptr p) { return reinterpret_cast<void *>(p); }
/// A call that takes a stream: recorded with it.
CUresult noteOn(const char *name, CUstream stream) {
  if (state().record)
    state().streamed.push_back({name, stream});
  return note(name);
}
} // namespace

extern "C" {
CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
  switch (error) {
  case CUDA_ERROR_OUT_OF_MEMORY:
    *pStr = "CUDA_ERROR_OUT_OF_MEMORY";
    break;
  case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    *pStr = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    break;
  default:
    *pStr = "CUDA_ERROR_FAKE";
  }
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
  *pStr = error == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "fake error";
  return CUDA_SUCCESS;
}
// Driver calls that only succeed and are recorded. `name` in the definition
// expands to the driver's versioned symbol (cuStreamDestroy_v2 ...); #name
// records the name as the runtime writes it.
#define MOE_FAKE_CALL(name, params)                                            \
  CUresult CUDAAPI name params { return note(#name); }
MOE_FAKE_CALL(cuInit, (unsigned int))
MOE_FAKE_CALL(cuCtxSynchronize, (void))
MOE_FAKE_CALL(cuMemHostRegister, (void *, size_t, unsigned int))
MOE_FAKE_CALL(cuMemHostUnregister, (void *))
MOE_FAKE_CALL(cuModuleUnload, (CUmodule))
MOE_FAKE_CALL(cuFuncSetAttribute, (CUfunction, CUfunction_attribute, int))
MOE_FAKE_CALL(cuStreamDestroy, (CUstream))
MOE_FAKE_CALL(cuStreamSynchronize, (CUstream))
MOE_FAKE_CALL(cuStreamWaitEvent, (CUstream, CUevent, unsigned int))
MOE_FAKE_CALL(cuEventDestroy, (CUevent))
MOE_FAKE_CALL(cuEventSynchronize, (CUevent))
MOE_FAKE_CALL(cuEventRecord, (CUevent, CUstream))
CUresult CUDAAPI cuDeviceGetCount(int *count) {
  *count = state().deviceCount;
  return note("cuDeviceGetCount");
}
CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  *device = ordinal;
  return note("cuDeviceGet");
}
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice) {
  *pctx = theContext;
  return note("cuDevicePrimaryCtxRetain");
}
CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
  ++state().contextQueries;
  *pctx = pushed ? theContext : nullptr;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxPushCurrent(CUcontext) {
  ++pushed;
  return note("cuCtxPushCurrent");
}
CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) {
  --pushed;
  *pctx = theContext;
  return note("cuCtxPopCurrent");
}
CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
  ++state().deviceQueries;
  *device = 0;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice) {
  *pool = nullptr;
  return note("cuDeviceGetDefaultMemPool");
}
CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute,
                                       void *) {
  return note("cuMemPoolSetAttribute");
}
CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  return alloc(dptr, bytesize, "cuMemAlloc");
}
CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize,
                                 CUstream hStream) {
  if (state().record)
    state().streamed.push_back({"cuMemAllocAsync", hStream});
  return alloc(dptr, bytesize, "cuMemAllocAsync");
}
CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize,
                                   unsigned int) {
  return alloc(dptr, bytesize, "cuMemAllocManaged");
}
CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
  std::free(ptr(dptr));
  return note("cuMemFree");
}
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  std::free(ptr(dptr));
  return noteOn("cuMemFreeAsync", hStream);
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src,
                               size_t ByteCount, CUstream hStream) {
  std::memcpy(ptr(dst), ptr(src), ByteCount);
  return noteOn("cuMemcpyAsync", hStream);
}
CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice,
                              size_t ByteCount) {
  std::memcpy(dstHost, ptr(srcDevice), ByteCount);
  return note("cuMemcpyDtoH");
}
CUresult CUDAAPI cuMemsetD32(CUdeviceptr dst, unsigned int ui, size_t N) {
  std::fill_n(static_cast<uint32_t *>(ptr(dst)), N, ui);
  return note("cuMemsetD32");
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t N,
                                  CUstream hStream) {
  std::fill_n(static_cast<uint32_t *>(ptr(dst)), N, ui);
  return noteOn("cuMemsetD32Async", hStream);
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dst, unsigned short us, size_t N,
                                  CUstream hStream) {
  std::fill_n(static_cast<uint16_t *>(ptr(dst)), N, us);
  return noteOn("cuMemsetD16Async", hStream);
}
CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *) {
  note("cuModuleLoadData");
  if (state().moduleLoadFailure != CUDA_SUCCESS) {
    *module = nullptr;
    return state().moduleLoadFailure;
  }
  *module = reinterpret_cast<CUmodule>(0x10);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image,
                                    unsigned int, CUjit_option *, void **) {
  state().lastJitImage = static_cast<const char *>(image);
  *module = reinterpret_cast<CUmodule>(0x11);
  return note("cuModuleLoadDataEx");
}
CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule,
                                     const char *) {
  *hfunc = reinterpret_cast<CUfunction>(0x20);
  return note("cuModuleGetFunction");
}
CUresult CUDAAPI cuLaunchKernel(CUfunction, unsigned int, unsigned int,
                                unsigned int, unsigned int, unsigned int,
                                unsigned int, unsigned int, CUstream hStream,
                                void **, void **) {
  ++state().launches;
  return noteOn("cuLaunchKernel", hStream);
}
CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction,
                                  void **, void **) {
  ++state().launches;
  return noteOn("cuLaunchKernelEx", config ? config->hStream : nullptr);
}
CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int) {
  *phStream = reinterpret_cast<CUstream>(0x30);
  return note("cuStreamCreate");
}
CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int) {
  *phEvent = reinterpret_cast<CUevent>(0x40);
  return note("cuEventCreate");
}
CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
                                      CUdevice) {
  *pi = attrib == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
            ? state().computeMajor
            : 0;
  return note("cuDeviceGetAttribute");
}
CUresult CUDAAPI cuStreamIsCapturing(CUstream,
                                     CUstreamCaptureStatus *captureStatus) {
  *captureStatus = state().capture;
  return note("cuStreamIsCapturing");
}
CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src,
                                   size_t bytes, CUstream hStream) {
  std::memcpy(ptr(dst), src, bytes);
  return noteOn("cuMemcpyHtoDAsync", hStream);
}
} // extern "C"

//===----------------------------------------------------------------------===//
// The fake runtime library's probe (libmoe_cuda_runtime.so in
// build/lib/fake-cuda/: MoECudaRuntime.cpp over this file), read through
// ctypes by python/tests/test_cuda_host_calls.py
//===----------------------------------------------------------------------===//

#define MOE_FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
/// `text` into `buffer` (truncated to `capacity` - 1 bytes), then `clear()`;
/// without a buffer (a size query) nothing is cleared. Returns the full length.
template <typename Record>
int64_t takeText(const std::string &text, char *buffer, int64_t capacity,
                 Record &record) {
  if (buffer && capacity > 0) {
    record.clear();
    size_t n = std::min<size_t>(text.size(), capacity - 1);
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return static_cast<int64_t>(text.size());
}
} // namespace

/// The driver calls recorded since the last take, newline-separated (see
/// takeText for the buffer).
MOE_FAKE_EXPORT int64_t moeFakeCudaTakeCalls(char *buffer, int64_t capacity) {
  std::string text;
  for (const std::string &call : state().calls)
    text += call + "\n";
  return takeText(text, buffer, capacity, state().calls);
}

/// The calls that took a stream since the last take, one "name stream" line
/// each (the stream as a decimal handle), as moeFakeCudaTakeCalls returns them.
MOE_FAKE_EXPORT int64_t moeFakeCudaTakeStreams(char *buffer, int64_t capacity) {
  std::string text;
  for (const auto &[name, stream] : state().streamed)
    text +=
        name + " " + std::to_string(reinterpret_cast<uintptr_t>(stream)) + "\n";
  return takeText(text, buffer, capacity, state().streamed);
}

/// Makes the primary context current on the calling thread (`current` != 0)
/// or not, as PyTorch leaves its own context current on the threads that
/// call the ops.
MOE_FAKE_EXPORT void moeFakeCudaSetCurrent(int32_t current) {
  pushed = current ? 1 : 0;
}

/// Does nothing: the probe calls it with a kernel's arguments to subtract the
/// cost of its own (ctypes) calls from the host time it reports.
MOE_FAKE_EXPORT void moeFakeCudaNoop() {}
