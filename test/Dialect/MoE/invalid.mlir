// Every verifier rule of every moe op, one rule per case; each message names the operand and the rule.
// RUN: moe-opt %s -split-input-file -verify-diagnostics

//===----------------------------------------------------------------------===//
// topk_renorm
//===----------------------------------------------------------------------===//

func.func @topk_k_exceeds_experts(%s: tensor<8x4xf32>) {
  // expected-error @+1 {{'k' (5) must be in [1, 4] (the size of the last dimension of 'scores')}}
  %w, %i = moe.topk_renorm %s k(5) : tensor<8x4xf32> -> tensor<8x5xf32>, tensor<8x5xi32>
  return
}

// -----

func.func @topk_k_zero(%s: tensor<8x4xf32>) {
  // expected-error @+1 {{'k' (0) must be in [1, 4]}}
  %w, %i = moe.topk_renorm %s k(0) : tensor<8x4xf32> -> tensor<8x?xf32>, tensor<8x?xi32>
  return
}

// -----

func.func @topk_k_negative_dynamic_experts(%s: tensor<8x?xf32>) {
  // expected-error @+1 {{'k' (-1) must be >= 1}}
  %w, %i = moe.topk_renorm %s k(-1) : tensor<8x?xf32> -> tensor<8x?xf32>, tensor<8x?xi32>
  return
}

// -----

func.func @topk_scalar_scores(%s: tensor<f32>) {
  // expected-error @+1 {{'scores' must have rank >= 1 ([..., K])}}
  %w, %i = moe.topk_renorm %s k(1) : tensor<f32> -> tensor<1xf32>, tensor<1xi32>
  return
}

// -----

func.func @topk_integer_scores(%s: tensor<8x4xi32>) {
  // expected-error @+1 {{operand #0 must be ranked tensor of 32-bit float or 16-bit float or bfloat16 type values}}
  %w, %i = moe.topk_renorm %s k(2) : tensor<8x4xi32> -> tensor<8x2xf32>, tensor<8x2xi32>
  return
}

// -----

func.func @topk_result_width_is_not_k(%s: tensor<8x4xf32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{inferred type(s) 'tensor<8x2xf32>', 'tensor<8x2xi32>' are incompatible with return type(s) of operation 'tensor<8x3xf32>', 'tensor<8x3xi32>'}}
  %w, %i = moe.topk_renorm %s k(2) : tensor<8x4xf32> -> tensor<8x3xf32>, tensor<8x3xi32>
  return
}

// -----

// Indices are i32 or i64 (index-results-i64.mlir), no other width.
func.func @topk_i16_indices(%s: tensor<8x4xf32>) {
  // expected-error @+1 {{result #1 must be ranked tensor of 32-bit signless integer or 64-bit signless integer values}}
  %w, %i = moe.topk_renorm %s k(2) : tensor<8x4xf32> -> tensor<8x2xf32>, tensor<8x2xi16>
  return
}

// -----

func.func @topk_unknown_mode(%s: tensor<8x4xf32>) {
  // expected-error @+1 {{unknown topk_mode 'softmax'}}
  %w, %i = moe.topk_renorm %s k(2) mode(softmax) : tensor<8x4xf32> -> tensor<8x2xf32>, tensor<8x2xi32>
  return
}

//===----------------------------------------------------------------------===//
// similarity_inform
//===----------------------------------------------------------------------===//

// -----

func.func @similarity_u_rank(%u: tensor<8x64xf32>, %e: tensor<1x8x4xf32>) {
  // expected-error @+1 {{'u' must have rank 3 ([B, N, D]), got shape [8, 64]}}
  %p = moe.similarity_inform %u, %e : tensor<8x64xf32>, tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  return
}

// -----

func.func @similarity_e_rank(%u: tensor<1x8x64xf32>, %e: tensor<8x4xf32>) {
  // expected-error @+1 {{'e' must have rank 3 ([B, N, K]), got shape [8, 4]}}
  %p = moe.similarity_inform %u, %e : tensor<1x8x64xf32>, tensor<8x4xf32> -> tensor<1x8x4xf32>
  return
}

// -----

