// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 --split-input-file | FileCheck %s

// router_stats: one kernel; the tokens in fixed blocks (64 rows) over the workers, each block into its own row of
// the partial sums ([blocks, E]: Σ w·p and Σ w·[selected]; [blocks]: Σ w), never a per-worker partial; per row the
// online softmax (max and Σ exp in vectors), p added into the block's row, the packed candidates and k = 8 rounds of
// a vector signed max; then, after the parallel loop, the partials summed in block order and P divided by W.

// CHECK-LABEL: func.func @router_stats
// CHECK: moe.kernel ins(%{{.*}}, %{{.*}} : tensor<?x64xf32>, tensor<?xf32>) outs(%{{.*}}, %{{.*}}, %{{.*}} : tensor<64xf32>, tensor<64xf32>, tensor<f32>)
// CHECK: %[[PROBS:.+]] = memref.alloc(%[[BLOCKS:.+]], %{{.+}}) {{.*}} : memref<?x?xf32>
// CHECK: %[[COUNTS:.+]] = memref.alloc(%[[BLOCKS]], %{{.+}}) {{.*}} : memref<?x?xf32>
// CHECK: %[[WSUM:.+]] = memref.alloc(%[[BLOCKS]]) {{.*}} : memref<?xf32>
// CHECK: scf.parallel (%[[W:.+]]) =
// CHECK: scf.for %[[B:.+]] = %[[W]] to %[[BLOCKS]] step
// CHECK: vector.reduction <maximumf>
// CHECK: vector.store %{{.+}}, %[[PROBS]][%[[B]], %{{.+}}]
// CHECK: scf.for %{{.+}} = %c0 to %c8 step %c1 iter_args
// CHECK: vector.reduction <maxsi>
// CHECK: memref.store %{{.+}}, %[[COUNTS]][%[[B]], %{{.+}}]
// CHECK: memref.store %{{.+}}, %[[WSUM]][%[[B]]]
// CHECK: scf.for %{{.+}} = %c0 to %[[BLOCKS]] step %c1 iter_args(%{{.+}} = %{{.+}}) -> (f32)
// CHECK: scf.for %{{.+}} = %c0 to %[[BLOCKS]] step %c1 iter_args(%{{.+}} = %{{.+}}, %{{.+}} = %{{.+}}) -> (vector<16xf32>, vector<16xf32>)
// CHECK: vector.maskedstore
// CHECK: arith.divf
// CHECK: vector.maskedstore
func.func @router_stats(%l: tensor<?x64xf32>, %m: tensor<?xf32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<?xf32>) k(8)
      : tensor<?x64xf32> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
  return %c, %p, %w : tensor<64xf32>, tensor<64xf32>, tensor<f32>
}

// -----

// The backward ops and the z-loss: rows independent (router_stats_grad, router_z_loss_grad) or block partials
// ([blocks] lse², summed in order after the parallel loop, then / T); no moe op is left.

// CHECK-LABEL: func.func @grads
// CHECK-NOT: moe.router
// CHECK: scf.parallel
// CHECK: scf.parallel
// CHECK: memref.alloc(%{{.+}}) {{.*}} : memref<?xf32>
// CHECK: scf.parallel
// CHECK: scf.for %{{.+}} = %c0 to %{{.+}} step %c1 iter_args(%{{.+}} = %{{.+}}) -> (f32)
// CHECK: arith.divf
// CHECK-NOT: moe.router
func.func @grads(%l: tensor<?x64xbf16>, %w: tensor<f32>, %g: tensor<64xf32>, %d: tensor<f32>)
    -> (tensor<?x64xf32>, tensor<?x64xf32>, tensor<f32>) {
  %a = moe.router_stats_grad %l weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<64xf32>)
      : tensor<?x64xbf16> -> tensor<?x64xf32>
  %b = moe.router_z_loss_grad %l dloss(%d : tensor<f32>) : tensor<?x64xbf16> -> tensor<?x64xf32>
  %z = moe.router_z_loss %l : tensor<?x64xbf16> -> tensor<f32>
  return %a, %b, %z : tensor<?x64xf32>, tensor<?x64xf32>, tensor<f32>
}

// -----

// sequence_balance_loss (+ grad): the sequences over the workers, each with its own scratch rows (counts, P) and
// partial; the partials summed in sequence order and divided by B.

// CHECK-LABEL: func.func @sequence
// CHECK-NOT: moe.sequence
// CHECK: memref.alloc(%{{.+}}) {{.*}} : memref<2x?xf32>
// CHECK: scf.parallel
// CHECK: scf.for %{{.+}} = %c0 to %{{.+}} step %c1 iter_args(%{{.+}} = %{{.+}}) -> (f32)
// CHECK: arith.divf
// CHECK: scf.parallel
// CHECK-NOT: moe.sequence
func.func @sequence(%s: tensor<?x?x16xf32>, %i: tensor<?x?x4xi64>, %d: tensor<f32>) -> (tensor<f32>, tensor<?x?x16xf32>) {
  %l = moe.sequence_balance_loss %s, %i : tensor<?x?x16xf32>, tensor<?x?x4xi64> -> tensor<f32>
  %g = moe.sequence_balance_loss_grad %s, %i dloss(%d : tensor<f32>)
      : tensor<?x?x16xf32>, tensor<?x?x4xi64> -> tensor<?x?x16xf32>
  return %l, %g : tensor<f32>, tensor<?x?x16xf32>
}
