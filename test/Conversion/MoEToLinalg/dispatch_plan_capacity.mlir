// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// The portable capacity: a first loop decides keep [N] and dropped [E], then the counting sort of
// dispatch_plan.mlir skips the assignments keep says were dropped. By probability the reference counts each
// assignment's rank among its expert's assignments directly (a nested loop): ahead when its weight is larger (NaN
// first: `uno`) or equal (`oeq`, NaN = NaN) and earlier in the position order (slot, then token: `ult`).
// CHECK-LABEL: func.func @by_probability
// CHECK: %[[DECIDED:.+]]:2 = scf.for {{.*}} -> (tensor<?xi32>, tensor<4xi32>)
// CHECK: %[[RANK:.+]] = scf.for {{.*}} -> (index)
// CHECK-DAG: arith.cmpf uno
// CHECK-DAG: arith.cmpf ogt
// CHECK-DAG: arith.cmpf oeq
// CHECK: arith.cmpi ult
// CHECK: %[[KEPT:.+]] = arith.cmpi ult, %[[RANK]], %c3 : index
// CHECK: scf.if %[[KEPT]] -> (tensor<?xi32>, tensor<4xi32>)
// CHECK: tensor.insert %c1_i32
// The counts of the kept assignments: keep is read.
// CHECK: %[[COUNTS:.+]] = scf.for {{.*}} -> (tensor<4xi32>)
// CHECK: tensor.extract %[[DECIDED]]#0
// CHECK: %[[PLACED:.+]]:4 = scf.for
// CHECK: return %[[COUNTS]], %[[PLACED]]#2, %[[DECIDED]]#1
// CHECK-NOT: moe.dispatch_plan
func.func @by_probability(%idx: tensor<?x2xi32>, %w: tensor<?x2xf32>) -> (tensor<4xi32>, tensor<?xi32>, tensor<4xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(3) drop(probability)
      weights(%w : tensor<?x2xf32>)
      : tensor<?x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<4xi32>
  return %c, %inv, %d : tensor<4xi32>, tensor<?xi32>, tensor<4xi32>
}

// By position: slots outside, tokens inside, a cursor per expert (the third loop-carried tensor).
// CHECK-LABEL: func.func @by_position
// CHECK: %[[SLOTS:.+]]:3 = scf.for {{.*}} -> (tensor<?xi32>, tensor<4xi32>, tensor<4xi32>)
// CHECK: scf.for {{.*}} -> (tensor<?xi32>, tensor<4xi32>, tensor<4xi32>)
// CHECK: arith.cmpi ult, %{{.+}}, %c5 : index
// CHECK: return %{{.+}}, %[[SLOTS]]#1
func.func @by_position(%idx: tensor<?x2xi64>) -> (tensor<4xi32>, tensor<4xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(5)
      : tensor<?x2xi64> -> tensor<4xi32>, tensor<5xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<4xi32>
  return %c, %d : tensor<4xi32>, tensor<4xi32>
}
