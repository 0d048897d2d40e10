// Round trip of every moe op in every attribute mode: print, parse and print again must agree, in the custom
// form and through the generic form.
// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s

// CHECK-LABEL: func.func @topk_renorm_defaults
func.func @topk_renorm_defaults(%s: tensor<4x128x16xf32>) -> (tensor<4x128x2xf32>, tensor<4x128x2xi32>) {
  // CHECK: moe.topk_renorm %{{.*}} k(2) : tensor<4x128x16xf32> -> tensor<4x128x2xf32>, tensor<4x128x2xi32>
  %w, %i = moe.topk_renorm %s k(2) : tensor<4x128x16xf32> -> tensor<4x128x2xf32>, tensor<4x128x2xi32>
  return %w, %i : tensor<4x128x2xf32>, tensor<4x128x2xi32>
}

// The defaults are elided when written explicitly.
// CHECK-LABEL: func.func @topk_renorm_explicit_defaults
func.func @topk_renorm_explicit_defaults(%s: tensor<8x16xf32>) -> tensor<8x2xf32> {
  // CHECK: moe.topk_renorm %{{.*}} k(2) : tensor<8x16xf32>
  %w, %i = moe.topk_renorm %s k(2) mode(logits) renormalize(true) : tensor<8x16xf32> -> tensor<8x2xf32>, tensor<8x2xi32>
  return %w : tensor<8x2xf32>
}

// CHECK-LABEL: func.func @topk_renorm_logits_raw
func.func @topk_renorm_logits_raw(%s: tensor<8x16xf32>) -> tensor<8x1xf32> {
  // CHECK: moe.topk_renorm %{{.*}} k(1) renormalize(false) : tensor<8x16xf32> -> tensor<8x1xf32>, tensor<8x1xi32>
  %w, %i = moe.topk_renorm %s k(1) renormalize(false) : tensor<8x16xf32> -> tensor<8x1xf32>, tensor<8x1xi32>
  return %w : tensor<8x1xf32>
}

// CHECK-LABEL: func.func @topk_renorm_probs
func.func @topk_renorm_probs(%s: tensor<2x8x16xf32>) -> tensor<2x8x4xf32> {
  // CHECK: moe.topk_renorm %{{.*}} k(4) mode(probs) : tensor<2x8x16xf32>
  %w, %i = moe.topk_renorm %s k(4) mode(probs) : tensor<2x8x16xf32> -> tensor<2x8x4xf32>, tensor<2x8x4xi32>
  return %w : tensor<2x8x4xf32>
}

// CHECK-LABEL: func.func @topk_renorm_probs_raw_dynamic_bf16
func.func @topk_renorm_probs_raw_dynamic_bf16(%s: tensor<?x16xbf16>) -> tensor<?x16xi32> {
  // CHECK: moe.topk_renorm %{{.*}} k(16) mode(probs) renormalize(false) : tensor<?x16xbf16> -> tensor<?x16xf32>, tensor<?x16xi32>
  %w, %i = moe.topk_renorm %s k(16) mode(probs) renormalize(false) : tensor<?x16xbf16> -> tensor<?x16xf32>, tensor<?x16xi32>
  return %i : tensor<?x16xi32>
}

// A result may refine a size that the operand leaves dynamic.
// CHECK-LABEL: func.func @topk_renorm_refined_result
func.func @topk_renorm_refined_result(%s: tensor<?x8xf16>) -> tensor<4x2xf32> {
  // CHECK: moe.topk_renorm %{{.*}} k(2) : tensor<?x8xf16> -> tensor<4x2xf32>, tensor<4x2xi32>
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x8xf16> -> tensor<4x2xf32>, tensor<4x2xi32>
  return %w : tensor<4x2xf32>
}

// CHECK-LABEL: func.func @similarity_inform_defaults
func.func @similarity_inform_defaults(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>) -> tensor<2x128x16xf32> {
  // CHECK: moe.similarity_inform %{{.*}}, %{{.*}} : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
  %p = moe.similarity_inform %u, %e : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// CHECK-LABEL: func.func @similarity_inform_all_options
func.func @similarity_inform_all_options(%u: tensor<2x?x64xbf16>, %e: tensor<2x?x16xf16>, %ws: tensor<64x64xf32>,
                                         %m: tensor<2x?xi1>) -> tensor<2x?x16xf32> {
  // CHECK: moe.similarity_inform %{{.*}}, %{{.*}} ws(%{{.*}} : tensor<64x64xf32>) key_mask(%{{.*}} : tensor<2x?xi1>)
  // CHECK-SAME: tau(5.000000e-01) causal(true) : tensor<2x?x64xbf16>, tensor<2x?x16xf16> -> tensor<2x?x16xf32>
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<64x64xf32>) key_mask(%m : tensor<2x?xi1>) tau(0.5) causal(true)
      : tensor<2x?x64xbf16>, tensor<2x?x16xf16> -> tensor<2x?x16xf32>
  return %p : tensor<2x?x16xf32>
}

