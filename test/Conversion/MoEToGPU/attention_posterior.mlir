// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file -verify-diagnostics | FileCheck %s

// min_entropy: the head selection is its own reduction phase (partial entropy
// sums per block in a fixed order, then a per-sequence argmin), then the head
// means with their bias, then the flash posterior reading h* from device
// memory; the fused op selects the experts in the flash epilogue.

// The entropy: a warp a row in one pass over its scores, 128 a step (4
// loads a lane), each lane's online (max, sum, weighted sum) in the step
// loop's carried values, the weights on the SFU (ex2.approx), then the lanes'
// states merged by a butterfly of three shuffles a step.
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @attention_entropy_0(%[[S:[^:]+]]: memref<2x8x128x128xf32>, %{{.*}}: memref<?x?x?xf32>, %{{.*}}: memref<?x?x?xf32>) workgroup(
// CHECK: scf.for {{.*}} step %c128 iter_args({{.*}}) -> (f32, f32, f32)
// CHECK-COUNT-4: memref.load %[[S]]
// CHECK-NOT: memref.load %[[S]]
// CHECK-COUNT-5: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// CHECK: scf.yield
// CHECK-NOT: memref.load %[[S]]
// CHECK-COUNT-3: gpu.shuffle  xor %{{.+}}, %c1_i32
// CHECK: math.log
// CHECK: gpu.barrier
// CHECK: gpu.func @attention_head_select_0(
// CHECK: arith.cmpf uno
// CHECK: arith.cmpf olt
// CHECK: memref.store %{{.*}} : memref<2xi32>
// CHECK: gpu.func @attention_head_means_0(
// CHECK: memref.load %{{.*}} : memref<2xi32>
// CHECK: gpu.func @attention_posterior_topk_0(%{{.*}}: memref<2x128x512xf32>, %{{.*}}: memref<?x?x?xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<2x8x128x128xf32>, %{{.*}}: memref<2xi32>, %{{.*}}: memref<2x128x2xf32>, %{{.*}}: memref<2x128x2xi32>) workgroup(
// CHECK: memref.load %{{.*}} : memref<2xi32>
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (i64, f32, f32)
// CHECK-LABEL: func.func @attn_topk(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_entropy_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_head_select_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_head_means_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_posterior_topk_0
// CHECK-NOT: memref<2x128x128xf32>
// CHECK: gpu.wait [
func.func @attn_topk(%s: tensor<2x8x128x128xf32>, %u: tensor<2x128x512xf32>, %v: tensor<2x8x128x64xf32>, %wo: tensor<512x512xf32>, %e: tensor<2x128x16xf32>) -> (tensor<2x128x2xf32>, tensor<2x128x2xi32>, tensor<2xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) sigma(2.000000e+00) : tensor<2x8x128x128xf32>, tensor<2x128x512xf32>, tensor<2x8x128x64xf32>, tensor<512x512xf32>, tensor<2x128x16xf32> -> tensor<2x128x2xf32>, tensor<2x128x2xi32>, tensor<2xi32>
  return %w, %i, %h : tensor<2x128x2xf32>, tensor<2x128x2xi32>, tensor<2xi32>
}

// -----

func.func @attn_all(%s: tensor<2x8x16x16xf32>, %u: tensor<2x16x32xf32>, %v: tensor<2x8x16x4xf32>, %wo: tensor<32x32xf32>, %e: tensor<2x16x4xf32>) -> (tensor<2x16x4xf32>, tensor<2xi32>) {
  // expected-error @+1 {{GPU lowering supports head_select = min_entropy only}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all) : tensor<2x8x16x16xf32>, tensor<2x16x32xf32>, tensor<2x8x16x4xf32>, tensor<32x32xf32>, tensor<2x16x4xf32> -> tensor<2x16x4xf32>, tensor<2xi32>
  return %p, %h : tensor<2x16x4xf32>, tensor<2xi32>
}
