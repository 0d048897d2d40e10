// Every verifier rule of moe.route, moe.dispatch_plan (with its capacity option) and moe.bias_update, one rule per
// case; each message names the operand or attribute and the rule.
// RUN: moe-opt %s -split-input-file -verify-diagnostics

func.func @route_logits_rank(%l: tensor<2x4x8xf32>) {
  // expected-error @+1 {{'logits' must have rank 2 ([T, E]), got shape [2, 4, 8]}}
  %w, %i = moe.route %l k(2) : tensor<2x4x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @route_bias_rank(%l: tensor<4x8xf32>, %b: tensor<1x8xf32>) {
  // expected-error @+1 {{'bias' must have rank 1 ([E]), got shape [1, 8]}}
  %w, %i = moe.route %l bias(%b : tensor<1x8xf32>) k(2) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @route_bias_size(%l: tensor<4x8xf32>, %b: tensor<7xf32>) {
  // expected-error @+1 {{dimension 0 of 'bias' (E = 7) must equal dimension 1 of 'logits' (E = 8)}}
  %w, %i = moe.route %l bias(%b : tensor<7xf32>) k(2) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @route_bias_type(%l: tensor<4x8xf32>, %b: tensor<8xi32>) {
  // expected-error @+1 {{operand #1 must be ranked tensor of 32-bit float or 16-bit float or bfloat16 type values}}
  %w, %i = moe.route %l bias(%b : tensor<8xi32>) k(2) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @route_k_exceeds_experts(%l: tensor<4x8xf32>) {
  // expected-error @+1 {{'k' (9) must be in [1, 8] (the size of the last dimension of 'logits')}}
  %w, %i = moe.route %l k(9) : tensor<4x8xf32> -> tensor<4x9xf32>, tensor<4x9xi32>
  return
}

// -----

func.func @route_k_zero_dynamic(%l: tensor<4x?xf32>) {
  // expected-error @+1 {{'k' (0) must be in [1, E]}}
  %w, %i = moe.route %l k(0) : tensor<4x?xf32> -> tensor<4x?xf32>, tensor<4x?xi32>
  return
}

// -----

func.func @route_n_group_zero(%l: tensor<4x8xf32>) {
  // expected-error @+1 {{'n_group' (0) must be >= 1}}
  %w, %i = moe.route %l k(2) n_group(0) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @route_n_group_divides(%l: tensor<4x160xf32>) {
  // expected-error @+1 {{'n_group' (3) must divide the number of experts E = 160}}
  %w, %i = moe.route %l k(2) n_group(3) topk_group(2) : tensor<4x160xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @route_topk_group_range(%l: tensor<4x8xf32>) {
  // expected-error @+1 {{'topk_group' (5) must be in [1, n_group = 4]}}
  %w, %i = moe.route %l k(2) n_group(4) topk_group(5) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @route_k_exceeds_kept(%l: tensor<4x256xf32>) {
  // expected-error @+1 {{'k' (65) must be <= topk_group * E / n_group = 2 * 32 = 64 (the experts of the kept groups)}}
  %w, %i = moe.route %l k(65) n_group(8) topk_group(2) : tensor<4x256xf32> -> tensor<4x65xf32>, tensor<4x65xi32>
  return
}

// -----

func.func @route_top2_needs_pairs(%l: tensor<4x8xf32>) {
  // expected-error @+1 {{'group_score' top2_sum needs groups of at least 2 experts, but E / n_group = 1}}
  %w, %i = moe.route %l k(2) n_group(8) topk_group(4) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @route_scaling_positive(%l: tensor<4x8xf32>) {
  // expected-error @+1 {{'routed_scaling_factor' (0.0) must be finite and > 0}}
  %w, %i = moe.route %l k(2) routed_scaling_factor(0.0) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @route_scaling_finite(%l: tensor<4x8xf32>) {
  // expected-error @+1 {{'routed_scaling_factor' (inf) must be finite and > 0}}
  %w, %i = moe.route %l k(2) routed_scaling_factor(0x7F800000) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @route_result_width(%l: tensor<4x8xf32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{'moe.route' op inferred type(s) 'tensor<4x2xf32>', 'tensor<4x2xi32>' are incompatible with return type(s) of operation 'tensor<4x3xf32>', 'tensor<4x3xi32>'}}
  %w, %i = moe.route %l k(2) : tensor<4x8xf32> -> tensor<4x3xf32>, tensor<4x3xi32>
  return
}

// -----

func.func @route_unknown_scoring(%l: tensor<4x8xf32>) {
  // expected-error @+1 {{unknown scoring 'relu'}}
  %w, %i = moe.route %l k(2) scoring(relu) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @plan_indices_rank(%idx: tensor<8xi32>) {
  // expected-error @+1 {{'indices' must have rank 2 ([T, k]), got shape [8]}}
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(4)
      : tensor<8xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>
  return
}

// -----

func.func @plan_indices_type(%idx: tensor<4x2xf32>) {
  // expected-error @+1 {{operand #0 must be ranked tensor of 32-bit signless integer or 64-bit signless integer values}}
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(4)
      : tensor<4x2xf32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>
  return
}

// -----

func.func @plan_num_experts(%idx: tensor<4x2xi32>) {
  // expected-error @+1 {{'num_experts' (0) must be >= 1}}
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(0)
      : tensor<4x2xi32> -> tensor<?xi32>, tensor<?xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>
  return
}

// -----

func.func @plan_block_size(%idx: tensor<4x2xi32>) {
  // expected-error @+1 {{'block_size' (0) must be >= 1}}
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(4) block_size(0)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>
  return
}

// -----

func.func @plan_fits_i32(%idx: tensor<4x2xi32>) {
  // expected-error @+1 {{the padded plan (T*k + num_experts*(block_size-1) = 4294967304) must fit in i32}}
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(65536) block_size(65537)
      : tensor<4x2xi32> -> tensor<65536xi32>, tensor<65537xi32>, tensor<8xi32>, tensor<8xi32>, tensor<4294967304xi32>,
        tensor<65537xi32>, tensor<1xi32>
  return
}

// -----

func.func @plan_result_size(%idx: tensor<4x2xi32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{'moe.dispatch_plan' op inferred type(s) 'tensor<4xi32>', 'tensor<5xi32>'}}
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(4)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<4xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>
  return
}

// -----

func.func @plan_capacity_negative(%idx: tensor<4x2xi32>) {
  // expected-error @+1 {{'capacity' (-1) must be >= 0}}
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(-1)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>, tensor<4xi32>
  return
}

// -----

func.func @plan_drop_without_capacity(%idx: tensor<4x2xi32>, %w: tensor<4x2xf32>) {
  // expected-error @+1 {{'drop' (probability) needs a 'capacity'}}
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(4) drop(probability)
      weights(%w : tensor<4x2xf32>)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>
  return
}

// -----

func.func @plan_weights_without_capacity(%idx: tensor<4x2xi32>, %w: tensor<4x2xf32>) {
  // expected-error @+1 {{'weights' are only read by drop(probability) with a 'capacity'}}
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(4) weights(%w : tensor<4x2xf32>)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>
  return
}

// -----

func.func @plan_weights_by_position(%idx: tensor<4x2xi32>, %w: tensor<4x2xf32>) {
  // expected-error @+1 {{'weights' are only read by drop(probability), not drop(position)}}
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(2) weights(%w : tensor<4x2xf32>)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>, tensor<4xi32>
  return
}

// -----

func.func @plan_probability_without_weights(%idx: tensor<4x2xi32>) {
  // expected-error @+1 {{drop(probability) needs the gate 'weights' ([T, k], the priorities)}}
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(2) drop(probability)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>, tensor<4xi32>
  return
}

// -----

func.func @plan_weights_rank(%idx: tensor<4x2xi32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{'weights' must have rank 2 ([T, k]), got shape [8]}}
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(2) drop(probability)
      weights(%w : tensor<8xf32>)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>, tensor<4xi32>
  return
}

// -----

func.func @plan_weights_shape(%idx: tensor<4x2xi32>, %w: tensor<4x3xf32>) {
  // expected-error @+1 {{dimension 1 of 'weights' (3) must equal dimension 1 of 'indices' (2)}}
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(2) drop(probability)
      weights(%w : tensor<4x3xf32>)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>, tensor<4xi32>
  return
}

// -----

func.func @plan_capacity_needs_dropped(%idx: tensor<4x2xi32>) {
  // expected-error @+2 {{failed to infer returned types}}
  // expected-error @+1 {{'moe.dispatch_plan' op inferred type(s)}}
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(4) capacity(2)
      : tensor<4x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>
  return
}

// -----

func.func @bias_update_bias_rank(%b: tensor<2x4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{'bias' must have rank 1 ([E]), got shape [2, 4]}}
  %n = moe.bias_update %b, %c rate(1.0e-3) : tensor<2x4xf32>, tensor<4xi32> -> tensor<?xf32>
  return
}

// -----

func.func @bias_update_counts_rank(%b: tensor<4xf32>, %c: tensor<1x4xi32>) {
  // expected-error @+1 {{'counts' must have rank 1 ([E]), got shape [1, 4]}}
  %n = moe.bias_update %b, %c rate(1.0e-3) : tensor<4xf32>, tensor<1x4xi32> -> tensor<4xf32>
  return
}

// -----

func.func @bias_update_size(%b: tensor<4xf32>, %c: tensor<5xi32>) {
  // expected-error @+1 {{dimension 0 of 'counts' (E = 5) must equal dimension 0 of 'bias' (E = 4)}}
  %n = moe.bias_update %b, %c rate(1.0e-3) : tensor<4xf32>, tensor<5xi32> -> tensor<4xf32>
  return
}

// -----

func.func @bias_update_counts_type(%b: tensor<4xf32>, %c: tensor<4xi8>) {
  // expected-error @+1 {{operand #1 must be ranked tensor of 32-bit signless integer or 64-bit signless integer or 32-bit float}}
  %n = moe.bias_update %b, %c rate(1.0e-3) : tensor<4xf32>, tensor<4xi8> -> tensor<4xf32>
  return
}

// -----

func.func @bias_update_negative_rate(%b: tensor<4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{'rate' (-0.5) must be finite and >= 0}}
  %n = moe.bias_update %b, %c rate(-0.5) : tensor<4xf32>, tensor<4xi32> -> tensor<4xf32>
  return
}

// -----

func.func @bias_update_infinite_rate(%b: tensor<4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{'rate' (inf) must be finite and >= 0}}
  %n = moe.bias_update %b, %c rate(0x7F800000) : tensor<4xf32>, tensor<4xi32> -> tensor<4xf32>
  return
}
