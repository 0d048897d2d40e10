// Cases of the load-balancing kernels (moe-lower-to-nvvm balance-kernels=true;
// lib/Conversion/MoEToGPU/RouterZLoss.cpp), for bench/gpu/ptxas_report.py:
// every function is a nospill_ one. The issue's expert counts (E = 64, 256),
// an odd one (E = 100: a partial last chunk of 32), a dynamic one, and the
// three logit types.

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
