//===- FakeDriverTest.cpp - lib/Runtime/CUDA against a fake driver --------===//
//
// Part of the MoE-MLIR project.
//
// The CUDA runtime's error paths without a GPU: MoECudaRuntime.cpp linked with
// FakeCuda.cpp instead of libcuda (ctest gpu.runtime-fake-driver, label unit).
//  * a failed device allocation (mgpuMemAlloc returns null, which the
//    compiled host code passes on) stops later launches/copies of the thread
//    until the error is taken, and the error names the allocation;
//  * the error word can be queued for reading without a wait and polled after
//    the caller's sync (moeGpuQueueErrorCheck / moeGpuPollErrors).
//
//===----------------------------------------------------------------------===//

#include "FakeCuda.h"

#include "MoE/Runtime/ErrorReporting.h"
#include "../../../lib/Runtime/CUDA/MoECudaRuntime.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

namespace {
int failures = 0;

#define EXPECT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: EXPECT failed: %s\n", __FILE__, __LINE__,   \
                   #cond);                                                     \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

std::string takeDriverError() {
  char buffer[512];
  return moeGpuTakeDriverError(buffer, sizeof(buffer)) ? buffer : "";
}

std::string takeIndexError() {
  char buffer[512];
  return moeTakeError(buffer, sizeof(buffer)) ? buffer : "";
}

int count(const std::string &call) {
  const auto &calls = fake_cuda::state().calls;
  return static_cast<int>(std::count(calls.begin(), calls.end(), call));
}

void launch(void *function, void *stream) {
  void *params[] = {nullptr};
  mgpuLaunchKernel(function, 4, 1, 1, 32, 1, 1, 0, stream, params, nullptr, 1);
}

void testFailedAllocationStopsLaunches() {
  fake_cuda::reset();
  void *module = mgpuModuleLoad(reinterpret_cast<void *>(0x1), 0);
  void *function = mgpuModuleGetFunction(module, "k");
  void *stream = mgpuStreamCreate();

  void *ok = mgpuMemAlloc(64, stream, false);
  EXPECT(ok != nullptr);
  launch(function, stream);
  EXPECT(fake_cuda::state().launches == 1);
  EXPECT(takeDriverError().empty());

  fake_cuda::state().failAllocs = 1;
  void *bad = mgpuMemAlloc(1 << 20, stream, false);
  EXPECT(bad == nullptr);
  // The compiled code goes on with the null pointer: nothing may run on it.
  launch(function, stream);
  mgpuMemcpy(ok, bad, 64, stream);
  mgpuMemset32(bad, 0, 16, stream);
  EXPECT(fake_cuda::state().launches == 1);
  EXPECT(count("cuMemcpyAsync") == 0);
  EXPECT(count("cuMemsetD32Async") == 0);
  std::string error = takeDriverError();
  EXPECT(error.find("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY") !=
         std::string::npos);
  EXPECT(error.find("3 launches/copies skipped") != std::string::npos);

  // Taken: the thread runs again.
  launch(function, stream);
  EXPECT(fake_cuda::state().launches == 2);
  EXPECT(takeDriverError().empty());

  // A managed allocation failure is handled the same way.
  fake_cuda::state().failAllocs = 1;
  EXPECT(mgpuMemAlloc(64, stream, true) == nullptr);
  launch(function, stream);
  EXPECT(fake_cuda::state().launches == 2);
  EXPECT(!takeDriverError().empty());

  // An empty allocation is no error: null, and launches go on.
  EXPECT(mgpuMemAlloc(0, stream, false) == nullptr);
  launch(function, stream);
  EXPECT(fake_cuda::state().launches == 3);
  EXPECT(takeDriverError().empty());
  mgpuMemFree(ok, stream);
  mgpuStreamDestroy(stream);
}

void recordError(int64_t word, int64_t op, int64_t position, int64_t value,
                 int64_t bound) {
  auto *w = reinterpret_cast<int64_t *>(word); // the fake's device memory
  w[0] = 1;
  w[1] = op;
  w[2] = position;
  w[3] = value;
  w[4] = bound;
}

void testErrorWordWithoutWait() {
  fake_cuda::reset();
  moeSetErrorEcho(0);
  auto *stream = reinterpret_cast<void *>(0x77);
  moeGpuSetStream(stream);
  int64_t word = moeGpuErrorWord();
  EXPECT(word != 0);

  // Nothing recorded: the queued copy is clean and the poll reports nothing.
  moeGpuQueueErrorCheck(nullptr);
  EXPECT(moeGpuPollErrors() == 0);

  recordError(word, /*op=*/1, 17, 8, 8);
  // Before a check is queued the host mirror does not know yet.
  EXPECT(moeGpuPollErrors() == 0);
  moeGpuQueueErrorCheck(nullptr);
  // Queued on the ambient stream, without any wait.
  auto &streamed = fake_cuda::state().streamed;
  EXPECT(!streamed.empty() && streamed.back().first == "cuMemcpyDtoHAsync" &&
         streamed.back().second == stream);
  EXPECT(count("cuCtxSynchronize") == 0);
  EXPECT(count("cuStreamSynchronize") == 0);
  EXPECT(count("cuMemcpyDtoH") == 0);

  EXPECT(moeGpuPollErrors() == 1);
  std::string error = takeIndexError();
  EXPECT(error.find("element 17 is 8") != std::string::npos);
  // The device word is cleared in the ambient stream's order.
  EXPECT(reinterpret_cast<int64_t *>(word)[0] == 0);
  EXPECT(streamed.back().first == "cuMemsetD32Async" &&
         streamed.back().second == stream);
  EXPECT(moeGpuPollErrors() == 0);
  EXPECT(count("cuCtxSynchronize") == 0);

  // The synchronous check still works and does not leave a stale copy behind.
  recordError(word, 2, 5, -3, 16);
  moeGpuQueueErrorCheck(nullptr);
  EXPECT(moeGpuCheckErrors() == 1);
  EXPECT(takeIndexError().find("element 5 is -3") != std::string::npos);
  EXPECT(moeGpuPollErrors() == 0);
  moeGpuSetStream(nullptr);
}
} // namespace

int main() {
  testFailedAllocationStopsLaunches();
  testErrorWordWithoutWait();
  if (failures) {
    std::fprintf(stderr, "%d expectation(s) failed\n", failures);
    return 1;
  }
  std::printf("moe-cuda-runtime-fake-test: all passed\n");
  return 0;
}
