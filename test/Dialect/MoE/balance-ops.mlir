// Round trip of the load-balancing ops (MoEBalanceOps.td): print, parse and print again must agree, in the custom
// form and through the generic form; the result types are inferred.
// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC

// CHECK-LABEL: func.func @router_stats
func.func @router_stats(%l: tensor<?x8xbf16>) -> (tensor<8xf32>, tensor<8xf32>, tensor<f32>) {
  // CHECK: %{{.*}}, %{{.*}}, %{{.*}} = moe.router_stats %{{.*}} k(2) : tensor<?x8xbf16> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
  // GENERIC: "moe.router_stats"(%{{.*}}) <{k = 2 : i64}> : (tensor<?x8xbf16>) -> (tensor<8xf32>, tensor<8xf32>, tensor<f32>)
  %c, %p, %w = moe.router_stats %l k(2) : tensor<?x8xbf16> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
  return %c, %p, %w : tensor<8xf32>, tensor<8xf32>, tensor<f32>
}

// CHECK-LABEL: func.func @router_stats_masked
func.func @router_stats_masked(%l: tensor<16x8xf32>, %m: tensor<16xf16>) -> tensor<8xf32> {
  // CHECK: moe.router_stats %{{.*}} token_mask(%{{.*}} : tensor<16xf16>) k(8) : tensor<16x8xf32>
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<16xf16>) k(8)
      : tensor<16x8xf32> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
  return %p : tensor<8xf32>
}

// CHECK-LABEL: func.func @router_stats_grad
func.func @router_stats_grad(%l: tensor<?x8xf32>, %m: tensor<?xf32>, %w: tensor<f32>, %g: tensor<8xf32>)
    -> tensor<?x8xf32> {
  // CHECK: moe.router_stats_grad %{{.*}} token_mask(%{{.*}} : tensor<?xf32>) weight_sum(%{{.*}} : tensor<f32>)
  // CHECK-SAME: dmean_probs(%{{.*}} : tensor<8xf32>) : tensor<?x8xf32> -> tensor<?x8xf32>
  %d = moe.router_stats_grad %l token_mask(%m : tensor<?xf32>) weight_sum(%w : tensor<f32>)
      dmean_probs(%g : tensor<8xf32>) : tensor<?x8xf32> -> tensor<?x8xf32>
  return %d : tensor<?x8xf32>
}

// CHECK-LABEL: func.func @load_balancing_loss
func.func @load_balancing_loss(%l: tensor<?x8xf32>) -> tensor<f32> {
  %c, %p, %w = moe.router_stats %l k(2) : tensor<?x8xf32> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
  // CHECK: moe.load_balancing_loss %{{.*}}, %{{.*}}, %{{.*}} : tensor<8xf32>, tensor<8xf32>, tensor<f32> -> tensor<f32>
  %loss = moe.load_balancing_loss %c, %p, %w : tensor<8xf32>, tensor<8xf32>, tensor<f32> -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: func.func @router_z_loss
func.func @router_z_loss(%l: tensor<?x64xf16>, %d: tensor<f32>) -> (tensor<f32>, tensor<?x64xf32>) {
  // CHECK: moe.router_z_loss %{{.*}} : tensor<?x64xf16> -> tensor<f32>
  %z = moe.router_z_loss %l : tensor<?x64xf16> -> tensor<f32>
  // CHECK: moe.router_z_loss_grad %{{.*}} dloss(%{{.*}} : tensor<f32>) : tensor<?x64xf16> -> tensor<?x64xf32>
  %dl = moe.router_z_loss_grad %l dloss(%d : tensor<f32>) : tensor<?x64xf16> -> tensor<?x64xf32>
  return %z, %dl : tensor<f32>, tensor<?x64xf32>
}

// CHECK-LABEL: func.func @sequence_balance_loss
func.func @sequence_balance_loss(%s: tensor<?x?x16xf32>, %i: tensor<?x?x4xi64>, %d: tensor<f32>)
    -> (tensor<f32>, tensor<?x?x16xf32>) {
  // CHECK: moe.sequence_balance_loss %{{.*}}, %{{.*}} : tensor<?x?x16xf32>, tensor<?x?x4xi64> -> tensor<f32>
  %l = moe.sequence_balance_loss %s, %i : tensor<?x?x16xf32>, tensor<?x?x4xi64> -> tensor<f32>
  // CHECK: moe.sequence_balance_loss_grad %{{.*}}, %{{.*}} dloss(%{{.*}} : tensor<f32>)
  // CHECK-SAME: : tensor<?x?x16xf32>, tensor<?x?x4xi64> -> tensor<?x?x16xf32>
  %ds = moe.sequence_balance_loss_grad %s, %i dloss(%d : tensor<f32>)
      : tensor<?x?x16xf32>, tensor<?x?x4xi64> -> tensor<?x?x16xf32>
  return %l, %ds : tensor<f32>, tensor<?x?x16xf32>
}
