// The GPU kernels of moe.topk_renorm and moe.route with their indices written as i64: the kernels select in i32
// as for i32 results and sign-extend each index at its store into the i64 buffer (KernelBuilder::asElementOf; the
// store of an i32 into the i64 memref would not verify; an i32 result's code is unchanged: topk_renorm.mlir,
// route.mlir). The register top-k (K = 16), the rounds over a wide row (K = 256), the route kernel of either map.
// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu="route-map=warp" -split-input-file | FileCheck %s --check-prefix=WARP

// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK-SAME: memref<?x2xi64>
// CHECK: memref.store %{{.*}} : memref<?x2xi64>
// CHECK: func.func @topk16
func.func @topk16(%s: tensor<?x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi64>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi64>
}

// -----

// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK-SAME: memref<?x8xi64>
// CHECK: memref.store %{{.*}} : memref<?x8xi64>
// CHECK: func.func @topk256
func.func @topk256(%s: tensor<?x256xbf16>) -> (tensor<?x8xf32>, tensor<?x8xi64>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x256xbf16> -> tensor<?x8xf32>, tensor<?x8xi64>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi64>
}

// -----

// CHECK-LABEL: gpu.func @route_lanes
// CHECK-SAME: memref<?x8xi64>
// CHECK: memref.store %{{.*}} : memref<?x8xi64>
// CHECK: func.func @dsv3
// WARP-LABEL: gpu.func @route_warp
// WARP-SAME: memref<?x8xi64>
// WARP: memref.store %{{.*}} : memref<?x8xi64>
// WARP: func.func @dsv3
func.func @dsv3(%l: tensor<?x256xf32>, %b: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi64>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true)
      routed_scaling_factor(2.5) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi64>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi64>
}
