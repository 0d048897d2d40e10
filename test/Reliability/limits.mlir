// Sizes the kernels cannot index are compile-time errors naming the limit (issue #15), in every pipeline.
// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-legalize-shapes
// RUN: moe-opt %s -split-input-file -verify-diagnostics --convert-moe-to-linalg
// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-lower-to-llvm
// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-lower-to-nvvm="chip=sm_90 format=isa"

func.func @topk_over_i32_elements(%x: tensor<65536x32768xf32>) -> tensor<65536x2xi32> {
  // expected-error @+1 {{operand #0 ('tensor<65536x32768xf32>') has 2147483648 elements, more than the kernels support: at most 2147483647 per tensor (2^31 - 1: the kernels index with i32 and the index results are i32)}}
  %w, %i = moe.topk_renorm %x k(2) : tensor<65536x32768xf32> -> tensor<65536x2xf32>, tensor<65536x2xi32>
  return %i : tensor<65536x2xi32>
}

// -----

func.func @similarity_overflowing_int64(%u: tensor<4294967296x4294967296x4xf32>, %e: tensor<4294967296x4294967296x2xf32>)
    -> tensor<4294967296x4294967296x2xf32> {
  // expected-error @+1 {{has more than 2^63 elements, more than the kernels support}}
  %p = moe.similarity_inform %u, %e : tensor<4294967296x4294967296x4xf32>, tensor<4294967296x4294967296x2xf32> -> tensor<4294967296x4294967296x2xf32>
  return %p : tensor<4294967296x4294967296x2xf32>
}
