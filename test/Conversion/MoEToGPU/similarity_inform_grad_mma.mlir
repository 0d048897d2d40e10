// RUN: moe-opt %s -split-input-file --convert-moe-to-gpu="flash-mma-grad=true" | FileCheck %s
// RUN: moe-opt %s -split-input-file --convert-moe-to-gpu | FileCheck %s --check-prefix=OFF

// flash-mma-grad (issue #47 item 3; off by default):
// similarity_inform_grad's flash passes on tensor cores (FlashMmaGrad.cpp)
// for f16/bf16 u and e without ws. The SIMT interpreter runs the kernels
// against float64 autograd (test/GPU/unit/test_flash_mma_grad_simt.py); the
// ptxas sweep (GPU/ptxas-sweep.mlir) assembles them with no local memory:
// ptxas-options: flash-mma-grad=true

// Saved statistics: the stats kernel rounds dp to bf16 into rows padded to
// a multiple of 8 (zeros past K) and forms delta of it (as the passes' dots
// take it), then the query-major pass (dq into du) and the
// key-major pass (de, du +=), each a block of 128 threads over 64 rows with
// u's column tile [64 x (64 + 8)] and e's / dp's [64 x (16 + 8)] (64
// columns: D + K padded is at most 96; 16-byte aligned) and the columns'
// terms [2 x 64]. Every row has one writer: no atomics. A tile: S (4
// feature chunks x 8 key blocks) and G (1 x 8) on mma.sync, 32 EX2 a thread
// (64 x 16 scores over 32 lanes), dX U (4 x 8).
// CHECK-LABEL: gpu.func @flash_grad_stats_0
// CHECK-SAME: %arg5: memref<1x100x16xbf16>
// CHECK: %[[R:.*]] = arith.truncf %{{.*}} : f32 to bf16
// CHECK: memref.store %[[R]], %arg5
// CHECK: arith.extf %[[R]] : bf16 to f32
// CHECK-LABEL: gpu.func @similarity_inform_grad_dq_mma_0
// CHECK-SAME: %arg5: memref<1x100xi1>, %arg6: memref<1x100x64xf32>) workgroup(%[[XS:.*]] : memref<64x72xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[ZS:.*]] : memref<64x24xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<2x64xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// Under causal the key loop ends at the block's last row (or N).
// CHECK: arith.addi %{{.*}}, %c64
// CHECK: scf.for
// CHECK: gpu.barrier
// CHECK: vector.store %{{.*}}, %[[XS]]
// CHECK: gpu.barrier
// CHECK: vector.load %arg0{{.*}} : memref<1x100x64xbf16>, vector<8xbf16>
// CHECK: nvgpu.ldmatrix %[[XS]]
// CHECK: nvvm.mma.sync
// CHECK: nvgpu.ldmatrix %[[ZS]]
// CHECK: llvm.nvvm.ex2.approx.ftz.f
// CHECK: nvgpu.ldmatrix %[[XS]]{{.*}}transpose = true
// CHECK-NOT: atomic
// CHECK: gpu.return
// CHECK-LABEL: gpu.func @similarity_inform_grad_dk_mma_0
// CHECK-SAME: %arg2: memref<1x100x16xbf16>
// CHECK-SAME: %arg6: memref<1x100x16xf32>, %arg7: memref<1x100x64xf32>)
// Under causal the query loop starts at the block's first row; the rounded
// dp's tile is staged 16 bytes at a time.
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c64
// CHECK: vector.load %arg2{{.*}} : memref<1x100x16xbf16>, vector<8xbf16>
// CHECK: llvm.nvvm.ex2.approx.ftz.f
// CHECK-NOT: atomic
// CHECK: gpu.return
// The host: stats, by query, by key.
// CHECK: gpu.launch_func {{.*}}@flash_grad_stats_0
// CHECK: gpu.launch_func {{.*}}@similarity_inform_grad_dq_mma_0
// CHECK: gpu.launch_func {{.*}}@similarity_inform_grad_dk_mma_0
// OFF-NOT: _mma
func.func @saved_causal_masked(%u: tensor<1x100x64xbf16>, %e: tensor<1x100x16xbf16>, %dp: tensor<1x100x16xf32>, %m: tensor<1x100xi1>, %p: tensor<1x100x16xf32>, %lse: tensor<1x100xf32>) -> (tensor<1x100x64xf32>, tensor<1x100x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<1x100xi1>) dp(%dp : tensor<1x100x16xf32>) saved(%p, %lse : tensor<1x100x16xf32>, tensor<1x100xf32>) tau(5.000000e-01) causal(true) : tensor<1x100x64xbf16>, tensor<1x100x16xbf16> -> tensor<1x100x64xf32>, tensor<1x100x16xf32>
  return %du, %de : tensor<1x100x64xf32>, tensor<1x100x16xf32>
}

