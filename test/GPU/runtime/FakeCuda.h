//===- FakeCuda.h - A fake CUDA driver for the runtime's tests --*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
// FakeCuda.cpp defines the cu* driver functions that lib/Runtime/CUDA uses,
// over host memory (a CUdeviceptr is a host address, so copies and memsets
// really happen), with failures that a test injects. Linked into
// moe-cuda-runtime-fake-test instead of libcuda, so the runtime's error paths
// are tested on a machine without a GPU.
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
  /// cuCtxGetCurrent, asked on every runtime call, is not recorded).
  std::vector<std::string> calls;
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