func.func @similarity_batch_mismatch(%u: tensor<2x8x64xf32>, %e: tensor<3x8x4xf32>) {
  // expected-error @+1 {{dimension 0 of 'e' (B = 3) must equal dimension 0 of 'u' (B = 2)}}
  %p = moe.similarity_inform %u, %e : tensor<2x8x64xf32>, tensor<3x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_tokens_mismatch(%u: tensor<2x8x64xf32>, %e: tensor<2x7x4xf32>) {
  // expected-error @+1 {{dimension 1 of 'e' (N = 7) must equal dimension 1 of 'u' (N = 8)}}
  %p = moe.similarity_inform %u, %e : tensor<2x8x64xf32>, tensor<2x7x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_ws_not_square(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>, %ws: tensor<64x32xf32>) {
  // expected-error @+1 {{dimension 1 of 'ws' (D = 32) must equal dimension 2 of 'u' (D = 64)}}
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<64x32xf32>) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_ws_rank(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>, %ws: tensor<64xf32>) {
  // expected-error @+1 {{'ws' must have rank 2 ([D, D])}}
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<64xf32>) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_mask_shape(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>, %m: tensor<2x9xi1>) {
  // expected-error @+1 {{dimension 1 of 'key_mask' (N = 9) must equal dimension 1 of 'u' (N = 8)}}
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<2x9xi1>) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_mask_not_bool(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>, %m: tensor<2x8xi32>) {
  // expected-error @+1 {{operand #2 must be ranked tensor of 1-bit signless integer values}}
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<2x8xi32>) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_tau_zero(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'tau' (0.0) must be finite and > 0}}
  %p = moe.similarity_inform %u, %e tau(0.0) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_tau_negative(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'tau' (-1.0) must be finite and > 0}}
  %p = moe.similarity_inform %u, %e tau(-1.0) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_tau_infinite(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'tau' (inf) must be finite and > 0}}
  %p = moe.similarity_inform %u, %e tau(0x7F800000) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_tau_nan(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'tau' (nan) must be finite and > 0}}
  %p = moe.similarity_inform %u, %e tau(0x7FC00000) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  return
}

// -----

func.func @similarity_result_experts(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{inferred type(s) 'tensor<2x8x4xf32>' are incompatible with return type(s) of operation 'tensor<2x8x5xf32>'}}
  %p = moe.similarity_inform %u, %e : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x5xf32>
  return
}

//===----------------------------------------------------------------------===//
// attention_posterior
//===----------------------------------------------------------------------===//

// -----

