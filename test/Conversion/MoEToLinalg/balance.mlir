// RUN: moe-opt %s --convert-moe-to-linalg --split-input-file | FileCheck %s

// router_stats, portably: row max and Σ exp (reductions over E), the shift of p, Σ_t w·p as a reduction over the
// tokens, Σ w, the selection of moe.topk_renorm (created and lowered by its own pattern) counted by a reduction
// over [T, k, E], and P / W. No moe op is left.

// CHECK-LABEL: func.func @router_stats
// CHECK-NOT: moe.
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]} ins(%[[L:.+]] : tensor<?x64xf32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]} ins(%[[L]], %{{.+}} : tensor<?x64xf32>, tensor<?xf32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["reduction", "parallel"]} ins(%[[L]], %{{.+}}, %{{.+}} : tensor<?x64xf32>, tensor<?xf32>, tensor<?xf32>) outs(%{{.+}} : tensor<64xf32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["reduction"]} {{.*}} outs(%{{.+}} : tensor<f32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["reduction", "reduction", "parallel"]} ins(%{{.+}} : tensor<?x8xi32>, tensor<?xf32>) outs(%{{.+}} : tensor<64xf32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel"]} ins(%{{.+}}, %{{.+}} : tensor<64xf32>, tensor<f32>)
// CHECK-NOT: moe.
func.func @router_stats(%l: tensor<?x64xf32>, %m: tensor<?xf32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<?xf32>) k(8)
      : tensor<?x64xf32> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
  return %c, %p, %w : tensor<64xf32>, tensor<64xf32>, tensor<f32>
}

// -----

// The Switch loss from the statistics: Σ_e (c/W)·P over E, then · E.

// CHECK-LABEL: func.func @load_balancing_loss
// CHECK: linalg.generic {{.*}} iterator_types = ["reduction"]} ins(%{{.+}}, %{{.+}}, %{{.+}} : tensor<8xf32>, tensor<8xf32>, tensor<f32>) outs(%{{.+}} : tensor<f32>)
// CHECK: arith.divf
// CHECK: arith.mulf
// CHECK: linalg.generic {{.*}} iterator_types = []} ins(%{{.+}} : tensor<f32>)
// CHECK-NOT: moe.
func.func @load_balancing_loss(%c: tensor<8xf32>, %p: tensor<8xf32>, %w: tensor<f32>) -> tensor<f32> {
  %l = moe.load_balancing_loss %c, %p, %w : tensor<8xf32>, tensor<8xf32>, tensor<f32> -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Every other balance op lowers to linalg (no moe op left).

// CHECK-LABEL: func.func @others
// CHECK-NOT: moe.
// CHECK: return
func.func @others(%l: tensor<?x16xf16>, %w: tensor<f32>, %g: tensor<16xf32>, %d: tensor<f32>,
                  %s: tensor<?x?x16xf32>, %i: tensor<?x?x4xi32>)
    -> (tensor<?x16xf32>, tensor<f32>, tensor<?x16xf32>, tensor<f32>, tensor<?x?x16xf32>) {
  %a = moe.router_stats_grad %l weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<16xf32>)
      : tensor<?x16xf16> -> tensor<?x16xf32>
  %z = moe.router_z_loss %l : tensor<?x16xf16> -> tensor<f32>
  %zg = moe.router_z_loss_grad %l dloss(%d : tensor<f32>) : tensor<?x16xf16> -> tensor<?x16xf32>
  %sl = moe.sequence_balance_loss %s, %i : tensor<?x?x16xf32>, tensor<?x?x4xi32> -> tensor<f32>
  %sg = moe.sequence_balance_loss_grad %s, %i dloss(%d : tensor<f32>)
      : tensor<?x?x16xf32>, tensor<?x?x4xi32> -> tensor<?x?x16xf32>
  return %a, %z, %zg, %sl, %sg : tensor<?x16xf32>, tensor<f32>, tensor<?x16xf32>, tensor<f32>, tensor<?x?x16xf32>
}
