// RUN: moe-opt %s --convert-moe-to-gpu=flash-mix-wide=true -split-input-file | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s --check-prefix=OFF

// The f32 flash mixing kernel's wide form (flash-mix-wide, FlashMixWide.cpp):
// 64-key tiles, the query and key chunks [16 x 32] and [64 x 32] padded by 4
// floats, the value tile [64 x K padded to 8, + 4]; 16-byte loads from shared
// memory; each lane's own softmax state and K sums carried over the key tiles
// (no shuffle in the key loop), merged over the row's 8 lanes at the end: the
// row max and sum (butterflies 1, 2, 4), then the sums reduce-scattered
// (K/2 shuffles at distance 4, K/4 at 2, K/8 at 1). 3 blocks a
// multiprocessor stated to ptxas up to 32 experts (flashMixWideBlocks).

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_0(
// CHECK-SAME: workgroup(%[[Q:.*]] : memref<16x36xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[K:.*]] : memref<64x36xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[E:.*]] : memref<64x20xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: nvvm.minctasm = 3
// The staging's 16-byte path where all three operands are aligned, chosen
// in each chunk; K = 12: 16 sums, the max and the sum carried over the tiles.
// CHECK: memref.extract_aligned_pointer_as_index
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c64{{.*}} iter_args({{([^,]*, ){17}[^,]*}}) -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c32{{.*}} iter_args
// CHECK: gpu.barrier
// CHECK: scf.if
// CHECK: vector.load %arg0{{.*}} vector<4xf32>
// CHECK: vector.store %{{.*}}, %[[Q]]{{.*}} vector<4xf32>
// CHECK: vector.store %{{.*}}, %[[K]]{{.*}} vector<4xf32>
// The values with the first chunk.
// CHECK: scf.if
// CHECK: vector.store %{{.*}}, %[[E]]{{.*}} vector<4xf32>
// The element staging (a misaligned or non-f32 operand).
// CHECK: } else {
// CHECK: memref.load %arg1
// CHECK: memref.store %{{.*}}, %[[K]]
// CHECK: gpu.barrier
// CHECK: vector.load %[[Q]]{{.*}} vector<4xf32>
// CHECK: vector.load %[[K]]{{.*}} vector<4xf32>
// CHECK: math.fma
// No shuffle until the key loop ends: the lane's softmax step, then its
// keys' P·e.
// CHECK-NOT: gpu.shuffle
// CHECK: llvm.nvvm.ex2.approx.ftz.f
// CHECK-NOT: gpu.shuffle
// CHECK: vector.load %[[E]]{{.*}} vector<4xf32>
// CHECK-NOT: gpu.shuffle
// CHECK: scf.yield
// The merge: the row max, each lane's scale, the row sum.
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c4_i32
// CHECK: llvm.nvvm.ex2.approx.ftz.f
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c4_i32
// The reduce-scatter: 8 + 4 + 2 shuffles (K = 12 padded to 16).
// CHECK-COUNT-8: gpu.shuffle  xor %{{.*}}, %c4_i32
// CHECK-COUNT-4: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK-COUNT-2: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK-NOT: gpu.shuffle
// CHECK: arith.divf
// CHECK: gpu.return
// CHECK: gpu.launch_func {{.*}} @moe_kernels::@similarity_inform_0 blocks in ({{.*}}) threads in (%c128

// OFF-LABEL: gpu.module @moe_kernels
// OFF: gpu.func @similarity_inform_0(
// OFF-SAME: memref<16x33xf32, #gpu.address_space<workgroup>>
// OFF-NOT: nvvm.minctasm
func.func @sim(%u: tensor<2x128x64xf32>, %e: tensor<2x128x12xf32>) -> tensor<2x128x12xf32> {
  %p = moe.similarity_inform %u, %e tau(0.5) : tensor<2x128x64xf32>, tensor<2x128x12xf32> -> tensor<2x128x12xf32>
  return %p : tensor<2x128x12xf32>
}

// -----

// Causal with a key mask and the lse (the training forward): the diagonal
// tile's keys checked (a skipped key adds nothing), a masked key's values
// staged as zeros; 2 blocks for 24 experts (3 without the masks and lse).
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_fwd_0(
// CHECK-SAME: memref<64x28xf32, #gpu.address_space<workgroup>>
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: arith.minui
// The values' rows kept where the key mask holds.
// CHECK: memref.load %arg3
// CHECK: vector.store
// The diagonal tile: a key after the row is skipped.
// CHECK: arith.cmpi ule
// CHECK: scf.if %{{.*}} -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32) {
// CHECK: arith.cmpf oeq
// CHECK: scf.if
// CHECK: math.log
// CHECK: gpu.return

// OFF-LABEL: gpu.module @moe_kernels
// OFF: gpu.func @similarity_inform_fwd_0(
// OFF-SAME: memref<32x24xf32, #gpu.address_space<workgroup>>
func.func @fwd(%u: tensor<?x?x40xf32>, %e: tensor<?x?x24xf32>, %m: tensor<?x?xi1>) -> (tensor<?x?x24xf32>, tensor<?x?xf32>) {
  %p, %lse = moe.similarity_inform_fwd %u, %e key_mask(%m : tensor<?x?xi1>) tau(0.5) causal(true) : tensor<?x?x40xf32>, tensor<?x?x24xf32> -> tensor<?x?x24xf32>, tensor<?x?xf32>
  return %p, %lse : tensor<?x?x24xf32>, tensor<?x?xf32>
}

// -----

// Past 64 experts the plain kernel; K = 64 takes the wide form with 2 blocks.
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_0(
// CHECK-SAME: memref<64x68xf32, #gpu.address_space<workgroup>>
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: gpu.func @similarity_inform_1(
// CHECK-SAME: memref<32x65xf32, #gpu.address_space<workgroup>>
// CHECK-NOT: nvvm.minctasm
func.func @big(%u: tensor<1x100x32xf32>, %e64: tensor<1x100x64xf32>, %e65: tensor<1x100x65xf32>) -> (tensor<1x100x64xf32>, tensor<1x100x65xf32>) {
  %p = moe.similarity_inform %u, %e64 tau(1.0) : tensor<1x100x32xf32>, tensor<1x100x64xf32> -> tensor<1x100x64xf32>
  %q = moe.similarity_inform %u, %e65 tau(1.0) : tensor<1x100x32xf32>, tensor<1x100x65xf32> -> tensor<1x100x65xf32>
  return %p, %q : tensor<1x100x64xf32>, tensor<1x100x65xf32>
}

// -----

// The fused top-k, ws's projected query (bf16 u: the element staging only,
// one key loop) and attention_posterior's mixing (every key checked).
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_topk_0(
// CHECK-SAME: memref<64x36xf32, #gpu.address_space<workgroup>>
// CHECK: gpu.func @similarity_project_0(
// CHECK: gpu.func @similarity_inform_0(
// CHECK-SAME: memref<64x36xf32, #gpu.address_space<workgroup>>
// CHECK-NOT: memref.extract_aligned_pointer_as_index
// CHECK: arith.extf
// CHECK: gpu.return
// CHECK: gpu.func @attention_posterior_0(
// CHECK-SAME: memref<64x36xf32, #gpu.address_space<workgroup>>
func.func @others(%u: tensor<1x50x16xf32>, %e: tensor<1x50x8xf32>, %ub: tensor<1x50x16xbf16>, %ws: tensor<16x16xf32>,
                  %s: tensor<1x4x50x50xf32>, %v: tensor<1x4x50x16xf32>, %wo: tensor<16x64xf32>)
    -> (tensor<1x50x2xf32>, tensor<1x50x2xi32>, tensor<1x50x8xf32>, tensor<1x50x8xf32>, tensor<1xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) tau(1.0) : tensor<1x50x16xf32>, tensor<1x50x8xf32> -> tensor<1x50x2xf32>, tensor<1x50x2xi32>
  %p = moe.similarity_inform %ub, %e ws(%ws : tensor<16x16xf32>) : tensor<1x50x16xbf16>, tensor<1x50x8xf32> -> tensor<1x50x8xf32>
  %a, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(1.0) : tensor<1x4x50x50xf32>, tensor<1x50x16xf32>, tensor<1x4x50x16xf32>, tensor<16x64xf32>, tensor<1x50x8xf32> -> tensor<1x50x8xf32>, tensor<1xi32>
  return %w, %i, %p, %a, %h : tensor<1x50x2xf32>, tensor<1x50x2xi32>, tensor<1x50x8xf32>, tensor<1x50x8xf32>, tensor<1xi32>
}