// CHECK-LABEL: func.func @similarity_inform_mask_only
func.func @similarity_inform_mask_only(%u: tensor<1x8x4xf32>, %e: tensor<1x8x2xf32>, %m: tensor<1x8xi1>) -> tensor<1x8x2xf32> {
  // CHECK: moe.similarity_inform %{{.*}}, %{{.*}} key_mask(%{{.*}} : tensor<1x8xi1>) : tensor<1x8x4xf32>
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<1x8xi1>) : tensor<1x8x4xf32>, tensor<1x8x2xf32> -> tensor<1x8x2xf32>
  return %p : tensor<1x8x2xf32>
}

// CHECK-LABEL: func.func @attention_posterior_min_entropy
func.func @attention_posterior_min_entropy(%s: tensor<2x8x128x128xf32>, %u: tensor<2x128x512xf32>,
    %v: tensor<2x8x128x64xf32>, %wo: tensor<512x512xf32>, %e: tensor<2x128x16xf32>) -> (tensor<2x128x16xf32>, tensor<2xi32>) {
  // CHECK: moe.attention_posterior %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} : tensor<2x8x128x128xf32>, tensor<2x128x512xf32>,
  // CHECK-SAME: -> tensor<2x128x16xf32>, tensor<2xi32>
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x8x128x128xf32>, tensor<2x128x512xf32>, tensor<2x8x128x64xf32>, tensor<512x512xf32>, tensor<2x128x16xf32>
      -> tensor<2x128x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x128x16xf32>, tensor<2xi32>
}

// CHECK-LABEL: func.func @attention_posterior_all_heads
func.func @attention_posterior_all_heads(%s: tensor<?x4x?x?xbf16>, %u: tensor<?x?x32xbf16>, %v: tensor<?x4x?x8xbf16>,
    %wo: tensor<32x32xf32>, %e: tensor<?x?x8xf32>) -> tensor<?x?x8xf32> {
  // CHECK: moe.attention_posterior {{.*}} sigma(1.000000e-01) head_select(all) head_scale(1.000000e+00)
  // CHECK-SAME: -> tensor<?x?x8xf32>, tensor<?xi32>
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(0.1) head_select(all) head_scale(1.0)
      : tensor<?x4x?x?xbf16>, tensor<?x?x32xbf16>, tensor<?x4x?x8xbf16>, tensor<32x32xf32>, tensor<?x?x8xf32>
      -> tensor<?x?x8xf32>, tensor<?xi32>
  return %p : tensor<?x?x8xf32>
}

// CHECK-LABEL: func.func @mad_dispersion_defaults
func.func @mad_dispersion_defaults(%x: tensor<4096x352xf32>, %a: tensor<4096xi32>) -> (tensor<16x352xf32>, tensor<16xi32>) {
  // CHECK: moe.mad_dispersion %{{.*}}, %{{.*}} num_experts(16) : tensor<4096x352xf32>, tensor<4096xi32> -> tensor<16x352xf32>, tensor<16xi32>
  %w, %c = moe.mad_dispersion %x, %a num_experts(16) : tensor<4096x352xf32>, tensor<4096xi32> -> tensor<16x352xf32>, tensor<16xi32>
  return %w, %c : tensor<16x352xf32>, tensor<16xi32>
}

// CHECK-LABEL: func.func @mad_dispersion_expert_variance_raw
func.func @mad_dispersion_expert_variance_raw(%x: tensor<?x64xf16>, %a: tensor<?xi64>) -> tensor<4x64xf32> {
  // CHECK: moe.mad_dispersion %{{.*}}, %{{.*}} num_experts(4) eps(1.000000e-01) clip(0.000000e+00) normalize(expert)
  // CHECK-SAME: measure(variance) empty(raw) : tensor<?x64xf16>, tensor<?xi64> -> tensor<4x64xf32>, tensor<4xi32>
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) eps(0.1) clip(0.0) normalize(expert) measure(variance) empty(raw)
      : tensor<?x64xf16>, tensor<?xi64> -> tensor<4x64xf32>, tensor<4xi32>
  return %w : tensor<4x64xf32>
}

// CHECK-LABEL: func.func @mad_dispersion_global
func.func @mad_dispersion_global(%x: tensor<32x8xbf16>, %a: tensor<32xi32>) -> tensor<2x8xf32> {
  // CHECK: moe.mad_dispersion %{{.*}}, %{{.*}} num_experts(2) clip(1.500000e+00) normalize(global) : tensor<32x8xbf16>
  %w, %c = moe.mad_dispersion %x, %a num_experts(2) clip(1.5) normalize(global)
      : tensor<32x8xbf16>, tensor<32xi32> -> tensor<2x8xf32>, tensor<2xi32>
  return %w : tensor<2x8xf32>
}

// CHECK-LABEL: func.func @adjacency_update_defaults
func.func @adjacency_update_defaults(%a: tensor<16x16xf32>, %idx: tensor<8192x2xi32>) -> tensor<16x16xf32> {
  // CHECK: moe.adjacency_update %{{.*}}, %{{.*}} : tensor<16x16xf32>, tensor<8192x2xi32> -> tensor<16x16xf32>
  %n = moe.adjacency_update %a, %idx : tensor<16x16xf32>, tensor<8192x2xi32> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}

