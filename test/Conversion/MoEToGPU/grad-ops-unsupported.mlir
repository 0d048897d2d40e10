// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file -verify-diagnostics

// The backward ops other than topk_renorm_grad and hyper_router_grad (topk_renorm_grad.mlir, hyper_router_grad.mlir)
// have no GPU kernels yet (the torch ops run their eager references on CUDA tensors): the pass names the op instead
// of crashing or leaving it silently.

func.func @similarity_inform_grad(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf32>)
    -> tensor<1x8x4xf32> {
  // expected-error @+1 {{'moe.similarity_inform_grad' op has no GPU lowering}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x3xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>
  return %du : tensor<1x8x4xf32>
}

// -----

func.func @attention_posterior_grad(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                    %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>, %h: tensor<1xi32>,
                                    %dp: tensor<1x4x3xf32>) -> tensor<1x4x6xf32> {
  // expected-error @+1 {{'moe.attention_posterior_grad' op has no GPU lowering}}
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>)
      dp(%dp : tensor<1x4x3xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return %du : tensor<1x4x6xf32>
}
