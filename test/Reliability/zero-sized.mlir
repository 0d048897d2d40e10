// Issue #15: every op with a zero-sized dimension (static) lowers through every pipeline, the result verifies
// (moe-opt verifies after each pass) and no moe op is left: moe-legalize-shapes, run first by each pipeline,
// rewrites them into their defined results (the values are checked by test/Integration/CPU/zero_sized.mlir).
// Names: <op>_<sizes>, e.g. ap_min_entropy_B_H_N_Nk_D_Dh_K, sim_B_N_D_K, mad_<empty>_T_D, hyper_De_Dh.
// RUN: moe-opt %s -split-input-file --convert-moe-to-linalg | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-lower-to-llvm | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-lower-to-llvm=cpu-kernels=false | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-lower-to-nvvm="chip=sm_90 format=isa" | FileCheck %s

// CHECK-LABEL: @adj_t0
// CHECK-NOT: moe.
func.func @adj_t0(%a: tensor<4x4xf32>, %i: tensor<0x2xi32>) -> tensor<4x4xf32> {
  %r = moe.adjacency_update %a, %i : tensor<4x4xf32>, tensor<0x2xi32> -> tensor<4x4xf32>
  return %r : tensor<4x4xf32>
}

// -----

// CHECK-LABEL: @ap_min_entropy_0_2_4_5_6_3_3
// CHECK-NOT: moe.
func.func @ap_min_entropy_0_2_4_5_6_3_3(%s: tensor<0x2x4x5xf32>, %u: tensor<0x4x6xf32>, %v: tensor<0x2x5x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<0x5x3xf32>) -> (tensor<0x4x3xf32>, tensor<0xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(min_entropy) : tensor<0x2x4x5xf32>, tensor<0x4x6xf32>, tensor<0x2x5x3xf32>, tensor<6x6xf32>, tensor<0x5x3xf32> -> tensor<0x4x3xf32>, tensor<0xi32>
  return %p, %h : tensor<0x4x3xf32>, tensor<0xi32>
}

// -----

