// RUN: moe-opt %s --convert-moe-to-gpu=flash-mma-tf32=true -split-input-file | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s --check-prefix=OFF

// similarity_inform with f32 operands on tensor cores by 3xTF32
// (flash-mma-tf32, FlashTf32.cpp): 4 warps and 64 rows a block, 64-key
// tiles staged split (the keys' big and small halves [64 x 72]: a row stride
// 8 mod 32 floats for the B fragments' 8-byte loads; the values' [64 x K
// padded to 8, + 4]); the query's fragments split once; per 8 keys and 8
// features two 8-byte loads a half and three mma.sync m16n8k8 tf32 (small
// products first); the softmax in base 2 (ex2.approx) with the row max over
// the quad; P·e on the same MMAs from the logits' C fragments.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_tf32_0(
// CHECK-SAME: workgroup(%[[KB:.*]] : memref<64x72xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[KS:.*]] : memref<64x72xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[VB:.*]] : memref<64x20xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[VS:.*]] : memref<64x20xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: nvvm.minctasm = 3
// The query's fragments: x & 0xFFFFE000 (big), x - big (small).
// CHECK: arith.andi %{{.*}}, %c-8192_i32
// CHECK: arith.subf
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c64{{.*}} iter_args
// CHECK: gpu.barrier
// The staging's split halves.
// CHECK: vector.store %{{.*}}, %[[KB]]
// CHECK: vector.store %{{.*}}, %[[KS]]
// CHECK: vector.store %{{.*}}, %[[VB]]
// CHECK: vector.store %{{.*}}, %[[VS]]
// CHECK: gpu.barrier
// CHECK: vector.load %[[KB]]{{.*}} vector<2xf32>
// CHECK: vector.load %[[KS]]{{.*}} vector<2xf32>
// CHECK: nvvm.mma.sync {{.*}}multiplicandAPtxType = #nvvm.mma_type<tf32>{{.*}}shape = #nvvm.shape<m = 16, n = 8, k = 8>
// CHECK: nvvm.mma.sync
// CHECK: nvvm.mma.sync
// The row max over the quad, the weights on the SFU.
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK: llvm.nvvm.ex2.approx.ftz.f
// P·e: the values' halves, three MMAs.
// CHECK: memref.load %[[VB]]
// CHECK: memref.load %[[VS]]
// CHECK: nvvm.mma.sync
// The rows' sums over the quad, p = O / l stored.
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK: arith.divf
// CHECK: memref.store
// CHECK: gpu.return
// CHECK: gpu.launch_func {{.*}} @moe_kernels::@similarity_inform_tf32_0 blocks in ({{.*}}) threads in (%c128

// OFF-LABEL: gpu.module @moe_kernels
// OFF: gpu.func @similarity_inform_0(
// OFF-NOT: mma_type<tf32>
// OFF: gpu.launch_func
func.func @sim(%u: tensor<2x128x64xf32>, %e: tensor<2x128x12xf32>) -> tensor<2x128x12xf32> {
  %p = moe.similarity_inform %u, %e tau(0.5) : tensor<2x128x64xf32>, tensor<2x128x12xf32> -> tensor<2x128x12xf32>
  return %p : tensor<2x128x12xf32>
}

// -----

// The training forward, causal with a key mask, dynamic shapes; K = 64 takes
// 32-key tiles (64 would pass 48 KiB); D = 40: row stride 40 (8 mod 32).
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_fwd_tf32_0(
// CHECK-SAME: memref<32x40xf32, #gpu.address_space<workgroup>>
// CHECK-SAME: memref<32x68xf32, #gpu.address_space<workgroup>>
// CHECK: arith.minui
// CHECK: math.log
// CHECK: gpu.return
func.func @fwd(%u: tensor<?x?x40xf32>, %e: tensor<?x?x64xf32>, %m: tensor<?x?xi1>) -> (tensor<?x?x64xf32>, tensor<?x?xf32>) {
  %p, %lse = moe.similarity_inform_fwd %u, %e key_mask(%m : tensor<?x?xi1>) tau(0.5) causal(true) : tensor<?x?x40xf32>, tensor<?x?x64xf32> -> tensor<?x?x64xf32>, tensor<?x?xf32>
  return %p, %lse : tensor<?x?x64xf32>, tensor<?x?xf32>
}

// -----

// Not past 64 features or experts, not for the fused top-k, not for f16/bf16
// (the bf16/f16 tensor-core kernel): the other kernels.
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK-NOT: _tf32_
// CHECK: gpu.func @similarity_inform_0(
// CHECK-NOT: _tf32_
// CHECK: gpu.func @similarity_inform_1(
// CHECK-NOT: _tf32_
// CHECK: gpu.func @similarity_inform_topk_0(
// CHECK-NOT: _tf32_
// CHECK: gpu.func @similarity_inform_mma_
// CHECK-NOT: _tf32_
func.func @others(%u72: tensor<1x100x72xf32>, %u: tensor<1x100x32xf32>, %e: tensor<1x100x16xf32>, %e65: tensor<1x100x65xf32>, %ub: tensor<1x100x32xbf16>, %eb: tensor<1x100x16xbf16>)
    -> (tensor<1x100x16xf32>, tensor<1x100x65xf32>, tensor<1x100x2xf32>, tensor<1x100x2xi32>, tensor<1x100x16xf32>) {
  %a = moe.similarity_inform %u72, %e tau(1.0) : tensor<1x100x72xf32>, tensor<1x100x16xf32> -> tensor<1x100x16xf32>
  %b = moe.similarity_inform %u, %e65 tau(1.0) : tensor<1x100x32xf32>, tensor<1x100x65xf32> -> tensor<1x100x65xf32>
  %w, %i = moe.similarity_inform_topk %u, %e k(2) tau(1.0) : tensor<1x100x32xf32>, tensor<1x100x16xf32> -> tensor<1x100x2xf32>, tensor<1x100x2xi32>
  %c = moe.similarity_inform %ub, %eb tau(1.0) : tensor<1x100x32xbf16>, tensor<1x100x16xbf16> -> tensor<1x100x16xf32>
  return %a, %b, %w, %i, %c : tensor<1x100x16xf32>, tensor<1x100x65xf32>, tensor<1x100x2xf32>, tensor<1x100x2xi32>, tensor<1x100x16xf32>
}

// -----

// similarity_inform_grad without saved p and lse: its recomputed forward
// (with the lse) on this kernel; the backward's passes stay the scalar ones.
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_grad_mix_tf32_0(
// CHECK: nvvm.mma.sync {{.*}}mma_type<tf32>
// CHECK: math.log
// CHECK: gpu.func @similarity_inform_grad_dq_0(
// CHECK: gpu.launch_func {{.*}} @moe_kernels::@similarity_inform_grad_mix_tf32_0
// OFF-LABEL: gpu.module @moe_kernels
// OFF: gpu.func @similarity_inform_grad_mix_0(
func.func @grad(%u: tensor<2x100x32xf32>, %e: tensor<2x100x16xf32>, %dp: tensor<2x100x16xf32>) -> (tensor<2x100x32xf32>, tensor<2x100x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x100x16xf32>) tau(1.0) causal(true) : tensor<2x100x32xf32>, tensor<2x100x16xf32> -> tensor<2x100x32xf32>, tensor<2x100x16xf32>
  return %du, %de : tensor<2x100x32xf32>, tensor<2x100x16xf32>
}
