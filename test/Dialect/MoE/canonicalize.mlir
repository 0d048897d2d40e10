// Folders and canonicalization patterns of the moe ops.
// RUN: moe-opt %s -canonicalize -split-input-file | FileCheck %s

// HyperRouter App. C.4: at inference every operand is constant and the router is generated once.
// By hand: h = relu(w1·emb + b1) = relu([1·1 + 0·2 + 0.5, 0·1 − 1·2 + 0.5]) = [1.5, 0];
// out = w2·h + b2 = [1.5, 3 + 1, 0 + 2, −1.5 + 3] = [1.5, 4, 2, 1.5] -> [E=2, D+1=2] rows [1.5, 4] and [2, 1.5].
// CHECK-LABEL: func.func @hyper_router_folds_at_inference
// CHECK-DAG:     %[[W:.+]] = arith.constant dense<{{\[}}[1.500000e+00], [2.000000e+00]]> : tensor<2x1xf32>
// CHECK-DAG:     %[[B:.+]] = arith.constant dense<[4.000000e+00, 1.500000e+00]> : tensor<2xf32>
// CHECK-NOT:     moe.hyper_router
// CHECK:         return %[[W]], %[[B]]
func.func @hyper_router_folds_at_inference() -> (tensor<2x1xf32>, tensor<2xf32>) {
  %emb = arith.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %w1 = arith.constant dense<[[1.0, 0.0], [0.0, -1.0]]> : tensor<2x2xf32>
  %b1 = arith.constant dense<[0.5, 0.5]> : tensor<2xf32>
  %w2 = arith.constant dense<[[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [-1.0, 3.0]]> : tensor<4x2xf32>
  %b2 = arith.constant dense<[0.0, 1.0, 2.0, 3.0]> : tensor<4xf32>
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(2)
      : tensor<2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<4x2xf32>, tensor<4xf32> -> tensor<2x1xf32>, tensor<2xf32>
  return %w, %b : tensor<2x1xf32>, tensor<2xf32>
}

// -----

// bf16 operands fold too; the arithmetic is f32. All ones: h = relu(2·1 + 0) = [2, 2], out = 2 + 2 + 1 = 5 everywhere.
// CHECK-LABEL: func.func @hyper_router_folds_bf16
// CHECK-DAG:     arith.constant dense<5.000000e+00> : tensor<2x2xf32>
// CHECK-DAG:     arith.constant dense<5.000000e+00> : tensor<2xf32>
// CHECK-NOT:     moe.hyper_router
func.func @hyper_router_folds_bf16() -> (tensor<2x2xf32>, tensor<2xf32>) {
  %emb = arith.constant dense<1.0> : tensor<2xbf16>
  %w1 = arith.constant dense<1.0> : tensor<2x2xbf16>
  %b1 = arith.constant dense<0.0> : tensor<2xbf16>
  %w2 = arith.constant dense<1.0> : tensor<6x2xbf16>
  %b2 = arith.constant dense<1.0> : tensor<6xbf16>
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(2)
      : tensor<2xbf16>, tensor<2x2xbf16>, tensor<2xbf16>, tensor<6x2xbf16>, tensor<6xbf16> -> tensor<2x2xf32>, tensor<2xf32>
  return %w, %b : tensor<2x2xf32>, tensor<2xf32>
}

// -----

// Splat operands are one value each: the fold never expands them (issue #15: 2^32-element splats aborted with
// "SmallVector unable to grow", 2^28 took 27 s). In f32, adding 1 to 2^24 gives 2^24 again, so the in-order sum of
// 2^32 ones is 2^24: h = relu(2^24 + 0.5) = 2^24 (0.5 is below half an ulp), out = 2^24 + 2^24 + 1 = 2^25.
// CHECK-LABEL: func.func @hyper_router_folds_huge_splats
// (0x4C000000 is 2^25.)
// CHECK-DAG:     %[[W:.+]] = arith.constant dense<0x4C000000> : tensor<4x1xf32>
// CHECK-DAG:     %[[B:.+]] = arith.constant dense<0x4C000000> : tensor<4xf32>
// CHECK-NOT:     moe.hyper_router
// CHECK:         return %[[W]], %[[B]]
func.func @hyper_router_folds_huge_splats() -> (tensor<4x1xf32>, tensor<4xf32>) {
  %emb = arith.constant dense<1.0> : tensor<4294967296xf32>
  %w1 = arith.constant dense<1.0> : tensor<2x4294967296xf32>
  %b1 = arith.constant dense<0.5> : tensor<2xf32>
  %w2 = arith.constant dense<1.0> : tensor<8x2xf32>
  %b2 = arith.constant dense<1.0> : tensor<8xf32>
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<4294967296xf32>, tensor<2x4294967296xf32>, tensor<2xf32>, tensor<8x2xf32>, tensor<8xf32>
      -> tensor<4x1xf32>, tensor<4xf32>
  return %w, %b : tensor<4x1xf32>, tensor<4xf32>
}

// -----

// Splat and non-splat operands mixed: every row of the splat w1 has the dot 1·1 + 1·2 = 3, so
// h = relu([3, 3, 3] + [0, −4, 1]) = [3, 0, 4]; every row of the splat w2 has the dot 2·(3 + 0 + 4) = 14, so
// out = 14 + [0, 1, 2, 3] -> rows [14, 15] and [16, 17].
// CHECK-LABEL: func.func @hyper_router_folds_mixed_splats
// CHECK-DAG:     %[[W:.+]] = arith.constant dense<{{\[}}[1.400000e+01], [1.600000e+01]]> : tensor<2x1xf32>
// CHECK-DAG:     %[[B:.+]] = arith.constant dense<[1.500000e+01, 1.700000e+01]> : tensor<2xf32>
// CHECK:         return %[[W]], %[[B]]
func.func @hyper_router_folds_mixed_splats() -> (tensor<2x1xf32>, tensor<2xf32>) {
  %emb = arith.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %w1 = arith.constant dense<1.0> : tensor<3x2xf32>
  %b1 = arith.constant dense<[0.0, -4.0, 1.0]> : tensor<3xf32>
  %w2 = arith.constant dense<2.0> : tensor<4x3xf32>
  %b2 = arith.constant dense<[0.0, 1.0, 2.0, 3.0]> : tensor<4xf32>
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(2)
      : tensor<2xf32>, tensor<3x2xf32>, tensor<3xf32>, tensor<4x3xf32>, tensor<4xf32> -> tensor<2x1xf32>, tensor<2xf32>
  return %w, %b : tensor<2x1xf32>, tensor<2xf32>
}

// -----

// ReLU keeps a NaN (as arith.maximumf does in the lowering): a NaN embedding yields a NaN router, not zeros.
// CHECK-LABEL: func.func @hyper_router_fold_propagates_nan
// CHECK-DAG:     arith.constant dense<0x7FC00000> : tensor<1x1xf32>
// CHECK-DAG:     arith.constant dense<0x7FC00000> : tensor<1xf32>
func.func @hyper_router_fold_propagates_nan() -> (tensor<1x1xf32>, tensor<1xf32>) {
  %emb = arith.constant dense<0x7FC00000> : tensor<1xf32>
  %w1 = arith.constant dense<1.0> : tensor<1x1xf32>
  %b1 = arith.constant dense<0.0> : tensor<1xf32>
  %w2 = arith.constant dense<1.0> : tensor<2x1xf32>
  %b2 = arith.constant dense<0.0> : tensor<2xf32>
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(1)
      : tensor<1xf32>, tensor<1x1xf32>, tensor<1xf32>, tensor<2x1xf32>, tensor<2xf32> -> tensor<1x1xf32>, tensor<1xf32>
  return %w, %b : tensor<1x1xf32>, tensor<1xf32>
}

// -----

// In training the embedding is an argument (it is being learned): nothing folds (HyperRouter spec §5.8).
// CHECK-LABEL: func.func @hyper_router_training_does_not_fold
// CHECK:         moe.hyper_router
func.func @hyper_router_training_does_not_fold(%emb: tensor<2xf32>) -> (tensor<2x1xf32>, tensor<2xf32>) {
  %w1 = arith.constant dense<1.0> : tensor<2x2xf32>
  %b1 = arith.constant dense<0.0> : tensor<2xf32>
  %w2 = arith.constant dense<1.0> : tensor<4x2xf32>
  %b2 = arith.constant dense<0.0> : tensor<4xf32>
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(2)
      : tensor<2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<4x2xf32>, tensor<4xf32> -> tensor<2x1xf32>, tensor<2xf32>
  return %w, %b : tensor<2x1xf32>, tensor<2xf32>
}

// -----

// beta = 1 freezes the graph: a_next = a.
// CHECK-LABEL: func.func @adjacency_update_frozen
// CHECK-SAME:    (%[[A:.+]]: tensor<8x8xf32>,
// CHECK-NOT:     moe.adjacency_update
// CHECK:         return %[[A]]
func.func @adjacency_update_frozen(%a: tensor<8x8xf32>, %idx: tensor<64x2xi32>) -> tensor<8x8xf32> {
  %n = moe.adjacency_update %a, %idx beta(1.0) : tensor<8x8xf32>, tensor<64x2xi32> -> tensor<8x8xf32>
  return %n : tensor<8x8xf32>
}

// -----

// CHECK-LABEL: func.func @adjacency_update_moving
// CHECK:         moe.adjacency_update
func.func @adjacency_update_moving(%a: tensor<8x8xf32>, %idx: tensor<64x2xi32>) -> tensor<8x8xf32> {
  %n = moe.adjacency_update %a, %idx beta(0.99) : tensor<8x8xf32>, tensor<64x2xi32> -> tensor<8x8xf32>
  return %n : tensor<8x8xf32>
}

// -----

// An f16 graph would need a conversion to the f32 result: the fold leaves it to the lowering.
// CHECK-LABEL: func.func @adjacency_update_frozen_f16_keeps_op
// CHECK:         moe.adjacency_update
func.func @adjacency_update_frozen_f16_keeps_op(%a: tensor<8x8xf16>, %idx: tensor<64x2xi32>) -> tensor<8x8xf32> {
  %n = moe.adjacency_update %a, %idx beta(1.0) : tensor<8x8xf16>, tensor<64x2xi32> -> tensor<8x8xf32>
  return %n : tensor<8x8xf32>
}

// -----

// A single expert is always expert 0; the weights still come from the op (they depend on NaN and masking).
// CHECK-LABEL: func.func @topk_single_expert_indices
// CHECK:         %[[Z:.+]] = arith.constant dense<0> : tensor<4x1xi32>
// CHECK:         %[[W:.+]], %{{.+}} = moe.topk_renorm
// CHECK:         return %[[W]], %[[Z]]
func.func @topk_single_expert_indices(%s: tensor<4x1xf32>) -> (tensor<4x1xf32>, tensor<4x1xi32>) {
  %w, %i = moe.topk_renorm %s k(1) : tensor<4x1xf32> -> tensor<4x1xf32>, tensor<4x1xi32>
  return %w, %i : tensor<4x1xf32>, tensor<4x1xi32>
}

// -----

// CHECK-LABEL: func.func @topk_two_experts_keeps_indices
// CHECK-NOT:     arith.constant
// CHECK:         %[[W:.+]], %[[I:.+]] = moe.topk_renorm
// CHECK:         return %[[W]], %[[I]]
func.func @topk_two_experts_keeps_indices(%s: tensor<4x2xf32>) -> (tensor<4x1xf32>, tensor<4x1xi32>) {
  %w, %i = moe.topk_renorm %s k(1) : tensor<4x2xf32> -> tensor<4x1xf32>, tensor<4x1xi32>
  return %w, %i : tensor<4x1xf32>, tensor<4x1xi32>
}

// -----

// The full posterior (eq 13) reports no head: −1.
// CHECK-LABEL: func.func @posterior_all_heads_reports_minus_one
// CHECK:         %[[M1:.+]] = arith.constant dense<-1> : tensor<2xi32>
// CHECK:         %[[P:.+]], %{{.+}} = moe.attention_posterior
// CHECK:         return %[[P]], %[[M1]]
func.func @posterior_all_heads_reports_minus_one(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
    %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) -> (tensor<2x8x4xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all)
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return %p, %h : tensor<2x8x4xf32>, tensor<2xi32>
}