func.func @posterior_scores_rank(%s: tensor<2x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                 %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'scores' must have rank 4 ([B, H, N, Nk])}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_batch_mismatch(%s: tensor<2x4x8x8xf32>, %u: tensor<3x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                   %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{dimension 0 of 'u' (B = 3) must equal dimension 0 of 'scores' (B = 2)}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x4x8x8xf32>, tensor<3x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_heads_mismatch(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x2x8x16xf32>,
                                    %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{dimension 1 of 'v' (H = 2) must equal dimension 1 of 'scores' (H = 4)}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x2x8x16xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_queries_mismatch(%s: tensor<2x4x8x8xf32>, %u: tensor<2x6x32xf32>, %v: tensor<2x4x8x8xf32>,
                                      %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{dimension 1 of 'u' (N = 6) must equal dimension 2 of 'scores' (N = 8)}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x4x8x8xf32>, tensor<2x6x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x6x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_keys_mismatch_values(%s: tensor<2x4x8x16xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                          %wo: tensor<32x32xf32>, %e: tensor<2x16x4xf32>) {
  // expected-error @+1 {{dimension 2 of 'v' (Nk = 8) must equal dimension 3 of 'scores' (Nk = 16)}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x4x8x16xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x16x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_keys_mismatch_probs(%s: tensor<2x4x8x16xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x16x8xf32>,
                                         %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{dimension 1 of 'e' (Nk = 8) must equal dimension 3 of 'scores' (Nk = 16)}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x4x8x16xf32>, tensor<2x8x32xf32>, tensor<2x4x16x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_model_dim_mismatch(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                        %wo: tensor<64x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{dimension 0 of 'wo' (D = 64) must equal dimension 2 of 'u' (D = 32)}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<64x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_out_projection_width(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                          %wo: tensor<32x16xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{dimension 1 of 'wo' (16) must equal H*Dh = 4*8 = 32 (heads and head size of 'v')}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x16xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_sigma_zero(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'sigma' (0.0) must be finite and > 0}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(0.0)
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_sigma_negative(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                    %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'sigma' (-2.0) must be finite and > 0}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(-2.0)
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_head_scale_infinite(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                         %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'head_scale' (inf) must be finite}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_scale(0x7F800000)
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_head_result_shape(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                       %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{inferred type(s) 'tensor<2x8x4xf32>', 'tensor<2xi32>' are incompatible with return type(s) of operation 'tensor<2x8x4xf32>', 'tensor<4xi32>'}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>, tensor<4xi32>
  return
}

//===----------------------------------------------------------------------===//
// mad_dispersion
//===----------------------------------------------------------------------===//

// -----

func.func @mad_tokens_rank(%x: tensor<2x32x8xf32>, %a: tensor<32xi32>) {
  // expected-error @+1 {{'tokens' must have rank 2 ([T, D])}}
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) : tensor<2x32x8xf32>, tensor<32xi32> -> tensor<4x8xf32>, tensor<4xi32>
  return
}

// -----

func.func @mad_assign_rank(%x: tensor<32x8xf32>, %a: tensor<32x1xi32>) {
  // expected-error @+1 {{'assign' must have rank 1 ([T])}}
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) : tensor<32x8xf32>, tensor<32x1xi32> -> tensor<4x8xf32>, tensor<4xi32>
  return
}

// -----

func.func @mad_token_count_mismatch(%x: tensor<32x8xf32>, %a: tensor<31xi32>) {
  // expected-error @+1 {{dimension 0 of 'assign' (T = 31) must equal dimension 0 of 'tokens' (T = 32)}}
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) : tensor<32x8xf32>, tensor<31xi32> -> tensor<4x8xf32>, tensor<4xi32>
  return
}

// -----

func.func @mad_float_assign(%x: tensor<32x8xf32>, %a: tensor<32xf32>) {
  // expected-error @+1 {{operand #1 must be ranked tensor of 32-bit signless integer or 64-bit signless integer values}}
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) : tensor<32x8xf32>, tensor<32xf32> -> tensor<4x8xf32>, tensor<4xi32>
  return
}

// -----

func.func @mad_no_experts(%x: tensor<32x8xf32>, %a: tensor<32xi32>) {
  // expected-error @+1 {{'num_experts' (0) must be >= 1}}
  %w, %c = moe.mad_dispersion %x, %a num_experts(0) : tensor<32x8xf32>, tensor<32xi32> -> tensor<?x8xf32>, tensor<?xi32>
  return
}

// -----

func.func @mad_result_experts(%x: tensor<32x8xf32>, %a: tensor<32xi32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{inferred type(s) 'tensor<4x8xf32>', 'tensor<4xi32>' are incompatible with return type(s) of operation 'tensor<5x8xf32>', 'tensor<5xi32>'}}
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) : tensor<32x8xf32>, tensor<32xi32> -> tensor<5x8xf32>, tensor<5xi32>
  return
}

// -----

func.func @mad_eps_zero(%x: tensor<32x8xf32>, %a: tensor<32xi32>) {
  // expected-error @+1 {{'eps' (0.0) must be finite and > 0}}
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) eps(0.0) : tensor<32x8xf32>, tensor<32xi32> -> tensor<4x8xf32>, tensor<4xi32>
  return
}

// -----

func.func @mad_clip_negative(%x: tensor<32x8xf32>, %a: tensor<32xi32>) {
  // expected-error @+1 {{'clip' (-1.0) must be finite and >= 0 (0 disables clipping)}}
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) clip(-1.0) : tensor<32x8xf32>, tensor<32xi32> -> tensor<4x8xf32>, tensor<4xi32>
  return
}

//===----------------------------------------------------------------------===//
// adjacency_update
//===----------------------------------------------------------------------===//

// -----

func.func @adjacency_not_square(%a: tensor<16x8xf32>, %idx: tensor<32x2xi32>) {
  // expected-error @+1 {{dimension 1 of 'a' (E = 8) must equal dimension 0 of 'a' (E = 16)}}
  %n = moe.adjacency_update %a, %idx : tensor<16x8xf32>, tensor<32x2xi32> -> tensor<16x16xf32>
  return
}

// -----

func.func @adjacency_rank(%a: tensor<16xf32>, %idx: tensor<32x2xi32>) {
  // expected-error @+1 {{'a' must have rank 2 ([E, E])}}
  %n = moe.adjacency_update %a, %idx : tensor<16xf32>, tensor<32x2xi32> -> tensor<?x?xf32>
  return
}

// -----

func.func @adjacency_idx_rank(%a: tensor<16x16xf32>, %idx: tensor<32xi32>) {
  // expected-error @+1 {{'idx' must have rank 2 ([T, k])}}
  %n = moe.adjacency_update %a, %idx : tensor<16x16xf32>, tensor<32xi32> -> tensor<16x16xf32>
  return
}

// -----

