// Round trip of the backward ops (MoEGradOps.td): print, parse and print again must agree, in the custom form and
// through the generic form.
// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s

// CHECK-LABEL: func.func @similarity_inform_grad_defaults
func.func @similarity_inform_grad_defaults(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>, %dp: tensor<2x128x16xf32>)
    -> (tensor<2x128x64xf32>, tensor<2x128x16xf32>) {
  // CHECK: moe.similarity_inform_grad %{{.*}}, %{{.*}} dp(%{{.*}} : tensor<2x128x16xf32>) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x128x16xf32>)
      : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>
  return %du, %de : tensor<2x128x64xf32>, tensor<2x128x16xf32>
}

// Every optional operand and attribute; ws adds the result dws [D, D]; f16 operands give f32 gradients.
// CHECK-LABEL: func.func @similarity_inform_grad_all
func.func @similarity_inform_grad_all(%u: tensor<?x?x64xf16>, %e: tensor<?x?x16xbf16>, %ws: tensor<64x64xf32>,
                                      %m: tensor<?x?xi1>, %dp: tensor<?x?x16xf32>)
    -> (tensor<?x?x64xf32>, tensor<?x?x16xf32>, tensor<64x64xf32>) {
  // CHECK: moe.similarity_inform_grad %{{.*}}, %{{.*}} ws(%{{.*}} : tensor<64x64xf32>) key_mask(%{{.*}} : tensor<?x?xi1>) dp(%{{.*}} : tensor<?x?x16xf32>) tau(5.000000e-01) causal(true) : tensor<?x?x64xf16>, tensor<?x?x16xbf16> -> tensor<?x?x64xf32>, tensor<?x?x16xf32>, tensor<64x64xf32>
  %du, %de, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<64x64xf32>) key_mask(%m : tensor<?x?xi1>)
      dp(%dp : tensor<?x?x16xf32>) tau(0.5) causal(true)
      : tensor<?x?x64xf16>, tensor<?x?x16xbf16> -> tensor<?x?x64xf32>, tensor<?x?x16xf32>, tensor<64x64xf32>
  return %du, %de, %dws : tensor<?x?x64xf32>, tensor<?x?x16xf32>, tensor<64x64xf32>
}

// The training forward and the backward that reads its saved p and lse.
// CHECK-LABEL: func.func @similarity_inform_fwd_then_saved_grad
func.func @similarity_inform_fwd_then_saved_grad(%u: tensor<?x?x64xbf16>, %e: tensor<?x?x16xf32>, %m: tensor<?x?xi1>,
                                                 %dp: tensor<?x?x16xf32>) -> (tensor<?x?x64xf32>, tensor<?x?xf32>) {
  // CHECK: %[[P:.+]], %[[LSE:.+]] = moe.similarity_inform_fwd %{{.*}}, %{{.*}} key_mask(%{{.*}} : tensor<?x?xi1>) tau(2.500000e-01) causal(true) : tensor<?x?x64xbf16>, tensor<?x?x16xf32> -> tensor<?x?x16xf32>, tensor<?x?xf32>
  %p, %lse = moe.similarity_inform_fwd %u, %e key_mask(%m : tensor<?x?xi1>) tau(0.25) causal(true)
      : tensor<?x?x64xbf16>, tensor<?x?x16xf32> -> tensor<?x?x16xf32>, tensor<?x?xf32>
  // CHECK: moe.similarity_inform_grad %{{.*}}, %{{.*}} key_mask(%{{.*}} : tensor<?x?xi1>) dp(%{{.*}} : tensor<?x?x16xf32>) saved(%[[P]], %[[LSE]] : tensor<?x?x16xf32>, tensor<?x?xf32>) tau(2.500000e-01) causal(true) : tensor<?x?x64xbf16>, tensor<?x?x16xf32> -> tensor<?x?x64xf32>, tensor<?x?x16xf32>
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<?x?xi1>) dp(%dp : tensor<?x?x16xf32>)
      saved(%p, %lse : tensor<?x?x16xf32>, tensor<?x?xf32>) tau(0.25) causal(true)
      : tensor<?x?x64xbf16>, tensor<?x?x16xf32> -> tensor<?x?x64xf32>, tensor<?x?x16xf32>
  return %du, %lse : tensor<?x?x64xf32>, tensor<?x?xf32>
}

