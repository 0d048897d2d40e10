//===- FakeCuda.h - A fake CUDA driver for the runtime's tests --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// FakeCuda.cpp defines the cu* driver functions that lib/Runtime/CUDA uses,
// over host memory (a CUdeviceptr is a host address, so copies and memsets
// really happen), with failures that a test injects. Linked into
// moe-cuda-runtime-fake-test instead of libcuda, so the runtime's error paths
// are tested on a machine without a GPU, and into moe-cuda-runtime-host-path
// (HostPathBench.cpp: the driver calls of one op call, their cost).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TEST_GPU_RUNTIME_FAKECUDA_H
#define MOE_TEST_GPU_RUNTIME_FAKECUDA_H

#include <cuda.h>

#include <string>
#include <vector>

namespace fake_cuda {
struct State {
  int deviceCount = 1;
  /// The next N calls of cuMemAllocAsync/cuMemAlloc fail with this result.
  int failAllocs = 0;
  CUresult allocFailure = CUDA_ERROR_OUT_OF_MEMORY;
  /// Every driver call, by name, in order (context pushes and pops included;
  /// cuCtxGetCurrent and cuCtxGetDevice, asked on many runtime calls, are
  /// counted below instead).
  std::vector<std::string> calls;
  /// False: calls and streams are not recorded, only counted in `callCount`
  /// (the host-path benchmark's timed loops would otherwise time the fake's
  /// own string vector).
  bool record = true;
  /// Every recorded-kind driver call, recorded or not.
  long long callCount = 0;
  long long contextQueries = 0; // cuCtxGetCurrent
  long long deviceQueries = 0;  // cuCtxGetDevice
  int launches = 0;
  /// cuModuleLoadData fails with this (CUDA_SUCCESS: loads).
  CUresult moduleLoadFailure = CUDA_SUCCESS;
  /// The image given to the last cuModuleLoadDataEx (a JIT of PTX text).
  std::string lastJitImage;
  /// The stream of each call that takes one (launches, stream-ordered
  /// allocations, frees, copies and memsets), by name, in order.
  std::vector<std::pair<std::string, CUstream>> streamed;
  /// The device's compute capability major (cuDeviceGetAttribute).
  int computeMajor = 9;
  /// What cuStreamIsCapturing reports for every stream.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
};
State &state();
void reset();
} // namespace fake_cuda

#endif // MOE_TEST_GPU_RUNTIME_FAKECUDA_H
