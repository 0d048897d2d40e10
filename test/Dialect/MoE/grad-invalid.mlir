// Every verifier rule of the backward ops (MoEGradOps.td), one rule per case: the forward operands follow the
// forward op's rules (same messages), the cotangent follows the forward result.
// RUN: moe-opt %s -split-input-file -verify-diagnostics

func.func @grad_u_rank(%u: tensor<8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf32>) {
  // expected-error @+1 {{'u' must have rank 3 ([B, N, D]), got shape [8, 4]}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x3xf32>)
      : tensor<8x4xf32>, tensor<1x8x3xf32> -> tensor<?x?x?xf32>, tensor<1x8x3xf32>
  return
}

// -----

func.func @grad_tokens_mismatch(%u: tensor<1x8x4xf32>, %e: tensor<1x7x3xf32>, %dp: tensor<1x7x3xf32>) {
  // expected-error @+1 {{dimension 1 of 'e' (N = 7) must equal dimension 1 of 'u' (N = 8)}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x7x3xf32>)
      : tensor<1x8x4xf32>, tensor<1x7x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>
  return
}

// -----

func.func @grad_tau(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf32>) {
  // expected-error @+1 {{'tau' (0.0) must be finite and > 0}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x3xf32>) tau(0.0)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>
  return
}

// -----

func.func @grad_ws_shape(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %ws: tensor<4x5xf32>, %dp: tensor<1x8x3xf32>) {
  // expected-error @+1 {{dimension 1 of 'ws' (D = 5) must equal dimension 2 of 'u' (D = 4)}}
  %du, %de, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<4x5xf32>) dp(%dp : tensor<1x8x3xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>, tensor<4x4xf32>
  return
}

// -----

func.func @grad_mask_shape(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %m: tensor<1x9xi1>, %dp: tensor<1x8x3xf32>) {
  // expected-error @+1 {{dimension 1 of 'key_mask' (N = 9) must equal dimension 1 of 'u' (N = 8)}}
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<1x9xi1>) dp(%dp : tensor<1x8x3xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>
  return
}

// -----

func.func @grad_dp_rank(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<8x3xf32>) {
  // expected-error @+1 {{'dp' must have rank 3 ([B, N, K], the shape of the forward result p), got shape [8, 3]}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<8x3xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>
  return
}

// -----

func.func @grad_dp_shape(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x5xf32>) {
  // expected-error @+1 {{dimension 2 of 'dp' (5) must equal dimension 2 of 'e' (3): 'dp' is the cotangent of p [B, N, K]}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x5xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>
  return
}

// -----

func.func @grad_dp_type(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf16>) {
  // expected-error @+1 {{operand #2 must be ranked tensor of 32-bit float values, but got 'tensor<1x8x3xf16>'}}
  %du, %de = "moe.similarity_inform_grad"(%u, %e, %dp) {operandSegmentSizes = array<i32: 1, 1, 0, 0, 1, 0, 0>}
      : (tensor<1x8x4xf32>, tensor<1x8x3xf32>, tensor<1x8x3xf16>) -> (tensor<1x8x4xf32>, tensor<1x8x3xf32>)
  return
}

// -----

// dws without ws.
func.func @grad_dws_without_ws(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf32>) {
  // expected-error @+1 {{the result 'dws' needs the operand 'ws'}}
  %du, %de, %dws = "moe.similarity_inform_grad"(%u, %e, %dp) {operandSegmentSizes = array<i32: 1, 1, 0, 0, 1, 0, 0>}
      : (tensor<1x8x4xf32>, tensor<1x8x3xf32>, tensor<1x8x3xf32>) -> (tensor<1x8x4xf32>, tensor<1x8x3xf32>, tensor<4x4xf32>)
  return
}

// -----

// ws without dws.
func.func @grad_ws_without_dws(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %ws: tensor<4x4xf32>, %dp: tensor<1x8x3xf32>) {
  // expected-error @+1 {{'ws' is present, so the result 'dws' must be too}}
  %du, %de = "moe.similarity_inform_grad"(%u, %e, %ws, %dp) {operandSegmentSizes = array<i32: 1, 1, 1, 0, 1, 0, 0>}
      : (tensor<1x8x4xf32>, tensor<1x8x3xf32>, tensor<4x4xf32>, tensor<1x8x3xf32>) -> (tensor<1x8x4xf32>, tensor<1x8x3xf32>)
  return
}

// -----

// A written result that contradicts the operands.
func.func @grad_du_shape(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf32>) {
  // expected-error @+2 {{inferred type(s) 'tensor<1x8x4xf32>', 'tensor<1x8x3xf32>' are incompatible with return type(s)}}
  // expected-error @+1 {{failed to infer returned types}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x3xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x5xf32>, tensor<1x8x3xf32>
  return
}