// A written result type may refine a dynamic size.
// CHECK-LABEL: func.func @similarity_inform_grad_refined
func.func @similarity_inform_grad_refined(%u: tensor<?x8x4xf32>, %e: tensor<?x8x3xf32>, %dp: tensor<2x8x3xf32>)
    -> tensor<2x8x4xf32> {
  // CHECK: -> tensor<2x8x4xf32>, tensor<?x8x3xf32>
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x8x3xf32>)
      : tensor<?x8x4xf32>, tensor<?x8x3xf32> -> tensor<2x8x4xf32>, tensor<?x8x3xf32>
  return %du : tensor<2x8x4xf32>
}

// CHECK-LABEL: func.func @topk_renorm_grad_defaults
func.func @topk_renorm_grad_defaults(%s: tensor<4x128x16xf32>, %i: tensor<4x128x2xi32>, %dw: tensor<4x128x2xf32>)
    -> tensor<4x128x16xf32> {
  // CHECK: moe.topk_renorm_grad %{{.*}}, %{{.*}} dw(%{{.*}} : tensor<4x128x2xf32>) : tensor<4x128x16xf32>, tensor<4x128x2xi32> -> tensor<4x128x16xf32>
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<4x128x2xf32>)
      : tensor<4x128x16xf32>, tensor<4x128x2xi32> -> tensor<4x128x16xf32>
  return %ds : tensor<4x128x16xf32>
}

// CHECK-LABEL: func.func @topk_renorm_grad_modes
func.func @topk_renorm_grad_modes(%s: tensor<?x16xbf16>, %i: tensor<?x16xi32>, %dw: tensor<?x16xf32>)
    -> (tensor<?x16xf32>, tensor<?x16xf32>) {
  // CHECK: moe.topk_renorm_grad %{{.*}}, %{{.*}} dw(%{{.*}} : tensor<?x16xf32>) mode(probs) renormalize(false) : tensor<?x16xbf16>, tensor<?x16xi32> -> tensor<?x16xf32>
  %a = moe.topk_renorm_grad %s, %i dw(%dw : tensor<?x16xf32>) mode(probs) renormalize(false)
      : tensor<?x16xbf16>, tensor<?x16xi32> -> tensor<?x16xf32>
  // CHECK: moe.topk_renorm_grad %{{.*}}, %{{.*}} dw(%{{.*}} : tensor<?x16xf32>) renormalize(false) : tensor<?x16xbf16>, tensor<?x16xi32> -> tensor<?x16xf32>
  %b = moe.topk_renorm_grad %s, %i dw(%dw : tensor<?x16xf32>) mode(logits) renormalize(false)
      : tensor<?x16xbf16>, tensor<?x16xi32> -> tensor<?x16xf32>
  return %a, %b : tensor<?x16xf32>, tensor<?x16xf32>
}

// CHECK-LABEL: func.func @hyper_router_grad_static
func.func @hyper_router_grad_static(%emb: tensor<8xf32>, %w1: tensor<6x8xf32>, %b1: tensor<6xf32>,
                                    %w2: tensor<20x6xf32>, %b2: tensor<20xf32>, %dw: tensor<4x4xf32>,
                                    %db: tensor<4xf32>)
    -> (tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>) {
  // CHECK: moe.hyper_router_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} dw(%{{.*}} : tensor<4x4xf32>) db(%{{.*}} : tensor<4xf32>) num_experts(4) : tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32> -> tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
  %a, %b, %c, %d, %e = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>)
      db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
  return %a, %b, %c, %d, %e : tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
}

// Dynamic sizes and bf16/f16 operands: the gradients are f32 in the operands' shapes.
// CHECK-LABEL: func.func @hyper_router_grad_dynamic
func.func @hyper_router_grad_dynamic(%emb: tensor<?xbf16>, %w1: tensor<?x?xbf16>, %b1: tensor<?xf16>,
                                     %w2: tensor<?x?xf32>, %b2: tensor<?xf32>, %dw: tensor<2x?xf32>,
                                     %db: tensor<?xf32>)
    -> (tensor<?xf32>, tensor<?x?xf32>) {
  // CHECK: moe.hyper_router_grad {{.*}} num_experts(2) : tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xf16>, tensor<?x?xf32>, tensor<?xf32> -> tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
  %a, %b, %c, %d, %e = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<2x?xf32>)
      db(%db : tensor<?xf32>) num_experts(2)
      : tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xf16>, tensor<?x?xf32>, tensor<?xf32>
      -> tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
  return %a, %b : tensor<?xf32>, tensor<?x?xf32>
}