// -----

// Without saved statistics the forward is recomputed on the tensor-core
// kernel (its one-row-tile form at D = 128), with the lse. The passes take
// 32-column tiles at D = 128, K = 64.
// CHECK-LABEL: gpu.func @similarity_inform_grad_mix_mma_0
// CHECK: nvgpu.mma.sync
// CHECK: gpu.func @flash_grad_stats_0
// CHECK: gpu.func @similarity_inform_grad_dq_mma_0({{.*}}workgroup({{.*}}memref<32x136xf16{{.*}}memref<32x72xf16{{.*}}memref<2x32xf32
// CHECK: gpu.func @similarity_inform_grad_dk_mma_0
// OFF-LABEL: gpu.func @similarity_inform_grad_mix_0
// OFF-NOT: _mma
func.func @recomputed_f16(%u: tensor<2x?x128xf16>, %e: tensor<2x?x64xf16>, %dp: tensor<2x?x64xf32>) -> (tensor<2x?x128xf32>, tensor<2x?x64xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x?x64xf32>) tau(1.000000e+00) : tensor<2x?x128xf16>, tensor<2x?x64xf16> -> tensor<2x?x128xf32>, tensor<2x?x64xf32>
  return %du, %de : tensor<2x?x128xf32>, tensor<2x?x64xf32>
}

// -----

// -----

// Past 128 features (D = 256, K = 64): dq's and du's features split over
// two blocks, the grid's z, each accumulating the 128 from z 128 (a view of
// the staged u tile at that column) with the logits in full; 16-column tiles
// [16 x (256 + 8)] copied by cp.async into two buffers (no tile's vectors
// carried in registers), the next tile's copies issued after the barrier
// that frees its buffer, each tile's waited for before it; 2 blocks a
// multiprocessor (ptxas's 255 registers). de is written by the first split
// only.
// CHECK-LABEL: gpu.func @similarity_inform_grad_dq_mma_0(%arg0: memref<2x?x256xbf16>
// CHECK-SAME: workgroup(%{{.*}} : memref<32x264xbf16, #gpu.address_space<workgroup>>
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: %[[Z:.*]] = gpu.block_id  z
// CHECK-NEXT: %[[C128:.*]] = arith.constant 128 : index
// CHECK-NEXT: %[[LO:.*]] = arith.muli %[[Z]], %[[C128]] : index
// The first tile's copies into the first buffer, before the loop.
// CHECK: nvgpu.device_async_copy %arg0{{.*}} : memref<2x?x256xbf16> to memref<16x264xbf16, strided<[264, 1], offset: ?>
// CHECK: nvvm.cp.async.commit.group
// CHECK: scf.for
// CHECK: nvvm.cp.async.wait.group 0
// CHECK-NEXT: gpu.barrier
// The next tile's copies into the other buffer (rows 16 (tile + 1) mod 2).
// CHECK: nvgpu.device_async_copy %arg0{{.*}} : memref<2x?x256xbf16> to memref<16x264xbf16, strided<[264, 1], offset: ?>
// CHECK: nvvm.cp.async.commit.group
// CHECK: memref.subview %{{.*}}[0, %[[LO]]] [16, 128] [1, 1] : memref<16x264xbf16, strided<[264, 1], offset: ?>, #gpu.address_space<workgroup>> to memref<16x128xbf16, strided<[264, 1], offset: ?>
// CHECK-LABEL: gpu.func @similarity_inform_grad_dk_mma_0(%arg0: memref<2x?x256xbf16>
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: %[[ZK:.*]] = gpu.block_id  z
// CHECK: memref.subview %{{.*}}[0, %{{.*}}] [16, 128] [1, 1]
// CHECK: %[[FIRST:.*]] = arith.cmpi eq, %[[ZK]], %c0 : index
// CHECK-NEXT: scf.if %[[FIRST]] {
// CHECK-LABEL: func.func @d256(
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@similarity_inform_grad_dq_mma_0 blocks in (%{{.*}}, %{{.*}}, %c2)
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@similarity_inform_grad_dk_mma_0 blocks in (%{{.*}}, %{{.*}}, %c2
func.func @d256(%u: tensor<2x?x256xbf16>, %e: tensor<2x?x64xbf16>, %dp: tensor<2x?x64xf32>, %p: tensor<2x?x64xf32>, %lse: tensor<2x?xf32>) -> (tensor<2x?x256xf32>, tensor<2x?x64xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x?x64xf32>) saved(%p, %lse : tensor<2x?x64xf32>, tensor<2x?xf32>) tau(1.000000e+00) causal(true) : tensor<2x?x256xbf16>, tensor<2x?x64xbf16> -> tensor<2x?x256xf32>, tensor<2x?x64xf32>
  return %du, %de : tensor<2x?x256xf32>, tensor<2x?x64xf32>
}

