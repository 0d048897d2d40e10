// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file -verify-diagnostics

// The backward ops other than topk_renorm_grad (topk_renorm_grad.mlir) and
// similarity_inform_grad (similarity_inform_grad.mlir) have no GPU kernels yet
// (the torch ops run their eager references on CUDA tensors): the pass names
// the op instead of crashing or leaving it silently.

func.func @hyper_router_grad(%emb: tensor<8xf32>, %w1: tensor<6x8xf32>, %b1: tensor<6xf32>, %w2: tensor<20x6xf32>,
                             %b2: tensor<20xf32>, %dw: tensor<4x4xf32>, %db: tensor<4xf32>) -> tensor<8xf32> {
  // expected-error @+1 {{'moe.hyper_router_grad' op has no GPU lowering}}
  %a, %b, %c, %d, %e = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>)
      db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
  return %a : tensor<8xf32>
}

// -----

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
