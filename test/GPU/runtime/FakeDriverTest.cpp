//===- FakeDriverTest.cpp - lib/Runtime/CUDA against a fake driver --------===//
//
// Part of the MoE-MLIR project.
//
// The CUDA runtime's error paths without a GPU: MoECudaRuntime.cpp linked with
// FakeCuda.cpp instead of libcuda (ctest gpu.runtime-fake-driver, label unit).
//  * a failed device allocation (mgpuMemAlloc returns null, which the
//    compiled host code passes on) stops later launches/copies of the thread
//    until the error is taken, and the error names the allocation;
//  * the error word is read on demand after the caller's own sync
//    (moeGpuPollErrors), without a synchronization of its own;
//  * a binary the driver rejects is replaced by its PTX fallback from
//    MOE_CUDA_PTX_DIR (moe-<key>.ptx), and without one the error says which
//    file was missing;
//
//===----------------------------------------------------------------------===//

#include "FakeCuda.h"

#include "../../../lib/Runtime/CUDA/MoECudaRuntime.h"
#include "MoE/Runtime/ErrorReporting.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

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
  int64_t word = moeGpuErrorWord();
  EXPECT(word != 0);
  EXPECT(moeGpuPollErrors() == 0);

  recordError(word, /*op=*/1, 17, 8, 8);
  EXPECT(moeGpuPollErrors() == 1);
  EXPECT(takeIndexError().find("element 17 is 8") != std::string::npos);
  EXPECT(reinterpret_cast<int64_t *>(word)[0] == 0); // cleared
  EXPECT(moeGpuPollErrors() == 0);
  // Read on demand: never a context or stream synchronization.
  EXPECT(count("cuCtxSynchronize") == 0);
  EXPECT(count("cuStreamSynchronize") == 0);

  // The synchronous check: without an ambient stream a context sync ...
  recordError(word, 2, 5, -3, 16);
  EXPECT(moeGpuCheckErrors() == 1);
  EXPECT(count("cuCtxSynchronize") == 1);
  EXPECT(takeIndexError().find("element 5 is -3") != std::string::npos);
  EXPECT(moeGpuPollErrors() == 0);
  // ... with one (PyTorch's stream), a wait for that stream only.
  moeGpuSetStream(reinterpret_cast<void *>(0x77));
  recordError(word, 2, 6, 99, 16);
  EXPECT(moeGpuCheckErrors() == 1);
  EXPECT(count("cuStreamSynchronize") == 1);
  EXPECT(count("cuCtxSynchronize") == 1);
  EXPECT(takeIndexError().find("element 6 is 99") != std::string::npos);
  moeGpuSetStream(nullptr);
}

void testPtxFallback() {
  fake_cuda::reset();
  static const char blob[] = "\x50\xed\x55\xba a fake fatbin";
  // FNV-1a 64 (independent of the runtime's; moe-aot.py computes the same).
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < sizeof(blob); ++i)
    h = (h ^ static_cast<unsigned char>(blob[i])) * 0x100000001b3ull;
  EXPECT(moeGpuBinaryKey(blob, sizeof(blob)) == h);
  EXPECT(moeGpuBinaryKey("a", 1) ==
         0xaf63dc4c8601ec8cull); // the FNV test vector
  char file[64];
  std::snprintf(file, sizeof(file), "moe-%016llx.ptx",
                static_cast<unsigned long long>(h));

  // Accepted binary: loaded as is, no JIT.
  EXPECT(mgpuModuleLoad(const_cast<char *>(blob), sizeof(blob)) != nullptr);
  EXPECT(count("cuModuleLoadDataEx") == 0);

  // Rejected, no fallback: null, and the error says what to provide.
  fake_cuda::state().moduleLoadFailure = CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
  unsetenv("MOE_CUDA_PTX_DIR");
  EXPECT(mgpuModuleLoad(const_cast<char *>(blob), sizeof(blob)) == nullptr);
  EXPECT(takeDriverError().find("CUDA_ERROR_UNSUPPORTED_PTX_VERSION") !=
         std::string::npos);

  // Rejected, fallback in the second folder of MOE_CUDA_PTX_DIR: JIT'd.
  char dir[] = "/tmp/moe-ptx-XXXXXX";
  EXPECT(mkdtemp(dir) != nullptr);
  std::string path = std::string(dir) + "/" + file;
  const std::string ptx = ".version 8.0\n.target sm_90\n.address_size 64\n";
  FILE *f = std::fopen(path.c_str(), "w");
  EXPECT(f != nullptr);
  std::fputs(ptx.c_str(), f);
  std::fclose(f);
  std::string dirs = std::string("/nonexistent:") + dir;
  setenv("MOE_CUDA_PTX_DIR", dirs.c_str(), 1);
  EXPECT(mgpuModuleLoad(const_cast<char *>(blob), sizeof(blob)) != nullptr);
  EXPECT(fake_cuda::state().lastJitImage == ptx);
  EXPECT(takeDriverError().empty());

  // A fallback that belongs to another binary is not used.
  static const char other[] = "another binary";
  EXPECT(mgpuModuleLoad(const_cast<char *>(other), sizeof(other)) == nullptr);
  EXPECT(!takeDriverError().empty());
  unsetenv("MOE_CUDA_PTX_DIR");
  std::remove(path.c_str());
  rmdir(dir);
}
} // namespace

int main() {
  testFailedAllocationStopsLaunches();
  testErrorWordWithoutWait();
  testPtxFallback();
  if (failures) {
    std::fprintf(stderr, "%d expectation(s) failed\n", failures);
    return 1;
  }
  std::printf("moe-cuda-runtime-fake-test: all passed\n");
  return 0;
}
