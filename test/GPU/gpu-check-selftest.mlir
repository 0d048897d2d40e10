// UNSUPPORTED: cuda-gpu
// The sanitized build (scripts/sanitize.sh) has no torch extension, with which the sample of torch-op kernels is
// recorded, and the folder's host build uses the system compiler, not the instrumented one: the plain build runs it.
// UNSUPPORTED: asan
// REQUIRES: ptxas
// RUN: rm -rf %t && mkdir -p %t
// RUN: env MOE_BUILD_DIR=%moe_obj_root MOE_GPU_CHECK_BUILD=%t/build MOE_GPU_CHECK_SELFTEST_OUT=%t/out \
// RUN:   MOE_GPU_CHECK_TORCH_OPS=sample \
// RUN:   %moe_src_root/scripts/gpu-check.sh %t/folder 2>&1 | FileCheck %s
// RUN: ls %t/out | FileCheck %s --check-prefix=FILES
// RUN: ls %t/folder %t/folder/art %t/folder/bench | FileCheck %s --check-prefix=FOLDER

// The one GPU check command (scripts/gpu-check.sh builds build/gpu-check/,
// whose run.sh a person runs on the GPU machine), here without a GPU: the
// folder is built, the steps that need no GPU pass (manifests, the host build
// with cmake, the runtime's fake-driver test, the harness's unit tests) and
// every GPU step reports skipped, never passed. With a GPU this test does not
// run: build/gpu-check/run.sh is the real thing there. The torch extension is
// built and loaded exactly as on the GPU machine (the build and torch-ext
// steps; the folder once failed there on a header its sources lacked); of the
// torch ops' CUDA kernels only a sample is recorded and prebuilt
// (MOE_GPU_CHECK_TORCH_OPS=sample: seconds; all of them take ~10 minutes).

// CHECK: | artifacts | pass |
// CHECK: | build | pass |
// CHECK: | runtime-unit | pass |
// CHECK: | harness-unit | pass |
// CHECK: | torch-ext | pass |
// CHECK: | checks | skipped |
// CHECK: | checks-ptx | skipped |
// CHECK: | torch-ops | skipped |
// CHECK: | memcheck | skipped |
// CHECK: | racecheck | skipped |
// CHECK: | bench | skipped |
// CHECK: SKIPPED: no CUDA device visible to PyTorch (the GPU-free steps passed)

// FILES: logs.tar.gz
// FILES: summary.json
// FILES: summary.md

// FOLDER: CMakeLists.txt
// FOLDER: MANIFEST.json
// FOLDER: README.md
// FOLDER: gpu_check.py
// FOLDER: kernels
// FOLDER: run.sh
// FOLDER: src
// FOLDER: gpu-cases-ptx
// FOLDER: gpu-cases.manifest.json
// FOLDER: gpu-cases.o
// FOLDER: bench-cases-ptx
// FOLDER: bench-cases.manifest.json
// FOLDER: bench-cases.o
// FOLDER: cases.json
