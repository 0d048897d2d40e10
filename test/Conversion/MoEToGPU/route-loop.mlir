// RUN: moe-opt %s --split-input-file --convert-moe-to-gpu="route-map=lanes" | FileCheck %s
// RUN: moe-opt %s --split-input-file --convert-moe-to-gpu="route-map=warp" | FileCheck %s

// moe.route past the register kernel's 1024 experts where the lanes' layout takes no shape (groups that need more
// than 128 slots a lane: 5 groups of 819, 17 of 129, 33 of 65; or more than 4096 experts) runs the loop kernel: a
// warp a token and a block, the lane's values in scf.for loops over m (expert m * 32 + lane) recomputed from the
// logits where a step reads them, the groups a loop whose candidates lane g % 32 keeps, the k rounds each a loop
// over the row. test/GPU/unit/test_route_lanes_simt.py runs these kernels against float64; ptxas-route-loop.mlir
// assembles them without spills.

// CHECK-LABEL: gpu.func @route_loop_0
// CHECK-SAME: known_block_size = array<i32: 32, 1, 1>
// A loop over a group's values (an i64 candidate carried), the logit loaded and scored in it, the group's best by
// a butterfly; no shared memory.
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (i64)
// CHECK: memref.load %{{.*}}[%{{.*}}, %{{.*}}] : memref<?x4095xf32>
// CHECK: math.exp
// CHECK: gpu.shuffle xor
// CHECK-NOT: workgroup
// CHECK: gpu.return
// CHECK-LABEL: func.func @groups_of_819
// CHECK: gpu.launch_func {{.*}}@moe_kernels::@route_loop_0
func.func @groups_of_819(%x: tensor<?x4095xf32>, %b: tensor<4095xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<4095xf32>) k(8) scoring(sigmoid) n_group(5) topk_group(2) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<?x4095xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// CHECK-LABEL: func.func @softmax_groups_of_129
// CHECK: gpu.launch_func {{.*}}@moe_kernels::@route_loop_0
func.func @softmax_groups_of_129(%x: tensor<?x2193xbf16>) -> (tensor<?x6xf32>, tensor<?x6xi32>) {
  %w, %i = moe.route %x k(6) n_group(17) topk_group(3) group_score(max) renormalize(true) : tensor<?x2193xbf16> -> tensor<?x6xf32>, tensor<?x6xi32>
  return %w, %i : tensor<?x6xf32>, tensor<?x6xi32>
}

// -----

// CHECK-LABEL: func.func @groups_of_65
// CHECK: gpu.launch_func {{.*}}@moe_kernels::@route_loop_0
func.func @groups_of_65(%x: tensor<?x2145xf16>, %b: tensor<2145xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<2145xf32>) k(8) scoring(sigmoid) n_group(33) topk_group(4) renormalize(true) : tensor<?x2145xf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// More than 4096 experts, no groups: k = 64, the score after the choice.
// CHECK-LABEL: func.func @experts_8192
// CHECK: gpu.launch_func {{.*}}@moe_kernels::@route_loop_0
func.func @experts_8192(%x: tensor<?x8192xf32>) -> (tensor<?x64xf32>, tensor<?x64xi32>) {
  %w, %i = moe.route %x k(64) order(topk_then_score) renormalize(true) : tensor<?x8192xf32> -> tensor<?x64xf32>, tensor<?x64xi32>
  return %w, %i : tensor<?x64xf32>, tensor<?x64xi32>
}

// -----

// Replay on the loop kernel: the given indices checked against E through the error word.
// CHECK-LABEL: func.func @replay_groups_of_819
// CHECK: gpu.launch_func {{.*}}@moe_kernels::@route_loop_0
func.func @replay_groups_of_819(%x: tensor<?x4095xf32>, %r: tensor<?x8xi64>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x replay(%r : tensor<?x8xi64>) k(8) n_group(5) topk_group(2) renormalize(true) : tensor<?x4095xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// The most groups (64: the kept groups are the bits of an i64), of 65 experts, 8 of them kept.
// CHECK-LABEL: func.func @groups_64_of_65
// CHECK: gpu.launch_func {{.*}}@moe_kernels::@route_loop_0
func.func @groups_64_of_65(%x: tensor<?x4160xf32>, %b: tensor<4160xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<4160xf32>) k(8) scoring(sigmoid) n_group(64) topk_group(8) renormalize(true) : tensor<?x4160xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// 8 of 64 groups kept at 1024 experts (the register kernel under route-map=warp): the kept groups' rounds are
// unrolled where topk_group is a multiple of 8, since LLVM 22's LoopIdiomRecognize took their one-block loop for a
// CRC and searched the rounds' selects on every path for hours (ptxas-route-loop.mlir lowers it to PTX).
// CHECK-LABEL: func.func @keep_8_of_64_groups
// CHECK: gpu.launch_func {{.*}}@moe_kernels::@route_{{lanes|warp}}_0
func.func @keep_8_of_64_groups(%x: tensor<?x1024xf32>, %b: tensor<1024xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<1024xf32>) k(8) scoring(sigmoid) n_group(64) topk_group(8) renormalize(true) : tensor<?x1024xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}
