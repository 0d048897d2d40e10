// RUN: moe-opt %s -split-input-file | moe-opt -split-input-file | FileCheck %s
// RUN: moe-opt %s -split-input-file -mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC

// moe.route with a given choice (replay): the indices operand prints after the bias, and the generic form
// carries both optional operands' segment sizes.

// CHECK-LABEL: func.func @replay_with_bias
// CHECK: moe.route %{{.+}} bias(%{{.+}} : tensor<64xf32>) replay(%{{.+}} : tensor<?x8xi32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true)
// GENERIC-LABEL: "func.func"() <{function_type = (tensor<?x64xf32>, tensor<64xf32>, tensor<?x8xi32>)
// GENERIC: "moe.route"(%arg0, %arg1, %arg2) <{{.*}}operandSegmentSizes = array<i32: 1, 1, 1>
func.func @replay_with_bias(%l: tensor<?x64xf32>, %b: tensor<64xf32>, %r: tensor<?x8xi32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<64xf32>) replay(%r : tensor<?x8xi32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true)
      : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// An i64 choice (a hash table's or an inference engine's indices) and no bias.
// CHECK-LABEL: func.func @replay_i64
// CHECK: moe.route %{{.+}} replay(%{{.+}} : tensor<5x2xi64>) k(2) :
// GENERIC-LABEL: "func.func"() <{function_type = (tensor<5x16xbf16>, tensor<5x2xi64>)
// GENERIC: "moe.route"(%arg0, %arg1) <{{.*}}operandSegmentSizes = array<i32: 1, 0, 1>
func.func @replay_i64(%l: tensor<5x16xbf16>, %r: tensor<5x2xi64>) -> (tensor<5x2xf32>, tensor<5x2xi32>) {
  %w, %i = moe.route %l replay(%r : tensor<5x2xi64>) k(2) : tensor<5x16xbf16> -> tensor<5x2xf32>, tensor<5x2xi32>
  return %w, %i : tensor<5x2xf32>, tensor<5x2xi32>
}

// -----

// Without replay the generic form has an empty replay segment.
// GENERIC-LABEL: "func.func"() <{function_type = (tensor<?x16xf32>)
// GENERIC: "moe.route"(%arg0) <{{.*}}operandSegmentSizes = array<i32: 1, 0, 0>
func.func @no_replay(%l: tensor<?x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.route %l k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}
