// RUN: moe-opt %s --convert-moe-to-gpu | FileCheck %s

// Two warp-per-row GEMVs (butterfly sums); the second writes w and b directly.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @hyper_router_hidden_0(
// CHECK-COUNT-5: gpu.shuffle  xor
// CHECK: arith.maximumf
// CHECK: gpu.func @hyper_router_out_0(%{{.*}}: memref<4112x256xf32>, %{{.*}}: memref<?xf32>, %{{.*}}: memref<4112xf32>, %{{.*}}: memref<16x256xf32>, %{{.*}}: memref<16xf32>)
// CHECK-LABEL: func.func @hyper(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@hyper_router_hidden_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@hyper_router_out_0
// CHECK: gpu.dealloc async
func.func @hyper(%emb: tensor<256xf32>, %w1: tensor<256x256xf32>, %b1: tensor<256xf32>, %w2: tensor<4112x256xf32>, %b2: tensor<4112xf32>) -> (tensor<16x256xf32>, tensor<16xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(16) : tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<4112x256xf32>, tensor<4112xf32> -> tensor<16x256xf32>, tensor<16xf32>
  return %w, %b : tensor<16x256xf32>, tensor<16xf32>
}
