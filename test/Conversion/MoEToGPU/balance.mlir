// RUN: moe-opt %s --convert-moe-to-gpu="balance-kernels=true" -split-input-file | FileCheck %s
// ptxas-options: balance-kernels=true

// balance-kernels: the router z-loss and its gradient (RouterZLoss.cpp). A
// warp per row takes the row's log-sum-exp over chunks of 32 experts (online
// softmax steps, butterfly max and sum); the loss is deterministic without
// atomics: each block of 4 warps owns the 64 rows of a row block
// (kBalanceRowsPerBlock, the CPU kernel's), leaves lse² per row in workgroup
// memory and one thread sums them in row order into the block's partial; a
// one-thread kernel sums the partials in block order and divides by T.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @router_z_loss_rows_0(%[[X:.*]]: memref<?x64xbf16>, %[[PART:.*]]: memref<?xf32>) workgroup(%[[SQ:.*]] : memref<64xf32, #gpu.address_space<workgroup>>)
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// The block's rows, 4 warps striding over them.
// CHECK: %[[FIRST:.*]] = arith.muli %{{.*}}, %c64
// CHECK: %[[N:.*]] = arith.minui
// CHECK: scf.for %[[R:.*]] = %{{.*}} to %[[N]] step %c4 {
// The row's chunks of 32 experts: lanes past E read -inf.
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c32{{.*}} iter_args
// CHECK: memref.load %[[X]]
// CHECK: arith.extf %{{.*}} : bf16 to f32
// CHECK: arith.select %{{.*}}, %{{.*}}, %cst
// CHECK: gpu.shuffle  xor %{{.*}}, %c16_i32
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: gpu.shuffle  xor %{{.*}}, %c16_i32
// CHECK: scf.yield
// lse = m + log(l); lane 0 stores lse².
// CHECK: math.log
// CHECK: scf.if
// CHECK: %[[SQV:.*]] = arith.mulf
// CHECK: memref.store %[[SQV]], %[[SQ]][%[[R]]]
// CHECK: gpu.barrier
// Thread 0: the block's rows in order.
// CHECK: scf.if
// CHECK: scf.for %{{.*}} = %{{.*}} to %[[N]] step %c1{{.*}} iter_args
// CHECK: memref.load %[[SQ]]
// CHECK: memref.store %{{.*}}, %[[PART]][%{{.*}}] : memref<?xf32>
// CHECK-NOT: memref.atomic_rmw
// CHECK: gpu.func @router_z_loss_sum_0(%{{.*}}: memref<?x64xbf16>, %[[P2:.*]]: memref<?xf32>, %[[OUT:.*]]: memref<f32>)
// CHECK-SAME: known_block_size = array<i32: 1, 1, 1>
// CHECK: scf.for
// CHECK: memref.load %[[P2]]
// CHECK: arith.sitofp
// CHECK: arith.divf
// CHECK: memref.store %{{.*}}, %[[OUT]][]
// CHECK-NOT: memref.atomic_rmw
// CHECK-LABEL: func.func @z_loss
// CHECK: moe.kernel ins(%{{.*}} : tensor<?x64xbf16>) outs(%{{.*}} : tensor<f32>)
// CHECK: %[[BLOCKS:.*]] = arith.ceildivui %{{.*}}, %c64
// CHECK: %[[TMP:.*]], %{{.*}} = gpu.alloc async [%{{.*}}] (%[[BLOCKS]]) : memref<?xf32>
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@router_z_loss_rows_0 blocks in (%[[BLOCKS]], %c1{{.*}}, %c1{{.*}}) threads in (%c128
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@router_z_loss_sum_0 blocks in (%c1{{.*}}, %c1{{.*}}, %c1{{.*}})
// CHECK: gpu.dealloc async [%{{.*}}] %[[TMP]]
func.func @z_loss(%x: tensor<?x64xbf16>) -> tensor<f32> {
  %z = moe.router_z_loss %x : tensor<?x64xbf16> -> tensor<f32>
  return %z : tensor<f32>
}

// -----

// The gradient: a warp per row (block-size / 32 rows a block), the row's lse,
// then 2 dloss / T · lse · exp(x - lse) per expert (0 where x = -inf).
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @router_z_loss_grad_0(%[[X:.*]]: memref<?x100xf32>, %[[D:.*]]: memref<f32>, %[[G:.*]]: memref<?x100xf32>)
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// CHECK: arith.muli %{{.*}}, %c4
// CHECK: scf.if
// CHECK: scf.for %{{.*}} step %c32{{.*}} iter_args
// CHECK: gpu.shuffle  xor
// CHECK: math.log
// CHECK: arith.sitofp
// CHECK: memref.load %[[D]][]
// CHECK: scf.for %[[C:.*]] = %{{.*}} to %{{.*}} step %c32
// CHECK: math.exp
// CHECK: memref.store %{{.*}}, %[[G]][%{{.*}}, %[[C]]]
// CHECK-LABEL: func.func @z_loss_grad
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@router_z_loss_grad_0 blocks in (%{{.*}}, %c1{{.*}}, %c1{{.*}}) threads in (%c128
func.func @z_loss_grad(%x: tensor<?x100xf32>, %d: tensor<f32>) -> tensor<?x100xf32> {
  %g = moe.router_z_loss_grad %x dloss(%d : tensor<f32>) : tensor<?x100xf32> -> tensor<?x100xf32>
  return %g : tensor<?x100xf32>
}
