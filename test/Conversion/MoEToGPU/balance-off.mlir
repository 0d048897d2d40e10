// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file -verify-diagnostics

// The load-balancing kernels are written without a GPU and stay behind the
// balance-kernels option until a GPU run has checked them (balance.mlir):
// without it the ops keep the "no GPU lowering" error and stay in place.

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
