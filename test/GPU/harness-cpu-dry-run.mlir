// RUN: env MOE_BUILD_DIR=%moe_obj_root %moe_python %S/run_gpu_tests.py --cpu-dry-run %S/Inputs/gpu-cases.mlir 2>&1 | FileCheck %s

// The GPU harness's cases and float64 references without a GPU: the same
// functions (Inputs/gpu-cases.mlir) compiled for the CPU by the execution
// API, checked by the same code that checks the GPU kernels. A wrong
// reference or a case that cannot pass shows here before any GPU run.

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
// CHECK: 14 passed, 0 failed (CPU dry run)
