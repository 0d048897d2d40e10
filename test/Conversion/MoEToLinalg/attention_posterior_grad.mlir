// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// The portable backward of attention_posterior: linalg.generic ops on [B, H, N, Nk] tensors (the size of the
// result d_scores), both head selections. wo is viewed as [D, H, Dh] (and d_wo collapsed back), the mixing weights
// are one softmax per row over the pairs (h, j), recomputed from the row max and sum.

// h* is checked first: a value outside [0, H) is reported (op code 4) and matches no head, so that its batch
// element's logits are all -inf, its weights 0 and its gradients 0 (skipped).
// CHECK: func.func private @moeReportIndexError(i32, i64, i64, i64)
// CHECK-LABEL: func.func @min_entropy
// CHECK-SAME: %[[WO:[^:]+]]: tensor<12x12xf32>, %{{[^:]+}}: tensor<2x36x5xf32>, %[[H:[^:]+]]: tensor<2xi32>
// CHECK: %[[NH:.+]] = arith.index_cast %c4 : index to i64
// CHECK: %[[CODE:.+]] = arith.constant 4 : i32
// CHECK: scf.for %[[B:.+]] = %c0 to %{{.+}} step %c1 {
// CHECK-NEXT: %[[HV:.+]] = tensor.extract %[[H]][%[[B]]] : tensor<2xi32>
// CHECK-NEXT: %[[HV64:.+]] = arith.extsi %[[HV]] : i32 to i64
// CHECK: %[[NEG:.+]] = arith.cmpi slt, %[[HV64]], %{{.+}} : i64
// CHECK-NEXT: %[[BIG:.+]] = arith.cmpi sge, %[[HV64]], %[[NH]] : i64
// CHECK-NEXT: %[[BAD:.+]] = arith.ori %[[NEG]], %[[BIG]] : i1
// CHECK-NEXT: scf.if %[[BAD]] {
// CHECK-NEXT: %[[POS:.+]] = arith.index_cast %[[B]] : index to i64
// CHECK-NEXT: func.call @moeReportIndexError(%[[CODE]], %[[POS]], %[[HV64]], %[[NH]])
// CHECK: tensor.expand_shape %[[WO]] {{\[}}[0], [1, 2]] output_shape [12, 4, 3] : tensor<12x12xf32> into tensor<12x4x3xf32>
// The logits: -inf where scores is -inf and on every head but h*[b].
// CHECK: linalg.generic {{.*}} ins(%{{.+}}, %{{.+}}, %{{.+}}, %[[H]] :
// CHECK: %[[IDX:.+]] = linalg.index 1 : index
// CHECK: %[[HI:.+]] = arith.index_cast %[[IDX]] : index to i32
// CHECK: arith.cmpi ne, %[[HI]], %{{.+}} : i32
// CHECK: arith.select %{{.+}}, %{{.+}}, %{{.+}} : f32
// The row max over (h, j): two reduction dimensions.
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction", "reduction"]} ins(%{{.+}} : tensor<2x4x40x36xf32>) outs(%{{.+}} : tensor<2x40xf32>)
// CHECK: arith.maximumf
// CHECK: math.exp
// d_wo [D, H, Dh] collapsed to [D, H·Dh].
// CHECK: tensor.collapse_shape %{{.+}} {{\[}}[0], [1, 2]] : tensor<12x4x3xf32> into tensor<12x12xf32>
// CHECK: return %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
func.func @min_entropy(%s: tensor<2x4x40x36xf32>, %u: tensor<2x40x12xf32>, %v: tensor<2x4x36x3xf32>,
    %wo: tensor<12x12xf32>, %e: tensor<2x36x5xf32>, %h: tensor<2xi32>, %dp: tensor<2x40x5xf32>)
    -> (tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<2xi32>)
      dp(%dp : tensor<2x40x5xf32>) sigma(2.0)
      : tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
      -> tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
  return %ds, %du, %dv, %dwo, %de
      : tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
}

// head_select = all, f16 scores and dynamic sizes: the log prior (its lse per row and head: math.log), no head
// index; d_scores gets the prior's term − softmax(scores) · Σ_j dz.
// CHECK-LABEL: func.func @all_heads
// CHECK: arith.extf
// CHECK: tensor.expand_shape
// CHECK: math.log
// CHECK-NOT: linalg.index
// CHECK: tensor.collapse_shape
// CHECK: return %{{.+}}, %{{.+}} : tensor<?x4x?x?xf32>, tensor<?x?x12xf32>
func.func @all_heads(%s: tensor<?x4x?x?xf16>, %u: tensor<?x?x12xf32>, %v: tensor<?x4x?x3xf32>,
    %wo: tensor<12x12xf32>, %e: tensor<?x?x5xf32>, %dp: tensor<?x?x5xf32>)
    -> (tensor<?x4x?x?xf32>, tensor<?x?x12xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e dp(%dp : tensor<?x?x5xf32>)
      head_select(all)
      : tensor<?x4x?x?xf16>, tensor<?x?x12xf32>, tensor<?x4x?x3xf32>, tensor<12x12xf32>, tensor<?x?x5xf32>
      -> tensor<?x4x?x?xf32>, tensor<?x?x12xf32>, tensor<?x4x?x3xf32>, tensor<12x12xf32>, tensor<?x?x5xf32>
  return %ds, %du : tensor<?x4x?x?xf32>, tensor<?x?x12xf32>
}

// Dynamic H: the bound is dim 1 of scores.
// CHECK-LABEL: func.func @min_entropy_dynamic
// CHECK-SAME: %[[S:[^:]+]]: tensor<?x?x?x?xf32>
// CHECK: %[[HD:.+]] = tensor.dim %[[S]], %c1{{.*}} : tensor<?x?x?x?xf32>
// CHECK: %[[HD64:.+]] = arith.index_cast %[[HD]] : index to i64
// CHECK: scf.for
// CHECK: func.call @moeReportIndexError(%{{.+}}, %{{.+}}, %{{.+}}, %[[HD64]])
// CHECK: linalg.generic
func.func @min_entropy_dynamic(%s: tensor<?x?x?x?xf32>, %u: tensor<?x?x12xf32>, %v: tensor<?x?x?x3xf32>,
    %wo: tensor<12x?xf32>, %e: tensor<?x?x5xf32>, %h: tensor<?xi32>, %dp: tensor<?x?x5xf32>) -> tensor<?x?x12xf32> {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<?xi32>)
      dp(%dp : tensor<?x?x5xf32>)
      : tensor<?x?x?x?xf32>, tensor<?x?x12xf32>, tensor<?x?x?x3xf32>, tensor<12x?xf32>, tensor<?x?x5xf32>
      -> tensor<?x?x?x?xf32>, tensor<?x?x12xf32>, tensor<?x?x?x3xf32>, tensor<12x?xf32>, tensor<?x?x5xf32>
  return %du : tensor<?x?x12xf32>
}
