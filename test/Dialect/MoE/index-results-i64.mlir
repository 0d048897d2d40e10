// moe.topk_renorm and moe.route return their indices as i32 (the inferred type) or, written so in the result
// type, as i64 (as torch.topk returns them): both parse, print and verify; other integer widths are rejected, and
// the fused mixing ops (i32 only) keep theirs. moe-fuse-routing leaves a gate whose indices are i64 unfused.
// RUN: moe-opt %s -split-input-file -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file -verify-diagnostics --mlir-print-op-generic | moe-opt -split-input-file | FileCheck %s
// RUN: moe-opt %s -split-input-file -verify-diagnostics -moe-fuse-routing | FileCheck %s --check-prefix=FUSE

// CHECK-LABEL: func.func @topk_i64
// CHECK: moe.topk_renorm %{{.*}} k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi64>
func.func @topk_i64(%s: tensor<?x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi64>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi64>
}

// -----

// CHECK-LABEL: func.func @route_i64
// CHECK: moe.route %{{.*}} bias(%{{.*}} : tensor<64xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4)
// CHECK-SAME: -> tensor<?x8xf32>, tensor<?x8xi64>
func.func @route_i64(%l: tensor<?x64xf32>, %b: tensor<64xf32>) -> (tensor<?x8xf32>, tensor<?x8xi64>) {
  %w, %i = moe.route %l bias(%b : tensor<64xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4)
      : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi64>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi64>
}

// -----

func.func @route_i16(%l: tensor<4x16xf32>) {
  // expected-error @+1 {{result #1 must be ranked tensor of 32-bit signless integer or 64-bit signless integer values}}
  %w, %i = moe.route %l k(2) : tensor<4x16xf32> -> tensor<4x2xf32>, tensor<4x2xi16>
  return
}

// -----

func.func @route_weights_i64(%l: tensor<4x16xf32>) {
  // Only the indices widen: the weights stay f32.
  // expected-error @+1 {{result #0 must be ranked tensor of 32-bit float values}}
  %w, %i = moe.route %l k(2) : tensor<4x16xf32> -> tensor<4x2xi64>, tensor<4x2xi64>
  return
}

// -----

func.func @fused_i64(%u: tensor<1x8x4xf32>, %e: tensor<1x8x4xf32>) {
  // expected-error @+1 {{result #1 must be ranked tensor of 32-bit signless integer values}}
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<1x8x4xf32>, tensor<1x8x4xf32> -> tensor<1x8x2xf32>, tensor<1x8x2xi64>
  return
}

// -----

// FUSE-LABEL: func.func @gate_i64_not_fused
// FUSE: moe.similarity_inform
// FUSE: moe.topk_renorm %{{.*}} k(2) mode(probs) : tensor<1x8x4xf32> -> tensor<1x8x2xf32>, tensor<1x8x2xi64>
// FUSE-NOT: moe.similarity_inform_topk
func.func @gate_i64_not_fused(%u: tensor<1x8x4xf32>, %e: tensor<1x8x4xf32>) -> (tensor<1x8x2xf32>, tensor<1x8x2xi64>) {
  %p = moe.similarity_inform %u, %e : tensor<1x8x4xf32>, tensor<1x8x4xf32> -> tensor<1x8x4xf32>
  %w, %i = moe.topk_renorm %p k(2) mode(probs) : tensor<1x8x4xf32> -> tensor<1x8x2xf32>, tensor<1x8x2xi64>
  return %w, %i : tensor<1x8x2xf32>, tensor<1x8x2xi64>
}
