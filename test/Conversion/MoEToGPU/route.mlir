// RUN: moe-opt %s --convert-moe-to-gpu="route-map=warp" -split-input-file | FileCheck %s

// DeepSeek-V3 (E = 256, 8 groups of 32, sigmoid, bias, top-4 groups, k = 8):
// one warp per token, 8 values a lane. A group spans one lane column, so each
// group's best two candidates are two butterfly maxes of one value a lane
// (8 groups x 2 x 5 steps x 2 halves = 160 shuffles); the kept groups are a
// loop over the group candidates every lane holds alike; then k rounds of one
// butterfly each; the pick's logit is reloaded and scored again by the lane
// that stores it; renormalization is one f32 butterfly sum.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @route_warp_0(%{{.*}}: memref<?x256xbf16>, %{{.*}}: memref<256xf32>, %{{.*}}: memref<?x8xf32>, %{{.*}}: memref<?x8xi32>) kernel attributes {known_block_size = array<i32: 128, 1, 1>}
// CHECK-COUNT-8: math.exp
// CHECK-NOT: math.exp
// CHECK-COUNT-160: gpu.shuffle  xor
// CHECK-NOT: gpu.shuffle
// CHECK: scf.for {{.*}} to %c4{{.*}} iter_args({{.*}}) -> (i64, i64)
// CHECK: scf.for {{.*}} to %c8{{.*}} iter_args({{.*}}) -> (i64)
// CHECK-COUNT-10: gpu.shuffle  xor
// CHECK: scf.if
// CHECK: memref.load %{{.*}} : memref<?x256xbf16>
// CHECK: math.exp
// CHECK: memref.store {{.*}} : memref<?x8xf32>
// CHECK: memref.store {{.*}} : memref<?x8xi32>
// CHECK: scf.for {{.*}} -> (f32)
// CHECK-COUNT-5: gpu.shuffle  xor
// CHECK: arith.mulf %{{.*}}, %cst{{.*}} : f32
// CHECK: memref.store {{.*}} : memref<?x8xf32>
// CHECK-NOT: gpu.barrier
// CHECK: gpu.return
// CHECK-LABEL: func.func @deepseek_v3(
// CHECK: bufferization.alloc_tensor(%{{.*}}) : tensor<?x8xf32>
// CHECK: bufferization.alloc_tensor(%{{.*}}) : tensor<?x8xi32>
// CHECK: moe.kernel ins(%{{.*}}, %{{.*}} : tensor<?x256xbf16>, tensor<256xf32>) outs(
// CHECK: %[[T0:.*]] = gpu.wait async
// CHECK: gpu.launch_func async [%[[T0]]] @moe_kernels::@route_warp_0 blocks in
// CHECK: gpu.wait [%{{.*}}]
func.func @deepseek_v3(%l: tensor<?x256xbf16>, %b: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<?x256xbf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// gpt-oss (top-k then softmax over the k), E = 20: 32 lanes (E rounded up to
// a power of two), the lanes past E hold "none". No row softmax (no exp
// before the rounds); the epilogue takes the selection's max and sum.

// CHECK: gpu.func @route_warp_0(%{{.*}}: memref<?x20xf32>, %{{.*}}: memref<?x4xf32>, %{{.*}}: memref<?x4xi32>)
// CHECK-NOT: math.exp
// CHECK: arith.cmpi slt, %{{.*}}, %c20_i32
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (i64)
// CHECK-NOT: math.exp
// CHECK: scf.yield
// CHECK: scf.for {{.*}} -> (f32)
// CHECK: arith.maximumf
// CHECK-COUNT-5: gpu.shuffle  xor
// CHECK: scf.for {{.*}} -> (f32)
// CHECK: math.exp
// CHECK: gpu.return
func.func @gpt_oss(%l: tensor<?x20xf32>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.route %l k(4) order(topk_then_score) : tensor<?x20xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}

// -----

// Groups that do not span lane columns (E = 160, 8 groups of 20): each value
// computes its group (a division by 20) and tests the kept bit.

// CHECK: gpu.func @route_warp_0(%{{.*}}: memref<?x160xf32>
// CHECK: arith.divui %{{.*}}, %c20_i32
// CHECK: arith.shrui %{{.*}} : i64
// CHECK: gpu.return
func.func @deepseek_v2(%l: tensor<?x160xf32>) -> (tensor<?x6xf32>, tensor<?x6xi32>) {
  %w, %i = moe.route %l k(6) n_group(8) topk_group(3) group_score(max) routed_scaling_factor(1.600000e+01) : tensor<?x160xf32> -> tensor<?x6xf32>, tensor<?x6xi32>
  return %w, %i : tensor<?x6xf32>, tensor<?x6xi32>
}

