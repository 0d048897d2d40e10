// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// A counting sort: the run-time range check of the indices, then three sequential loops over tensors (count;
// scan into offsets, padded offsets and the block map; place at each expert's cursor), with every write guarded
// by the range check, and the results cast to the op's static types.
// CHECK: func.func private @moeReportIndexError(i32, i64, i64, i64)
// CHECK-LABEL: func.func @plan
// CHECK-SAME: %[[IDX:.+]]: tensor<?x2xi64>
// CHECK: scf.for
// CHECK: scf.for
// CHECK: tensor.extract %[[IDX]]
// CHECK: func.call @moeReportIndexError(%c3_i32,
// The counts: one increment per in-range assignment.
// CHECK: %[[COUNTS:.+]] = scf.for {{.*}} -> (tensor<3xi32>)
// CHECK: tensor.extract %[[IDX]]
// CHECK: scf.if %{{.+}} -> (tensor<3xi32>)
// CHECK: tensor.insert
// The scan over the experts, with the block -> expert loop nested.
// CHECK: %[[SCAN:.+]]:3 = scf.for {{.*}} -> (tensor<?xi32>, tensor<?xi32>, tensor<?xi32>)
// CHECK: tensor.extract %[[COUNTS]]
// CHECK: scf.for {{.*}} -> (tensor<?xi32>)
// The placement: cursor, order, inverse, padded order.
// CHECK: %[[CURSOR:.+]] = tensor.extract_slice %[[SCAN]]#0[0] [3] [1]
// CHECK: %[[PLACED:.+]]:4 = scf.for {{.*}} iter_args(%{{.+}} = %[[CURSOR]], {{.*}} -> (tensor<3xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>)
// CHECK: scf.if %{{.+}} -> (tensor<3xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>)
// CHECK-COUNT-4: tensor.insert
// CHECK: %[[NUM:.+]] = tensor.extract_slice %[[SCAN]]#1[3] [1] [1]
// CHECK: return %[[COUNTS]], %[[PLACED]]#1, %[[NUM]]
// CHECK-NOT: moe.
func.func @plan(%idx: tensor<?x2xi64>) -> (tensor<3xi32>, tensor<?xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(3) block_size(4)
      : tensor<?x2xi64> -> tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>
  return %c, %ord, %n : tensor<3xi32>, tensor<?xi32>, tensor<1xi32>
}