func.func @adjacency_k_exceeds_experts(%a: tensor<4x4xf32>, %idx: tensor<32x5xi32>) {
  // expected-error @+1 {{dimension 1 of 'idx' (k = 5) must be <= E = 4 (the size of 'a')}}
  %n = moe.adjacency_update %a, %idx : tensor<4x4xf32>, tensor<32x5xi32> -> tensor<4x4xf32>
  return
}

// -----

func.func @adjacency_no_choice(%a: tensor<4x4xf32>, %idx: tensor<32x0xi32>) {
  // expected-error @+1 {{dimension 1 of 'idx' (k = 0) must be >= 1 (experts chosen per token)}}
  %n = moe.adjacency_update %a, %idx : tensor<4x4xf32>, tensor<32x0xi32> -> tensor<4x4xf32>
  return
}

// -----

func.func @adjacency_float_idx(%a: tensor<4x4xf32>, %idx: tensor<32x2xf32>) {
  // expected-error @+1 {{operand #1 must be ranked tensor of 32-bit signless integer or 64-bit signless integer values}}
  %n = moe.adjacency_update %a, %idx : tensor<4x4xf32>, tensor<32x2xf32> -> tensor<4x4xf32>
  return
}

// -----

func.func @adjacency_beta_above_one(%a: tensor<4x4xf32>, %idx: tensor<32x2xi32>) {
  // expected-error @+1 {{'beta' (1.5) must be in [0.0, 1.0]}}
  %n = moe.adjacency_update %a, %idx beta(1.5) : tensor<4x4xf32>, tensor<32x2xi32> -> tensor<4x4xf32>
  return
}

// -----

func.func @adjacency_beta_negative(%a: tensor<4x4xf32>, %idx: tensor<32x2xi32>) {
  // expected-error @+1 {{'beta' (-0.1) must be in [0.0, 1.0]}}
  %n = moe.adjacency_update %a, %idx beta(-0.1) : tensor<4x4xf32>, tensor<32x2xi32> -> tensor<4x4xf32>
  return
}

// -----

func.func @adjacency_beta_nan(%a: tensor<4x4xf32>, %idx: tensor<32x2xi32>) {
  // expected-error @+1 {{'beta' (nan) must be in [0.0, 1.0]}}
  %n = moe.adjacency_update %a, %idx beta(0x7FC00000) : tensor<4x4xf32>, tensor<32x2xi32> -> tensor<4x4xf32>
  return
}

//===----------------------------------------------------------------------===//
// hyper_router
//===----------------------------------------------------------------------===//

// -----

func.func @hyper_emb_rank(%emb: tensor<1x8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>, %b2: tensor<20xf32>) {
  // expected-error @+1 {{'emb' must have rank 1 ([De])}}
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<1x8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32> -> tensor<4x4xf32>, tensor<4xf32>
  return
}

// -----

func.func @hyper_w1_columns(%emb: tensor<8xf32>, %w1: tensor<4x6xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>, %b2: tensor<20xf32>) {
  // expected-error @+1 {{dimension 1 of 'w1' (De = 6) must equal dimension 0 of 'emb' (De = 8)}}
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<8xf32>, tensor<4x6xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32> -> tensor<4x4xf32>, tensor<4xf32>
  return
}

// -----

func.func @hyper_b1_size(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<5xf32>, %w2: tensor<20x4xf32>, %b2: tensor<20xf32>) {
  // expected-error @+1 {{dimension 0 of 'b1' (Dh = 5) must equal dimension 0 of 'w1' (Dh = 4)}}
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<5xf32>, tensor<20x4xf32>, tensor<20xf32> -> tensor<4x4xf32>, tensor<4xf32>
  return
}

// -----

func.func @hyper_w2_columns(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<20x3xf32>, %b2: tensor<20xf32>) {
  // expected-error @+1 {{dimension 1 of 'w2' (Dh = 3) must equal dimension 0 of 'w1' (Dh = 4)}}
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x3xf32>, tensor<20xf32> -> tensor<4x4xf32>, tensor<4xf32>
  return
}

// -----

func.func @hyper_b2_size(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>, %b2: tensor<16xf32>) {
  // expected-error @+1 {{dimension 0 of 'b2' (E*(D+1) = 16) must equal dimension 0 of 'w2' (E*(D+1) = 20)}}
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<16xf32> -> tensor<4x4xf32>, tensor<4xf32>
  return
}

// -----