// CHECK-LABEL: @ap_min_entropy_2_2_0_5_6_3_3
// CHECK-NOT: moe.
func.func @ap_min_entropy_2_2_0_5_6_3_3(%s: tensor<2x2x0x5xf32>, %u: tensor<2x0x6xf32>, %v: tensor<2x2x5x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<2x5x3xf32>) -> (tensor<2x0x3xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(min_entropy) : tensor<2x2x0x5xf32>, tensor<2x0x6xf32>, tensor<2x2x5x3xf32>, tensor<6x6xf32>, tensor<2x5x3xf32> -> tensor<2x0x3xf32>, tensor<2xi32>
  return %p, %h : tensor<2x0x3xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @ap_min_entropy_2_2_4_0_6_3_3
// CHECK-NOT: moe.
func.func @ap_min_entropy_2_2_4_0_6_3_3(%s: tensor<2x2x4x0xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x0x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<2x0x3xf32>) -> (tensor<2x4x3xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(min_entropy) : tensor<2x2x4x0xf32>, tensor<2x4x6xf32>, tensor<2x2x0x3xf32>, tensor<6x6xf32>, tensor<2x0x3xf32> -> tensor<2x4x3xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x3xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @ap_min_entropy_2_2_4_5_0_3_3
// CHECK-NOT: moe.
func.func @ap_min_entropy_2_2_4_5_0_3_3(%s: tensor<2x2x4x5xf32>, %u: tensor<2x4x0xf32>, %v: tensor<2x2x5x3xf32>, %wo: tensor<0x6xf32>, %e: tensor<2x5x3xf32>) -> (tensor<2x4x3xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(min_entropy) : tensor<2x2x4x5xf32>, tensor<2x4x0xf32>, tensor<2x2x5x3xf32>, tensor<0x6xf32>, tensor<2x5x3xf32> -> tensor<2x4x3xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x3xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @ap_min_entropy_2_2_4_5_6_0_3
// CHECK-NOT: moe.
func.func @ap_min_entropy_2_2_4_5_6_0_3(%s: tensor<2x2x4x5xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x5x0xf32>, %wo: tensor<6x0xf32>, %e: tensor<2x5x3xf32>) -> (tensor<2x4x3xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(min_entropy) : tensor<2x2x4x5xf32>, tensor<2x4x6xf32>, tensor<2x2x5x0xf32>, tensor<6x0xf32>, tensor<2x5x3xf32> -> tensor<2x4x3xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x3xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @ap_min_entropy_2_2_4_5_6_3_0
// CHECK-NOT: moe.
func.func @ap_min_entropy_2_2_4_5_6_3_0(%s: tensor<2x2x4x5xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x5x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<2x5x0xf32>) -> (tensor<2x4x0xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(min_entropy) : tensor<2x2x4x5xf32>, tensor<2x4x6xf32>, tensor<2x2x5x3xf32>, tensor<6x6xf32>, tensor<2x5x0xf32> -> tensor<2x4x0xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x0xf32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @aptopk_0_2_4_5_6_3
// CHECK-NOT: moe.
func.func @aptopk_0_2_4_5_6_3(%s: tensor<0x2x4x5xf32>, %u: tensor<0x4x6xf32>, %v: tensor<0x2x5x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<0x5x4xf32>) -> (tensor<0x4x2xf32>, tensor<0x4x2xi32>, tensor<0xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) : tensor<0x2x4x5xf32>, tensor<0x4x6xf32>, tensor<0x2x5x3xf32>, tensor<6x6xf32>, tensor<0x5x4xf32> -> tensor<0x4x2xf32>, tensor<0x4x2xi32>, tensor<0xi32>
  return %w, %i, %h : tensor<0x4x2xf32>, tensor<0x4x2xi32>, tensor<0xi32>
}

// -----

// CHECK-LABEL: @aptopk_2_2_0_5_6_3
// CHECK-NOT: moe.
func.func @aptopk_2_2_0_5_6_3(%s: tensor<2x2x0x5xf32>, %u: tensor<2x0x6xf32>, %v: tensor<2x2x5x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<2x5x4xf32>) -> (tensor<2x0x2xf32>, tensor<2x0x2xi32>, tensor<2xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) : tensor<2x2x0x5xf32>, tensor<2x0x6xf32>, tensor<2x2x5x3xf32>, tensor<6x6xf32>, tensor<2x5x4xf32> -> tensor<2x0x2xf32>, tensor<2x0x2xi32>, tensor<2xi32>
  return %w, %i, %h : tensor<2x0x2xf32>, tensor<2x0x2xi32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @aptopk_2_2_4_0_6_3
// CHECK-NOT: moe.
func.func @aptopk_2_2_4_0_6_3(%s: tensor<2x2x4x0xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x0x3xf32>, %wo: tensor<6x6xf32>, %e: tensor<2x0x4xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) : tensor<2x2x4x0xf32>, tensor<2x4x6xf32>, tensor<2x2x0x3xf32>, tensor<6x6xf32>, tensor<2x0x4xf32> -> tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2xi32>
  return %w, %i, %h : tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @aptopk_2_2_4_5_0_3
// CHECK-NOT: moe.
func.func @aptopk_2_2_4_5_0_3(%s: tensor<2x2x4x5xf32>, %u: tensor<2x4x0xf32>, %v: tensor<2x2x5x3xf32>, %wo: tensor<0x6xf32>, %e: tensor<2x5x4xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) : tensor<2x2x4x5xf32>, tensor<2x4x0xf32>, tensor<2x2x5x3xf32>, tensor<0x6xf32>, tensor<2x5x4xf32> -> tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2xi32>
  return %w, %i, %h : tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: @hyper_0_5
// CHECK-NOT: moe.
func.func @hyper_0_5(%emb: tensor<0xf32>, %w1: tensor<5x0xf32>, %b1: tensor<5xf32>, %w2: tensor<12x5xf32>, %b2: tensor<12xf32>) -> (tensor<4x2xf32>, tensor<4xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4) : tensor<0xf32>, tensor<5x0xf32>, tensor<5xf32>, tensor<12x5xf32>, tensor<12xf32> -> tensor<4x2xf32>, tensor<4xf32>
  return %w, %b : tensor<4x2xf32>, tensor<4xf32>
}

// -----

// CHECK-LABEL: @hyper_5_0
// CHECK-NOT: moe.
func.func @hyper_5_0(%emb: tensor<5xf32>, %w1: tensor<0x5xf32>, %b1: tensor<0xf32>, %w2: tensor<12x0xf32>, %b2: tensor<12xf32>) -> (tensor<4x2xf32>, tensor<4xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4) : tensor<5xf32>, tensor<0x5xf32>, tensor<0xf32>, tensor<12x0xf32>, tensor<12xf32> -> tensor<4x2xf32>, tensor<4xf32>
  return %w, %b : tensor<4x2xf32>, tensor<4xf32>
}

// -----

// CHECK-LABEL: @mad_identity_0_8
// CHECK-NOT: moe.
func.func @mad_identity_0_8(%x: tensor<0x8xf32>, %a: tensor<0xi32>) -> (tensor<4x8xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) empty(identity) : tensor<0x8xf32>, tensor<0xi32> -> tensor<4x8xf32>, tensor<4xi32>
  return %w, %c : tensor<4x8xf32>, tensor<4xi32>
}

// -----

// CHECK-LABEL: @mad_identity_6_0
// CHECK-NOT: moe.
func.func @mad_identity_6_0(%x: tensor<6x0xf32>, %a: tensor<6xi32>) -> (tensor<4x0xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) empty(identity) : tensor<6x0xf32>, tensor<6xi32> -> tensor<4x0xf32>, tensor<4xi32>
  return %w, %c : tensor<4x0xf32>, tensor<4xi32>
}

