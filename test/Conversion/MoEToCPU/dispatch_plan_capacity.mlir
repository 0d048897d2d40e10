// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// moe.dispatch_plan with a capacity: one kernel whose ins hold the weights (drop(probability)) and whose outs add
// `dropped`. A sequential phase 0 decides the kept assignments before the parallel counting sort: the 63-bit
// priority keys (the weight's ordered bits, shifted by 31, then the position), per-expert demands, and the 63-pass
// bisection of every overloaded expert's C-th largest key; phases 1-3 then skip what phase 0 dropped.

// CHECK-LABEL: func.func @by_probability
// CHECK: moe.kernel ins(%{{.+}}, %{{.+}} : tensor<?x2xi32>, tensor<?x2xf32>) outs({{.*}} : tensor<4xi32>, tensor<5xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>, tensor<4xi32>)
// CHECK-NEXT: ^bb0(%{{[^:]+}}: memref<?x2xi32>, %{{[^:]+}}: memref<?x2xf32>, {{.*}}, %[[DROPPED:[^:]+]]: memref<4xi32>):
// CHECK: %[[KEEP:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?xi32>
// CHECK-NOT: scf.parallel
// CHECK: %[[KEYS:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?xi64>
// CHECK: arith.shli %{{.+}}, %c31_i64 : i64
// CHECK: memref.store %{{.+}}, %[[KEYS]]
// CHECK: memref.store %{{.+}}, %[[DROPPED]]
// CHECK: scf.for %{{.+}} = %c0 to %c63 step %c1
// CHECK: arith.cmpi sge, %{{.+}}, %{{.+}} : i64
// CHECK: memref.store %c1_i32, %[[KEEP]]
// Phase 1 counts the kept assignments only.
// CHECK: scf.parallel
// CHECK: memref.load %[[KEEP]]
// CHECK-NOT: moe.dispatch_plan
func.func @by_probability(%idx: tensor<?x2xi32>, %w: tensor<?x2xf32>) -> (tensor<4xi32>, tensor<?xi32>, tensor<4xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(3) drop(probability)
      weights(%w : tensor<?x2xf32>)
      : tensor<?x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<4xi32>
  return %c, %inv, %d : tensor<4xi32>, tensor<?xi32>, tensor<4xi32>
}

// By position: one slot-major pass (slots outside, tokens inside) with a cursor per expert, no keys.
// CHECK-LABEL: func.func @by_position
// CHECK: moe.kernel ins(%{{.+}} : tensor<?x2xi32>) outs(
// CHECK: %[[KEEP:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?xi32>
// CHECK: %[[DEMAND:.+]] = memref.alloc() {alignment = 64 : i64} : memref<4xi32>
// CHECK: scf.for
// CHECK-NEXT: memref.store %c0_i32, %[[DEMAND]]
// CHECK: scf.for
// CHECK-NEXT: scf.for
// CHECK: memref.store %c1_i32, %[[KEEP]]
// CHECK-NOT: memref<?xi64>
// CHECK: scf.parallel
// A route feeding a plan with a capacity is not fused: the route keeps its own kernel.
// CHECK: moe.kernel ins(%{{.+}} : tensor<?x8xf32>) outs(%{{.+}}, %{{.+}} : tensor<?x2xf32>, tensor<?x2xi32>)
// CHECK: moe.kernel ins(%{{.+}} : tensor<?x2xi32>) outs({{.*}}, tensor<8xi32>)
func.func @by_position(%idx: tensor<?x2xi32>, %l: tensor<?x8xf32>) -> (tensor<4xi32>, tensor<8xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(4) capacity(5)
      : tensor<?x2xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<4xi32>
  %w, %i = moe.route %l k(2) : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %c2, %o2, %ord2, %inv2, %p2, %b2, %n2, %d2 = moe.dispatch_plan %i num_experts(8) capacity(1)
      : tensor<?x2xi32> -> tensor<8xi32>, tensor<9xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<8xi32>
  return %c, %d2 : tensor<4xi32>, tensor<8xi32>
}
