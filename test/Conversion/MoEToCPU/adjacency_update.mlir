// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// adjacency_update: co-selection counts as T·k² increments (no [T, E] indicator, no matmul): each token's slots
// are deduplicated in a k-entry list first, so a repeated expert counts once; out-of-range indices are reported
// and skipped. The O(E²) tail (normalization, moving average) is the portable one.

// CHECK-LABEL: func.func @adj
// CHECK-SAME: %[[A:[^:]+]]: tensor<16x16xf32>, %[[IDX:[^:]+]]: tensor<?x2xi32>
// CHECK: func.call @moeReportIndexError
// CHECK: %[[IB:.+]] = bufferization.to_buffer %[[IDX]] read_only
// CHECK: %[[C:.+]] = memref.alloc() {alignment = 64 : i64} : memref<16x16xi32>
// CHECK: %[[SEEN:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?xindex>
// Per token: the distinct in-range experts...
// CHECK: scf.for
// CHECK: scf.for {{.*}} iter_args(%{{.+}} = %{{.+}}) -> (index)
// CHECK: scf.for {{.*}} iter_args(%{{.+}} = %{{.+}}) -> (i1)
// ...then one increment per ordered pair.
// CHECK: scf.for
// CHECK: scf.for
// CHECK: arith.addi %{{.+}}, %{{.+}} : i32
// CHECK: memref.store %{{.+}}, %[[C]]
// CHECK: %[[CT:.+]] = bufferization.to_tensor %[[C]] restrict writable : memref<16x16xi32>
// CHECK-NOT: linalg.matmul
// CHECK: linalg.generic {{.*}} ins(%[[A]], %[[CT]], %{{.+}} :
// CHECK-NOT: moe.adjacency_update
func.func @adj(%a: tensor<16x16xf32>, %idx: tensor<?x2xi32>) -> tensor<16x16xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<16x16xf32>, tensor<?x2xi32> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}
