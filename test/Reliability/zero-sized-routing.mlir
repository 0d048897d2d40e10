// Issue #15: the production routing ops with a zero-sized dimension (no token; no slot per token) lower through
// the CPU pipelines, verify after every pass and leave no moe op; the values are checked at run time by
// zero-sized-dynamic.mlir and unittests/Runtime/ZeroSizedTest.cpp. moe-legalize-shapes rewrites a route over no
// token into empty results; dispatch_plan over no assignment lowers on the GPU too (its counting and scatter
// kernels get empty grids, the scan still writes zero counts and the -1 block experts).
// RUN: moe-opt %s -split-input-file --convert-moe-to-linalg | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-lower-to-llvm | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-lower-to-llvm=cpu-kernels=false | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-lower-to-nvvm="chip=sm_90 format=isa" 2>&1 | FileCheck %s --check-prefix=GPU

// GPU-NOT: error
// GPU-NOT: moe.{{[a-z_]+}} 

// CHECK-LABEL: @route_t0
// CHECK-NOT: moe.
func.func @route_t0(%l: tensor<0x8xf32>) -> (tensor<0x2xf32>, tensor<0x2xi32>) {
  %w, %i = moe.route %l k(2) renormalize(true) : tensor<0x8xf32> -> tensor<0x2xf32>, tensor<0x2xi32>
  return %w, %i : tensor<0x2xf32>, tensor<0x2xi32>
}

// -----

// CHECK-LABEL: @route_grouped_biased_t0
// CHECK-NOT: moe.
func.func @route_grouped_biased_t0(%l: tensor<0x8xf32>, %b: tensor<8xf32>) -> (tensor<0x2xf32>, tensor<0x2xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<8xf32>) k(2) scoring(sigmoid) n_group(4) topk_group(2) renormalize(true)
      routed_scaling_factor(2.5) : tensor<0x8xf32> -> tensor<0x2xf32>, tensor<0x2xi32>
  return %w, %i : tensor<0x2xf32>, tensor<0x2xi32>
}

// -----

// CHECK-LABEL: @plan_t0
// CHECK-NOT: moe.
func.func @plan_t0(%idx: tensor<0x2xi32>) -> (tensor<3xi32>, tensor<4xi32>, tensor<0xi32>, tensor<0xi32>, tensor<3xi32>,
                                              tensor<2xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(3) block_size(2)
      : tensor<0x2xi32> -> tensor<3xi32>, tensor<4xi32>, tensor<0xi32>, tensor<0xi32>, tensor<3xi32>, tensor<2xi32>,
        tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n
      : tensor<3xi32>, tensor<4xi32>, tensor<0xi32>, tensor<0xi32>, tensor<3xi32>, tensor<2xi32>, tensor<1xi32>
}

// -----

// CHECK-LABEL: @plan_k0
// CHECK-NOT: moe.
func.func @plan_k0(%idx: tensor<4x0xi32>) -> (tensor<3xi32>, tensor<4xi32>, tensor<0xi32>, tensor<0xi32>, tensor<0xi32>,
                                              tensor<0xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(3)
      : tensor<4x0xi32> -> tensor<3xi32>, tensor<4xi32>, tensor<0xi32>, tensor<0xi32>, tensor<0xi32>, tensor<0xi32>,
        tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n
      : tensor<3xi32>, tensor<4xi32>, tensor<0xi32>, tensor<0xi32>, tensor<0xi32>, tensor<0xi32>, tensor<1xi32>
}
