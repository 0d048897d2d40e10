// Every verifier rule of the load-balancing ops (MoEBalanceOps.td), one rule per case; each message names the
// operand or attribute and the rule.
// RUN: moe-opt %s -split-input-file -verify-diagnostics

func.func @router_stats_logits_rank(%l: tensor<2x4x8xf32>) {
  // expected-error @+1 {{'logits' must have rank 2 ([T, E]), got shape [2, 4, 8]}}
  %c, %p, %w = moe.router_stats %l k(2) : tensor<2x4x8xf32> -> tensor<?xf32>, tensor<?xf32>, tensor<f32>
  return
}

// -----

func.func @router_stats_k_too_large(%l: tensor<4x8xf32>) {
  // expected-error @+1 {{'k' (9) must be in [1, 8] (the size of the last dimension of 'logits')}}
  %c, %p, %w = moe.router_stats %l k(9) : tensor<4x8xf32> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
  return
}

// -----

func.func @router_stats_k_zero(%l: tensor<4x?xf32>) {
  // expected-error @+1 {{'k' (0) must be in [1, E]}}
  %c, %p, %w = moe.router_stats %l k(0) : tensor<4x?xf32> -> tensor<?xf32>, tensor<?xf32>, tensor<f32>
  return
}

// -----

func.func @router_stats_mask_rank(%l: tensor<4x8xf32>, %m: tensor<4x1xf32>) {
  // expected-error @+1 {{'token_mask' must have rank 1 ([T]), got shape [4, 1]}}
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<4x1xf32>) k(2)
      : tensor<4x8xf32> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
  return
}

// -----

func.func @router_stats_mask_tokens(%l: tensor<4x8xf32>, %m: tensor<5xf32>) {
  // expected-error @+1 {{dimension 0 of 'token_mask' (5) must equal the token count T of 'logits' (4)}}
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<5xf32>) k(2)
      : tensor<4x8xf32> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
  return
}

// -----

func.func @router_stats_grad_weight_sum_rank(%l: tensor<4x8xf32>, %w: tensor<1xf32>, %g: tensor<8xf32>) {
  // expected-error @+1 {{'weight_sum' must have rank 0 (a scalar), got shape [1]}}
  %d = moe.router_stats_grad %l weight_sum(%w : tensor<1xf32>) dmean_probs(%g : tensor<8xf32>)
      : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @router_stats_grad_experts(%l: tensor<4x8xf32>, %w: tensor<f32>, %g: tensor<7xf32>) {
  // expected-error @+1 {{dimension 0 of 'dmean_probs' (7) must equal the expert count E of 'logits' (8)}}
  %d = moe.router_stats_grad %l weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<7xf32>)
      : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @load_balancing_loss_experts(%c: tensor<8xf32>, %p: tensor<4xf32>, %w: tensor<f32>) {
  // expected-error @+1 {{dimension 0 of 'mean_probs' (4) must equal the expert count E of 'counts' (8)}}
  %l = moe.load_balancing_loss %c, %p, %w : tensor<8xf32>, tensor<4xf32>, tensor<f32> -> tensor<f32>
  return
}

// -----

func.func @load_balancing_loss_counts_rank(%c: tensor<2x8xf32>, %p: tensor<8xf32>, %w: tensor<f32>) {
  // expected-error @+1 {{'counts' must have rank 1 ([E]), got shape [2, 8]}}
  %l = moe.load_balancing_loss %c, %p, %w : tensor<2x8xf32>, tensor<8xf32>, tensor<f32> -> tensor<f32>
  return
}

// -----

func.func @router_z_loss_rank(%l: tensor<8xf32>) {
  // expected-error @+1 {{'logits' must have rank 2 ([T, E]), got shape [8]}}
  %z = moe.router_z_loss %l : tensor<8xf32> -> tensor<f32>
  return
}

// -----

func.func @router_z_loss_grad_dloss(%l: tensor<4x8xf32>, %d: tensor<4xf32>) {
  // expected-error @+1 {{'dloss' must have rank 0 (a scalar), got shape [4]}}
  %g = moe.router_z_loss_grad %l dloss(%d : tensor<4xf32>) : tensor<4x8xf32> -> tensor<4x8xf32>
  return
}

// -----

func.func @sequence_balance_loss_scores_rank(%s: tensor<4x8xf32>, %i: tensor<1x4x2xi64>) {
  // expected-error @+1 {{'scores' must have rank 3 ([B, S, E]), got shape [4, 8]}}
  %l = moe.sequence_balance_loss %s, %i : tensor<4x8xf32>, tensor<1x4x2xi64> -> tensor<f32>
  return
}

// -----

func.func @sequence_balance_loss_indices_rank(%s: tensor<1x4x8xf32>, %i: tensor<4x2xi64>) {
  // expected-error @+1 {{'indices' must have rank 3 ([B, S, k]), got shape [4, 2]}}
  %l = moe.sequence_balance_loss %s, %i : tensor<1x4x8xf32>, tensor<4x2xi64> -> tensor<f32>
  return
}

// -----

func.func @sequence_balance_loss_batch(%s: tensor<2x4x8xf32>, %i: tensor<3x4x2xi32>) {
  // expected-error @+1 {{dimension 0 of 'indices' (3) must equal the batch size B of 'scores' (2)}}
  %l = moe.sequence_balance_loss %s, %i : tensor<2x4x8xf32>, tensor<3x4x2xi32> -> tensor<f32>
  return
}

// -----

func.func @sequence_balance_loss_length(%s: tensor<2x4x8xf32>, %i: tensor<2x5x2xi32>) {
  // expected-error @+1 {{dimension 1 of 'indices' (5) must equal the sequence length S of 'scores' (4)}}
  %l = moe.sequence_balance_loss %s, %i : tensor<2x4x8xf32>, tensor<2x5x2xi32> -> tensor<f32>
  return
}

// -----

func.func @sequence_balance_loss_k(%s: tensor<2x4x8xf32>, %i: tensor<2x4x9xi32>) {
  // expected-error @+1 {{the number of selections k (dimension 2 of 'indices', 9) must be in [1, 8] (the expert count of 'scores')}}
  %l = moe.sequence_balance_loss %s, %i : tensor<2x4x8xf32>, tensor<2x4x9xi32> -> tensor<f32>
  return
}

// -----

func.func @sequence_balance_loss_grad_dloss(%s: tensor<2x4x8xf32>, %i: tensor<2x4x2xi32>, %d: tensor<2xf32>) {
  // expected-error @+1 {{'dloss' must have rank 0 (a scalar), got shape [2]}}
  %g = moe.sequence_balance_loss_grad %s, %i dloss(%d : tensor<2xf32>)
      : tensor<2x4x8xf32>, tensor<2x4x2xi32> -> tensor<2x4x8xf32>
  return
}
