// REQUIRES: cuda-gpu, ptxas
// RUN: rm -rf %t && mkdir -p %t
// RUN: %python %moe_src_root/tools/moe-aot/moe-aot.py %S/Inputs/gpu-cases.mlir -o %t --moe-opt %moe_obj_root/bin/moe-opt --toolkit %cuda_toolkit --link --runtime-dir %moe_obj_root/lib
// RUN: %moe_python %S/run_gpu_tests.py --lib %t/libgpu-cases.so --runtime-dir %moe_obj_root/lib | FileCheck %s

// Every op on a real GPU against PyTorch (needs torch with CUDA in the
// project venv). Without a device this test is UNSUPPORTED, never passed.

// CHECK: PASS: topk_renorm
// CHECK: PASS: similarity_inform
// CHECK: PASS: attention_posterior
// CHECK: PASS: mad_dispersion
// CHECK: PASS: adjacency_update
// CHECK: PASS: hyper_router
// CHECK: 6 passed, 0 failed
