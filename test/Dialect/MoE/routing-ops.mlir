// Round trip of moe.route, moe.dispatch_plan and moe.bias_update in every attribute mode: print, parse and print
// again must agree, in the custom form and through the generic form; the result types are inferred.
// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC

// CHECK-LABEL: func.func @route_defaults
func.func @route_defaults(%l: tensor<4x8xf32>) -> (tensor<4x2xf32>, tensor<4x2xi32>) {
  // CHECK: moe.route %{{.*}} k(2) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  %w, %i = moe.route %l k(2) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return %w, %i : tensor<4x2xf32>, tensor<4x2xi32>
}

// The defaults are elided when written explicitly.
// CHECK-LABEL: func.func @route_explicit_defaults
func.func @route_explicit_defaults(%l: tensor<4x8xf32>) -> tensor<4x2xf32> {
  // CHECK: moe.route %{{.*}} k(2) : tensor<4x8xf32>
  %w, %i = moe.route %l k(2) scoring(softmax) order(score_then_topk) n_group(1) topk_group(1) group_score(top2_sum)
      renormalize(false) routed_scaling_factor(1.0) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return %w : tensor<4x2xf32>
}

// DeepSeek-V3: sigmoid, selection bias, 8 groups of 32, top-4 groups, top-8, renormalize, scaling 2.5.
// GENERIC-LABEL: sym_name = "route_deepseek_v3"
// GENERIC: "moe.route"(%{{.*}}, %{{.*}}) <{group_score = #moe<group_score top2_sum>, k = 8 : i64, n_group = 8 : i64,
// GENERIC-SAME: order = #moe<order score_then_topk>, renormalize = true, routed_scaling_factor = 2.500000e+00 : f32,
// GENERIC-SAME: scoring = #moe<scoring sigmoid>, topk_group = 4 : i64}>
// CHECK-LABEL: func.func @route_deepseek_v3
func.func @route_deepseek_v3(%l: tensor<?x256xbf16>, %b: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  // CHECK: moe.route %{{.*}} bias(%{{.*}} : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4)
  // CHECK-SAME: renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<?x256xbf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true)
      routed_scaling_factor(2.5) : tensor<?x256xbf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// DeepSeek-V2: softmax, groups ranked by their max; Kimi-K2: 384 experts, f16 bias.
// CHECK-LABEL: func.func @route_group_max_and_kimi
func.func @route_group_max_and_kimi(%l: tensor<3x160xf16>, %k2: tensor<2x384xf32>, %b: tensor<384xf16>)
    -> (tensor<3x6xf32>, tensor<2x8xi32>) {
  // CHECK: moe.route %{{.*}} k(6) n_group(8) topk_group(3) group_score(max) routed_scaling_factor(1.600000e+01)
  // CHECK-SAME: : tensor<3x160xf16> -> tensor<3x6xf32>, tensor<3x6xi32>
  %w, %i = moe.route %l k(6) n_group(8) topk_group(3) group_score(max) routed_scaling_factor(16.0)
      : tensor<3x160xf16> -> tensor<3x6xf32>, tensor<3x6xi32>
  // CHECK: moe.route %{{.*}} bias(%{{.*}} : tensor<384xf16>) k(8) scoring(sigmoid) renormalize(true)
  // CHECK-SAME: routed_scaling_factor(2.827000e+00)
  %w2, %i2 = moe.route %k2 bias(%b : tensor<384xf16>) k(8) scoring(sigmoid) renormalize(true)
      routed_scaling_factor(2.827) : tensor<2x384xf32> -> tensor<2x8xf32>, tensor<2x8xi32>
  return %w, %i2 : tensor<3x6xf32>, tensor<2x8xi32>
}

// gpt-oss (top-k then softmax over the k) and Llama-4 (top-1 then sigmoid); dynamic experts; scoring none.
// CHECK-LABEL: func.func @route_topk_then_score
func.func @route_topk_then_score(%l: tensor<?x?xf32>) -> (tensor<?x4xf32>, tensor<?x1xf32>, tensor<?x3xf32>) {
  // CHECK: moe.route %{{.*}} k(4) order(topk_then_score) : tensor<?x?xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  %w, %i = moe.route %l k(4) order(topk_then_score) : tensor<?x?xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  // CHECK: moe.route %{{.*}} k(1) scoring(sigmoid) order(topk_then_score)
  %w1, %i1 = moe.route %l k(1) scoring(sigmoid) order(topk_then_score) : tensor<?x?xf32> -> tensor<?x1xf32>, tensor<?x1xi32>
  // CHECK: moe.route %{{.*}} k(3) scoring(none) renormalize(true)
  %w3, %i3 = moe.route %l k(3) scoring(none) renormalize(true) : tensor<?x?xf32> -> tensor<?x3xf32>, tensor<?x3xi32>
  return %w, %w1, %w3 : tensor<?x4xf32>, tensor<?x1xf32>, tensor<?x3xf32>
}

// A written static size may refine an inferred dynamic one.
// CHECK-LABEL: func.func @route_refined
func.func @route_refined(%l: tensor<?x16xf32>) -> tensor<5x2xf32> {
  // CHECK: moe.route %{{.*}} k(2) : tensor<?x16xf32> -> tensor<5x2xf32>, tensor<5x2xi32>
  %w, %i = moe.route %l k(2) : tensor<?x16xf32> -> tensor<5x2xf32>, tensor<5x2xi32>
  return %w : tensor<5x2xf32>
}

// CHECK-LABEL: func.func @dispatch_plan_defaults
func.func @dispatch_plan_defaults(%idx: tensor<4x2xi32>) -> tensor<8xi32> {
  // CHECK: moe.dispatch_plan %{{.*}} num_experts(5) : tensor<4x2xi32> -> tensor<5xi32>, tensor<6xi32>, tensor<8xi32>,
  // CHECK-SAME: tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<1xi32>
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(5) block_size(1)
      : tensor<4x2xi32> -> tensor<5xi32>, tensor<6xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
        tensor<1xi32>
  return %ord : tensor<8xi32>
}

// Block padding: N + E(B-1) = 32 + 256*63 = 16160 padded rows, ceil(16160/64) = 253 blocks; i64 indices; dynamic T.
// GENERIC-LABEL: sym_name = "dispatch_plan_blocks"
// GENERIC: "moe.dispatch_plan"(%{{.*}}) <{block_size = 64 : i64, drop = #moe<drop position>, num_experts = 256 : i64}>
// CHECK-LABEL: func.func @dispatch_plan_blocks
func.func @dispatch_plan_blocks(%idx: tensor<4x8xi64>, %dyn: tensor<?x8xi32>) -> (tensor<253xi32>, tensor<?xi32>) {
  // CHECK: moe.dispatch_plan %{{.*}} num_experts(256) block_size(64) : tensor<4x8xi64> -> tensor<256xi32>,
  // CHECK-SAME: tensor<257xi32>, tensor<32xi32>, tensor<32xi32>, tensor<16160xi32>, tensor<253xi32>, tensor<1xi32>
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(256) block_size(64)
      : tensor<4x8xi64> -> tensor<256xi32>, tensor<257xi32>, tensor<32xi32>, tensor<32xi32>, tensor<16160xi32>,
        tensor<253xi32>, tensor<1xi32>
  // CHECK: moe.dispatch_plan %{{.*}} num_experts(3) block_size(4) : tensor<?x8xi32> -> tensor<3xi32>,
  // CHECK-SAME: tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  %c2, %o2, %ord2, %inv2, %p2, %b2, %n2 = moe.dispatch_plan %dyn num_experts(3) block_size(4)
      : tensor<?x8xi32> -> tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>
  return %b, %p2 : tensor<253xi32>, tensor<?xi32>
}

// The generic form written before the capacity option (no `drop`, no `capacity`) still parses, as the plain plan.
// CHECK-LABEL: func.func @dispatch_plan_generic_without_capacity
func.func @dispatch_plan_generic_without_capacity(%idx: tensor<4x2xi32>) -> tensor<8xi32> {
  // CHECK: moe.dispatch_plan %{{.*}} num_experts(5) : tensor<4x2xi32> -> tensor<5xi32>, tensor<6xi32>, tensor<8xi32>,
  // CHECK-SAME: tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<1xi32>{{$}}
  %r:7 = "moe.dispatch_plan"(%idx) <{block_size = 1 : i64, num_experts = 5 : i64}>
      : (tensor<4x2xi32>) -> (tensor<5xi32>, tensor<6xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>, tensor<8xi32>,
          tensor<1xi32>)
  return %r#2 : tensor<8xi32>
}

// Capacity by position: one more result, `dropped` [E].
// GENERIC-LABEL: sym_name = "dispatch_plan_capacity"
// GENERIC: "moe.dispatch_plan"(%{{.*}}) <{block_size = 1 : i64, capacity = 3 : i64, drop = #moe<drop position>,
// GENERIC-SAME: num_experts = 4 : i64}>
// CHECK-LABEL: func.func @dispatch_plan_capacity
func.func @dispatch_plan_capacity(%idx: tensor<?x2xi32>) -> tensor<4xi32> {
  // CHECK: moe.dispatch_plan %{{.*}} num_experts(4) capacity(3) : tensor<?x2xi32> -> tensor<4xi32>, tensor<5xi32>,
  // CHECK-SAME: tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>, tensor<4xi32>
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(3)
      : tensor<?x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<4xi32>
  return %d : tensor<4xi32>
}

// Capacity by probability reads the gate weights; capacity 0 is valid (everything is dropped).
// GENERIC-LABEL: sym_name = "dispatch_plan_capacity_probability"
// GENERIC: "moe.dispatch_plan"(%{{.*}}, %{{.*}}) <{block_size = 2 : i64, capacity = 0 : i64,
// GENERIC-SAME: drop = #moe<drop probability>, num_experts = 8 : i64}>
// CHECK-LABEL: func.func @dispatch_plan_capacity_probability
func.func @dispatch_plan_capacity_probability(%idx: tensor<3x2xi64>, %w: tensor<3x2xbf16>) -> tensor<8xi32> {
  // CHECK: moe.dispatch_plan %{{.*}} num_experts(8) block_size(2) capacity(0) drop(probability)
  // CHECK-SAME: weights(%{{.*}} : tensor<3x2xbf16>) : tensor<3x2xi64> -> tensor<8xi32>, tensor<9xi32>, tensor<6xi32>,
  // CHECK-SAME: tensor<6xi32>, tensor<14xi32>, tensor<7xi32>, tensor<1xi32>, tensor<8xi32>
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(8) block_size(2) capacity(0)
      drop(probability) weights(%w : tensor<3x2xbf16>)
      : tensor<3x2xi64> -> tensor<8xi32>, tensor<9xi32>, tensor<6xi32>, tensor<6xi32>, tensor<14xi32>, tensor<7xi32>,
        tensor<1xi32>, tensor<8xi32>
  return %d : tensor<8xi32>
}

// CHECK-LABEL: func.func @bias_update
func.func @bias_update(%b: tensor<256xf32>, %c: tensor<256xi32>, %h: tensor<?xbf16>, %f: tensor<?xf32>)
    -> (tensor<256xf32>, tensor<?xf32>) {
  // CHECK: moe.bias_update %{{.*}}, %{{.*}} rate(1.000000e-03) : tensor<256xf32>, tensor<256xi32> -> tensor<256xf32>
  %n = moe.bias_update %b, %c rate(1.000000e-03) : tensor<256xf32>, tensor<256xi32> -> tensor<256xf32>
  // CHECK: moe.bias_update %{{.*}}, %{{.*}} rate(0.000000e+00) : tensor<?xbf16>, tensor<?xf32> -> tensor<?xf32>
  %m = moe.bias_update %h, %f rate(0.0) : tensor<?xbf16>, tensor<?xf32> -> tensor<?xf32>
  return %n, %m : tensor<256xf32>, tensor<?xf32>
}
