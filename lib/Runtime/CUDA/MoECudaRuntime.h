//===- MoECudaRuntime.h - The CUDA runtime of compiled moe code -*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// libmoe_cuda_runtime.so implements, over the CUDA driver API, every `mgpu*`
// function that upstream `gpu-to-llvm` and the `gpu.binary` embedding emit
// (module load/unload/get-function, kernel and cluster launch, streams, events,
// device memory, host registration, default device); the declarations below
// are the exact ABI those emit in LLVM 22. On top of that ABI it offers the
// controls the moe GPU path needs:
//
//  * the *ambient stream*: `moeGpuSetStream(s)` makes every `mgpuStreamCreate`
//    of the calling thread return `s` (e.g. PyTorch's current stream) and the
//    matching `mgpuStreamDestroy` leave it alone, so compiled code runs in the
//    caller's stream order;
//  * the *device error word*: kernels that read run-time indices (`assign`,
//    `idx`) record the first out-of-range element in a small device buffer
//    (`moeGpuErrorWord()` gives its device address); compiled host code calls
//    `moeGpuCheckErrors()` after the op (a wait for the ambient stream, or
//    for the context when there is none), or the caller
//    `moeGpuPollErrors()` after its own sync (no sync of its own); both
//    forward it to the CPU convention of MoE/Runtime/ErrorReporting.h
//    (`moeTakeError`);
//  * the PTX fallback: when the driver rejects an embedded binary (a driver
//    older than the toolkit, a chip without code in it) or
//    `MOE_CUDA_FORCE_PTX=1`, `mgpuModuleLoad` JIT-compiles
//    `$MOE_CUDA_PTX_DIR/moe-<FNV-1a 64 of the binary>.ptx`, which
//    `tools/moe-aot/moe-aot.py --ptx-fallback` writes;
//  * driver errors are never silent: each failing driver call prints one line
//    (`moe_cuda_runtime: cuXxx failed: CUDA_ERROR_...: text`) and is kept for
//    `moeGpuTakeDriverError()`; `MOE_CUDA_ABORT_ON_ERROR=1` aborts instead.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_CUDA_MOECUDARUNTIME_H
#define MOE_RUNTIME_CUDA_MOECUDARUNTIME_H

#include <cstddef>
#include <cstdint>

#define MOE_CUDA_EXPORT __attribute__((visibility("default")))

