// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// A moe.route whose indices feed a moe.dispatch_plan over the same experts is one kernel: each worker routes its
// rows and counts their picks into its item's histogram row (no index check: the route's indices are in range),
// then the plan's scan and placement read the route's index buffer.

// CHECK-LABEL: func.func @route_then_plan
// CHECK-NOT: moeReportIndexError
// One kernel for both ops: the route's two results, then the plan's seven, are its outs.
// CHECK: moe.kernel ins({{.*}}) outs({{.*}} : tensor<?x8xf32>, tensor<?x8xi32>, tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>)
// CHECK-NEXT: ^bb0({{.*}}, %{{[^:]+}}: memref<?x8xf32>, %[[I:[^:]+]]: memref<?x8xi32>, %{{[^:]+}}: memref<256xi32>,
// CHECK: %[[H:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?x256xi32>
// CHECK: scf.parallel
// The route's rounds store the picks, then the row's picks are counted.
// CHECK: memref.store %{{.+}}, %[[I]]
// CHECK: memref.load %[[I]]
// CHECK: memref.store %{{.+}}, %[[H]]
// The placement reads the route's index buffer.
// CHECK: scf.parallel
// CHECK: memref.load %[[I]]
// CHECK-NOT: moe.route
// CHECK-NOT: moe.dispatch_plan
func.func @route_then_plan(%l: tensor<?x256xf32>, %b: tensor<256xf32>)
    -> (tensor<?x8xf32>, tensor<256xi32>, tensor<?xi32>, tensor<?xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4)
      renormalize(true) routed_scaling_factor(2.5) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  %c, %o, %ord, %inv, %p, %bl, %n = moe.dispatch_plan %i num_experts(256) block_size(64)
      : tensor<?x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<?xi32>, tensor<1xi32>
  return %w, %c, %ord, %p : tensor<?x8xf32>, tensor<256xi32>, tensor<?xi32>, tensor<?xi32>
}

// A plan over another expert count is not fused: both kernels, the plan with its index check.
// CHECK-LABEL: func.func @different_experts
// CHECK: func.call @moeReportIndexError
// CHECK-NOT: moe.dispatch_plan
func.func @different_experts(%l: tensor<?x16xf32>) -> tensor<32xi32> {
  %w, %i = moe.route %l k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %c, %o, %ord, %inv, %p, %bl, %n = moe.dispatch_plan %i num_experts(32)
      : tensor<?x2xi32> -> tensor<32xi32>, tensor<33xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<?xi32>, tensor<1xi32>
  return %c : tensor<32xi32>
}
