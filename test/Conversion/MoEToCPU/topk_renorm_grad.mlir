// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// topk_renorm_grad: rows in blocks of 32 over the workers; per row the selected values are read through the
// indices (clamped), the forward's weights recomputed (kernels::topkWeight, the polynomial exp), and the gradient
// written: zeros, then the selected entries under an in-range guard.

// CHECK-LABEL: func.func @logits_renormalized
// CHECK-SAME: %[[S:[^:]+]]: tensor<4x128x16xf32>, %[[I:[^:]+]]: tensor<4x128x2xi32>, %[[DW:[^:]+]]: tensor<4x128x2xf32>
// CHECK: %[[EMPTY:.+]] = tensor.empty() : tensor<4x128x16xf32>
// CHECK: %[[R:.+]] = moe.kernel ins(%[[S]], %[[I]], %[[DW]] : {{.*}}) outs(%[[EMPTY]] : tensor<4x128x16xf32>)
// CHECK-NEXT: ^bb0(%{{[^:]+}}: memref<4x128x16xf32>, %{{[^:]+}}: memref<4x128x2xi32>, %{{[^:]+}}: memref<4x128x2xf32>, %[[OUT:[^:]+]]: memref<4x128x16xf32>):
// CHECK: memref.collapse_shape %[[OUT]] {{\[\[}}0, 1], [2]]
// CHECK: scf.parallel
// CHECK: arith.maximumf
// CHECK-NOT: math.exp
// CHECK: scf.if
// CHECK: memref.store
// CHECK: } -> tensor<4x128x16xf32>
// CHECK: return %[[R]]
func.func @logits_renormalized(%s: tensor<4x128x16xf32>, %i: tensor<4x128x2xi32>, %dw: tensor<4x128x2xf32>)
    -> tensor<4x128x16xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<4x128x2xf32>)
      : tensor<4x128x16xf32>, tensor<4x128x2xi32> -> tensor<4x128x16xf32>
  return %ds : tensor<4x128x16xf32>
}

// Logits without renormalization: the dense softmax of the row (max and sum over the K = 8 experts) feeds -s_j c
// (the selection's own max and sum are not needed, and not emitted).
// CHECK-LABEL: func.func @logits_raw_dynamic
// CHECK: scf.parallel
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (f32)
// CHECK: memref.load %{{.+}} : memref<?x8xbf16>
// CHECK: arith.maximumf
// CHECK-NOT: math.exp
// CHECK: return %{{.+}} : tensor<?x8xf32>
func.func @logits_raw_dynamic(%s: tensor<?x8xbf16>, %i: tensor<?x3xi32>, %dw: tensor<?x3xf32>) -> tensor<?x8xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<?x3xf32>) renormalize(false)
      : tensor<?x8xbf16>, tensor<?x3xi32> -> tensor<?x8xf32>
  return %ds : tensor<?x8xf32>
}

// Rank-1 scores are left to the portable lowering.
// CHECK-LABEL: func.func @rank_one
// CHECK: moe.topk_renorm_grad
func.func @rank_one(%s: tensor<8xf32>, %i: tensor<2xi32>, %dw: tensor<2xf32>) -> tensor<8xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<2xf32>) mode(probs) : tensor<8xf32>, tensor<2xi32> -> tensor<8xf32>
  return %ds : tensor<8xf32>
}
