// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// topk_renorm_grad: rows in blocks of 32 over the workers; per row the selected values are read through the
// indices (clamped), the forward's weights recomputed (kernels::topkWeight, the polynomial exp), and the gradient
// written: zeros, then the selected entries under an in-range guard. With a static k in [4, 16] the k selections sit
// in the lanes of one vector (8 lanes up to k = 8, else 16; one exp, vector reductions) and the row is written in
// vectors; the stores at the selected entries stay scalar, in index order.

// CHECK-LABEL: func.func @logits_renormalized
// CHECK-SAME: %[[S:[^:]+]]: tensor<4x128x16xf32>, %[[I:[^:]+]]: tensor<4x128x4xi32>, %[[DW:[^:]+]]: tensor<4x128x4xf32>
// CHECK: %[[EMPTY:.+]] = tensor.empty() : tensor<4x128x16xf32>
// CHECK: %[[R:.+]] = moe.kernel ins(%[[S]], %[[I]], %[[DW]] : {{.*}}) outs(%[[EMPTY]] : tensor<4x128x16xf32>)
// CHECK-NEXT: ^bb0(%{{[^:]+}}: memref<4x128x16xf32>, %{{[^:]+}}: memref<4x128x4xi32>, %{{[^:]+}}: memref<4x128x4xf32>, %[[OUT:[^:]+]]: memref<4x128x16xf32>):
// CHECK: %[[OUT2:.+]] = memref.collapse_shape %[[OUT]] {{\[\[}}0, 1], [2]]
// CHECK: scf.parallel
// CHECK: %[[V0:.+]] = vector.insert %{{.+}}, %{{.+}} [0] : f32 into vector<8xf32>
// CHECK: vector.insert %{{.+}}, %{{.+}} [1] : f32 into vector<8xf32>
// CHECK: vector.insert %{{.+}}, %{{.+}} [2] : f32 into vector<8xf32>
// CHECK: %[[V3:.+]] = vector.insert %{{.+}}, %{{.+}} [3] : f32 into vector<8xf32>
// CHECK-NOT: vector.insert
// CHECK: vector.reduction <maximumf>, %[[V3]] : vector<8xf32> into f32
// CHECK-NOT: math.exp
// CHECK: vector.reduction <add>
// CHECK: vector.maskedstore %[[OUT2]]
// CHECK: scf.if
// CHECK-NEXT: %[[D0:.+]] = vector.extract %[[D:.+]][0] : f32 from vector<8xf32>
// CHECK-NEXT: memref.store %[[D0]], %[[OUT2]]
// CHECK: scf.if
// CHECK-NEXT: %[[D1:.+]] = vector.extract %[[D]][1] : f32 from vector<8xf32>
// CHECK-NEXT: memref.store %[[D1]], %[[OUT2]]
// CHECK: } -> tensor<4x128x16xf32>
// CHECK: return %[[R]]
func.func @logits_renormalized(%s: tensor<4x128x16xf32>, %i: tensor<4x128x4xi32>, %dw: tensor<4x128x4xf32>)
    -> tensor<4x128x16xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<4x128x4xf32>)
      : tensor<4x128x16xf32>, tensor<4x128x4xi32> -> tensor<4x128x16xf32>
  return %ds : tensor<4x128x16xf32>
}

// Logits without renormalization: the dense softmax of the row (max and sum over the K = 8 experts, bf16 read as
// f32, in vectors) feeds -s_j c (the selection's own max and sum are not needed, and not emitted).
// CHECK-LABEL: func.func @logits_raw_dynamic
// CHECK: scf.parallel
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (vector<8xf32>)
// CHECK: vector.maskedload %{{.+}} : memref<?x8xbf16>, vector<8xi1>, vector<8xbf16> into vector<8xbf16>
// CHECK: arith.maximumf
// CHECK-NOT: math.exp
// CHECK: return %{{.+}} : tensor<?x8xf32>
func.func @logits_raw_dynamic(%s: tensor<?x8xbf16>, %i: tensor<?x5xi32>, %dw: tensor<?x5xf32>) -> tensor<?x8xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<?x5xf32>) renormalize(false)
      : tensor<?x8xbf16>, tensor<?x5xi32> -> tensor<?x8xf32>
  return %ds : tensor<?x8xf32>
}

// A dynamic k, k < 4 or k > 16: the k-long scalar loops of kernels::emitTopkGradRow.
// CHECK-LABEL: func.func @dynamic_k
// CHECK: scf.parallel
// CHECK-NOT: vector.insert
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (f32)
// CHECK: arith.maximumf %{{.+}}, %{{.+}} : f32
// CHECK: return
func.func @dynamic_k(%s: tensor<?x64xf32>, %i: tensor<?x?xi32>, %dw: tensor<?x?xf32>) -> tensor<?x64xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<?x?xf32>) : tensor<?x64xf32>, tensor<?x?xi32> -> tensor<?x64xf32>
  return %ds : tensor<?x64xf32>
}

// CHECK-LABEL: func.func @k_below_4
// CHECK: scf.parallel
// CHECK-NOT: vector.insert
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (f32)
// CHECK: return
func.func @k_below_4(%s: tensor<?x8xf32>, %i: tensor<?x2xi32>, %dw: tensor<?x2xf32>) -> tensor<?x8xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<?x2xf32>) : tensor<?x8xf32>, tensor<?x2xi32> -> tensor<?x8xf32>
  return %ds : tensor<?x8xf32>
}

// CHECK-LABEL: func.func @k_above_16
// CHECK: scf.parallel
// CHECK-NOT: vector.insert
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (f32)
// CHECK: return
func.func @k_above_16(%s: tensor<?x64xf32>, %i: tensor<?x17xi32>, %dw: tensor<?x17xf32>) -> tensor<?x64xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<?x17xf32>) mode(probs)
      : tensor<?x64xf32>, tensor<?x17xi32> -> tensor<?x64xf32>
  return %ds : tensor<?x64xf32>
}

// Rank-1 scores are left to the portable lowering.
// CHECK-LABEL: func.func @rank_one
// CHECK: moe.topk_renorm_grad
func.func @rank_one(%s: tensor<8xf32>, %i: tensor<2xi32>, %dw: tensor<2xf32>) -> tensor<8xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<2xf32>) mode(probs) : tensor<8xf32>, tensor<2xi32> -> tensor<8xf32>
  return %ds : tensor<8xf32>
}