// The reference code's reshape([E, -1]) accepts any multiple of E; the verifier checks E*(D+1) exactly.
func.func @hyper_w2_rows_not_e_times_d_plus_one(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>,
                                                 %w2: tensor<?x4xf32>, %b2: tensor<24xf32>) {
  // expected-error @+1 {{'w2' must have E*(D+1) = 4*(4+1) = 20 rows, but has 24}}
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<?x4xf32>, tensor<24xf32> -> tensor<4x4xf32>, tensor<4xf32>
  return
}

// -----

func.func @hyper_w2_rows_not_multiple_of_e(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>,
                                           %w2: tensor<21x4xf32>, %b2: tensor<21xf32>) {
  // expected-error @+1 {{dimension 0 of 'w2' (21) must be num_experts * (D+1) = 4 * (D+1) with D >= 0}}
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<21x4xf32>, tensor<21xf32> -> tensor<4x?xf32>, tensor<4xf32>
  return
}

// -----

// D = 0 is valid: a router of biases only (w is [E, 0]; the torch op has always taken it).
func.func @hyper_no_features(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<4x4xf32>, %b2: tensor<4xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<4x4xf32>, tensor<4xf32> -> tensor<4x?xf32>, tensor<4xf32>
  return
}

// -----

func.func @hyper_no_experts(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>, %b2: tensor<20xf32>) {
  // expected-error @+1 {{'num_experts' (0) must be >= 1}}
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(0)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32> -> tensor<?x?xf32>, tensor<?xf32>
  return
}

//===----------------------------------------------------------------------===//
// Fused ops: the rules of both parts apply
//===----------------------------------------------------------------------===//

// -----

func.func @similarity_topk_k_exceeds_experts(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'k' (5) must be in [1, 4] (dimension 2 of 'e', K)}}
  %w, %i = moe.similarity_inform_topk %u, %e k(5) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x5xf32>, tensor<2x8x5xi32>
  return
}

// -----

func.func @similarity_topk_tau(%u: tensor<2x8x64xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'tau' (-0.5) must be finite and > 0}}
  %w, %i = moe.similarity_inform_topk %u, %e k(2) tau(-0.5) : tensor<2x8x64xf32>, tensor<2x8x4xf32> -> tensor<2x8x2xf32>, tensor<2x8x2xi32>
  return
}

// -----

func.func @similarity_topk_tokens_mismatch(%u: tensor<2x8x64xf32>, %e: tensor<2x6x4xf32>) {
  // expected-error @+1 {{dimension 1 of 'e' (N = 6) must equal dimension 1 of 'u' (N = 8)}}
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<2x8x64xf32>, tensor<2x6x4xf32> -> tensor<2x8x2xf32>, tensor<2x8x2xi32>
  return
}

// -----

func.func @posterior_topk_k_zero(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                 %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'k' (0) must be in [1, 4] (dimension 2 of 'e', K)}}
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(0)
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32>
      -> tensor<2x8x?xf32>, tensor<2x8x?xi32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_topk_sigma(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                %wo: tensor<32x32xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{'sigma' (0.0) must be finite and > 0}}
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) sigma(0.0)
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x4xf32>
      -> tensor<2x8x2xf32>, tensor<2x8x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_topk_out_projection(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                                         %wo: tensor<32x24xf32>, %e: tensor<2x8x4xf32>) {
  // expected-error @+1 {{dimension 1 of 'wo' (24) must equal H*Dh = 4*8 = 32 (heads and head size of 'v')}}
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2)
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x24xf32>, tensor<2x8x4xf32>
      -> tensor<2x8x2xf32>, tensor<2x8x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @posterior_without_heads(%s: tensor<1x0x2x2xf32>, %u: tensor<1x2x4xf32>, %v: tensor<1x0x2x3xf32>,
                                   %wo: tensor<4x0xf32>, %e: tensor<1x2x3xf32>) {
  // expected-error @+1 {{dimension 1 of 'scores' (H = 0) must be >= 1: the posterior selects among the heads}}
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<1x0x2x2xf32>, tensor<1x2x4xf32>, tensor<1x0x2x3xf32>, tensor<4x0xf32>, tensor<1x2x3xf32>
      -> tensor<1x2x3xf32>, tensor<1xi32>
  return
}

// -----

func.func @num_experts_beyond_i32(%x: tensor<4x8xf32>, %a: tensor<4xi32>) {
  // expected-error @+1 {{'num_experts' (2147483648) must be <= 2147483647 (expert indices and counts are i32)}}
  %w, %c = "moe.mad_dispersion"(%x, %a) {num_experts = 2147483648 : i64} : (tensor<4x8xf32>, tensor<4xi32>) -> (tensor<?x8xf32>, tensor<?xi32>)
  return
}

