// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// similarity_inform_grad with symmetric scores (no ws, not causal: x_ij = x_ji) takes one query-major pass
// that serves both roles of a pair (SimilarityInformGrad.cpp, 2'): the scores and two cotangent dot tiles,
// <dp_i, e_j> and the transposed pair's <e_i, dp_j>, the last one to memory. Each pass (the recomputed forward,
// a backward pass) has its [8, 32] tile scratches per worker: 2 + 3 here, 2 + 2 + 2 with two backward passes.

// CHECK-LABEL: func.func @symmetric_one_pass
// CHECK-COUNT-2: memref.alloc() {alignment = 64 : i64} : memref<2x8x32xf32>
// CHECK: scf.parallel
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<2x8x32xf32>
// CHECK-NEXT: memref.alloc() {alignment = 64 : i64} : memref<2x8x32xf32>
// CHECK-NEXT: memref.alloc() {alignment = 64 : i64} : memref<2x8x32xf32>
// CHECK-NOT: memref<2x8x32xf32>{{$}}
// CHECK: return
func.func @symmetric_one_pass(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>, %m: tensor<2x100xi1>,
                              %dp: tensor<2x100x16xf32>) -> (tensor<2x100x64xf32>, tensor<2x100x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<2x100xi1>) dp(%dp : tensor<2x100x16xf32>)
      tau(0.5) causal(false)
      : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x64xf32>, tensor<2x100x16xf32>
  return %du, %de : tensor<2x100x64xf32>, tensor<2x100x16xf32>
}

// Causal: x_ij is used only below the diagonal, so the pair has one role; two passes (query-major, key-major).
// CHECK-LABEL: func.func @causal_two_passes
// CHECK-COUNT-2: memref.alloc() {alignment = 64 : i64} : memref<2x8x32xf32>
// CHECK: scf.parallel
// CHECK-COUNT-2: memref.alloc() {alignment = 64 : i64} : memref<2x8x32xf32>
// CHECK-NOT: memref<2x8x32xf32>{{$}}
// CHECK: scf.parallel
// CHECK-COUNT-2: memref.alloc() {alignment = 64 : i64} : memref<2x8x32xf32>
// CHECK: return
func.func @causal_two_passes(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>, %m: tensor<2x100xi1>,
                             %dp: tensor<2x100x16xf32>) -> (tensor<2x100x64xf32>, tensor<2x100x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<2x100xi1>) dp(%dp : tensor<2x100x16xf32>)
      tau(0.5) causal(true)
      : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x64xf32>, tensor<2x100x16xf32>
  return %du, %de : tensor<2x100x64xf32>, tensor<2x100x16xf32>
}