// attention_posterior_grad: min_entropy takes the forward's head; every gradient has its operand's shape, in f32.
// CHECK-LABEL: func.func @attention_posterior_grad_min_entropy
func.func @attention_posterior_grad_min_entropy(%s: tensor<2x4x8x6xf32>, %u: tensor<2x8x12xf32>,
    %v: tensor<2x4x6x3xf32>, %wo: tensor<12x12xf32>, %e: tensor<2x6x5xf32>, %h: tensor<2xi32>,
    %dp: tensor<2x8x5xf32>)
    -> (tensor<2x4x8x6xf32>, tensor<2x8x12xf32>, tensor<2x4x6x3xf32>, tensor<12x12xf32>, tensor<2x6x5xf32>) {
  // CHECK: moe.attention_posterior_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} head(%{{.*}} : tensor<2xi32>) dp(%{{.*}} : tensor<2x8x5xf32>) sigma(2.000000e+00) head_scale(5.000000e-01) : tensor<2x4x8x6xf32>, tensor<2x8x12xf32>, tensor<2x4x6x3xf32>, tensor<12x12xf32>, tensor<2x6x5xf32> -> tensor<2x4x8x6xf32>, tensor<2x8x12xf32>, tensor<2x4x6x3xf32>, tensor<12x12xf32>, tensor<2x6x5xf32>
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<2xi32>)
      dp(%dp : tensor<2x8x5xf32>) sigma(2.0) head_select(min_entropy) head_scale(0.5)
      : tensor<2x4x8x6xf32>, tensor<2x8x12xf32>, tensor<2x4x6x3xf32>, tensor<12x12xf32>, tensor<2x6x5xf32>
      -> tensor<2x4x8x6xf32>, tensor<2x8x12xf32>, tensor<2x4x6x3xf32>, tensor<12x12xf32>, tensor<2x6x5xf32>
  return %ds, %du, %dv, %dwo, %de
      : tensor<2x4x8x6xf32>, tensor<2x8x12xf32>, tensor<2x4x6x3xf32>, tensor<12x12xf32>, tensor<2x6x5xf32>
}

// head_select = all: no head operand; f16/bf16 operands and dynamic sizes give f32 gradients.
// CHECK-LABEL: func.func @attention_posterior_grad_all
func.func @attention_posterior_grad_all(%s: tensor<?x4x?x?xf16>, %u: tensor<?x?x12xf32>,
    %v: tensor<?x4x?x3xbf16>, %wo: tensor<12x12xf32>, %e: tensor<?x?x5xf32>, %dp: tensor<?x?x5xf32>)
    -> (tensor<?x4x?x?xf32>, tensor<?x4x?x3xf32>) {
  // CHECK: moe.attention_posterior_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} dp(%{{.*}} : tensor<?x?x5xf32>) head_select(all) : tensor<?x4x?x?xf16>, tensor<?x?x12xf32>, tensor<?x4x?x3xbf16>, tensor<12x12xf32>, tensor<?x?x5xf32> -> tensor<?x4x?x?xf32>, tensor<?x?x12xf32>, tensor<?x4x?x3xf32>, tensor<12x12xf32>, tensor<?x?x5xf32>
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e dp(%dp : tensor<?x?x5xf32>)
      head_select(all)
      : tensor<?x4x?x?xf16>, tensor<?x?x12xf32>, tensor<?x4x?x3xbf16>, tensor<12x12xf32>, tensor<?x?x5xf32>
      -> tensor<?x4x?x?xf32>, tensor<?x?x12xf32>, tensor<?x4x?x3xf32>, tensor<12x12xf32>, tensor<?x?x5xf32>
  return %ds, %dv : tensor<?x4x?x?xf32>, tensor<?x4x?x3xf32>
}