// -----

// CHECK-LABEL: @mad_raw_0_8
// CHECK-NOT: moe.
func.func @mad_raw_0_8(%x: tensor<0x8xf32>, %a: tensor<0xi32>) -> (tensor<4x8xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) empty(raw) : tensor<0x8xf32>, tensor<0xi32> -> tensor<4x8xf32>, tensor<4xi32>
  return %w, %c : tensor<4x8xf32>, tensor<4xi32>
}

// -----

// CHECK-LABEL: @mad_raw_6_0
// CHECK-NOT: moe.
func.func @mad_raw_6_0(%x: tensor<6x0xf32>, %a: tensor<6xi32>) -> (tensor<4x0xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) empty(raw) : tensor<6x0xf32>, tensor<6xi32> -> tensor<4x0xf32>, tensor<4xi32>
  return %w, %c : tensor<4x0xf32>, tensor<4xi32>
}

// -----

// CHECK-LABEL: @sim_0_4_8_3
// CHECK-NOT: moe.
func.func @sim_0_4_8_3(%u: tensor<0x4x8xf32>, %e: tensor<0x4x3xf32>) -> tensor<0x4x3xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<0x4x8xf32>, tensor<0x4x3xf32> -> tensor<0x4x3xf32>
  return %p : tensor<0x4x3xf32>
}

// -----

// CHECK-LABEL: @sim_2_0_8_3
// CHECK-NOT: moe.
func.func @sim_2_0_8_3(%u: tensor<2x0x8xf32>, %e: tensor<2x0x3xf32>) -> tensor<2x0x3xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<2x0x8xf32>, tensor<2x0x3xf32> -> tensor<2x0x3xf32>
  return %p : tensor<2x0x3xf32>
}

// -----

// CHECK-LABEL: @sim_2_4_0_3
// CHECK-NOT: moe.
func.func @sim_2_4_0_3(%u: tensor<2x4x0xf32>, %e: tensor<2x4x3xf32>) -> tensor<2x4x3xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<2x4x0xf32>, tensor<2x4x3xf32> -> tensor<2x4x3xf32>
  return %p : tensor<2x4x3xf32>
}

// -----

// CHECK-LABEL: @sim_2_4_8_0
// CHECK-NOT: moe.
func.func @sim_2_4_8_0(%u: tensor<2x4x8xf32>, %e: tensor<2x4x0xf32>) -> tensor<2x4x0xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<2x4x8xf32>, tensor<2x4x0xf32> -> tensor<2x4x0xf32>
  return %p : tensor<2x4x0xf32>
}

// -----

// CHECK-LABEL: @simtopk_d0
// CHECK-NOT: moe.
func.func @simtopk_d0(%u: tensor<2x3x0xf32>, %e: tensor<2x3x4xf32>) -> (tensor<2x3x2xf32>, tensor<2x3x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<2x3x0xf32>, tensor<2x3x4xf32> -> tensor<2x3x2xf32>, tensor<2x3x2xi32>
  return %w, %i : tensor<2x3x2xf32>, tensor<2x3x2xi32>
}

// -----

// CHECK-LABEL: @simtopk_n0
// CHECK-NOT: moe.
func.func @simtopk_n0(%u: tensor<2x0x8xf32>, %e: tensor<2x0x4xf32>) -> (tensor<2x0x2xf32>, tensor<2x0x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<2x0x8xf32>, tensor<2x0x4xf32> -> tensor<2x0x2xf32>, tensor<2x0x2xi32>
  return %w, %i : tensor<2x0x2xf32>, tensor<2x0x2xi32>
}

// -----

// CHECK-LABEL: @topk_b0
// CHECK-NOT: moe.
func.func @topk_b0(%x: tensor<3x0x16xf32>) -> (tensor<3x0x2xf32>, tensor<3x0x2xi32>) {
  %w, %i = moe.topk_renorm %x k(2) mode(probs) : tensor<3x0x16xf32> -> tensor<3x0x2xf32>, tensor<3x0x2xi32>
  return %w, %i : tensor<3x0x2xf32>, tensor<3x0x2xi32>
}

// -----

// CHECK-LABEL: @topk_rows0
// CHECK-NOT: moe.
func.func @topk_rows0(%x: tensor<0x16xf32>) -> (tensor<0x2xf32>, tensor<0x2xi32>) {
  %w, %i = moe.topk_renorm %x k(2) : tensor<0x16xf32> -> tensor<0x2xf32>, tensor<0x2xi32>
  return %w, %i : tensor<0x2xf32>, tensor<0x2xi32>
}
