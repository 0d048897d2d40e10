// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s

// A thread per row runs the row algorithm shared with the CPU kernel
// (kernels::emitTopkGradRow): the weights recomputed (max and Σ exp over the
// selection), Σ dw·w, every entry's -s_j c (logits without renormalization)
// or 0, then the selected entries. Leading dims are collapsed to rows.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @topk_renorm_grad_0(%{{.*}}: memref<?x64xbf16>, %{{.*}}: memref<?x8xi32>, %{{.*}}: memref<?x8xf32>, %{{.*}}: memref<?x64xf32>) kernel attributes {known_block_size = array<i32: 128, 1, 1>}
// CHECK: scf.if
// CHECK: arith.extf %{{.*}} : bf16 to f32
// CHECK: math.exp
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK: memref.store {{.*}} : memref<?x64xf32>
// CHECK: memref.store {{.*}} : memref<?x64xf32>
// CHECK: gpu.return
// CHECK-LABEL: func.func @grad_dense(
// CHECK: memref.collapse_shape %{{.*}} {{\[\[}}0, 1], [2]] : memref<2x?x64xbf16> into memref<?x64xbf16>
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@topk_renorm_grad_0
func.func @grad_dense(%s: tensor<2x?x64xbf16>, %i: tensor<2x?x8xi32>, %dw: tensor<2x?x8xf32>) -> tensor<2x?x64xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<2x?x8xf32>) renormalize(false) : tensor<2x?x64xbf16>, tensor<2x?x8xi32> -> tensor<2x?x64xf32>
  return %ds : tensor<2x?x64xf32>
}
