// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s

// The flash-style backward (FlashGrad.cpp, SimilarityInformGrad.cpp): the
// forward's flash kernel recomputes p and the row log-sum-exp, a stats kernel
// forms lse' and delta = <dp, p>, then a query-major kernel (dq) and a
// key-major kernel (de, dk) stream 32-column tiles of S = exp(x - lse') and
// dX = S (<dp, e> - delta) / tau through workgroup memory; every output row
// is written by the one block that owns it (read-add-store in column order,
// no atomics). Nothing N x N is allocated.

// The forward kernel with the log-sum-exp output: m + log(l), stored once
// per row (lane 0 of the row's group).
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_grad_mix_0(%{{.*}}: memref<2x128x64xf32>, %{{.*}}: memref<2x128x64xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x128x16xf32>, %[[LSE:.*]]: memref<2x128xf32>)
// CHECK: %[[SUM:.*]]:4 = scf.for
// CHECK: scf.if
// CHECK-NEXT: %[[LOG:.*]] = math.log %[[SUM]]#3 : f32
// CHECK-NEXT: %[[L:.*]] = arith.addf %[[SUM]]#2, %[[LOG]] : f32
// CHECK-NEXT: memref.store %[[L]], %[[LSE]]
// CHECK: gpu.return
// lse' (+inf for a row without keys), delta = <dp, p>; the recomputed lse is
// passed as both its input and its output (rewritten in place).
// CHECK: gpu.func @flash_grad_stats_0(%{{.*}}: memref<2x128xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x128x16xf32>, %[[SD:.*]]: memref<2x128xf32>, %[[SL:.*]]: memref<2x128xf32>)
// CHECK: arith.cmpf oeq
// CHECK: memref.store %{{.*}}, %[[SL]]
// CHECK: scf.for
// CHECK: memref.store %{{.*}}, %[[SD]]
// Query-major: rows are queries; causal column tiles stop after the block's
// last row; score dots over D and cotangent dots over K, both through the
// staged chunks; S and dX into padded tiles, excluded pairs marked -1.
// CHECK: gpu.func @similarity_inform_grad_dq_0(%{{.*}}: memref<2x128x64xf32>, %{{.*}}: memref<2x128x64xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x128xf32>, %{{.*}}: memref<2x128xf32>, %{{.*}}: memref<2x128x64xf32>, %[[DQ:.*]]: memref<2x128x64xf32>)
// CHECK-SAME: workgroup(%[[RS:.*]] : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[CS:.*]] : memref<32x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[SS:.*]] : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[DXS:.*]] : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// The causal order of the blocks (flash-causal-balance; flash_causal_order.mlir): its first wave's minui.
// CHECK: nvvm.read.ptx.sreg.nsmid
// CHECK: arith.minui
// CHECK: %[[END:.*]] = arith.minui
// CHECK: scf.for %[[J0:.*]] = %{{.*}} to %[[END]] step %c32
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (f32, f32, f32, f32)
// CHECK: gpu.barrier
// CHECK: memref.store %{{.*}}, %[[RS]]
// CHECK: memref.store %{{.*}}, %[[CS]]
// CHECK: gpu.barrier
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (f32, f32, f32, f32)
// CHECK: arith.cmpi ule
// CHECK: math.exp
// CHECK: memref.store %{{.*}}, %[[SS]]
// CHECK: memref.store %{{.*}}, %[[DXS]]
// One accumulator (dq = Σ dX u): the value rows through the column tile, a
// fixed-order sum that skips the mark, then the block's own rows updated.
// CHECK: gpu.barrier
// CHECK: memref.store %{{.*}}, %[[CS]]
// CHECK: gpu.barrier
// CHECK: scf.for {{.*}} = %{{.*}} to %c32{{.*}} step %c1{{.*}} iter_args({{.*}}) -> (f32, f32, f32, f32)
// CHECK: memref.load %[[SS]]
// CHECK: arith.cmpf une
// CHECK: memref.load %[[DXS]]
// CHECK: scf.if
// CHECK: memref.load %[[DQ]]
// CHECK: arith.select
// CHECK: memref.store %{{.*}}, %[[DQ]]
// CHECK-NOT: memref.atomic_rmw
// CHECK: gpu.return
// Key-major: rows are keys; causal column tiles start at the tile of the
// block's first row; two accumulators: de = Σ S dp, then dk = Σ dX q added
// to dq (already in du). Three blocks per multiprocessor stated for ptxas
// (.minnctapersm: its own occupancy target spilled here on sm_90).
// CHECK: gpu.func @similarity_inform_grad_dk_0({{.*}}, %[[DE:.*]]: memref<2x128x16xf32>, %{{.*}}: memref<2x128x64xf32>, %[[DU:.*]]: memref<2x128x64xf32>)
// CHECK-SAME: kernel attributes {known_block_size = array<i32: 128, 1, 1>, nvvm.minctasm = 3 : i32}
// CHECK: %[[FIRST:.*]] = arith.divui %{{.*}}, %c32
// CHECK: %[[BEGIN:.*]] = arith.muli %[[FIRST]], %c32
// CHECK: scf.for %{{.*}} = %[[BEGIN]] to
// CHECK: memref.store %{{.*}}, %[[DE]]
// CHECK: memref.load %[[DU]]
// CHECK-NEXT: arith.addf
// CHECK-NEXT: memref.store %{{.*}}, %[[DU]]
// CHECK-NOT: memref.atomic_rmw
// CHECK: gpu.return
// Host: p [B,N,K] and lse/delta [B,N] temporaries, no N x N buffer; the
// four launches in stream order.
// CHECK-LABEL: func.func @grad(
// CHECK-NOT: memref<2x128x128
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_grad_mix_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@flash_grad_stats_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_grad_dq_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_grad_dk_0
// CHECK-NOT: memref<2x128x128
// CHECK: return
func.func @grad(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>, %dp: tensor<2x128x16xf32>) -> (tensor<2x128x64xf32>, tensor<2x128x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x128x16xf32>) tau(5.000000e-01) causal(true) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>
  return %du, %de : tensor<2x128x64xf32>, tensor<2x128x16xf32>
}

