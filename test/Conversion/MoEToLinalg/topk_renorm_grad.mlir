// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// The portable backward of the top-k gate: a gather generic through the indices, the forward's row reductions,
// the weights and their gradients (the shared formulas of MoE/Kernels/TopK.h) and the scatter as a reduction over
// the selection.

// CHECK-LABEL: func.func @probs_renormalized
// CHECK-SAME: %[[S:[^:]+]]: tensor<4x16xf32>, %[[I:[^:]+]]: tensor<4x2xi32>, %[[DW:[^:]+]]: tensor<4x2xf32>
// Gather (clamped reads).
// CHECK: linalg.generic {{.*}} ins(%[[I]] : tensor<4x2xi32>)
// CHECK: tensor.extract %[[S]]
// Σ sel, then c = Σ dw·w and the selected gradients.
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]}
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]}
// CHECK: arith.divf
// Scatter: [rows, K, k] with the selection reduced.
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[I]], %{{.+}} : tensor<4x2xi32>, tensor<4x2xf32>) outs(%{{.+}} : tensor<4x16xf32>)
// CHECK: arith.cmpi eq
// CHECK: arith.select
func.func @probs_renormalized(%s: tensor<4x16xf32>, %i: tensor<4x2xi32>, %dw: tensor<4x2xf32>) -> tensor<4x16xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<4x2xf32>) mode(probs)
      : tensor<4x16xf32>, tensor<4x2xi32> -> tensor<4x16xf32>
  return %ds : tensor<4x16xf32>
}

// Logits without renormalization, rank 1: the dense max and sum over the row, and -s_j c everywhere.
// CHECK-LABEL: func.func @logits_raw_rank_one
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: return %{{.+}} : tensor<8xf32>
func.func @logits_raw_rank_one(%s: tensor<8xf16>, %i: tensor<3xi32>, %dw: tensor<3xf32>) -> tensor<8xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<3xf32>) renormalize(false)
      : tensor<8xf16>, tensor<3xi32> -> tensor<8xf32>
  return %ds : tensor<8xf32>
}
