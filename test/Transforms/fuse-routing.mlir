// moe-fuse-routing: a mixing op whose probabilities feed only a probs-mode top-k becomes one fused op;
// moe-split-fused-routing undoes it exactly.
// RUN: moe-opt %s -moe-fuse-routing -split-input-file | FileCheck %s
// RUN: moe-opt %s -moe-fuse-routing -moe-split-fused-routing -split-input-file | FileCheck %s --check-prefix=SPLIT

// CHECK-LABEL: func.func @similarity_then_gate
// CHECK-SAME:    (%[[U:.+]]: tensor<2x8x16xf32>, %[[E:.+]]: tensor<2x8x4xf32>, %[[M:.+]]: tensor<2x8xi1>)
// CHECK:         %[[W:.+]], %[[I:.+]] = moe.similarity_inform_topk %[[U]], %[[E]] key_mask(%[[M]] : tensor<2x8xi1>) k(2)
// CHECK-SAME:      tau(5.000000e-01) causal(true) : tensor<2x8x16xf32>, tensor<2x8x4xf32> -> tensor<2x8x2xf32>, tensor<2x8x2xi32>
// CHECK-NOT:     moe.similarity_inform
// CHECK-NOT:     moe.topk_renorm
// CHECK:         return %[[W]], %[[I]]
// SPLIT-LABEL: func.func @similarity_then_gate
// SPLIT:         %[[P:.+]] = moe.similarity_inform %{{.+}}, %{{.+}} key_mask(%{{.+}} : tensor<2x8xi1>) tau(5.000000e-01) causal(true)
// SPLIT:         moe.topk_renorm %[[P]] k(2) mode(probs) :
func.func @similarity_then_gate(%u: tensor<2x8x16xf32>, %e: tensor<2x8x4xf32>, %m: tensor<2x8xi1>)
    -> (tensor<2x8x2xf32>, tensor<2x8x2xi32>) {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<2x8xi1>) tau(0.5) causal(true)
      : tensor<2x8x16xf32>, tensor<2x8x4xf32> -> tensor<2x8x4xf32>
  %w, %i = moe.topk_renorm %p k(2) mode(probs) : tensor<2x8x4xf32> -> tensor<2x8x2xf32>, tensor<2x8x2xi32>
  return %w, %i : tensor<2x8x2xf32>, tensor<2x8x2xi32>
}

// -----

// The raw (Symphony-style) gate fuses too; `renormalize` travels with it.
// CHECK-LABEL: func.func @similarity_then_raw_gate
// CHECK:         moe.similarity_inform_topk %{{.+}}, %{{.+}} ws(%{{.+}} : tensor<16x16xf32>) k(1) renormalize(false) :
// SPLIT-LABEL: func.func @similarity_then_raw_gate
// SPLIT:         moe.topk_renorm %{{.+}} k(1) mode(probs) renormalize(false)
func.func @similarity_then_raw_gate(%u: tensor<?x8x16xf32>, %e: tensor<?x8x4xf32>, %ws: tensor<16x16xf32>) -> tensor<?x8x1xf32> {
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<16x16xf32>) : tensor<?x8x16xf32>, tensor<?x8x4xf32> -> tensor<?x8x4xf32>
  %w, %i = moe.topk_renorm %p k(1) mode(probs) renormalize(false) : tensor<?x8x4xf32> -> tensor<?x8x1xf32>, tensor<?x8x1xi32>
  return %w : tensor<?x8x1xf32>
}

// -----

// p is also returned: fusing would compute the mixing twice, so nothing changes.
// CHECK-LABEL: func.func @shared_probabilities_stay_unfused
// CHECK:         moe.similarity_inform %
// CHECK:         moe.topk_renorm
// CHECK-NOT:     moe.similarity_inform_topk
func.func @shared_probabilities_stay_unfused(%u: tensor<1x8x16xf32>, %e: tensor<1x8x4xf32>)
    -> (tensor<1x8x4xf32>, tensor<1x8x2xf32>) {
  %p = moe.similarity_inform %u, %e : tensor<1x8x16xf32>, tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  %w, %i = moe.topk_renorm %p k(2) mode(probs) : tensor<1x8x4xf32> -> tensor<1x8x2xf32>, tensor<1x8x2xi32>
  return %p, %w : tensor<1x8x4xf32>, tensor<1x8x2xf32>
}

