// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s

// The presets print as today (no region); a custom score prints scoring(custom) and its region.

// CHECK-LABEL: func.func @sigmoid_preset
// CHECK: moe.route %{{.*}} k(8) scoring(sigmoid) renormalize(true) :
// CHECK-NOT: score {
func.func @sigmoid_preset(%l: tensor<?x64xf32>) -> tensor<?x8xf32> {
  %w, %i = moe.route %l k(8) scoring(sigmoid) renormalize(true) : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w : tensor<?x8xf32>
}

// DeepSeek-V4's sqrtsoftplus, with a selection bias and the weights renormalized.
// CHECK-LABEL: func.func @sqrtsoftplus
// CHECK: moe.route %{{.*}} bias(%{{.*}} : tensor<64xf32>) k(8) scoring(custom) renormalize(true) score {
// CHECK-NEXT: ^bb0(%[[X:.+]]: f32):
// CHECK: %[[A:.+]] = math.absf %[[X]] : f32
// CHECK: math.log1p
// CHECK: arith.maximumf %[[X]]
// CHECK: %[[S:.+]] = math.sqrt
// CHECK: moe.yield %[[S]] : f32
// CHECK-NEXT: } : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
func.func @sqrtsoftplus(%l: tensor<?x64xf32>, %b: tensor<64xf32>) -> tensor<?x8xf32> {
  %w, %i = moe.route %l bias(%b : tensor<64xf32>) k(8) scoring(custom) renormalize(true) score {
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
  return %w : tensor<?x8xf32>
}

// A comparison and a select: the region holds i1 conditions next to f32.
// CHECK-LABEL: func.func @leaky
// CHECK: scoring(custom) order(topk_then_score) score {
// CHECK: arith.cmpf ogt
// CHECK: arith.select
func.func @leaky(%l: tensor<4x16xbf16>) -> tensor<4x2xf32> {
  %w, %i = moe.route %l k(2) scoring(custom) order(topk_then_score) score {
  ^bb0(%x: f32):
    %zero = arith.constant 0.000000e+00 : f32
    %c = arith.constant 1.000000e-01 : f32
    %p = arith.cmpf ogt, %x, %zero : f32
    %y = arith.mulf %x, %c : f32
    %r = arith.select %p, %x, %y : f32
    moe.yield %r : f32
  } : tensor<4x16xbf16> -> tensor<4x2xf32>, tensor<4x2xi32>
  return %w : tensor<4x2xf32>
}

// CHECK-LABEL: func.func @route_grad_custom
// CHECK: moe.route_grad %{{.*}}, %{{.*}} dw(%{{.*}} : tensor<?x4xf32>) scoring(custom) renormalize(true) routed_scaling_factor(2.500000e+00) score {
// CHECK: math.tanh
// CHECK: } : tensor<?x32xf32>, tensor<?x4xi32> -> tensor<?x32xf32>
func.func @route_grad_custom(%l: tensor<?x32xf32>, %i: tensor<?x4xi32>, %dw: tensor<?x4xf32>) -> tensor<?x32xf32> {
  %d = moe.route_grad %l, %i dw(%dw : tensor<?x4xf32>) scoring(custom) renormalize(true) routed_scaling_factor(2.5) score {
  ^bb0(%x: f32):
    %t = math.tanh %x : f32
    %r = arith.mulf %x, %t : f32
    moe.yield %r : f32
  } : tensor<?x32xf32>, tensor<?x4xi32> -> tensor<?x32xf32>
  return %d : tensor<?x32xf32>
}

// CHECK-LABEL: func.func @route_grad_sigmoid
// CHECK: moe.route_grad %{{.*}}, %{{.*}} dw(%{{.*}} : tensor<?x4xf32>) :
func.func @route_grad_sigmoid(%l: tensor<?x32xf32>, %i: tensor<?x4xi32>, %dw: tensor<?x4xf32>) -> tensor<?x32xf32> {
  %d = moe.route_grad %l, %i dw(%dw : tensor<?x4xf32>) scoring(sigmoid) : tensor<?x32xf32>, tensor<?x4xi32> -> tensor<?x32xf32>
  return %d : tensor<?x32xf32>
}
