//===- HostPathBench.cpp - One torch op call's runtime path, fake driver --===//
//
// Part of the MoE-MLIR project.
//
// The host path of one torch.ops.moe.* call on CUDA tensors below the C++ op:
// what launchOnCurrentStream (lib/Runtime/Torch/TorchCudaOps.cpp) and the
// compiled kernel's host code (moe-lower-to-nvvm results-to-out-params=true
// wait-at-return=false, gpu.launch_func translated by SelectObjectAttr) ask of
// lib/Runtime/CUDA/MoECudaRuntime.cpp, replayed against the fake driver of
// FakeCuda.cpp with PyTorch's context current. The call sequences are the
// lowered host code's, read from moe-opt's output for these keys:
//
//  * topk_renorm|k=8|mode=logits|renormalize=1|in:scores:f32:?x64: the ambient
//    stream, then for each of the two register kernels (topk_renorm_warp_0/1,
//    the token count picks one, the other launches over an empty grid) a
//    function lookup and a launch;
//  * route|...DeepSeek-V3 (E=256, n_group=8, topk_group=4, sigmoid + bias):
//    the stream, one lookup and one launch (route_lanes_0);
//  * dispatch_plan|num_experts=256|block_size=64: the stream, one scratch
//    allocation, three lookups and launches, the scratch freed.
//
// Without arguments (ctest gpu.runtime-host-path, label unit) it checks the
// driver calls of one steady-state call of each (counts, never times):
// HostPathBench --bench N  prints ns per call over N calls (indicative: the
// machine's load decides them); --case NAME --calls N runs only that case,
// for `valgrind --tool=callgrind --toggle-collect=hostPathCall` (instructions
// per call = Ir / N, independent of the load). See
// bench/results/host-path-2026-11-30-fake-driver.md.
//
//===----------------------------------------------------------------------===//

#include "FakeCuda.h"

#include "../../../lib/Runtime/CUDA/MoECudaRuntime.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

extern "C" void moeFakeCudaSetCurrent(int32_t current);

namespace {

/// What the kernels' libraries hold: the module their constructor loaded and
/// the kernel names' constants (stable pointers, as in the generated code).
void *theModule = nullptr;
const char kTopk0[] = "topk_renorm_warp_0";
const char kTopk1[] = "topk_renorm_warp_1";
const char kRoute[] = "route_lanes_0";
const char kPlan0[] = "dispatch_counts_0";
const char kPlan1[] = "dispatch_scan_0";
const char kPlan2[] = "dispatch_scatter_0";
void *const kTorchStream = reinterpret_cast<void *>(0x5000);

/// The kernel arguments: the memref descriptors' words as the host code
/// passes them (their values do not matter to the runtime).
void *params[32];

void launch(const char *name, void *stream, intptr_t grid) {
  void *fn = mgpuModuleGetFunction(theModule, name);
  mgpuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream, params, nullptr, 21);
}

void topkRenormHost() {
  void *stream = mgpuStreamCreate();
  launch(kTopk0, stream, 1);
  launch(kTopk1, stream, 0);
}

void routeHost() {
  void *stream = mgpuStreamCreate();
  launch(kRoute, stream, 1);
}

void dispatchPlanHost() {
  void *stream = mgpuStreamCreate();
  void *scratch = mgpuMemAlloc(4096, stream, false);
  launch(kPlan0, stream, 2);
  launch(kPlan1, stream, 1);
  launch(kPlan2, stream, 2);
  mgpuMemFree(scratch, stream);
}

/// launchOnCurrentStream's part around the host code (minus PyTorch's
/// VirtualGuardImpl::getStream): the device, the ambient stream for the call,
/// the driver error of the call taken.
__attribute__((noinline)) void hostPathCall(void (*host)()) {
  mgpuSetDefaultDevice(0);
  moeGpuSetStream(kTorchStream);
  host();
  moeGpuSetStream(nullptr);
  char message[512];
  if (moeGpuTakeDriverError(message, sizeof(message)))
    std::fprintf(stderr, "driver error: %s\n", message);
}

struct Case {
  const char *name;
  void (*host)();
  /// One steady-state call's driver calls, by kind.
  std::map<std::string, int> calls;
  int contextQueries;
  int deviceQueries;
};