// -----

// A logits-mode gate on probabilities is not the eq 11 gate: not fused.
// CHECK-LABEL: func.func @logits_gate_stays_unfused
// CHECK:         moe.similarity_inform %
// CHECK:         moe.topk_renorm %{{.+}} k(2) :
func.func @logits_gate_stays_unfused(%u: tensor<1x8x16xf32>, %e: tensor<1x8x4xf32>) -> tensor<1x8x2xf32> {
  %p = moe.similarity_inform %u, %e : tensor<1x8x16xf32>, tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  %w, %i = moe.topk_renorm %p k(2) : tensor<1x8x4xf32> -> tensor<1x8x2xf32>, tensor<1x8x2xi32>
  return %w : tensor<1x8x2xf32>
}

// -----

// Attention-Inform (eq 17): the selected head keeps its users through the fused op.
// CHECK-LABEL: func.func @posterior_then_gate
// CHECK:         %[[W:.+]], %[[I:.+]], %[[H:.+]] = moe.attention_posterior_topk %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} k(2)
// CHECK-SAME:      sigma(2.000000e+00) head_scale(4.000000e+00) :
// CHECK-NOT:     moe.topk_renorm
// CHECK:         return %[[W]], %[[I]], %[[H]]
// SPLIT-LABEL: func.func @posterior_then_gate
// SPLIT:         %[[P:.+]], %[[H:.+]] = moe.attention_posterior {{.+}} sigma(2.000000e+00) head_scale(4.000000e+00)
// SPLIT:         %[[W:.+]], %[[I:.+]] = moe.topk_renorm %[[P]] k(2) mode(probs)
// SPLIT:         return %[[W]], %[[I]], %[[H]]
func.func @posterior_then_gate(%s: tensor<2x4x8x8xf32>, %u: tensor<2x8x32xf32>, %v: tensor<2x4x8x8xf32>,
                               %wo: tensor<32x32xf32>, %e: tensor<2x8x16xf32>)
    -> (tensor<2x8x2xf32>, tensor<2x8x2xi32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.0) head_scale(4.0)
      : tensor<2x4x8x8xf32>, tensor<2x8x32xf32>, tensor<2x4x8x8xf32>, tensor<32x32xf32>, tensor<2x8x16xf32>
      -> tensor<2x8x16xf32>, tensor<2xi32>
  %w, %i = moe.topk_renorm %p k(2) mode(probs) : tensor<2x8x16xf32> -> tensor<2x8x2xf32>, tensor<2x8x2xi32>
  return %w, %i, %h : tensor<2x8x2xf32>, tensor<2x8x2xi32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: func.func @posterior_all_heads_then_gate
// CHECK:         moe.attention_posterior_topk {{.+}} k(4) head_select(all) :
// SPLIT-LABEL: func.func @posterior_all_heads_then_gate
// SPLIT:         moe.attention_posterior {{.+}} head_select(all) :
func.func @posterior_all_heads_then_gate(%s: tensor<1x2x8x8xbf16>, %u: tensor<1x8x32xbf16>, %v: tensor<1x2x8x16xbf16>,
                                         %wo: tensor<32x32xbf16>, %e: tensor<1x8x4xf32>) -> tensor<1x8x4xf32> {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all)
      : tensor<1x2x8x8xbf16>, tensor<1x8x32xbf16>, tensor<1x2x8x16xbf16>, tensor<32x32xbf16>, tensor<1x8x4xf32>
      -> tensor<1x8x4xf32>, tensor<1xi32>
  %w, %i = moe.topk_renorm %p k(4) mode(probs) : tensor<1x8x4xf32> -> tensor<1x8x4xf32>, tensor<1x8x4xi32>
  return %w : tensor<1x8x4xf32>
}