// -----

// ws and a key mask, dynamic B·N: q = u · ws first; dq is a temporary; du
// gets dk from the key-major kernel (first tile stores) and then
// dq · ws^T from the projection kernel (transposed, accumulating); dws is a
// thread per entry over the rows in order. The key mask is read per key
// (query-major: the column; key-major: the row).

// CHECK: gpu.func @similarity_project_0(
// CHECK: gpu.func @similarity_inform_grad_mix_0({{.*}}: memref<?x?xi1>, {{.*}}: memref<?x?x8xf32>, {{.*}}: memref<?x?xf32>)
// CHECK: gpu.func @similarity_inform_grad_dq_0({{.*}}: memref<?x?xi1>, %{{.*}}: memref<?x?x32xbf16>, %{{.*}}: memref<?x?x32xf32>)
// CHECK-NOT: arith.minui
// CHECK: scf.for
// CHECK: memref.load %{{.*}} : memref<?x?xi1>
// CHECK: gpu.func @similarity_inform_grad_dk_0
// CHECK: gpu.func @similarity_grad_project_0(%{{.*}}: memref<?x?x32xf32>, %[[WS:.*]]: memref<32x32xf32>, %[[OUT:.*]]: memref<?x?x32xf32>)
// CHECK: memref.load %[[WS]][%{{.*}}, %[[D:.*]]] : memref<32x32xf32>
// CHECK: memref.load %[[OUT]]
// CHECK: arith.addf
// CHECK: memref.store %{{.*}}, %[[OUT]]
// CHECK: gpu.func @similarity_grad_dws_0(%{{.*}}: memref<?x?x32xbf16>, %{{.*}}: memref<?x?x32xf32>, %{{.*}}: memref<32x32xf32>)
// CHECK-LABEL: func.func @grad_ws(
// CHECK: %[[Q:.*]], %{{.*}} = gpu.alloc async {{.*}} : memref<?x?x32xf32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_project_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_grad_mix_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@flash_grad_stats_0
// CHECK: %[[DQ:.*]], %{{.*}} = gpu.alloc async {{.*}} : memref<?x?x32xf32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_grad_dq_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_grad_dk_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_grad_project_0 {{.*}} args(%[[DQ]] : memref<?x?x32xf32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_grad_dws_0
// CHECK: gpu.dealloc async {{.*}} %[[DQ]]
// CHECK: gpu.dealloc async {{.*}} %[[Q]]
func.func @grad_ws(%u: tensor<?x?x32xbf16>, %e: tensor<?x?x8xf32>, %ws: tensor<32x32xf32>, %m: tensor<?x?xi1>, %dp: tensor<?x?x8xf32>) -> (tensor<?x?x32xf32>, tensor<?x?x8xf32>, tensor<32x32xf32>) {
  %du, %de, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<32x32xf32>) key_mask(%m : tensor<?x?xi1>) dp(%dp : tensor<?x?x8xf32>) : tensor<?x?x32xbf16>, tensor<?x?x8xf32> -> tensor<?x?x32xf32>, tensor<?x?x8xf32>, tensor<32x32xf32>
  return %du, %de, %dws : tensor<?x?x32xf32>, tensor<?x?x8xf32>, tensor<32x32xf32>
}

