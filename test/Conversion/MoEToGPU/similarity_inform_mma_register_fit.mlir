// RUN: moe-opt %s -split-input-file --convert-moe-to-gpu | FileCheck %s

// The tensor-core kernel's tile choice (flashMmaTile) against ptxas's 255
// registers, at shapes where the default kernels once spilled (dynamic N,
// found by a grid of D = 32, 64, 128 x K = 16, 32, 64 x key mask x lse on
// sm_80 and sm_90): the ptxas sweep (GPU/ptxas-sweep.mlir, --all-nospill)
// assembles every kernel of this file with no local memory, and the checks
// below hold each case to the tile that does.

// D = 128, K = 32 with a key mask: the two row tiles at 32 keys spilled
// 180-204 bytes; the mask's selects count now, and the kernel keeps one row
// tile (64 rows a block; two buffers of 64 keys in static shared memory),
// 2 blocks a multiprocessor (no 128-register cap).
// CHECK-LABEL: gpu.func @similarity_inform_fwd_mma_0
// CHECK-SAME: memref<128x136xbf16
// CHECK-SAME: nvvm.minctasm = 2
func.func @fwd_bf16_d128_k32_masked(%u: tensor<1x?x128xbf16>, %e: tensor<1x?x32xbf16>, %m: tensor<1x?xi1>) -> (tensor<1x?x32xf32>, tensor<1x?xf32>) {
  %p, %l = moe.similarity_inform_fwd %u, %e key_mask(%m : tensor<1x?xi1>) tau(5.000000e-01) : tensor<1x?x128xbf16>, tensor<1x?x32xbf16> -> tensor<1x?x32xf32>, tensor<1x?xf32>
  return %p, %l : tensor<1x?x32xf32>, tensor<1x?xf32>
}

// -----

// D = 32, K = 64: 64-key tiles spilled 56 bytes on sm_90; the value
// blocks' fragments count now: 32-key tiles, two row tiles (the direct
// kernel and the split pair, their tiles in dynamic shared memory).
// CHECK-LABEL: gpu.func @similarity_inform_mma_0
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: gpu.func @similarity_inform_mma_combine_0
func.func @f16_d32_k64(%u: tensor<1x?x32xf16>, %e: tensor<1x?x64xf16>) -> tensor<1x?x64xf32> {
  %p = moe.similarity_inform %u, %e tau(5.000000e-01) : tensor<1x?x32xf16>, tensor<1x?x64xf16> -> tensor<1x?x64xf32>
  return %p : tensor<1x?x64xf32>
}

// -----

// D = 64, K = 16 with a key mask (4 bytes on sm_80 at 64-key tiles):
// 32-key tiles of two row tiles.
// CHECK-LABEL: gpu.func @similarity_inform_mma_0
// CHECK: gpu.func @similarity_inform_mma_combine_0
func.func @bf16_d64_k16_masked(%u: tensor<1x?x64xbf16>, %e: tensor<1x?x16xbf16>, %m: tensor<1x?xi1>) -> tensor<1x?x16xf32> {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<1x?xi1>) tau(5.000000e-01) : tensor<1x?x64xbf16>, tensor<1x?x16xbf16> -> tensor<1x?x16xf32>
  return %p : tensor<1x?x16xf32>
}

// -----

// D = 64, K = 64, a key mask and causal (16-32 bytes at 32-key tiles of two
// row tiles): one row tile, two buffers of 64 keys, 2 blocks a
// multiprocessor (at 4 the 128-register cap spilled the mask's selects).
// CHECK-LABEL: gpu.func @similarity_inform_mma_0
// CHECK-SAME: memref<128x72xbf16
// CHECK-SAME: nvvm.minctasm = 2
func.func @bf16_d64_k64_masked_causal(%u: tensor<1x?x64xbf16>, %e: tensor<1x?x64xbf16>, %m: tensor<1x?xi1>) -> tensor<1x?x64xf32> {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<1x?xi1>) tau(5.000000e-01) causal(true) : tensor<1x?x64xbf16>, tensor<1x?x64xbf16> -> tensor<1x?x64xf32>
  return %p : tensor<1x?x64xf32>
}

// -----

// D = 128, K = 64, causal, with the lse (4 bytes on sm_90 at 64-key tiles):
// 32-key tiles (two buffers), 2 blocks a multiprocessor.
// CHECK-LABEL: gpu.func @similarity_inform_fwd_mma_0
// CHECK-SAME: memref<64x136xf16
// CHECK-SAME: nvvm.minctasm = 2
func.func @fwd_f16_d128_k64_causal(%u: tensor<1x?x128xf16>, %e: tensor<1x?x64xf16>) -> (tensor<1x?x64xf32>, tensor<1x?xf32>) {
  %p, %l = moe.similarity_inform_fwd %u, %e tau(5.000000e-01) causal(true) : tensor<1x?x128xf16>, tensor<1x?x64xf16> -> tensor<1x?x64xf32>, tensor<1x?xf32>
  return %p, %l : tensor<1x?x64xf32>, tensor<1x?xf32>
}
