// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s --check-prefix=LANES
// RUN: moe-opt %s --convert-moe-to-gpu=route-map=warp -split-input-file | FileCheck %s --check-prefix=WARP

// moe.route with the choice given (replay) on the GPU: the route kernel takes the indices and the error word after
// its outputs; pick j's index is read (kernels::routeReplayPick: the expert read in its place first), one outside
// [0, E) recorded (op code 5, the first error wins the cmpxchg) and read as expert 0. Where the route-map=lanes kernel
// routes the shape (the default), that kernel replays: every expert scored and its score kept in shared memory as
// when it routes, then the given picks put in the slots its top-k would have filled (lane j % W) and weighed by its
// own epilogue (the same sources, sums and butterflies), so that a router's own choice replayed gives its weights bit
// for bit (softmax's row sum and the renormalization's included). With route-map=warp the warp kernel replays, lane
// j % 32 reading pick j, and an elementwise score reads only the given logits (IEEE exp and divide).

// LANES-LABEL: gpu.module @moe_kernels
// LANES: gpu.func @route_lanes_0(%{{.+}}: memref<?x256xf32>, %{{.+}}: memref<256xf32>, %{{.+}}: memref<?x8xf32>, %{{.+}}: memref<?x8xi32>, %[[R:.+]]: memref<?x8xi64>, %[[WORD:.+]]: i64) workgroup
// The scores first (sigmoid on the SFU), kept in shared memory.
// LANES: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// LANES: llvm.call_intrinsic "llvm.nvvm.rcp.approx.ftz.f"
// LANES: memref.store %{{.+}}, %{{.+}}[%{{.+}}] : memref<{{[0-9]+}}xf32, #gpu.address_space<workgroup>>
// No selection: the given pick, checked.
// LANES-NOT: gpu.shuffle
// LANES: %[[G:.+]] = memref.load %[[R]]
// LANES: %[[SEL:.+]] = arith.select %{{.+}}, %[[G]], %{{.+}} : i64
// LANES: arith.trunci %[[SEL]] : i64 to i32
// LANES: llvm.inttoptr %[[WORD]]
// LANES: llvm.cmpxchg
// LANES: llvm.store %c5_i64
// LANES: llvm.store %[[G]]
// The epilogue of a routing: the sources read back, the renormalization's butterfly over the token's 8 lanes.
// LANES: nvvm.bar.warp.sync
// LANES: memref.load %{{.+}}[%{{.+}}] : memref<{{[0-9]+}}xf32, #gpu.address_space<workgroup>>
// LANES: gpu.shuffle xor %{{.+}}, %c1_i32
// LANES: gpu.shuffle xor %{{.+}}, %c2_i32
// LANES: gpu.shuffle xor %{{.+}}, %c4_i32
// LANES-NOT: gpu.shuffle
// LANES: memref.store %{{.+}}, %{{.+}} : memref<?x8xf32>
// LANES-LABEL: func.func @sigmoid_replay
// LANES: llvm.call @moeGpuErrorWord()
// LANES: gpu.launch_func {{.+}} @moe_kernels::@route_lanes_0

// WARP-LABEL: gpu.module @moe_kernels
// WARP: gpu.func @route_warp_0(%{{.+}}: memref<?x256xf32>, %{{.+}}: memref<256xf32>, %{{.+}}: memref<?x8xf32>, %{{.+}}: memref<?x8xi32>, %[[R:.+]]: memref<?x8xi64>, %[[WORD:.+]]: i64)
// WARP-NOT: gpu.shuffle
// WARP: %[[G:.+]] = memref.load %[[R]]
// WARP: %[[SEL:.+]] = arith.select %{{.+}}, %[[G]], %{{.+}} : i64
// WARP: arith.trunci %[[SEL]] : i64 to i32
// WARP: llvm.inttoptr %[[WORD]]
// WARP: llvm.cmpxchg
// WARP: llvm.store %c5_i64
// WARP: llvm.store %[[G]]
// WARP: math.exp
// WARP-NOT: llvm.nvvm.ex2.approx
// WARP: gpu.shuffle xor
// WARP-LABEL: func.func @sigmoid_replay
// WARP: llvm.call @moeGpuErrorWord()
// WARP: gpu.launch_func {{.+}} @moe_kernels::@route_warp_0
func.func @sigmoid_replay(%l: tensor<?x256xf32>, %b: tensor<256xf32>, %r: tensor<?x8xi64>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) replay(%r : tensor<?x8xi64>) k(8) scoring(sigmoid) n_group(8) topk_group(4)
      renormalize(true) routed_scaling_factor(2.5) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// A softmax before the choice: the row's max and sum as butterflies first.
// LANES-LABEL: gpu.module @moe_kernels
// LANES: gpu.func @route_lanes_0(%{{.+}}: memref<?x128xbf16>, %{{.+}}: memref<?x4xf32>, %{{.+}}: memref<?x4xi32>, %[[R:.+]]: memref<?x4xi32>, %{{.+}}: i64)
// LANES: gpu.shuffle xor
// LANES: memref.load %[[R]]
// WARP-LABEL: gpu.module @moe_kernels
// WARP: gpu.func @route_warp_0(%{{.+}}: memref<?x128xbf16>, %{{.+}}: memref<?x4xf32>, %{{.+}}: memref<?x4xi32>, %[[R:.+]]: memref<?x4xi32>, %{{.+}}: i64)
// WARP: gpu.shuffle xor
// WARP: memref.load %[[R]]
func.func @softmax_replay(%l: tensor<?x128xbf16>, %r: tensor<?x4xi32>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.route %l replay(%r : tensor<?x4xi32>) k(4) : tensor<?x128xbf16> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}
