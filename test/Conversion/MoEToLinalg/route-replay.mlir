// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// The portable lowering of a replayed choice: the index check (op code 5), the given indices as i32 (one outside
// [0, E) read as 0), no top-k (no selection loop over E), then the weights as for a chosen row.

// CHECK-LABEL: func.func @replay
// CHECK: %[[CODE:.+]] = arith.constant 5 : i32
// CHECK: func.call @moeReportIndexError(%[[CODE]]
// CHECK: linalg.generic {{.+}} ins(%{{.+}} : tensor<?x2xi64>) outs(%{{.+}} : tensor<?x2xi32>)
// CHECK: %[[SEL:.+]] = arith.select %{{.+}}, %{{.+}}, %{{.+}} : i64
// CHECK: arith.trunci %[[SEL]] : i64 to i32
// CHECK-NOT: scf.for
// CHECK: tensor.extract %{{.+}} : tensor<?x16xf32>
// CHECK: return
func.func @replay(%l: tensor<?x16xf32>, %b: tensor<16xf32>, %r: tensor<?x2xi64>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<16xf32>) replay(%r : tensor<?x2xi64>) k(2) scoring(sigmoid) renormalize(true)
      : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}