// The counts of the runtime as it is: one function lookup per launch site
// at the first call only (cached per module and name afterwards), the current
// context asked once per call (the first driver call that needs it while the
// ambient stream is set).
const Case kCases[] = {
    {"topk_renorm", topkRenormHost, {{"cuLaunchKernel", 1}}, 1, 0},
    {"route_deepseek_v3", routeHost, {{"cuLaunchKernel", 1}}, 1, 0},
    {"dispatch_plan",
     dispatchPlanHost,
     {{"cuLaunchKernel", 3}, {"cuMemAllocAsync", 1}, {"cuMemFreeAsync", 1}},
     1,
     1},
};

/// The library constructor's module load and PyTorch's context current.
void setUp() {
  fake_cuda::reset();
  moeFakeCudaSetCurrent(1);
  theModule = mgpuModuleLoad(reinterpret_cast<void *>(0x1), 0);
}

int checkCounts() {
  int failures = 0;
  for (const Case &c : kCases) {
    setUp();
    hostPathCall(c.host); // the first call: lookups, the pool's set-up
    fake_cuda::state().calls.clear();
    fake_cuda::state().contextQueries = 0;
    fake_cuda::state().deviceQueries = 0;
    hostPathCall(c.host);
    std::map<std::string, int> seen;
    for (const std::string &call : fake_cuda::state().calls)
      ++seen[call];
    const auto &s = fake_cuda::state();
    std::printf("%s:", c.name);
    for (const auto &[name, n] : seen)
      std::printf(" %s=%d", name.c_str(), n);
    std::printf(" cuCtxGetCurrent=%lld cuCtxGetDevice=%lld\n", s.contextQueries,
                s.deviceQueries);
    if (seen != c.calls || s.contextQueries != c.contextQueries ||
        s.deviceQueries != c.deviceQueries) {
      std::fprintf(stderr, "%s: unexpected driver calls per call\n", c.name);
      ++failures;
    }
  }
  // A module unloaded and another loaded (at the same handle, as the fake
  // driver gives it) is asked for its functions again.
  setUp();
  hostPathCall(routeHost);
  mgpuModuleUnload(theModule);
  theModule = mgpuModuleLoad(reinterpret_cast<void *>(0x1), 0);
  fake_cuda::state().calls.clear();
  hostPathCall(routeHost);
  int lookups = 0;
  for (const std::string &call : fake_cuda::state().calls)
    lookups += call == "cuModuleGetFunction";
  if (lookups != 1) {
    std::fprintf(stderr, "after a module unload: %d lookups, expected 1\n",
                 lookups);
    ++failures;
  }
  return failures;
}

const Case *findCase(const char *name) {
  for (const Case &c : kCases)
    if (std::strcmp(c.name, name) == 0)
      return &c;
  std::fprintf(stderr, "no case %s\n", name);
  std::exit(2);
}

void runCalls(const Case &c, long calls) {
  setUp();
  fake_cuda::state().record = false;
  for (long i = 0; i < calls; ++i)
    hostPathCall(c.host);
}

void bench(long calls) {
  for (const Case &c : kCases) {
    runCalls(c, 1000); // warm
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i)
      hostPathCall(c.host);
    double ns = std::chrono::duration<double, std::nano>(
                    std::chrono::steady_clock::now() - start)
                    .count();
    std::printf("%s: %.1f ns per call (%ld calls; %.2f fake driver calls "
                "per call)\n",
                c.name, ns / calls, calls,
                double(fake_cuda::state().callCount) / (calls + 1000));
  }
}
} // namespace

int main(int argc, char **argv) {
  const char *caseName = nullptr;
  long calls = 0, benchCalls = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--case"))
      caseName = argv[i + 1];
    else if (!std::strcmp(argv[i], "--calls"))
      calls = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bench"))
      benchCalls = std::atol(argv[i + 1]);
  }
  if (caseName) {
    runCalls(*findCase(caseName), calls ? calls : 1000);
    return 0;
  }
  if (benchCalls) {
    bench(benchCalls);
    return 0;
  }
  int failures = checkCounts();
  std::printf(failures ? "FAILED\n" : "PASSED\n");
  return failures ? 1 : 0;
}
