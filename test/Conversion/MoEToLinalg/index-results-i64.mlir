// RUN: moe-opt %s --convert-moe-to-linalg -split-input-file | FileCheck %s

// Indices written as i64: the portable lowering selects in i32 and sign-extends the [.., k] indices once, in one
// elementwise generic, at the end (the reference's form; the CPU and GPU kernels extend at each store).
// CHECK-LABEL: func.func @topk
// CHECK: linalg.generic
// CHECK: arith.extsi %{{.*}} : i32 to i64
// CHECK: return %{{.*}}, %{{.*}} : tensor<?x2xf32>, tensor<?x2xi64>
func.func @topk(%s: tensor<?x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi64>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi64>
}

// -----

// CHECK-LABEL: func.func @route
// CHECK: arith.extsi %{{.*}} : i32 to i64
// CHECK: return %{{.*}}, %{{.*}} : tensor<4x2xf32>, tensor<4x2xi64>
func.func @route(%l: tensor<4x8xf32>) -> (tensor<4x2xf32>, tensor<4x2xi64>) {
  %w, %i = moe.route %l k(2) scoring(sigmoid) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi64>
  return %w, %i : tensor<4x2xf32>, tensor<4x2xi64>
}