extern "C" {
//===----------------------------------------------------------------------===//
// The mgpu ABI (LLVM 22 gpu-to-llvm and SelectObjectAttr)
//===----------------------------------------------------------------------===//
MOE_CUDA_EXPORT void *mgpuModuleLoad(void *data, size_t gpuBlobSize);
MOE_CUDA_EXPORT void *mgpuModuleLoadJIT(void *data, int optLevel);
MOE_CUDA_EXPORT void mgpuModuleUnload(void *module);
MOE_CUDA_EXPORT void *mgpuModuleGetFunction(void *module, const char *name);
MOE_CUDA_EXPORT void mgpuLaunchKernel(void *function, intptr_t gridX,
                                      intptr_t gridY, intptr_t gridZ,
                                      intptr_t blockX, intptr_t blockY,
                                      intptr_t blockZ, int32_t smem,
                                      void *stream, void **params, void **extra,
                                      size_t paramsCount);
MOE_CUDA_EXPORT void
mgpuLaunchClusterKernel(void *function, intptr_t clusterX, intptr_t clusterY,
                        intptr_t clusterZ, intptr_t gridX, intptr_t gridY,
                        intptr_t gridZ, intptr_t blockX, intptr_t blockY,
                        intptr_t blockZ, int32_t smem, void *stream,
                        void **params, void **extra);
MOE_CUDA_EXPORT void *mgpuStreamCreate();
MOE_CUDA_EXPORT void mgpuStreamDestroy(void *stream);
MOE_CUDA_EXPORT void mgpuStreamSynchronize(void *stream);
MOE_CUDA_EXPORT void mgpuStreamWaitEvent(void *stream, void *event);
MOE_CUDA_EXPORT void *mgpuEventCreate();
MOE_CUDA_EXPORT void mgpuEventDestroy(void *event);
MOE_CUDA_EXPORT void mgpuEventSynchronize(void *event);
MOE_CUDA_EXPORT void mgpuEventRecord(void *event, void *stream);
MOE_CUDA_EXPORT void *mgpuMemAlloc(uint64_t sizeBytes, void *stream,
                                   bool isHostShared);
MOE_CUDA_EXPORT void mgpuMemFree(void *ptr, void *stream);
MOE_CUDA_EXPORT void mgpuMemcpy(void *dst, void *src, size_t sizeBytes,
                                void *stream);
MOE_CUDA_EXPORT void mgpuMemset32(void *dst, unsigned int value, size_t count,
                                  void *stream);
MOE_CUDA_EXPORT void mgpuMemset16(void *dst, unsigned short value, size_t count,
                                  void *stream);
MOE_CUDA_EXPORT void mgpuMemHostRegisterMemRef(int64_t rank, void *descriptor,
                                               int64_t elementSizeBytes);
MOE_CUDA_EXPORT void mgpuMemHostUnregisterMemRef(int64_t rank, void *descriptor,
                                                 int64_t elementSizeBytes);
MOE_CUDA_EXPORT void mgpuSetDefaultDevice(int32_t device);

//===----------------------------------------------------------------------===//
// moe controls
//===----------------------------------------------------------------------===//
/// Makes `stream` (a CUstream, or null for "none") the ambient stream of the
/// calling thread; see the file comment.
MOE_CUDA_EXPORT void moeGpuSetStream(void *stream);
/// Device address of the error word of the current device (allocated and
/// zeroed on first use): int64 words {flag, op, position, value, bound}.
MOE_CUDA_EXPORT int64_t moeGpuErrorWord();
/// Waits for the ambient stream (without one: for the current context), reads
/// the error word and, when a kernel recorded an error, clears it and reports
/// it through moeReportIndexError (so that moeTakeError returns it). Returns 1
/// when there was one.
MOE_CUDA_EXPORT int32_t moeGpuCheckErrors();
/// The error check without a wait of its own, for callers that synchronize
/// themselves (compiled code that does not wait per op; the Python layer):
/// call it after synchronizing the stream(s) that ran the ops (e.g.
/// torch.cuda.synchronize()). It reads the error word with a blocking 40-byte
/// copy on the legacy default stream -- which waits for that stream and the
/// blocking streams, not for non-blocking ones such as PyTorch's side streams,
/// and never synchronizes the context -- and, when a kernel recorded an error,
/// clears the word and reports it through moeReportIndexError (so that
/// moeTakeError returns it). Returns 1 when there was one. Kernels record only
/// the first error and the word is cleared only here or in
/// moeGpuCheckErrors, so errors of several ops wait for the next poll.
MOE_CUDA_EXPORT int32_t moeGpuPollErrors();
/// Copies the first driver error of this thread since the last call into
/// `message` and clears it; returns 1 when there was one. A failed device
/// allocation is one: mgpuMemAlloc then returns null and, until this call,
/// every later launch, copy and memset of the thread is skipped (and counted
/// in the message) rather than run on the null pointer.
MOE_CUDA_EXPORT int32_t moeGpuTakeDriverError(char *message, int64_t capacity);
/// Frees device memory returned by compiled code (the results of the compiled
/// functions belong to the caller).
MOE_CUDA_EXPORT void moeGpuFree(void *ptr);
/// The key of an embedded GPU binary (FNV-1a 64 of its bytes) that names its
/// PTX fallback, moe-<key as 16 hex digits>.ptx.
MOE_CUDA_EXPORT uint64_t moeGpuBinaryKey(const void *data, size_t size);
/// Why moeGpuTensorMap3d makes no map of these (a sentence), or null.
MOE_CUDA_EXPORT const char *
moeGpuTensorMapRefusal(int64_t address, int32_t elementType, int64_t inner,
                       int64_t rows, int64_t batches, int32_t boxInner,
                       int32_t boxRows);
/// Number of CUDA devices (0 when there is no driver or no device); never
/// reports an error, so callers can use it to skip GPU work.
MOE_CUDA_EXPORT int32_t moeGpuDeviceCount();
}

#endif // MOE_RUNTIME_CUDA_MOECUDARUNTIME_H
