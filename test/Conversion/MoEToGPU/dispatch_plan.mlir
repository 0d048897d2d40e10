// RUN: moe-opt %s --convert-moe-to-gpu | FileCheck %s

// A stable counting sort without atomics: per-chunk counts (one warp a chunk
// of 1024 assignments; match.any finds the lanes of a step holding the same
// expert, the lowest of them adds their popcount), one scan block (its first
// warp scans E / 32 experts a lane and a butterfly across lanes), then the
// scatter by the same warps (rank = popcount of the lower matching lanes).
// No memsets and one scratch allocation a call: the scan block writes the
// entries no assignment takes (padded_order's padding = N, order's tail past
// offsets[E] = -1), the scatter an out-of-range assignment's inverse (-1);
// the chunks' counts and the padded offsets share the scratch buffer. An
// index outside [0, E) is recorded in the error word and checked at the end.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @dispatch_counts_0(%{{.*}}: memref<?x8xi32>, %{{.*}}: memref<?xi32>, %{{.*}}: i64) workgroup(%{{.*}} : memref<256xi32, #gpu.address_space<workgroup>>) kernel attributes {known_block_size = array<i32: 32, 1, 1>}
// CHECK: scf.for
// CHECK: nvvm.match.sync  any %{{.*}}, %{{.*}} : i32 -> i32
// CHECK: llvm.cmpxchg
// CHECK: math.cttz
// CHECK: math.ctpop
// CHECK: gpu.barrier
// CHECK-NOT: memref.atomic_rmw
// CHECK: gpu.return
// CHECK: gpu.func @dispatch_scan_0(%{{.*}}: memref<?x8xi32>, %[[SCRATCH:.*]]: memref<?xi32>, %{{.*}}: memref<256xi32>, %{{.*}}: memref<257xi32>, %{{.*}}: memref<?xi32>, %{{.*}}: memref<1xi32>, %[[ORDER:.*]]: memref<?xi32>, %[[PADDED:.*]]: memref<?xi32>) workgroup({{.*}}) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// The scans by the first warp: runs of 8 experts a lane, a 5-step butterfly of
// the counts and the rounded counts (no thread walks all E experts).
// CHECK: arith.ceildivui %{{.*}}, %c64_i32{{.*}} : i32
// CHECK-COUNT-10: gpu.shuffle  xor %{{.*}} : i32
// CHECK-NOT: gpu.shuffle
// The padding after each expert's assignments, then the tails.
// CHECK: scf.for
// CHECK: memref.store %{{.*}}, %[[PADDED]]
// CHECK: scf.for
// CHECK: memref.store %{{.*}}, %[[PADDED]]
// CHECK: scf.for
// CHECK: memref.store %c-1_i32{{.*}}, %[[ORDER]]
// CHECK: gpu.return
// CHECK: gpu.func @dispatch_scatter_0(%{{.*}}: memref<?x8xi32>, %{{.*}}: memref<?xi32>, %{{.*}}: memref<257xi32>, %{{.*}}: memref<?xi32>, %[[INVERSE:.*]]: memref<?xi32>, %{{.*}}: memref<?xi32>)
// CHECK: nvvm.match.sync  any
// CHECK: math.ctpop
// CHECK: memref.store %c-1_i32{{.*}}, %[[INVERSE]]
// CHECK: gpu.barrier
// CHECK: math.ctpop
// CHECK: gpu.barrier
// CHECK: gpu.return
// CHECK-LABEL: func.func @plan(
// CHECK-NOT: gpu.memset
// CHECK: gpu.alloc async
// CHECK-NOT: gpu.memset
// CHECK-NOT: gpu.alloc
// Nothing but the launches between the first and the last (constants aside).
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@dispatch_counts_0
// CHECK-NOT: {{gpu\.(alloc|memset|wait|dealloc)|llvm\.call}}
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@dispatch_scan_0 blocks in (%c1{{.*}}, %c1{{.*}}, %c1{{.*}}) threads in (%c256
// CHECK-NOT: {{gpu\.(alloc|memset|wait|dealloc)|llvm\.call}}
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@dispatch_scatter_0
// CHECK-NEXT: gpu.dealloc async
// CHECK-NEXT: gpu.wait [%{{.*}}]
// CHECK: call @moeGpuCheckErrors
// CHECK-NOT: gpu.memset
func.func @plan(%idx: tensor<?x8xi32>) -> (tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(256) block_size(64) : tensor<?x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n : tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}