// -----

// The register fit past 128 features (the ptxas sweep assembles these for
// sm_80 and sm_90 without local memory): D = 256 with K = 16 (it spilled with
// the next tile's vectors carried in registers, 32-column tiles), D = 200 with K = 12 under a
// key mask (two splits of 104 features: 13 blocks, one unpaired), D = 192, f16
// (96 each), D = 144, K = 40, causal with a key mask (ptxas took 168
// registers and spilled without the kernel's 2 blocks a multiprocessor).
// CHECK-LABEL: func.func @fit_d256_k16(
// CHECK-LABEL: func.func @fit_d200_k12_mask(
// CHECK-LABEL: func.func @fit_d192_k64_f16(
// CHECK-LABEL: func.func @fit_d144_k40_causal_mask(
// CHECK: gpu.launch_func {{.*}}@similarity_inform_grad_dq_mma_{{[0-9]+}} blocks in (%{{.*}}, %{{.*}}, %c2
func.func @fit_d256_k16(%u: tensor<2x?x256xbf16>, %e: tensor<2x?x16xbf16>, %dp: tensor<2x?x16xf32>, %m: tensor<2x?xi1>, %p: tensor<2x?x16xf32>, %lse: tensor<2x?xf32>) -> (tensor<2x?x256xf32>, tensor<2x?x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x?x16xf32>) saved(%p, %lse : tensor<2x?x16xf32>, tensor<2x?xf32>) tau(1.000000e+00) causal(true) : tensor<2x?x256xbf16>, tensor<2x?x16xbf16> -> tensor<2x?x256xf32>, tensor<2x?x16xf32>
  return %du, %de : tensor<2x?x256xf32>, tensor<2x?x16xf32>
}
func.func @fit_d200_k12_mask(%u: tensor<2x?x200xbf16>, %e: tensor<2x?x12xbf16>, %dp: tensor<2x?x12xf32>, %m: tensor<2x?xi1>, %p: tensor<2x?x12xf32>, %lse: tensor<2x?xf32>) -> (tensor<2x?x200xf32>, tensor<2x?x12xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<2x?xi1>) dp(%dp : tensor<2x?x12xf32>) saved(%p, %lse : tensor<2x?x12xf32>, tensor<2x?xf32>) tau(1.000000e+00) causal(false) : tensor<2x?x200xbf16>, tensor<2x?x12xbf16> -> tensor<2x?x200xf32>, tensor<2x?x12xf32>
  return %du, %de : tensor<2x?x200xf32>, tensor<2x?x12xf32>
}
func.func @fit_d192_k64_f16(%u: tensor<2x?x192xf16>, %e: tensor<2x?x64xf16>, %dp: tensor<2x?x64xf32>, %m: tensor<2x?xi1>, %p: tensor<2x?x64xf32>, %lse: tensor<2x?xf32>) -> (tensor<2x?x192xf32>, tensor<2x?x64xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x?x64xf32>) saved(%p, %lse : tensor<2x?x64xf32>, tensor<2x?xf32>) tau(1.000000e+00) causal(false) : tensor<2x?x192xf16>, tensor<2x?x64xf16> -> tensor<2x?x192xf32>, tensor<2x?x64xf32>
  return %du, %de : tensor<2x?x192xf32>, tensor<2x?x64xf32>
}
func.func @fit_d144_k40_causal_mask(%u: tensor<2x?x144xbf16>, %e: tensor<2x?x40xbf16>, %dp: tensor<2x?x40xf32>, %m: tensor<2x?xi1>, %p: tensor<2x?x40xf32>, %lse: tensor<2x?xf32>) -> (tensor<2x?x144xf32>, tensor<2x?x40xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<2x?xi1>) dp(%dp : tensor<2x?x40xf32>) saved(%p, %lse : tensor<2x?x40xf32>, tensor<2x?xf32>) tau(1.000000e+00) causal(true) : tensor<2x?x144xbf16>, tensor<2x?x40xbf16> -> tensor<2x?x144xf32>, tensor<2x?x40xf32>
  return %du, %de : tensor<2x?x144xf32>, tensor<2x?x40xf32>
}

