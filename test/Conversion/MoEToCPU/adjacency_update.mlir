// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// adjacency_update: co-selection counts as T·k² increments (no [T, E] indicator, no matmul): blocks of tokens go
// to the workers, each counting into its own E x E matrix (summed at the end: exact integers); each token's slots
// are deduplicated first (an expert already stamped with the token is skipped), so a repeated expert counts once;
// out-of-range indices are reported and skipped. The O(E²) tail (normalization, moving average) is the portable one.

// CHECK-LABEL: func.func @adj
// CHECK-SAME: %[[A:[^:]+]]: tensor<16x16xf32>, %[[IDX:[^:]+]]: tensor<?x2xi32>
// CHECK: func.call @moeReportIndexError
// CHECK: %[[IB:.+]] = bufferization.to_buffer %[[IDX]] read_only
// CHECK: %[[C:.+]] = memref.alloc() {alignment = 64 : i64} : memref<16x16xi32>
// CHECK: %[[COUNTS:.+]] = memref.alloc() {alignment = 64 : i64} : memref<2x16x16xi32>
// CHECK: %[[STAMPS:.+]] = memref.alloc() {alignment = 64 : i64} : memref<2x16xindex>
// CHECK: %[[LISTS:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<2x?xindex>
// Per token (on the workers): the distinct in-range experts...
// CHECK: scf.parallel
// CHECK: scf.for {{.*}} iter_args(%{{.+}} = %{{.+}}) -> (index)
// CHECK: arith.cmpi ne
// ...then one increment per ordered pair, in the worker's matrix.
// CHECK: scf.for
// CHECK: scf.for
// CHECK: arith.addi %{{.+}}, %{{.+}} : i32
// CHECK: memref.store
// The sum over the workers.
// CHECK: scf.for {{.*}} iter_args(%{{.+}} = %{{.+}}) -> (i32)
// CHECK: memref.load %[[COUNTS]]
// CHECK: memref.store %{{.+}}, %[[C]]
// CHECK: %[[CT:.+]] = bufferization.to_tensor %[[C]] restrict writable : memref<16x16xi32>
// CHECK-NOT: linalg.matmul
// CHECK: linalg.generic {{.*}} ins(%[[A]], %[[CT]], %{{.+}} :
// CHECK-NOT: moe.adjacency_update
func.func @adj(%a: tensor<16x16xf32>, %idx: tensor<?x2xi32>) -> tensor<16x16xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<16x16xf32>, tensor<?x2xi32> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}
