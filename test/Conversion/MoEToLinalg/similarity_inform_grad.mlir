// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s --check-prefix=NO-NXN

// The portable backward of similarity_inform: the forward's key loop recomputes the row statistics, then a second
// scf.for over the keys accumulates dq and writes the rows de[:, j] and dk[:, j]; nothing N x N (128 x 128).
// NO-NXN-NOT: 128x128

// CHECK-LABEL: func.func @streams_keys_twice
// CHECK-SAME: %[[U:[^:]+]]: tensor<2x128x64xf32>, %[[E:[^:]+]]: tensor<2x128x16xf32>, %[[DP:[^:]+]]: tensor<2x128x16xf32>
// The forward's online softmax.
// CHECK: scf.for
// CHECK: math.exp
// CHECK: scf.yield
// lse' = m + log(l), +inf without keys; delta = <dp_i, p_i>.
// CHECK: math.log
// CHECK: arith.constant 0x7F800000 : f32
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[DP]], %{{.+}} : tensor<2x128x16xf32>, tensor<2x128x16xf32>)
// The backward key loop: dq, de, dk and four [B, N] scratch rows.
// CHECK: scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step %{{.+}} iter_args(
// CHECK-SAME: -> (tensor<2x128x64xf32>, tensor<2x128x16xf32>, tensor<2x128x64xf32>, tensor<2x128xf32>, tensor<2x128xf32>, tensor<2x128xf32>, tensor<2x128xf32>)
// CHECK: math.exp
// CHECK: tensor.insert_slice %{{.+}} into %{{.+}}[0, %[[J]], 0] [2, 1, 16] [1, 1, 1] : tensor<2x16xf32> into tensor<2x128x16xf32>
// CHECK: tensor.insert_slice %{{.+}} into %{{.+}}[0, %[[J]], 0] [2, 1, 64] [1, 1, 1] : tensor<2x64xf32> into tensor<2x128x64xf32>
// CHECK: scf.yield
// du = dq + dk.
// CHECK: arith.addf
// CHECK: return
func.func @streams_keys_twice(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>, %dp: tensor<2x128x16xf32>)
    -> (tensor<2x128x64xf32>, tensor<2x128x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x128x16xf32>)
      : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>
  return %du, %de : tensor<2x128x64xf32>, tensor<2x128x16xf32>
}

// ws: du adds dq · ws^T to dk (a contraction over D), dws = Σ u^T dq; key_mask and causal enter the logits.
// CHECK-LABEL: func.func @ws_mask_causal
// CHECK: arith.cmpi ule
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction", "reduction"]}
// CHECK: return %{{.+}}, %{{.+}}, %{{.+}} : tensor<?x?x8xf32>, tensor<?x?x4xf32>, tensor<8x8xf32>
func.func @ws_mask_causal(%u: tensor<?x?x8xf16>, %e: tensor<?x?x4xf32>, %ws: tensor<8x8xf32>, %m: tensor<?x?xi1>,
                          %dp: tensor<?x?x4xf32>) -> (tensor<?x?x8xf32>, tensor<?x?x4xf32>, tensor<8x8xf32>) {
  %du, %de, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<8x8xf32>) key_mask(%m : tensor<?x?xi1>)
      dp(%dp : tensor<?x?x4xf32>) tau(2.0) causal(true)
      : tensor<?x?x8xf16>, tensor<?x?x4xf32> -> tensor<?x?x8xf32>, tensor<?x?x4xf32>, tensor<8x8xf32>
  return %du, %de, %dws : tensor<?x?x8xf32>, tensor<?x?x4xf32>, tensor<8x8xf32>
}