// -----

// Where the passes do not apply the scalar ones run: ws (q = u ws is f32),
// f32 operands, more than 64 experts, more than 256 features.
// CHECK-LABEL: gpu.func @similarity_project_0
// CHECK-NOT: _mma
// CHECK: gpu.func @similarity_inform_grad_dk_3
// CHECK-NOT: _mma
// CHECK-LABEL: func.func @with_ws
func.func @with_ws(%u: tensor<1x40x32xbf16>, %e: tensor<1x40x8xbf16>, %ws: tensor<32x32xf32>, %dp: tensor<1x40x8xf32>) -> (tensor<1x40x32xf32>, tensor<1x40x8xf32>, tensor<32x32xf32>) {
  %du, %de, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<32x32xf32>) dp(%dp : tensor<1x40x8xf32>) : tensor<1x40x32xbf16>, tensor<1x40x8xbf16> -> tensor<1x40x32xf32>, tensor<1x40x8xf32>, tensor<32x32xf32>
  return %du, %de, %dws : tensor<1x40x32xf32>, tensor<1x40x8xf32>, tensor<32x32xf32>
}
func.func @f32_operands(%u: tensor<1x40x32xf32>, %e: tensor<1x40x8xf32>, %dp: tensor<1x40x8xf32>) -> (tensor<1x40x32xf32>, tensor<1x40x8xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x40x8xf32>) : tensor<1x40x32xf32>, tensor<1x40x8xf32> -> tensor<1x40x32xf32>, tensor<1x40x8xf32>
  return %du, %de : tensor<1x40x32xf32>, tensor<1x40x8xf32>
}
func.func @k_past_64(%u: tensor<1x40x32xbf16>, %e: tensor<1x40x65xbf16>, %dp: tensor<1x40x65xf32>) -> (tensor<1x40x32xf32>, tensor<1x40x65xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x40x65xf32>) : tensor<1x40x32xbf16>, tensor<1x40x65xbf16> -> tensor<1x40x32xf32>, tensor<1x40x65xf32>
  return %du, %de : tensor<1x40x32xf32>, tensor<1x40x65xf32>
}
func.func @d_past_256(%u: tensor<1x40x264xbf16>, %e: tensor<1x40x8xbf16>, %dp: tensor<1x40x8xf32>) -> (tensor<1x40x264xf32>, tensor<1x40x8xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x40x8xf32>) : tensor<1x40x264xbf16>, tensor<1x40x8xbf16> -> tensor<1x40x264xf32>, tensor<1x40x8xf32>
  return %du, %de : tensor<1x40x264xf32>, tensor<1x40x8xf32>
}
