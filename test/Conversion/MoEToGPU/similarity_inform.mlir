// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s

// Flash-style mixing: a block per 16 query rows, key tiles of 32 staged with
// the query/key feature chunks (padded 33 columns) and the value tile [32 x K]
// in workgroup memory, an online softmax with 8-lane butterflies, and no
// N x N buffer anywhere.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_0(%{{.*}}: memref<2x128x64xf32>, %{{.*}}: memref<2x128x64xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x128x16xf32>)
// CHECK-SAME: workgroup(%[[Q:.*]] : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[K:.*]] : memref<32x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[E:.*]] : memref<32x16xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[P:.*]] : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// Key tiles (causal: up to the tile's last row), then feature chunks.
// CHECK: arith.minui
// Carried over key tiles: the two accumulators of a lane (K = 16 over 8
// lanes), the running max, the running sum.
// CHECK: %[[FIN:.*]]:4 = scf.for %[[J0:.*]] = %{{.*}} to %{{.*}} step %c32{{.*}} iter_args
// CHECK: scf.for %{{.*}} = %{{.*}} to %{{.*}} step %c32{{.*}} iter_args
// CHECK: gpu.barrier
// CHECK: memref.store %{{.*}}, %[[Q]]
// CHECK: memref.store %{{.*}}, %[[K]]
// CHECK: gpu.barrier
// CHECK: memref.load %[[Q]]
// CHECK: memref.load %[[K]]
// Online softmax: tile max over the row's 8 lanes, rescale, tile sum (the
// reductions are gpu.subgroup_reduce with cluster_size 8, lowered to
// butterflies by upstream's patterns).
// CHECK: arith.cmpi ule
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : f32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32{{.*}} : f32
// CHECK: gpu.shuffle  xor %{{.*}}, %c4_i32{{.*}} : f32
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : f32
// CHECK: gpu.barrier
// CHECK: memref.store %{{.*}}, %[[P]]
// CHECK: memref.store %{{.*}}, %[[E]]
// CHECK: gpu.barrier
// CHECK: memref.load %[[P]]
// CHECK: memref.load %[[E]]
// Epilogue: p = acc / l (0 for a row without keys), l the running sum: the
// running max here was a wrong p found by the first run on an H200.
// CHECK: %[[EMPTY:.*]] = arith.cmpf oeq, %[[FIN]]#3, %{{.*}} : f32
// CHECK: %[[P0:.*]] = arith.divf %[[FIN]]#0, %[[FIN]]#3 : f32
// CHECK: arith.select %[[EMPTY]], %{{.*}}, %[[P0]]
// CHECK: arith.divf %[[FIN]]#1, %[[FIN]]#3 : f32
// CHECK: memref.store %{{.*}} : memref<2x128x16xf32>
// CHECK-LABEL: func.func @sim(
// CHECK-NOT: memref<2x128x128
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_0 blocks in (%{{.*}}, %{{.*}}, %{{.*}})
// CHECK-NOT: memref<2x128x128
// CHECK: return
func.func @sim(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// -----

// Fused top-k: the epilogue runs the register top-k on the K-wide
// accumulator (8-lane butterflies on i32 halves) and stores only k values.

// CHECK: gpu.func @similarity_inform_topk_0({{.*}}, %[[W:.*]]: memref<2x128x2xf32>, %[[I:.*]]: memref<2x128x2xi32>)
// CHECK: scf.for {{.*}} step %c32
// CHECK: gpu.barrier
// CHECK-NOT: memref.store {{.*}} : memref<2x128x16xf32>
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (i64, f32, f32)
// CHECK-COUNT-2: gpu.shuffle  xor %{{.*}}, %c4_i32{{.*}} : i32
// CHECK-COUNT-2: gpu.shuffle  xor %{{.*}}, %c2_i32{{.*}} : i32
// CHECK-COUNT-2: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : i32
// CHECK: memref.store {{.*}} : memref<256x2xf32>
// CHECK: memref.store {{.*}} : memref<256x2xi32>
// CHECK-LABEL: func.func @sim_topk(
// CHECK: bufferization.alloc_tensor() : tensor<2x128x2xf32>
// CHECK: bufferization.alloc_tensor() : tensor<2x128x2xi32>
// CHECK: moe.kernel
// CHECK-NOT: gpu.alloc
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_topk_0
func.func @sim_topk(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>) -> (tensor<2x128x2xf32>, tensor<2x128x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x2xf32>, tensor<2x128x2xi32>
  return %w, %i : tensor<2x128x2xf32>, tensor<2x128x2xi32>
}

// -----

// ws: a projection kernel forms q = u · ws first (a [B, N, D] temporary,
// released on the stream); the key mask is read per key. The B·N rows of the
// projection are a grid-stride loop over blocks along y, and the launch caps
// gridDim.y at 65535 (the hardware limit), so any B·N works.

// CHECK: gpu.func @similarity_project_0
// CHECK-DAG: %[[BY:.+]] = gpu.block_id y
// CHECK-DAG: %[[GY:.+]] = gpu.grid_dim y
// CHECK: scf.for %{{.+}} = %[[BY]] to %{{.+}} step %[[GY]]
// CHECK: gpu.return
// CHECK: gpu.func @similarity_inform_0(%{{.*}}: memref<?x?x32xf32>, %{{.*}}: memref<?x?x32xbf16>, %{{.*}}: memref<?x?x8xf32>, %{{.*}}: memref<?x?xi1>, %{{.*}}: memref<?x?x8xf32>)
// CHECK: memref.load %{{.*}} : memref<?x?xi1>
// CHECK-LABEL: func.func @sim_ws(
// CHECK: %[[Q:.*]], %{{.*}} = gpu.alloc async {{.*}} : memref<?x?x32xf32>
// CHECK: %[[ROWS:.+]] = arith.muli
// CHECK: %[[GRIDY:.+]] = arith.minui %[[ROWS]], %c65535
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_project_0 blocks in (%{{.+}}, %[[GRIDY]], %{{.+}}) threads in (%{{.+}}, %{{.+}}, %{{.+}})
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_0
// CHECK: gpu.dealloc async {{.*}} %[[Q]]
func.func @sim_ws(%u: tensor<?x?x32xbf16>, %e: tensor<?x?x8xf32>, %ws: tensor<32x32xf32>, %m: tensor<?x?xi1>) -> tensor<?x?x8xf32> {
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<32x32xf32>) key_mask(%m : tensor<?x?xi1>) : tensor<?x?x32xbf16>, tensor<?x?x8xf32> -> tensor<?x?x8xf32>
  return %p : tensor<?x?x8xf32>
}
