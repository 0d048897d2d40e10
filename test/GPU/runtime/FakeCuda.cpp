//===- FakeCuda.cpp - A fake CUDA driver for the runtime's tests ----------===//
//
// Part of the MoE-MLIR project. See FakeCuda.h.
//
//===----------------------------------------------------------------------===//

#include "FakeCuda.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

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
  *dptr = reinterpret_cast<CUdeviceptr>(std::calloc(1, bytes));
  return CUDA_SUCCESS;
}
void *ptr(CUdeviceptr p) { return reinterpret_cast<void *>(p); }
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
  *pctx = pushed ? theContext : nullptr;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxPushCurrent(CUcontext) {
  ++pushed;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) {
  --pushed;
  *pctx = theContext;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
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
CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream) {
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
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream) {
  std::free(ptr(dptr));
  return note("cuMemFreeAsync");
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src,
                               size_t ByteCount, CUstream hStream) {
  std::memcpy(ptr(dst), ptr(src), ByteCount);
  state().streamed.push_back({"cuMemcpyAsync", hStream});
  return note("cuMemcpyAsync");
}
CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice,
                              size_t ByteCount) {
  std::memcpy(dstHost, ptr(srcDevice), ByteCount);
  return note("cuMemcpyDtoH");
}
CUresult CUDAAPI cuMemsetD32(CUdeviceptr dst, unsigned int ui, size_t N) {
  auto *p = static_cast<uint32_t *>(ptr(dst));
  for (size_t i = 0; i < N; ++i)
    p[i] = ui;
  return note("cuMemsetD32");
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t N,
                                  CUstream hStream) {
  auto *p = static_cast<uint32_t *>(ptr(dst));
  for (size_t i = 0; i < N; ++i)
    p[i] = ui;
  state().streamed.push_back({"cuMemsetD32Async", hStream});
  return note("cuMemsetD32Async");
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dst, unsigned short us, size_t N,
                                  CUstream) {
  auto *p = static_cast<uint16_t *>(ptr(dst));
  for (size_t i = 0; i < N; ++i)
    p[i] = us;
  return note("cuMemsetD16Async");
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
                                unsigned int, unsigned int, CUstream, void **,
                                void **) {
  ++state().launches;
  return note("cuLaunchKernel");
}
CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **,
                                  void **) {
  ++state().launches;
  return note("cuLaunchKernelEx");
}
CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int) {
  *phStream = reinterpret_cast<CUstream>(0x30);
  return note("cuStreamCreate");
}
CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int) {
  *phEvent = reinterpret_cast<CUevent>(0x40);
  return note("cuEventCreate");
}
} // extern "C"
