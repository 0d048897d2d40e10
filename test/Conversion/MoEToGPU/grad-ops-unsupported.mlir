// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file -verify-diagnostics

// attention_posterior_grad has no GPU kernel yet (the torch op runs its eager
// reference on CUDA tensors; the other backward ops have their own tests): the
// pass names the op instead of crashing or leaving it silently.

// similarity_inform_grad has a GPU lowering (similarity_inform_grad.mlir) for
// a static expert count up to the flash kernel's register accumulator
// (kFlashMaxExperts = 256), as the forward; beyond it the op is refused.

func.func @similarity_inform_grad_wide(%u: tensor<1x8x4xf32>, %e: tensor<1x8x300xf32>, %dp: tensor<1x8x300xf32>)
    -> tensor<1x8x4xf32> {
  // expected-error @+1 {{'moe.similarity_inform_grad' op GPU lowering needs a static expert count <= 256 (got 300)}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x300xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x300xf32> -> tensor<1x8x4xf32>, tensor<1x8x300xf32>
  return %du : tensor<1x8x4xf32>
}

// -----

func.func @similarity_inform_grad_dynamic_k(%u: tensor<1x8x4xf32>, %e: tensor<1x8x?xf32>, %dp: tensor<1x8x?xf32>)
    -> tensor<1x8x4xf32> {
  // expected-error @+1 {{'moe.similarity_inform_grad' op GPU lowering needs a static expert count <= 256 (got ?)}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x?xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x?xf32> -> tensor<1x8x4xf32>, tensor<1x8x?xf32>
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
