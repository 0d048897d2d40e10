// RUN: moe-opt %s -split-input-file --convert-moe-to-gpu="flash-mma-symmetric=true" | FileCheck %s
// RUN: moe-opt %s -split-input-file --convert-moe-to-gpu | FileCheck %s --check-prefix=OFF

// flash-mma-symmetric (issue #47 item 4; off by default):
// similarity_inform over half the pairs (FlashSymmetric.cpp,
// MoE/Kernels/SymmetricMix.h). The host launches the guard's two kernels,
// the pairs, the rows, then the exact kernel gated by the element stats
// [B, 4] (guard, redo) as its last argument. The SIMT interpreter runs the
// kernels against the float64 reference
// (test/GPU/unit/test_flash_symmetric_simt.py); the ptxas sweep
// (GPU/ptxas-sweep.mlir) assembles them with no local memory:
// ptxas-options: flash-mma-symmetric=true

// CHECK-LABEL: gpu.func @similarity_inform_mma_norms_0
// CHECK-LABEL: gpu.func @similarity_inform_mma_values_0
// CHECK-LABEL: gpu.func @similarity_inform_mma_pairs_0
// The keys' half [64 x (64 + 8)], V'_J [64 x (24 + 8)], V'_I [128 x 32], A
// [128 x (64 + 8)] and -h_J, 16-byte aligned.
// CHECK-SAME: workgroup(%[[KS:.*]] : memref<64x72xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[VJ:.*]] : memref<64x32xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[VI:.*]] : memref<128x32xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[PS:.*]] : memref<128x72xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[HS:.*]] : memref<64xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// The walk carries the rows of I's accumulators (2 row tiles x 3 blocks x 4)
// and the next step's tiles in registers: 4 + 2 vectors of 8 (the keys' 64
// x 64 and V'_J's 64 x 24 over 128 threads) and -h_j; they are stored after
// the step's first barrier, the next step's loaded after its second.
// CHECK: scf.for {{.*}} -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>, vector<8xbf16>, f32) {
// CHECK: gpu.barrier
// CHECK: vector.store %{{.*}}, %[[KS]]
// CHECK: gpu.barrier
// CHECK: vector.load %arg0{{.*}} : memref<2x300x64xbf16>, vector<8xbf16>
// CHECK: nvgpu.ldmatrix %[[KS]]
// CHECK: nvvm.mma.sync
// A weight: one FFMA (the accumulators started at -h_j), one EX2.
// CHECK: %[[D:.+]] = math.fma
// CHECK-NEXT: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"(%[[D]])
// CHECK: arith.truncf %{{.*}} : vector<2xf32> to vector<2xbf16>
// Rows of I: A's fragments against V'_J.
// CHECK: nvgpu.ldmatrix %[[VJ]]{{.*}}transpose = true
// CHECK: nvvm.mma.sync
// Rows of J, off the diagonal pair: A through shared memory, A^T by
// ldmatrix.trans against V'_I, added to the global rows.
// CHECK: scf.if
// CHECK: vector.store %{{.*}}, %[[PS]]
// CHECK: gpu.barrier
// CHECK: nvgpu.ldmatrix %[[PS]]{{.*}}transpose = true
// CHECK: nvgpu.ldmatrix %[[VI]]{{.*}}transpose = true
// CHECK: nvvm.mma.sync
// CHECK: memref.atomic_rmw addf
// After the walk: the rows of I.
// CHECK: memref.atomic_rmw addf
// CHECK-LABEL: gpu.func @similarity_inform_mma_rows_0
// The exact kernel runs the elements the guard declined (stats[b, 1] == 0)
// or asked to redo (stats[b, 3] != 0).
// CHECK-LABEL: gpu.func @similarity_inform_mma_0
// CHECK-SAME: %[[STATS:arg[0-9]+]]: memref<?x4xf32>)
// CHECK: %[[GUARD:.+]] = memref.load %[[STATS]][%{{.*}}, %c1]
// CHECK: %[[REDO:.+]] = memref.load %[[STATS]][%{{.*}}, %c3]
// CHECK-DAG: arith.cmpf oeq, %[[GUARD]]
// CHECK-DAG: arith.cmpf une, %[[REDO]]
// CHECK: scf.if
// CHECK-LABEL: gpu.func @similarity_inform_mma_1
// CHECK-LABEL: gpu.func @similarity_inform_mma_combine_0
// CHECK-SAME: memref<?x4xf32>
// The host: the stats, V' (bf16, K + 1 padded to 24) and the accumulators
// (K + 1 f32), then the launches in order.
// CHECK-LABEL: func.func @sym
// CHECK: gpu.alloc async {{.*}} : memref<?x4xf32>
// CHECK: gpu.alloc async {{.*}} : memref<?x?x24xbf16>
// CHECK: gpu.alloc async {{.*}} : memref<?x?x17xf32>
// CHECK: gpu.launch_func {{.*}}@similarity_inform_mma_norms_0
// CHECK: gpu.launch_func {{.*}}@similarity_inform_mma_values_0
// CHECK: gpu.launch_func {{.*}}@similarity_inform_mma_pairs_0
// CHECK: gpu.launch_func {{.*}}@similarity_inform_mma_rows_0
// CHECK: gpu.launch_func {{.*}}@similarity_inform_mma_0
// CHECK: gpu.launch_func {{.*}}@similarity_inform_mma_1
// CHECK: gpu.launch_func {{.*}}@similarity_inform_mma_combine_0
// OFF-LABEL: func.func @sym
// OFF-NOT: similarity_inform_mma_pairs
// OFF: gpu.launch_func {{.*}}@similarity_inform_mma_0
func.func @sym(%u: tensor<2x300x64xbf16>, %e: tensor<2x300x16xbf16>) -> tensor<2x300x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.0) : tensor<2x300x64xbf16>, tensor<2x300x16xbf16> -> tensor<2x300x16xf32>
  return %p : tensor<2x300x16xf32>
}

