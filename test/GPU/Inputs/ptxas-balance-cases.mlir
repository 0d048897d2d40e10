// Cases of the load-balancing kernels (moe-lower-to-nvvm balance-kernels=true;
// RouterZLoss.cpp, RouterStats.cpp), for bench/gpu/ptxas_report.py:
// every function is a nospill_ one. The issue's expert counts (E = 64, 256),
// an odd one (E = 100: a partial last chunk of 32), a dynamic one, token
// masks, k = 2 and 8, and the three logit types.

func.func @nospill_z_loss_bf16_e64(%x: tensor<?x64xbf16>) -> tensor<f32> {
  %z = moe.router_z_loss %x : tensor<?x64xbf16> -> tensor<f32>
  return %z : tensor<f32>
}
func.func @nospill_z_loss_f32_dyn(%x: tensor<?x?xf32>) -> tensor<f32> {
  %z = moe.router_z_loss %x : tensor<?x?xf32> -> tensor<f32>
  return %z : tensor<f32>
}
func.func @nospill_z_loss_grad_f32_e256(%x: tensor<?x256xf32>, %d: tensor<f32>) -> tensor<?x256xf32> {
  %g = moe.router_z_loss_grad %x dloss(%d : tensor<f32>) : tensor<?x256xf32> -> tensor<?x256xf32>
  return %g : tensor<?x256xf32>
}
func.func @nospill_z_loss_grad_f16_e100(%x: tensor<?x100xf16>, %d: tensor<f32>) -> tensor<?x100xf32> {
  %g = moe.router_z_loss_grad %x dloss(%d : tensor<f32>) : tensor<?x100xf16> -> tensor<?x100xf32>
  return %g : tensor<?x100xf32>
}
func.func @nospill_stats_bf16_e64_k2_mask(%x: tensor<?x64xbf16>, %m: tensor<?xf32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %x token_mask(%m : tensor<?xf32>) k(2) : tensor<?x64xbf16> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
  return %c, %p, %w : tensor<64xf32>, tensor<64xf32>, tensor<f32>
}
func.func @nospill_stats_f32_e256_k8(%x: tensor<?x256xf32>) -> (tensor<256xf32>, tensor<256xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %x k(8) : tensor<?x256xf32> -> tensor<256xf32>, tensor<256xf32>, tensor<f32>
  return %c, %p, %w : tensor<256xf32>, tensor<256xf32>, tensor<f32>
}
func.func @nospill_stats_grad_f16_dyn_mask(%x: tensor<?x?xf16>, %m: tensor<?xf16>, %w: tensor<f32>, %g: tensor<?xf32>) -> tensor<?x?xf32> {
  %d = moe.router_stats_grad %x token_mask(%m : tensor<?xf16>) weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<?xf32>) : tensor<?x?xf16> -> tensor<?x?xf32>
  return %d : tensor<?x?xf32>
}
func.func @nospill_load_balancing_loss_e64(%c: tensor<64xf32>, %p: tensor<64xf32>, %w: tensor<f32>) -> tensor<f32> {
  %l = moe.load_balancing_loss %c, %p, %w : tensor<64xf32>, tensor<64xf32>, tensor<f32> -> tensor<f32>
  return %l : tensor<f32>
}
