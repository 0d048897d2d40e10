// Zero-sized dimensions (issue #15): each op folds to its defined result (MoEDegenerate.cpp).
// RUN: moe-opt %s -canonicalize -split-input-file | FileCheck %s
// RUN: moe-opt %s -moe-legalize-shapes -split-input-file | FileCheck %s --check-prefix=LEGAL

// No rows: empty weights and indices.
// CHECK-LABEL: func.func @topk_no_rows
// CHECK-DAG:     %[[W:.+]] = tensor.empty() : tensor<0x2xf32>
// CHECK-DAG:     %[[I:.+]] = tensor.empty() : tensor<0x2xi32>
// CHECK:         return %[[W]], %[[I]]
// LEGAL-LABEL: func.func @topk_no_rows
// LEGAL-NOT:     moe.topk_renorm
func.func @topk_no_rows(%x: tensor<0x16xf32>) -> (tensor<0x2xf32>, tensor<0x2xi32>) {
  %w, %i = moe.topk_renorm %x k(2) : tensor<0x16xf32> -> tensor<0x2xf32>, tensor<0x2xi32>
  return %w, %i : tensor<0x2xf32>, tensor<0x2xi32>
}

// -----

// A dynamic batch keeps its size: tensor.empty takes it from the scores.
// LEGAL-LABEL: func.func @topk_no_rows_dynamic_batch
// CHECK-LABEL: func.func @topk_no_rows_dynamic_batch
// CHECK-SAME:    (%[[X:.+]]: tensor<?x0x8xf32>)
// CHECK:         %[[B:.+]] = tensor.dim %[[X]], %{{.+}} : tensor<?x0x8xf32>
// CHECK:         tensor.empty(%[[B]]) : tensor<?x0x3xf32>
func.func @topk_no_rows_dynamic_batch(%x: tensor<?x0x8xf32>) -> tensor<?x0x3xf32> {
  %w, %i = moe.topk_renorm %x k(3) : tensor<?x0x8xf32> -> tensor<?x0x3xf32>, tensor<?x0x3xi32>
  return %w : tensor<?x0x3xf32>
}

// -----

// D = 0: every logit is an empty sum, 0, as with a one-wide zero u (and no ws).
// CHECK-LABEL: func.func @similarity_no_features
// CHECK:         %[[Z:.+]] = arith.constant dense<0.000000e+00> : tensor<2x4x1xf32>
// CHECK:         moe.similarity_inform %[[Z]], %{{.+}} causal(true) : tensor<2x4x1xf32>, tensor<2x4x3xf32>
func.func @similarity_no_features(%u: tensor<2x4x0xf32>, %e: tensor<2x4x3xf32>, %ws: tensor<0x0xf32>) -> tensor<2x4x3xf32> {
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<0x0xf32>) causal(true)
      : tensor<2x4x0xf32>, tensor<2x4x3xf32> -> tensor<2x4x3xf32>
  return %p : tensor<2x4x3xf32>
}

// -----

// No keys: every query row is fully masked, p = 0, and the min-entropy head is 0.
// CHECK-LABEL: func.func @posterior_no_keys
// CHECK-DAG:     %[[P:.+]] = arith.constant dense<0.000000e+00> : tensor<2x4x3xf32>
// CHECK-DAG:     %[[H:.+]] = arith.constant dense<0> : tensor<2xi32>
// CHECK:         return %[[P]], %[[H]]
func.func @posterior_no_keys(%s: tensor<2x2x4x0xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x0x3xf32>,
                             %wo: tensor<6x6xf32>, %e: tensor<2x0x3xf32>) -> (tensor<2x4x3xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x2x4x0xf32>, tensor<2x4x6xf32>, tensor<2x2x0x3xf32>, tensor<6x6xf32>, tensor<2x0x3xf32>
      -> tensor<2x4x3xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x3xf32>, tensor<2xi32>
}

// -----

// No experts: p is empty, the head still follows from the scores (through a one-expert op).
// CHECK-LABEL: func.func @posterior_no_experts
// CHECK-DAG:     %[[E:.+]] = arith.constant dense<0.000000e+00> : tensor<2x5x1xf32>
// CHECK-DAG:     %[[P:.+]] = tensor.empty() : tensor<2x4x0xf32>
// CHECK:         %{{.+}}, %[[H:.+]] = moe.attention_posterior {{.+}}, %[[E]] : {{.+}} -> tensor<2x4x1xf32>, tensor<2xi32>
// CHECK:         return %[[P]], %[[H]]
func.func @posterior_no_experts(%s: tensor<2x2x4x5xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x5x3xf32>,
                                %wo: tensor<6x6xf32>, %e: tensor<2x5x0xf32>) -> (tensor<2x4x0xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<2x2x4x5xf32>, tensor<2x4x6xf32>, tensor<2x2x5x3xf32>, tensor<6x6xf32>, tensor<2x5x0xf32>
      -> tensor<2x4x0xf32>, tensor<2xi32>
  return %p, %h : tensor<2x4x0xf32>, tensor<2xi32>
}

// -----

// Dh = 0: the head means are zero vectors, as they are for one-wide zero v and wo.
// CHECK-LABEL: func.func @posterior_no_head_features
// CHECK-DAG:     %[[V:.+]] = arith.constant dense<0.000000e+00> : tensor<2x2x5x1xf32>
// CHECK-DAG:     %[[WO:.+]] = arith.constant dense<0.000000e+00> : tensor<6x2xf32>
// CHECK:         moe.attention_posterior %{{.+}}, %{{.+}}, %[[V]], %[[WO]], %{{.+}} head_select(all)
func.func @posterior_no_head_features(%s: tensor<2x2x4x5xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x5x0xf32>,
                                      %wo: tensor<6x0xf32>, %e: tensor<2x5x3xf32>) -> tensor<2x4x3xf32> {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all)
      : tensor<2x2x4x5xf32>, tensor<2x4x6xf32>, tensor<2x2x5x0xf32>, tensor<6x0xf32>, tensor<2x5x3xf32>
      -> tensor<2x4x3xf32>, tensor<2xi32>
  return %p : tensor<2x4x3xf32>
}

// -----

// The fused gate without keys: p = 0, so zero weights and indices 0..k-1 (a probs-mode top-k of zeros).
// CHECK-LABEL: func.func @posterior_topk_no_keys
// CHECK:         %[[Z:.+]] = arith.constant dense<0.000000e+00> : tensor<2x4x4xf32>
// CHECK:         moe.topk_renorm %[[Z]] k(2) mode(probs)
func.func @posterior_topk_no_keys(%s: tensor<2x2x4x0xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x2x0x3xf32>,
                                  %wo: tensor<6x6xf32>, %e: tensor<2x0x4xf32>)
    -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2)
      : tensor<2x2x4x0xf32>, tensor<2x4x6xf32>, tensor<2x2x0x3xf32>, tensor<6x6xf32>, tensor<2x0x4xf32>
      -> tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2xi32>
  return %w, %i, %h : tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<2xi32>
}
