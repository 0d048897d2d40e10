// RUN: moe-opt %s --convert-moe-to-linalg -split-input-file | FileCheck %s

// The portable lowering inlines a custom score region in the body of the scoring linalg.generic (scalar f32, the
// region's own math.exp: the portable path has no polynomial of its own).

// CHECK-LABEL: func.func @sqrtsoftplus
// CHECK: linalg.generic {{.+}} ins(%{{.+}} : tensor<?x64xf32>)
// CHECK-NEXT: ^bb0(%[[X:.+]]: f32, %{{.+}}: f32):
// CHECK: %[[A:.+]] = math.absf %[[X]] : f32
// CHECK-NEXT: %[[N:.+]] = arith.negf %[[A]] : f32
// CHECK-NEXT: %[[E:.+]] = math.exp %[[N]] : f32
// CHECK-NEXT: %[[L:.+]] = math.log1p %[[E]] : f32
// CHECK-NEXT: %[[M:.+]] = arith.maximumf %[[X]], %{{.+}} : f32
// CHECK-NEXT: %[[SP:.+]] = arith.addf %[[L]], %[[M]] : f32
// CHECK-NEXT: %[[S:.+]] = math.sqrt %[[SP]] : f32
// CHECK-NEXT: linalg.yield %[[S]] : f32
// CHECK-NOT: moe.route
func.func @sqrtsoftplus(%l: tensor<?x64xf32>, %b: tensor<64xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<64xf32>) k(8) scoring(custom) renormalize(true) routed_scaling_factor(2.5) score {
  ^bb0(%x: f32):
    %zero = arith.constant 0.000000e+00 : f32
    %a = math.absf %x : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %s = math.log1p %e : f32
    %m = arith.maximumf %x, %zero : f32
    %sp = arith.addf %s, %m : f32
    %r = math.sqrt %sp : f32
    moe.yield %r : f32
  } : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// moe.route_grad: the picks' logits gathered (an out-of-range index reads entry 0), the score's derivative
// (d(x·tanh x) = tanh x + x·(1 − tanh² x)) and the score, S and C as row reductions, the pick's gradient, and its
// scatter to [T, E] as a reduction over the picks (a repeated index accumulates; an out-of-range one matches no
// expert).

// CHECK-LABEL: func.func @route_grad_xtanh
// CHECK: %[[SEL:.+]] = linalg.generic
// CHECK: arith.cmpi sge
// CHECK: tensor.extract
// CHECK: %[[DS:.+]] = linalg.generic {{.+}} ins(%[[SEL]] : tensor<?x8xf32>)
// CHECK: %[[T:.+]] = math.tanh
// CHECK: arith.subf %{{.+}}, %{{.+}} : f32
// CHECK: %[[S:.+]] = linalg.generic {{.+}} ins(%[[SEL]] : tensor<?x8xf32>)
// CHECK: %[[GS:.+]] = linalg.generic {{.+}} ins(%{{.+}}, %[[S]] : tensor<?x8xf32>, tensor<?x8xf32>)
// CHECK: %[[SUM:.+]] = linalg.generic {{.+}} iterator_types = ["parallel", "reduction"]} ins(%[[S]] : tensor<?x8xf32>)
// CHECK: %[[C:.+]] = linalg.generic {{.+}} iterator_types = ["parallel", "reduction"]} ins(%[[GS]] : tensor<?x8xf32>)
// CHECK: %[[D:.+]] = linalg.generic {{.+}} ins(%{{.+}}, %[[DS]], %[[SUM]], %[[C]] :
// CHECK: arith.cmpf oeq
// CHECK: arith.select
// CHECK: linalg.generic {{.+}} iterator_types = ["parallel", "parallel", "reduction"]} ins(%{{.+}}, %[[D]] : tensor<?x8xi32>, tensor<?x8xf32>) outs(%{{.+}} : tensor<?x64xf32>)
// CHECK: %[[SAME:.+]] = arith.cmpi eq
// CHECK: %[[ADD:.+]] = arith.addf
// CHECK: arith.select %[[SAME]], %[[ADD]]
func.func @route_grad_xtanh(%l: tensor<?x64xf32>, %i: tensor<?x8xi32>, %dw: tensor<?x8xf32>) -> tensor<?x64xf32> {
  %d = moe.route_grad %l, %i dw(%dw : tensor<?x8xf32>) scoring(custom) renormalize(true) routed_scaling_factor(2.5) score {
  ^bb0(%x: f32):
    %t = math.tanh %x : f32
    %r = arith.mulf %x, %t : f32
    moe.yield %r : f32
  } : tensor<?x64xf32>, tensor<?x8xi32> -> tensor<?x64xf32>
  return %d : tensor<?x64xf32>
}
