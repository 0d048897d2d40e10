// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// mad_dispersion: counts and both statistics passes are scatters (token t adds its row into row assign[t]) instead
// of the portable one-hot reductions over T per cluster; the workers own 32-feature column blocks (two vector<16>
// groups), so every sum is accumulated by one thread in token order. Out-of-range assign values are reported
// first and then add nothing. The O(E·D) tail is the portable one (linalg).

// CHECK-LABEL: func.func @mad
// CHECK-SAME: %[[X:[^:]+]]: tensor<?x64xf32>, %[[A:[^:]+]]: tensor<?xi32>
// CHECK: func.call @moeReportIndexError
// The kernel's outs: the counts and the deviations, for the portable tail.
// CHECK: %[[R:.+]]:2 = moe.kernel ins(%[[X]], %[[A]] : tensor<?x64xf32>, tensor<?xi32>) outs(%{{.+}}, %{{.+}} : tensor<4xi32>, tensor<4x?xf32>)
// CHECK-NEXT: ^bb0(%[[XB:[^:]+]]: memref<?x64xf32>, %[[AB:[^:]+]]: memref<?xi32>, %[[COUNTS:[^:]+]]: memref<4xi32>, %{{[^:]+}}: memref<4x?xf32>):
// CHECK: %[[T:.+]] = memref.dim %[[XB]], %c0 : memref<?x64xf32>
// CHECK: %[[D:.+]] = memref.dim %[[XB]], %c1 : memref<?x64xf32>
// Counts: one increment per in-range token.
// CHECK: scf.for
// CHECK: memref.load %[[AB]]
// CHECK: arith.andi
// CHECK: scf.if
// CHECK: arith.addi %{{.+}}, %{{.+}} : i32
// Cluster sums: column blocks over the workers, token rows added at row assign[t].
// CHECK: %[[SUMS:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<4x?xf32>
// D = 64 is two blocks, each over every token: few items, but not little work. The calling thread runs them
// alone only when T·D is at most 16384 (decode); otherwise the workers do (T = 16384 on one thread took
// 1.6-1.9x the time).
// CHECK: %[[TD:.+]] = arith.muli %[[T]], %[[D]] : index
// CHECK: %[[SMALL:.+]] = arith.cmpi ule, %[[TD]], %c16384 : index
// CHECK: scf.if %[[SMALL]] {
// CHECK: } else {
// CHECK: scf.parallel
// D = 64 is a multiple of the block: plain loads and stores (no masked read-modify-write, see target.mlir).
// CHECK: vector.load %[[XB]]
// CHECK: arith.addf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK: vector.store %{{.+}}, %[[SUMS]]
// Deviations: |x - mean| accumulated the same way, by the same worker (same column block).
// CHECK: arith.subf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK: math.absf %{{.+}} : vector<16xf32>
// CHECK: } -> tensor<4xi32>, tensor<4x?xf32>
// The tail: 1/(s+eps), clip, normalize.
// CHECK: linalg.generic
// CHECK-NOT: moe.mad_dispersion
func.func @mad(%x: tensor<?x64xf32>, %a: tensor<?xi32>) -> (tensor<4x64xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) : tensor<?x64xf32>, tensor<?xi32> -> tensor<4x64xf32>, tensor<4xi32>
  return %w, %c : tensor<4x64xf32>, tensor<4xi32>
}