// CHECK-LABEL: func.func @adjacency_update_col_no_self
func.func @adjacency_update_col_no_self(%a: tensor<16x16xf32>, %idx: tensor<?x4xi64>) -> tensor<16x16xf32> {
  // CHECK: moe.adjacency_update %{{.*}}, %{{.*}} beta(9.900000e-01) norm(col) include_self(false) : tensor<16x16xf32>, tensor<?x4xi64>
  %n = moe.adjacency_update %a, %idx beta(0.99) norm(col) include_self(false) : tensor<16x16xf32>, tensor<?x4xi64> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}

// CHECK-LABEL: func.func @adjacency_update_counts
func.func @adjacency_update_counts(%a: tensor<?x?xf16>, %idx: tensor<?x?xi32>) -> tensor<?x?xf32> {
  // CHECK: moe.adjacency_update %{{.*}}, %{{.*}} beta(0.000000e+00) norm(none) : tensor<?x?xf16>, tensor<?x?xi32> -> tensor<?x?xf32>
  %n = moe.adjacency_update %a, %idx beta(0.0) norm(none) : tensor<?x?xf16>, tensor<?x?xi32> -> tensor<?x?xf32>
  return %n : tensor<?x?xf32>
}

// CHECK-LABEL: func.func @hyper_router_paper_sizes
func.func @hyper_router_paper_sizes(%emb: tensor<256xf32>, %w1: tensor<256x256xf32>, %b1: tensor<256xf32>,
    %w2: tensor<4112x256xf32>, %b2: tensor<4112xf32>) -> (tensor<16x256xf32>, tensor<16xf32>) {
  // CHECK: moe.hyper_router %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} num_experts(16) : tensor<256xf32>, tensor<256x256xf32>,
  // CHECK-SAME: -> tensor<16x256xf32>, tensor<16xf32>
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(16)
      : tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<4112x256xf32>, tensor<4112xf32>
      -> tensor<16x256xf32>, tensor<16xf32>
  return %w, %b : tensor<16x256xf32>, tensor<16xf32>
}

// CHECK-LABEL: func.func @hyper_router_dynamic_rows
func.func @hyper_router_dynamic_rows(%emb: tensor<8xbf16>, %w1: tensor<4x8xbf16>, %b1: tensor<4xbf16>,
    %w2: tensor<?x4xbf16>, %b2: tensor<?xbf16>) -> tensor<2x?xf32> {
  // CHECK: moe.hyper_router {{.*}} num_experts(2) : tensor<8xbf16>, tensor<4x8xbf16>, tensor<4xbf16>, tensor<?x4xbf16>, tensor<?xbf16> -> tensor<2x?xf32>, tensor<2xf32>
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(2)
      : tensor<8xbf16>, tensor<4x8xbf16>, tensor<4xbf16>, tensor<?x4xbf16>, tensor<?xbf16> -> tensor<2x?xf32>, tensor<2xf32>
  return %w : tensor<2x?xf32>
}

// CHECK-LABEL: func.func @similarity_inform_topk_round_trip
func.func @similarity_inform_topk_round_trip(%u: tensor<2x?x64xf32>, %e: tensor<2x?x16xf32>, %m: tensor<2x?xi1>)
    -> tensor<2x?x2xi32> {
  // CHECK: moe.similarity_inform_topk %{{.*}}, %{{.*}} key_mask(%{{.*}} : tensor<2x?xi1>) k(2) renormalize(false) tau(2.000000e+00) causal(true)
  // CHECK-SAME: : tensor<2x?x64xf32>, tensor<2x?x16xf32> -> tensor<2x?x2xf32>, tensor<2x?x2xi32>
  %w, %i = moe.similarity_inform_topk %u, %e key_mask(%m : tensor<2x?xi1>) k(2) renormalize(false) tau(2.0) causal(true)
      : tensor<2x?x64xf32>, tensor<2x?x16xf32> -> tensor<2x?x2xf32>, tensor<2x?x2xi32>
  return %i : tensor<2x?x2xi32>
}

// CHECK-LABEL: func.func @attention_posterior_topk_round_trip
func.func @attention_posterior_topk_round_trip(%s: tensor<2x8x128x128xf32>, %u: tensor<2x128x512xf32>,
    %v: tensor<2x8x128x64xf32>, %wo: tensor<512x512xf32>, %e: tensor<2x128x16xf32>) -> tensor<2xi32> {
  // CHECK: moe.attention_posterior_topk %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} k(2) sigma(5.000000e-01) head_select(all)
  // CHECK-SAME: -> tensor<2x128x2xf32>, tensor<2x128x2xi32>, tensor<2xi32>
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) sigma(0.5) head_select(all)
      : tensor<2x8x128x128xf32>, tensor<2x128x512xf32>, tensor<2x8x128x64xf32>, tensor<512x512xf32>, tensor<2x128x16xf32>
      -> tensor<2x128x2xf32>, tensor<2x128x2xi32>, tensor<2xi32>
  return %h : tensor<2xi32>
}