// -----

// The training forward with a key mask and a dynamic N (the guard checks N
// >= 256 at run time): the rows kernel writes the lse too.
// CHECK-LABEL: gpu.func @similarity_inform_fwd_mma_norms_0
// CHECK-SAME: memref<1x?xi1>
// CHECK-LABEL: gpu.func @similarity_inform_fwd_mma_rows_0
// CHECK-SAME: %[[LSE:arg[0-9]+]]: memref<1x?xf32>)
// CHECK: math.log
// CHECK: memref.store %{{.*}}, %[[LSE]]
// CHECK-LABEL: func.func @sym_fwd
// CHECK: @similarity_inform_fwd_mma_pairs_0
func.func @sym_fwd(%u: tensor<1x?x32xbf16>, %e: tensor<1x?x8xbf16>, %m: tensor<1x?xi1>) -> (tensor<1x?x8xf32>, tensor<1x?xf32>) {
  %p, %lse = moe.similarity_inform_fwd %u, %e key_mask(%m : tensor<1x?xi1>) tau(0.5) : tensor<1x?x32xbf16>, tensor<1x?x8xbf16> -> tensor<1x?x8xf32>, tensor<1x?xf32>
  return %p, %lse : tensor<1x?x8xf32>, tensor<1x?xf32>
}

// -----

// Where the symmetric form does not apply, the exact kernel alone: causal
// logits (not symmetric), f16 (its range would flush the weights), fewer
// than 256 rows, more than 64 features, the fused top-k.
// CHECK-LABEL: func.func @not_symmetric
// CHECK-NOT: _pairs_
// CHECK: return
func.func @not_symmetric(%u: tensor<1x300x64xbf16>, %e: tensor<1x300x16xbf16>, %h: tensor<1x300x64xf16>,
                         %eh: tensor<1x300x16xf16>, %s: tensor<1x200x64xbf16>, %es: tensor<1x200x16xbf16>,
                         %w: tensor<1x300x128xbf16>)
    -> (tensor<1x300x16xf32>, tensor<1x300x16xf32>, tensor<1x200x16xf32>, tensor<1x300x16xf32>, tensor<1x300x2xf32>, tensor<1x300x2xi32>) {
  %c = moe.similarity_inform %u, %e tau(1.0) causal(true) : tensor<1x300x64xbf16>, tensor<1x300x16xbf16> -> tensor<1x300x16xf32>
  %f = moe.similarity_inform %h, %eh tau(1.0) : tensor<1x300x64xf16>, tensor<1x300x16xf16> -> tensor<1x300x16xf32>
  %n = moe.similarity_inform %s, %es tau(1.0) : tensor<1x200x64xbf16>, tensor<1x200x16xbf16> -> tensor<1x200x16xf32>
  %d = moe.similarity_inform %w, %e tau(1.0) : tensor<1x300x128xbf16>, tensor<1x300x16xbf16> -> tensor<1x300x16xf32>
  %tw, %ti = moe.similarity_inform_topk %u, %e k(2) : tensor<1x300x64xbf16>, tensor<1x300x16xbf16> -> tensor<1x300x2xf32>, tensor<1x300x2xi32>
  return %c, %f, %n, %d, %tw, %ti : tensor<1x300x16xf32>, tensor<1x300x16xf32>, tensor<1x200x16xf32>, tensor<1x300x16xf32>, tensor<1x300x2xf32>, tensor<1x300x2xi32>
}
