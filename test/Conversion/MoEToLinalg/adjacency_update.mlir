// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// idx entries outside [0, E) are reported (op code 2, row-major position) and
// match no expert in the indicator S; C = SᵀS is an i32 linalg.matmul.
// CHECK: func.func private @moeReportIndexError(i32, i64, i64, i64)
// CHECK-LABEL: func.func @row_norm
// CHECK-SAME: %[[A:[^:]+]]: tensor<16x16xf32>, %[[IDX:[^:]+]]: tensor<?x2xi32>
// CHECK: tensor.dim %[[IDX]], %{{.+}} : tensor<?x2xi32>
// CHECK: %[[CODE:.+]] = arith.constant 2 : i32
// CHECK: scf.for %[[TI:.+]] = %{{.+}} to %{{.+}} step
// CHECK: scf.for %[[CI:.+]] = %{{.+}} to %{{.+}} step
// CHECK: tensor.extract %[[IDX]][%[[TI]], %[[CI]]] : tensor<?x2xi32>
// CHECK: scf.if
// CHECK: %[[ROW:.+]] = arith.muli %[[TI]], %{{.+}} : index
// CHECK: %[[POS:.+]] = arith.addi %[[ROW]], %[[CI]] : index
// CHECK: %[[POS64:.+]] = arith.index_cast %[[POS]] : index to i64
// CHECK: func.call @moeReportIndexError(%[[CODE]], %[[POS64]],
// S[t, j] = any_c (idx[t, c] == j): a repeated index sets the same bit.
// CHECK: %[[S:.+]] = linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[IDX]] : tensor<?x2xi32>) outs(%{{.+}} : tensor<?x16xi32>)
// CHECK: arith.cmpi eq
// CHECK: arith.select
// CHECK: %[[ST:.+]] = linalg.transpose ins(%[[S]] : tensor<?x16xi32>) outs(%{{.+}} : tensor<16x?xi32>) permutation = [1, 0]
// CHECK: %[[C:.+]] = linalg.matmul ins(%[[ST]], %[[S]] : tensor<16x?xi32>, tensor<?x16xi32>) outs(%{{.+}} : tensor<16x16xi32>)
// Row sums in i32; an all-zero row stays zero.
// CHECK: %[[SUMS:.+]] = linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]} ins(%[[C]] : tensor<16x16xi32>) outs(%{{.+}} : tensor<16xi32>)
// CHECK: arith.addi
// CHECK: %[[NEXT:.+]] = linalg.generic {{.*}} ins(%[[A]], %[[C]], %[[SUMS]] : tensor<16x16xf32>, tensor<16x16xi32>, tensor<16xi32>)
// CHECK: arith.sitofp
// CHECK: arith.cmpi eq
// CHECK: arith.divf
// CHECK: arith.select
// CHECK: arith.constant 0.899999976 : f32
// CHECK: arith.constant 0.100000024 : f32
// CHECK: return %[[NEXT]]
func.func @row_norm(%a: tensor<16x16xf32>, %idx: tensor<?x2xi32>) -> tensor<16x16xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<16x16xf32>, tensor<?x2xi32> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}

// norm = col sums over rows; include_self = false zeroes the diagonal both in
// the sums and in the counts.
// CHECK-LABEL: func.func @col_norm_no_self
// CHECK: %[[C:.+]] = linalg.matmul
// CHECK: %[[SUMS:.+]] = linalg.generic {{.*}}iterator_types = ["reduction", "parallel"]} ins(%[[C]] : tensor<16x16xi32>)
// CHECK: %[[J:.+]] = linalg.index 0 : index
// CHECK: %[[M:.+]] = linalg.index 1 : index
// CHECK: arith.cmpi eq, %[[J]], %[[M]] : index
// CHECK: linalg.generic {{.*}} ins(%{{.+}}, %[[C]], %[[SUMS]] :
// CHECK: linalg.index 0
// CHECK: linalg.index 1
// CHECK: arith.select
func.func @col_norm_no_self(%a: tensor<16x16xf32>, %idx: tensor<8x2xi64>) -> tensor<16x16xf32> {
  %n = moe.adjacency_update %a, %idx beta(5.000000e-01) norm(col) include_self(false) : tensor<16x16xf32>, tensor<8x2xi64> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}

// norm = none: the counts are used as they are (no sums, no division).
// CHECK-LABEL: func.func @no_norm
// CHECK: %[[C:.+]] = linalg.matmul
// CHECK: linalg.generic {{.*}} ins(%{{.+}}, %[[C]] : tensor<4x4xf32>, tensor<4x4xi32>)
// CHECK-NOT: arith.divf
// CHECK: return
func.func @no_norm(%a: tensor<4x4xf16>, %idx: tensor<8x1xi32>) -> tensor<4x4xf32> {
  %n = moe.adjacency_update %a, %idx beta(0.000000e+00) norm(none) : tensor<4x4xf16>, tensor<8x1xi32> -> tensor<4x4xf32>
  return %n : tensor<4x4xf32>
}
