// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s --check-prefixes=CHECK,LANES
// RUN: moe-opt %s --convert-moe-to-gpu=route-map=warp -split-input-file | FileCheck %s --check-prefixes=CHECK,WARP

// moe.route with the choice given (replay) on the GPU: the warp kernel (route-map=lanes too) takes the indices and
// the error word after its outputs; lane j % 32 reads pick j's index (kernels::routeReplayPick: the expert read in
// its place first), records one outside [0, E) (op code 5, the first error wins the cmpxchg) and reads expert 0;
// an elementwise score reads only the given logits (no butterfly before the renormalization's sum). Where the
// route-map=lanes kernel routes the shape (the default), the replay scores a sigmoid as that kernel does (ex2.approx
// and rcp.approx), so that a router's own choice replayed gives its weights bit for bit; with route-map=warp, as
// the warp kernel (IEEE exp and divide).

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @route_warp_0(%{{.+}}: memref<?x256xf32>, %{{.+}}: memref<256xf32>, %{{.+}}: memref<?x8xf32>, %{{.+}}: memref<?x8xi32>, %[[R:.+]]: memref<?x8xi64>, %[[WORD:.+]]: i64)
// CHECK-NOT: gpu.shuffle
// CHECK: %[[G:.+]] = memref.load %[[R]]
// CHECK: %[[SEL:.+]] = arith.select %{{.+}}, %[[G]], %{{.+}} : i64
// CHECK: arith.trunci %[[SEL]] : i64 to i32
// CHECK: llvm.inttoptr %[[WORD]]
// CHECK: llvm.cmpxchg
// CHECK: llvm.store %c5_i64
// CHECK: llvm.store %[[G]]
// LANES: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// LANES: llvm.call_intrinsic "llvm.nvvm.rcp.approx.ftz.f"
// WARP: math.exp
// WARP-NOT: llvm.nvvm.ex2.approx
// CHECK: gpu.shuffle xor
// CHECK-LABEL: func.func @sigmoid_replay
// CHECK: llvm.call @moeGpuErrorWord()
// CHECK: gpu.launch_func {{.+}} @moe_kernels::@route_warp_0
func.func @sigmoid_replay(%l: tensor<?x256xf32>, %b: tensor<256xf32>, %r: tensor<?x8xi64>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) replay(%r : tensor<?x8xi64>) k(8) scoring(sigmoid) n_group(8) topk_group(4)
      renormalize(true) routed_scaling_factor(2.5) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// A softmax before the choice: the row's max and sum as butterflies first.
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @route_warp_0(%{{.+}}: memref<?x128xbf16>, %{{.+}}: memref<?x4xf32>, %{{.+}}: memref<?x4xi32>, %[[R:.+]]: memref<?x4xi32>, %{{.+}}: i64)
// CHECK: gpu.shuffle xor
// CHECK: memref.load %[[R]]
func.func @softmax_replay(%l: tensor<?x128xbf16>, %r: tensor<?x4xi32>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.route %l replay(%r : tensor<?x4xi32>) k(4) : tensor<?x128xbf16> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}