// -----

// saved(p, lse) from the training forward: no forward kernel; flash_grad_stats
// reads the saved lse and writes lse' into a buffer of its own.

// CHECK-NOT: gpu.func @similarity_inform_grad_mix
// CHECK: gpu.func @flash_grad_stats_0(%[[IN:.*]]: memref<?x?xf32>, %{{.*}}: memref<?x?x16xf32>, %{{.*}}: memref<?x?x16xf32>, %{{.*}}: memref<?x?xf32>, %[[OUT:.*]]: memref<?x?xf32>)
// CHECK: memref.load %[[IN]]
// CHECK: memref.store %{{.*}}, %[[OUT]]
// CHECK-LABEL: func.func @grad_saved(
// CHECK-NOT: @similarity_inform_grad_mix
// CHECK: %[[LSE:.*]], %{{.*}} = gpu.alloc async {{.*}} : memref<?x?xf32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@flash_grad_stats_0 {{.*}} args(%{{.*}} : memref<?x?xf32>, %{{.*}} : memref<?x?x16xf32>, %{{.*}} : memref<?x?x16xf32>, %{{.*}} : memref<?x?xf32>, %[[LSE]] : memref<?x?xf32>)
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_grad_dq_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_grad_dk_0
func.func @grad_saved(%u: tensor<?x?x64xf32>, %e: tensor<?x?x16xf32>, %dp: tensor<?x?x16xf32>, %p: tensor<?x?x16xf32>,
                      %lse: tensor<?x?xf32>) -> (tensor<?x?x64xf32>, tensor<?x?x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<?x?x16xf32>) saved(%p, %lse : tensor<?x?x16xf32>, tensor<?x?xf32>) causal(true)
      : tensor<?x?x64xf32>, tensor<?x?x16xf32> -> tensor<?x?x64xf32>, tensor<?x?x16xf32>
  return %du, %de : tensor<?x?x64xf32>, tensor<?x?x16xf32>
}

// -----

// The training forward: the flash kernel with its log-sum-exp output.

// CHECK: gpu.func @similarity_inform_fwd_0(%{{.*}}: memref<?x?x64xf32>, %{{.*}}: memref<?x?x64xf32>, %{{.*}}: memref<?x?x16xf32>, %{{.*}}: memref<?x?x16xf32>, %[[L:.*]]: memref<?x?xf32>)
// CHECK: math.log
// CHECK: memref.store %{{.*}}, %[[L]]
// CHECK-LABEL: func.func @fwd(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_fwd_0
func.func @fwd(%u: tensor<?x?x64xf32>, %e: tensor<?x?x16xf32>) -> (tensor<?x?x16xf32>, tensor<?x?xf32>) {
  %p, %lse = moe.similarity_inform_fwd %u, %e causal(true)
      : tensor<?x?x64xf32>, tensor<?x?x16xf32> -> tensor<?x?x16xf32>, tensor<?x?xf32>
  return %p, %lse : tensor<?x?x16xf32>, tensor<?x?xf32>
}