// -----

func.func @topk_grad_scalar(%s: tensor<f32>, %i: tensor<2xi32>, %dw: tensor<2xf32>) {
  // expected-error @+1 {{'scores' must have rank >= 1 ([..., K]), but has type 'tensor<f32>'}}
  %ds = "moe.topk_renorm_grad"(%s, %i, %dw) : (tensor<f32>, tensor<2xi32>, tensor<2xf32>) -> tensor<f32>
  return
}

// -----

func.func @topk_grad_indices_rank(%s: tensor<4x8xf32>, %i: tensor<2xi32>, %dw: tensor<4x2xf32>) {
  // expected-error @+1 {{'indices' must have the rank of 'scores' (2: [..., k]), but has type 'tensor<2xi32>'}}
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<4x2xf32>) : tensor<4x8xf32>, tensor<2xi32> -> tensor<4x8xf32>
  return
}

// -----

func.func @topk_grad_rows(%s: tensor<4x8xf32>, %i: tensor<4x2xi32>, %dw: tensor<5x2xf32>) {
  // expected-error @+1 {{dimension 0 of 'dw' (5) must equal dimension 0 of 'scores' (4)}}
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<5x2xf32>) : tensor<4x8xf32>, tensor<4x2xi32> -> tensor<4x8xf32>
  return
}

// -----

func.func @topk_grad_k_mismatch(%s: tensor<4x8xf32>, %i: tensor<4x2xi32>, %dw: tensor<4x3xf32>) {
  // expected-error @+1 {{the last dimension of 'dw' (3) must equal that of 'indices' (k = 2)}}
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<4x3xf32>) : tensor<4x8xf32>, tensor<4x2xi32> -> tensor<4x8xf32>
  return
}

// -----

func.func @topk_grad_k_too_large(%s: tensor<4x8xf32>, %i: tensor<4x9xi32>, %dw: tensor<4x9xf32>) {
  // expected-error @+1 {{the last dimension of 'indices' (k = 9) must be in [1, 8] (K, the experts of 'scores')}}
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<4x9xf32>) : tensor<4x8xf32>, tensor<4x9xi32> -> tensor<4x8xf32>
  return
}

// -----

func.func @topk_grad_i64_indices(%s: tensor<4x8xf32>, %i: tensor<4x2xi64>, %dw: tensor<4x2xf32>) {
  // expected-error @+1 {{operand #1 must be ranked tensor of 32-bit signless integer values}}
  %ds = "moe.topk_renorm_grad"(%s, %i, %dw) : (tensor<4x8xf32>, tensor<4x2xi64>, tensor<4x2xf32>) -> tensor<4x8xf32>
  return
}

// -----

// hyper_router_grad: the forward operands follow moe.hyper_router's rules; dw [E, D] and db [E] the results'.

func.func @hyper_grad_w1_columns(%emb: tensor<8xf32>, %w1: tensor<4x6xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>,
                                 %b2: tensor<20xf32>, %dw: tensor<4x4xf32>, %db: tensor<4xf32>) {
  // expected-error @+1 {{dimension 1 of 'w1' (De = 6) must equal dimension 0 of 'emb' (De = 8)}}
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>) db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<4x6xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<4x6xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
  return
}

// -----

func.func @hyper_grad_w2_rows(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<24x4xf32>,
                              %b2: tensor<24xf32>, %dw: tensor<4x4xf32>, %db: tensor<4xf32>) {
  // expected-error @+1 {{'w2' must have E*(D+1) = 4*(4+1) = 20 rows, but has 24}}
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>) db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<24x4xf32>, tensor<24xf32>
      -> tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<24x4xf32>, tensor<24xf32>
  return
}

// -----

func.func @hyper_grad_num_experts(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>,
                                  %b2: tensor<20xf32>, %dw: tensor<4x4xf32>, %db: tensor<4xf32>) {
  // expected-error @+1 {{'num_experts' (0) must be >= 1}}
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>) db(%db : tensor<4xf32>) num_experts(0)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
  return
}

// -----

func.func @hyper_grad_dw_rank(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>,
                              %b2: tensor<20xf32>, %dw: tensor<16xf32>, %db: tensor<4xf32>) {
  // expected-error @+1 {{'dw' must have rank 2 ([E, D], the shape of the forward result w), got shape [16]}}
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<16xf32>) db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
  return
}

// -----

func.func @hyper_grad_db_rank(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>,
                              %b2: tensor<20xf32>, %dw: tensor<4x4xf32>, %db: tensor<4x1xf32>) {
  // expected-error @+1 {{'db' must have rank 1 ([E], the shape of the forward result b), got shape [4, 1]}}
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>) db(%db : tensor<4x1xf32>) num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
  return
}

// -----

