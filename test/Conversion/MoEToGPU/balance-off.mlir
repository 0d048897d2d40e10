// RUN: moe-opt %s --convert-moe-to-gpu="balance-kernels=false" -split-input-file -verify-diagnostics

// The load-balancing kernels (balance.mlir) are on by default since an H100
// run checked them; balance-kernels=false must still give the previous
// behaviour: the ops keep the "no GPU lowering" error and stay in place.

func.func @z_loss(%x: tensor<?x64xf32>) -> tensor<f32> {
  // expected-error @+1 {{'moe.router_z_loss' op has no GPU lowering}}
  %z = moe.router_z_loss %x : tensor<?x64xf32> -> tensor<f32>
  return %z : tensor<f32>
}

// -----

func.func @z_loss_grad(%x: tensor<?x64xf32>, %d: tensor<f32>) -> tensor<?x64xf32> {
  // expected-error @+1 {{'moe.router_z_loss_grad' op has no GPU lowering}}
  %g = moe.router_z_loss_grad %x dloss(%d : tensor<f32>) : tensor<?x64xf32> -> tensor<?x64xf32>
  return %g : tensor<?x64xf32>
}

// -----

func.func @stats(%x: tensor<?x64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{'moe.router_stats' op has no GPU lowering}}
  %c, %p, %w = moe.router_stats %x k(2) : tensor<?x64xf32> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
  return %c : tensor<64xf32>
}

// -----

func.func @stats_grad(%x: tensor<?x8xf32>, %w: tensor<f32>, %g: tensor<8xf32>) -> tensor<?x8xf32> {
  // expected-error @+1 {{'moe.router_stats_grad' op has no GPU lowering}}
  %d = moe.router_stats_grad %x weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<8xf32>) : tensor<?x8xf32> -> tensor<?x8xf32>
  return %d : tensor<?x8xf32>
}

// -----

func.func @lbl(%c: tensor<8xf32>, %p: tensor<8xf32>, %w: tensor<f32>) -> tensor<f32> {
  // expected-error @+1 {{'moe.load_balancing_loss' op has no GPU lowering}}
  %l = moe.load_balancing_loss %c, %p, %w : tensor<8xf32>, tensor<8xf32>, tensor<f32> -> tensor<f32>
  return %l : tensor<f32>
}