// -----

// With one head the minimum-entropy head is head 0.
// CHECK-LABEL: func.func @posterior_single_head_is_zero
// CHECK:         %[[Z:.+]] = arith.constant dense<0> : tensor<2xi32>
// CHECK:         %[[P:.+]], %{{.+}} = moe.attention_posterior
// CHECK:         return %[[P]], %[[Z]]
func.func @posterior_single_head_is_zero(%s: tensor<2x1x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x1x8x32xf32>,
    %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) -> (tensor<2x8x4xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x1x8x8xf32>, tensor<2x8x32xf32>, tensor<2x1x8x32xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return %p, %h : tensor<2x8x4xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: func.func @posterior_many_heads_keeps_head
// CHECK-NOT:     arith.constant
// CHECK:         %[[P:.+]], %[[H:.+]] = moe.attention_posterior
// CHECK:         return %[[P]], %[[H]]
func.func @posterior_many_heads_keeps_head(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
    %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) -> (tensor<2x8x4xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return %p, %h : tensor<2x8x4xf32>, tensor<2xi32>
}

// -----

// Pure ops whose results are unused disappear.
// CHECK-LABEL: func.func @dead_routing_is_erased
// CHECK-NEXT:    return
func.func @dead_routing_is_erased(%s: tensor<4x8xf32>, %u: tensor<1x4x8xf32>, %e: tensor<1x4x8xf32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  %p = moe.similarity_inform %u, %e : tensor<1x4x8xf32>, tensor<1x4x8xf32> -> tensor<1x4x8xf32>
  return
}