func.func @hyper_grad_dw_features(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>,
                                  %b2: tensor<20xf32>, %dw: tensor<4x3xf32>, %db: tensor<4xf32>) {
  // expected-error @+1 {{'w2' must have E*(D+1) = 4*(3+1) = 16 rows, but has 20}}
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x3xf32>) db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
  return
}

// -----

func.func @hyper_grad_dw_zero_features(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<?x4xf32>,
                                       %b2: tensor<?xf32>, %dw: tensor<4x0xf32>, %db: tensor<4xf32>) {
  // D = 0 is valid (a router of biases only, as the forward).
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x0xf32>) db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<?x4xf32>, tensor<?xf32>
      -> tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<?x4xf32>, tensor<?xf32>
  return
}

// -----

func.func @hyper_grad_db_experts(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<?x4xf32>,
                                 %b2: tensor<?xf32>, %dw: tensor<4x4xf32>, %db: tensor<5xf32>) {
  // expected-error @+1 {{dimension 0 of 'db' (5) must equal num_experts (E = 4)}}
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>) db(%db : tensor<5xf32>) num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<?x4xf32>, tensor<?xf32>
      -> tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<?x4xf32>, tensor<?xf32>
  return
}

// -----

func.func @hyper_grad_dw_experts(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<?x4xf32>,
                                 %b2: tensor<?xf32>, %dw: tensor<3x4xf32>, %db: tensor<4xf32>) {
  // expected-error @+1 {{dimension 0 of 'dw' (3) must equal num_experts (E = 4)}}
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<3x4xf32>) db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<?x4xf32>, tensor<?xf32>
      -> tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<?x4xf32>, tensor<?xf32>
  return
}

// -----

func.func @hyper_grad_result_shape(%emb: tensor<8xf32>, %w1: tensor<4x8xf32>, %b1: tensor<4xf32>, %w2: tensor<20x4xf32>,
                                   %b2: tensor<20xf32>, %dw: tensor<4x4xf32>, %db: tensor<4xf32>) {
  // expected-error @+2 {{inferred type(s) 'tensor<8xf32>', 'tensor<4x8xf32>', 'tensor<4xf32>', 'tensor<20x4xf32>', 'tensor<20xf32>' are incompatible with return type(s)}}
  // expected-error @+1 {{failed to infer returned types}}
  %a:5 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>) db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<4x8xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<8x4xf32>, tensor<4xf32>, tensor<20x4xf32>, tensor<20xf32>
  return
}

// -----

// attention_posterior_grad: the forward's rules (same messages) ...
func.func @posterior_grad_wo_cols(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                  %wo: tensor<6x5xf32>, %e: tensor<1x4x3xf32>, %h: tensor<1xi32>,
                                  %dp: tensor<1x4x3xf32>) {
  // expected-error @+1 {{dimension 1 of 'wo' (5) must equal H*Dh = 2*3 = 6 (heads and head size of 'v')}}
  %0:5 = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>) dp(%dp : tensor<1x4x3xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x5xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x5xf32>, tensor<1x4x3xf32>
  return
}

// -----

func.func @posterior_grad_sigma(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>, %h: tensor<1xi32>,
                                %dp: tensor<1x4x3xf32>) {
  // expected-error @+1 {{'sigma' (0.0) must be finite and > 0}}
  %0:5 = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>) dp(%dp : tensor<1x4x3xf32>)
      sigma(0.0)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return
}

// -----

// ... then the cotangent against p [B, N, K] ...
func.func @posterior_grad_dp_rank(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                  %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>, %h: tensor<1xi32>,
                                  %dp: tensor<4x3xf32>) {
  // expected-error @+1 {{'dp' must have rank 3 ([B, N, K], the shape of the forward result p), got shape [4, 3]}}
  %0:5 = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>) dp(%dp : tensor<4x3xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return
}

// -----

func.func @posterior_grad_dp_width(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                   %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>, %h: tensor<1xi32>,
                                   %dp: tensor<1x4x2xf32>) {
  // expected-error @+1 {{dimension 2 of 'dp' (2) must equal K (3): 'dp' is the cotangent of p [B, N, K]}}
  %0:5 = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>) dp(%dp : tensor<1x4x2xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return
}

// -----

func.func @posterior_grad_dp_tokens(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                    %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>, %h: tensor<1xi32>,
                                    %dp: tensor<1x5x3xf32>) {
  // expected-error @+1 {{dimension 1 of 'dp' (5) must equal N (4): 'dp' is the cotangent of p [B, N, K]}}
  %0:5 = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>) dp(%dp : tensor<1x5x3xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return
}

// -----

