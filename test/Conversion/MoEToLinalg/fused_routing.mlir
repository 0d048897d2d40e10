// The portable lowering has no fused kernel: fused routing ops are split into the mixing op and its gate, which
// are then lowered like any other; no moe op survives.
// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// CHECK-LABEL: func.func @posterior_topk_is_lowered
// CHECK-NOT:     moe.
// CHECK:         return
func.func @posterior_topk_is_lowered(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x8xf32>, %v: tensor<1x2x4x4xf32>,
    %wo: tensor<8x8xf32>, %e: tensor<1x4x3xf32>) -> (tensor<1x4x2xf32>, tensor<1x4x2xi32>, tensor<1xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2)
      : tensor<1x2x4x4xf32>, tensor<1x4x8xf32>, tensor<1x2x4x4xf32>, tensor<8x8xf32>, tensor<1x4x3xf32>
      -> tensor<1x4x2xf32>, tensor<1x4x2xi32>, tensor<1xi32>
  return %w, %i, %h : tensor<1x4x2xf32>, tensor<1x4x2xi32>, tensor<1xi32>
}

// CHECK-LABEL: func.func @similarity_topk_is_lowered
// CHECK-NOT:     moe.
// CHECK:         return
func.func @similarity_topk_is_lowered(%u: tensor<1x4x8xf32>, %e: tensor<1x4x3xf32>) -> (tensor<1x4x1xf32>, tensor<1x4x1xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(1) renormalize(false) causal(true)
      : tensor<1x4x8xf32>, tensor<1x4x3xf32> -> tensor<1x4x1xf32>, tensor<1x4x1xi32>
  return %w, %i : tensor<1x4x1xf32>, tensor<1x4x1xi32>
}
