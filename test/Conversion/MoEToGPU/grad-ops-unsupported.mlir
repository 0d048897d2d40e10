// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file -verify-diagnostics

// Every backward op has a GPU lowering (its own test file); what their GPU
// kernels do not take is refused with a diagnostic naming the op, as the
// forward ops' (the torch ops run their eager references on CUDA tensors
// there), instead of crashing or leaving the op silently.

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

// attention_posterior_grad has a GPU lowering (attention_posterior_grad.mlir)
// for head_select = min_entropy and a static expert count up to 256, as its
// forward; the rest is refused with the forward's diagnostics.

func.func @attention_posterior_grad_all(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                        %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>,
                                        %dp: tensor<1x4x3xf32>) -> tensor<1x4x6xf32> {
  // expected-error @+1 {{'moe.attention_posterior_grad' op GPU lowering supports head_select = min_entropy only (use the portable lowering for head_select = all)}}
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e
      dp(%dp : tensor<1x4x3xf32>) head_select(all)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return %du : tensor<1x4x6xf32>
}

// -----

func.func @attention_posterior_grad_wide(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                         %wo: tensor<6x6xf32>, %e: tensor<1x4x300xf32>, %h: tensor<1xi32>,
                                         %dp: tensor<1x4x300xf32>) -> tensor<1x4x6xf32> {
  // expected-error @+1 {{'moe.attention_posterior_grad' op GPU lowering needs a static expert count <= 256}}
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>)
      dp(%dp : tensor<1x4x300xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x300xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x300xf32>
  return %du : tensor<1x4x6xf32>
}

// -----

func.func @attention_posterior_grad_dynamic_k(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                              %wo: tensor<6x6xf32>, %e: tensor<1x4x?xf32>, %h: tensor<1xi32>,
                                              %dp: tensor<1x4x?xf32>) -> tensor<1x4x6xf32> {
  // expected-error @+1 {{'moe.attention_posterior_grad' op GPU lowering needs a static expert count <= 256}}
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>)
      dp(%dp : tensor<1x4x?xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x?xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x?xf32>
  return %du : tensor<1x4x6xf32>
}
