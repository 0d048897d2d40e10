// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// moe.dispatch_plan: a counting sort in three phases over items of 32 tokens. (1) the workers count each item's
// in-range assignments per expert into its row of an [items, E] histogram; (2) a sequential scan over the experts
// (and per expert over the items) turns it into each item's cursor, with counts, offsets, padded offsets and the
// block -> expert map; (3) the workers place their assignments at their cursors (order, inverse, padded order).
// Out-of-range indices are reported first (moeReportIndexError) and skipped.

// CHECK-LABEL: func.func @plan
// CHECK: func.call @moeReportIndexError
// One kernel; the seven results are its outs.
// CHECK: moe.kernel ins(%{{.+}} : tensor<?x8xi32>) outs({{.*}} : tensor<64xi32>, tensor<65xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>)
// CHECK-NEXT: ^bb0(%{{[^:]+}}: memref<?x8xi32>, %[[CNT:[^:]+]]: memref<64xi32>, %[[OFF:[^:]+]]: memref<65xi32>,
// CHECK: %[[H:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?x64xi32>
// Phase 1.
// CHECK: scf.parallel
// CHECK: memref.store %{{.+}}, %[[H]]
// Phase 2 (sequential).
// CHECK-NOT: scf.parallel
// CHECK: scf.for %{{.+}} = %c0 to %c64 step %c1 iter_args
// CHECK: memref.store %{{.+}}, %[[CNT]]
// Phase 3.
// CHECK: scf.parallel
// CHECK-NOT: moe.dispatch_plan
func.func @plan(%idx: tensor<?x8xi32>) -> (tensor<64xi32>, tensor<65xi32>, tensor<?xi32>, tensor<?xi32>,
                                          tensor<?xi32>, tensor<?xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(64) block_size(16)
      : tensor<?x8xi32> -> tensor<64xi32>, tensor<65xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<?xi32>, tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n : tensor<64xi32>, tensor<65xi32>, tensor<?xi32>, tensor<?xi32>,
      tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}
