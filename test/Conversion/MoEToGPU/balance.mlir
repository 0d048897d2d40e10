// RUN: moe-opt %s --convert-moe-to-gpu="balance-kernels=true" -split-input-file | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s
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
// T, then dloss: one op a statement in the lowering, the same order from gcc
// and clang builds.
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

// -----

// router_stats: a block of 4 warps per 64-row block. A warp per row leaves
// the row's probability shift and its k-th pick (k rounds of the shared
// top-k step below the previous pick, a warp max of packed i64 candidates)
// in workgroup memory; then a thread per expert walks the block's rows in
// order: selected iff its candidate ranks at or above the k-th pick (count
// += w), probability sum += w · exp(x - shift), into the block's partial
// rows; thread 0 sums the weights. A thread per expert then sums the partial
// rows in block order and divides by W.
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @router_stats_rows_0(%[[X:.*]]: memref<?x64xbf16>, %[[M:.*]]: memref<?xf32>, %[[PC:.*]]: memref<?x?xf32>, %[[PP:.*]]: memref<?x?xf32>, %[[PW:.*]]: memref<?xf32>) workgroup(%[[SH:.*]] : memref<64xf32, #gpu.address_space<workgroup>>, %[[KTH:.*]] : memref<64xi64, #gpu.address_space<workgroup>>)
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// CHECK: scf.for %[[R:.*]] = %{{.*}} to %{{.*}} step %c4 {
// CHECK: math.log
// The k = 2 rounds.
// CHECK: scf.for %{{.*}} = %c0{{.*}} to %c2{{.*}} step %c1{{.*}} iter_args(%[[PREV:.*]] = %c9223372036854775807_i64) -> (i64)
// CHECK: arith.cmpi slt, %{{.*}}, %[[PREV]] : i64
// CHECK: arith.maxsi
// CHECK: gpu.shuffle  xor %{{.*}}, %c16_i32
// CHECK: arith.maxsi
// CHECK: memref.store %{{.*}}, %[[SH]][%[[R]]]
// CHECK: memref.store %{{.*}}, %[[KTH]][%[[R]]]
// CHECK: gpu.barrier
// CHECK: scf.for %[[E:.*]] = %thread_id_x to %{{.*}} step %c128
// CHECK: %[[W:.*]] = memref.load %[[M]]
// CHECK: %[[PICK:.*]] = memref.load %[[KTH]]
// CHECK: %[[SEL:.*]] = arith.cmpi sge, %{{.*}}, %[[PICK]] : i64
// CHECK: %[[INC:.*]] = arith.addf %{{.*}}, %[[W]]
// CHECK: arith.select %[[SEL]], %[[INC]]
// CHECK: memref.load %[[SH]]
// CHECK: math.exp
// CHECK: memref.store %{{.*}}, %[[PC]][%{{.*}}, %[[E]]]
// CHECK: memref.store %{{.*}}, %[[PP]][%{{.*}}, %[[E]]]
// CHECK: memref.store %{{.*}}, %[[PW]][%{{.*}}]
// CHECK-NOT: memref.atomic_rmw
// CHECK: gpu.func @router_stats_sum_0(%{{.*}}: memref<?x?xf32>, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<?xf32>, %[[C:.*]]: memref<64xf32>, %[[P:.*]]: memref<64xf32>, %[[WS:.*]]: memref<f32>)
// CHECK: scf.for %{{.*}} iter_args({{.*}}) -> (f32, f32, f32)
// CHECK: memref.store %{{.*}}, %[[C]]
// CHECK: arith.divf
// CHECK: memref.store %{{.*}}, %[[P]]
// CHECK: memref.store %{{.*}}, %[[WS]][]
// CHECK-NOT: memref.atomic_rmw
// CHECK-LABEL: func.func @stats
// CHECK: gpu.alloc async
// CHECK: gpu.alloc async
// CHECK: gpu.alloc async
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@router_stats_rows_0
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@router_stats_sum_0
// CHECK-COUNT-3: gpu.dealloc async
func.func @stats(%x: tensor<?x64xbf16>, %m: tensor<?xf32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %x token_mask(%m : tensor<?xf32>) k(2) : tensor<?x64xbf16> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
  return %c, %p, %w : tensor<64xf32>, tensor<64xf32>, tensor<f32>
}

// -----

// router_stats_grad: a warp per row: c = Σ_j p_j g_j (warp sum), then
// (w / W) · p · (g - c).
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @router_stats_grad_0(%[[X:.*]]: memref<?x?xf32>, %[[W:.*]]: memref<f32>, %[[G:.*]]: memref<?xf32>, %[[OUT:.*]]: memref<?x?xf32>)
// CHECK: scf.if
// CHECK: math.log
// CHECK: scf.for %{{.*}} step %c32{{.*}} iter_args
// CHECK: memref.load %[[G]]
// CHECK: scf.yield
// CHECK: gpu.shuffle  xor %{{.*}}, %c16_i32
// CHECK: memref.load %[[W]][]
// CHECK: arith.divf
// CHECK: scf.for %[[E:.*]] = %{{.*}} step %c32
// CHECK: arith.subf
// CHECK: memref.store %{{.*}}, %[[OUT]][%{{.*}}, %[[E]]]
func.func @stats_grad(%x: tensor<?x?xf32>, %w: tensor<f32>, %g: tensor<?xf32>) -> tensor<?x?xf32> {
  %d = moe.router_stats_grad %x weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<?xf32>) : tensor<?x?xf32> -> tensor<?x?xf32>
  return %d : tensor<?x?xf32>
}

// -----

// load_balancing_loss: one thread, Σ_e (counts_e / W) · P_e in expert order,
// then · E.
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @load_balancing_loss_0(%[[C:.*]]: memref<8xf32>, %[[P:.*]]: memref<8xf32>, %[[W:.*]]: memref<f32>, %[[L:.*]]: memref<f32>)
// CHECK-SAME: known_block_size = array<i32: 1, 1, 1>
// CHECK: %[[WV:.*]] = memref.load %[[W]][]
// CHECK: scf.for
// CHECK: %[[F:.*]] = arith.divf %{{.*}}, %[[WV]]
// CHECK: arith.mulf %[[F]]
// CHECK: arith.addf
// CHECK: arith.sitofp
// CHECK: arith.mulf
// CHECK: memref.store %{{.*}}, %[[L]][]
func.func @lbl(%c: tensor<8xf32>, %p: tensor<8xf32>, %w: tensor<f32>) -> tensor<f32> {
  %l = moe.load_balancing_loss %c, %p, %w : tensor<8xf32>, tensor<8xf32>, tensor<f32> -> tensor<f32>
  return %l : tensor<f32>
}
