//===- TorchCudaOps.cpp - torch.ops.moe.* on the compiled CUDA kernels ----===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The CUDA half of libmoe_torch.so. The ops themselves (checks, cache key,
// outputs allocated by torch) are the CPU ones of TorchOps.cpp: a key of a
// call on CUDA tensors carries `device=cuda:N`, and the kernel cache
// (python/moe_mlir/runtime/cache.py) compiles it with moe-lower-to-nvvm for
// that device's sm (`results-to-out-params=true wait-at-return=false`) into a
// shared object linked to libmoe_cuda_runtime.so. Here:
//
// * the launch: PyTorch's current stream of the device becomes the runtime's
//   ambient stream for the call (moeGpuSetStream), so the kernel's host code
//   launches there, ordered after the producers of its inputs and before the
//   consumers of its outputs, and returns without waiting. Stream-ordered
//   scratch allocations (cuMemAllocAsync) and launches only: a call can be
//   captured in a CUDA graph once its kernel is loaded.
// * the entry point of the registration of the CUDA kernels at run time
//   (Registration.cpp): moeTorchEnableCuda(), called when Python finds the
//   CUDA kernels usable (else CUDA tensors keep the eager references).
//
// libmoe_cuda_runtime.so is not a link dependency (a machine without a CUDA
// driver must still load the extension for the CPU kernels): the kernel cache
// loads it with the first CUDA kernel, and its symbols are looked up through
// that already-loaded library.
//
//===----------------------------------------------------------------------===//

#include "TorchCuda.h"

#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>

namespace {

/// The entry points of libmoe_cuda_runtime.so the launch needs
/// (lib/Runtime/CUDA/MoECudaRuntime.h).
struct CudaRuntime {
  void (*setStream)(void *) = nullptr;
  void (*setDefaultDevice)(int32_t) = nullptr;
  int32_t (*takeDriverError)(char *, int64_t) = nullptr;
};

const CudaRuntime &cudaRuntime() {
  // A failed initialization throws and is retried at the next call.
  static const CudaRuntime rt = [] {
    void *lib = dlopen("libmoe_cuda_runtime.so", RTLD_LAZY | RTLD_NOLOAD);
    TORCH_CHECK(lib != nullptr,
                "moe: libmoe_cuda_runtime.so is not loaded (the kernel cache "
                "loads it with the first CUDA kernel)");
    CudaRuntime r;
    r.setStream = reinterpret_cast<void (*)(void *)>(
        dlsym(lib, "moeGpuSetStream"));
    r.setDefaultDevice = reinterpret_cast<void (*)(int32_t)>(
        dlsym(lib, "mgpuSetDefaultDevice"));
    r.takeDriverError = reinterpret_cast<int32_t (*)(char *, int64_t)>(
        dlsym(lib, "moeGpuTakeDriverError"));
    TORCH_CHECK(r.setStream && r.setDefaultDevice && r.takeDriverError,
                "moe: libmoe_cuda_runtime.so lacks moeGpuSetStream, "
                "mgpuSetDefaultDevice or moeGpuTakeDriverError");
    return r;
  }();
  return rt;
}

/// CU_STREAM_LEGACY: the handle of the legacy default stream that the driver
/// API accepts where the runtime API's 0 means it. PyTorch's default stream is
/// that stream (native handle 0), which the runtime reads as "no ambient
/// stream" (it would then create a stream of its own, unordered with torch's).
void *const kLegacyStream = reinterpret_cast<void *>(0x1);

/// The ambient stream for one call; reset when the call ends, even by an
/// exception.
struct AmbientStream {
  const CudaRuntime &rt;
  AmbientStream(const CudaRuntime &rt, void *stream) : rt(rt) {
    rt.setStream(stream);
  }
  ~AmbientStream() { rt.setStream(nullptr); }
};

} // namespace

void moe_torch::launchOnCurrentStream(c10::Device device,
                                      const std::function<void()> &call) {
  const CudaRuntime &rt = cudaRuntime();
  c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
  void *stream = guard.getStream(device).native_handle();
  rt.setDefaultDevice(device.index());
  {
    AmbientStream ambient(rt, stream ? stream : kLegacyStream);
    call();
  }
  // Host-side failures of this call (a launch refused, an allocation that
  // failed); what the kernels do on the device is not waited for.
  char message[512];
  if (rt.takeDriverError(message, sizeof(message)))
    TORCH_CHECK(false, "moe: CUDA driver error in a kernel call on ", device,
                ": ", message);
}

/// Called by python/moe_mlir/runtime/extension.py when the CUDA kernels are
/// usable: from then on torch.ops.moe.* on CUDA tensors run them.
/// Returns 0, or 1 after printing why the registration failed.
extern "C" __attribute__((visibility("default"))) int32_t moeTorchEnableCuda() {
  try {
    moe_torch::registerCudaKernels();
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "moe: registering the CUDA kernels failed: %s\n",
                 e.what());
    return 1;
  }
}