// ... and the head operand: required for min_entropy, ...
func.func @posterior_grad_no_head(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                  %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>, %dp: tensor<1x4x3xf32>) {
  // expected-error @+1 {{head_select = min_entropy needs the operand 'head' (the forward's chosen head h*, [B])}}
  %0:5 = moe.attention_posterior_grad %s, %u, %v, %wo, %e dp(%dp : tensor<1x4x3xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return
}

// -----

// ... absent for all, ...
func.func @posterior_grad_head_with_all(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                        %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>, %h: tensor<1xi32>,
                                        %dp: tensor<1x4x3xf32>) {
  // expected-error @+1 {{'head' must be absent for head_select = all (the gradient mixes every head)}}
  %0:5 = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>) dp(%dp : tensor<1x4x3xf32>)
      head_select(all)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return
}

// -----

// ... and one per batch element.
func.func @posterior_grad_head_batch(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                     %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>, %h: tensor<2xi32>,
                                     %dp: tensor<1x4x3xf32>) {
  // expected-error @+1 {{dimension 0 of 'head' (2) must equal B (1)}}
  %0:5 = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<2xi32>) dp(%dp : tensor<1x4x3xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return
}

// -----

func.func @posterior_grad_head_rank(%s: tensor<1x2x4x4xf32>, %u: tensor<1x4x6xf32>, %v: tensor<1x2x4x3xf32>,
                                    %wo: tensor<6x6xf32>, %e: tensor<1x4x3xf32>, %h: tensor<1x1xi32>,
                                    %dp: tensor<1x4x3xf32>) {
  // expected-error @+1 {{'head' must have rank 1 ([B], the forward's chosen head), got shape [1, 1]}}
  %0:5 = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1x1xi32>) dp(%dp : tensor<1x4x3xf32>)
      : tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
      -> tensor<1x2x4x4xf32>, tensor<1x4x6xf32>, tensor<1x2x4x3xf32>, tensor<6x6xf32>, tensor<1x4x3xf32>
  return
}

// -----

// saved(p, lse) comes as a pair.
func.func @grad_saved_p_without_lse(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf32>,
                                    %p: tensor<1x8x3xf32>) {
  // expected-error @+1 {{'saved' takes both the forward's 'p' and 'lse'}}
  %du, %de = "moe.similarity_inform_grad"(%u, %e, %dp, %p) {operandSegmentSizes = array<i32: 1, 1, 0, 0, 1, 1, 0>}
      : (tensor<1x8x4xf32>, tensor<1x8x3xf32>, tensor<1x8x3xf32>, tensor<1x8x3xf32>)
      -> (tensor<1x8x4xf32>, tensor<1x8x3xf32>)
  return
}

// -----

func.func @grad_saved_p_shape(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf32>,
                              %p: tensor<1x8x5xf32>, %lse: tensor<1x8xf32>) {
  // expected-error @+1 {{dimension 2 of saved 'p' (5) must equal dimension 2 of 'e' (3)}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x3xf32>)
      saved(%p, %lse : tensor<1x8x5xf32>, tensor<1x8xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>
  return
}

// -----

func.func @grad_saved_lse_rank(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf32>,
                               %p: tensor<1x8x3xf32>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{saved 'p' must have rank 3 ([B, N, K]) and 'lse' rank 2 ([B, N]), but they have types 'tensor<1x8x3xf32>' and 'tensor<8xf32>'}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x3xf32>)
      saved(%p, %lse : tensor<1x8x3xf32>, tensor<8xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>
  return
}

// -----

func.func @grad_saved_lse_rows(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>, %dp: tensor<1x8x3xf32>,
                               %p: tensor<1x8x3xf32>, %lse: tensor<1x7xf32>) {
  // expected-error @+1 {{dimension 1 of saved 'lse' (7) must equal dimension 1 of 'e' (8): 'lse' is per row [B, N]}}
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x8x3xf32>)
      saved(%p, %lse : tensor<1x8x3xf32>, tensor<1x7xf32>)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x4xf32>, tensor<1x8x3xf32>
  return
}

// -----

// The training forward checks its operands with similarity_inform's rules.
func.func @fwd_tau(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>) {
  // expected-error @+1 {{'tau' (0.0) must be finite and > 0}}
  %p, %lse = moe.similarity_inform_fwd %u, %e tau(0.000000e+00)
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x3xf32>, tensor<1x8xf32>
  return
}

// -----

func.func @fwd_lse_type(%u: tensor<1x8x4xf32>, %e: tensor<1x8x3xf32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{'moe.similarity_inform_fwd' op inferred type(s) 'tensor<1x8x3xf32>', 'tensor<1x8xf32>' are incompatible with return type(s) of operation 'tensor<1x8x3xf32>', 'tensor<1x9xf32>'}}
  %p, %lse = moe.similarity_inform_fwd %u, %e
      : tensor<1x8x4xf32>, tensor<1x8x3xf32> -> tensor<1x8x3xf32>, tensor<1x9xf32>
  return
}
