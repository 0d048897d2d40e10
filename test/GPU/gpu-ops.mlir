// REQUIRES: cuda-gpu, ptxas
// RUN: rm -rf %t && mkdir -p %t
// RUN: %python %moe_src_root/tools/moe-aot/moe-aot.py %S/Inputs/gpu-cases.mlir -o %t --moe-opt %moe_obj_root/bin/moe-opt --toolkit %cuda_toolkit --pipeline-options "balance-kernels=true" --link --runtime-dir %moe_obj_root/lib
// RUN: %moe_python %S/run_gpu_tests.py --lib %t/libgpu-cases.so --runtime-dir %moe_obj_root/lib | FileCheck %s

// Every op on a real GPU against PyTorch (needs torch with CUDA in the
// project venv). Without a device this test is UNSUPPORTED, never passed.

// The balance case's kernels are behind balance-kernels=true (off by
// default until this has passed on a GPU), as in scripts/gpu-check.sh.

// CHECK: PASS: topk_renorm
// CHECK: PASS: similarity_inform
// CHECK: PASS: similarity_inform_topk_mma
// CHECK: PASS: similarity_inform_grad
// CHECK: PASS: attention_posterior
// CHECK: PASS: attention_posterior_mma
// CHECK: PASS: attention_posterior_grad
// CHECK: PASS: mad_dispersion
// CHECK: PASS: adjacency_update
// CHECK: PASS: hyper_router
// CHECK: PASS: hyper_router_grad
// CHECK: PASS: route
// CHECK: PASS: dispatch_plan
// CHECK: PASS: balance
// CHECK: 14 passed, 0 failed
