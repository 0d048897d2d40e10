// RUN: moe-opt %s --convert-moe-to-gpu="route-map=warp" -split-input-file | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu="route-map=lanes" -split-input-file | FileCheck %s --check-prefix=LANES

// A custom score region (DeepSeek-V4's sqrtsoftplus) inlined in the warp-per-token route kernel: each lane scores
// its logits with the region's ops on scalars (math.exp/log1p/sqrt become libdevice calls in NVVM), where the
// sigmoid preset is computed; the pick's logit is scored again by the lane that stores its weight.

// CHECK-LABEL: gpu.func @route_warp_0
// CHECK-SAME: memref<?x256xbf16>
// CHECK: %[[X:.+]] = arith.extf %{{.+}} : bf16 to f32
// CHECK: %[[A:.+]] = math.absf %[[X]] : f32
// CHECK: %[[N:.+]] = arith.negf %[[A]] : f32
// CHECK: %[[E:.+]] = math.exp %[[N]] : f32
// CHECK: %[[L:.+]] = math.log1p %[[E]] : f32
// CHECK: %[[M:.+]] = arith.maximumf %[[X]], %{{.+}} : f32
// CHECK: %[[SP:.+]] = arith.addf %[[L]], %[[M]] : f32
// CHECK: math.sqrt %[[SP]] : f32
// CHECK: gpu.shuffle xor

// LANES-LABEL: gpu.func @route_lanes
// LANES: math.log1p
// LANES: math.sqrt
func.func @deepseek_v4_sqrtsoftplus(%l: tensor<?x256xbf16>, %b: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(custom) renormalize(true) routed_scaling_factor(2.5) score {
  ^bb0(%x: f32):
    %zero = arith.constant 0.000000e+00 : f32
    %a = math.absf %x : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %s = math.log1p %e : f32
    %m = arith.maximumf %x, %zero : f32
    %sp = arith.addf %s, %m : f32
    %r = math.sqrt %sp : f32
    moe.yield %r : f32
  } : tensor<?x256xbf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// Scored after the top-k (topk_then_score): the region scores the k selected logits only.
// CHECK-LABEL: gpu.func @route_warp_0
// CHECK-NOT: math.tanh
// CHECK: gpu.shuffle xor
// CHECK: math.tanh
// LANES-LABEL: gpu.func @route_lanes
// LANES: math.tanh
func.func @xtanh_topk_then_score(%l: tensor<?x64xf32>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.route %l k(4) scoring(custom) order(topk_then_score) renormalize(true) score {
  ^bb0(%x: f32):
    %two = arith.constant 2.000000e+00 : f32
    %t = math.tanh %x : f32
    %y = arith.mulf %x, %t : f32
    %r = arith.addf %y, %two : f32
    moe.yield %r : f32
  } : tensor<?x64xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}
