// RUN: moe-opt %s --convert-moe-to-gpu="route-map=lanes" -split-input-file -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu="route-map=lanes block-size=1024" -split-input-file -verify-diagnostics | FileCheck %s --check-prefix=BLOCK1024
// ptxas-options: route-map=lanes

// route-map=lanes (RouteLanes.cpp; the default): W lanes a token
// sized by E, lane l holding the experts [l*P, l*P + P) loaded 16 bytes at a
// time where the logits and the bias are aligned, scored once, the weight
// sources kept in shared memory (a lane's run at tid * (P + 1)), the groups
// ranked by shuffles of their keys, the top-k by emitListTopk's candidate
// lists, the weights from shared memory (never a second read of the logits)
// stored by lane l for picks l + s * W.

// DeepSeek-V3 (E = 256, 8 groups of 32, 4 kept, k = 8): SGLang's 8 lanes a
// token (16 tokens a block of 128), one group a lane, 32 experts a lane: 8
// 16-byte loads of logits and 8 of bias, 32 sigmoids of 2 SFU operations (no
// division), each group's key seen by the 7 other lanes (7 shuffles), then
// the rounds (two 3-step butterflies of 32-bit keys), the selection's sum
// (one 3-step f32 butterfly) and the stores.
// CHECK-LABEL: gpu.func @route_lanes_0
// CHECK-SAME: workgroup(%[[SMEM:.*]] : memref<4224xf32, #gpu.address_space<workgroup>>)
// CHECK: %[[LANE:.*]] = arith.remui %{{.*}}, %c8{{.*}} : index
// CHECK: arith.muli %{{.*}}, %c16{{.*}} : index
// CHECK: %[[PX:.*]] = memref.extract_aligned_pointer_as_index %arg0
// CHECK: arith.andi %[[PX]], %c15
// CHECK: %[[PB:.*]] = memref.extract_aligned_pointer_as_index %arg1
// CHECK: arith.andi %[[PB]], %c15
// CHECK: scf.if %{{.*}} -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)
// CHECK-COUNT-16: llvm.inline_asm has_side_effects "{ .reg .u64 g; cvta.to.global.u64 g, $4; ld.global.nc.v4.b32 {$0, $1, $2, $3}, [g]; }"
// CHECK: } else {
// CHECK-COUNT-32: memref.load %arg0
// CHECK-COUNT-32: memref.load %arg1
// CHECK: }
// CHECK-NOT: arith.divf
// CHECK: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// CHECK: llvm.call_intrinsic "llvm.nvvm.rcp.approx.ftz.f"
// CHECK: memref.store %{{.*}}, %[[SMEM]]
// CHECK-COUNT-7: gpu.shuffle  xor %{{.*}} : i32
// CHECK-NOT: gpu.shuffle
// CHECK: scf.while
// CHECK: scf.while
// CHECK-COUNT-6: gpu.shuffle  xor %{{.*}} : i32
// CHECK: nvvm.vote.sync  any
// CHECK-NOT: gpu.shuffle
// CHECK-NOT: memref.load %arg0
// CHECK: nvvm.bar.warp.sync
// CHECK: memref.load %[[SMEM]]
// CHECK-NOT: memref.load %arg0
// CHECK-COUNT-3: gpu.shuffle  xor %{{.*}} : f32
// CHECK-NOT: gpu.shuffle
// CHECK-NOT: memref.load
// CHECK: memref.store %{{.*}}, %arg2
// CHECK: memref.store %{{.*}}, %arg3
// CHECK: gpu.return
// CHECK: gpu.launch_func {{.*}}@moe_kernels::@route_lanes_0
func.func @deepseek_v3(%x: tensor<?x256xf32>, %b: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// Kimi-K2 in bf16 (E = 384, one group, k = 8): 16 lanes a token, 24 experts a
// lane: 3 16-byte loads of 8 logits and 6 of 4 biases; no group shuffles.
// CHECK-LABEL: gpu.func @route_lanes_0
// CHECK-SAME: workgroup(%{{.*}} : memref<3200xf32, #gpu.address_space<workgroup>>)
// CHECK: arith.remui %{{.*}}, %c16{{.*}} : index
// CHECK: scf.if
// CHECK-COUNT-9: llvm.inline_asm
// CHECK: } else {
// CHECK-NOT: gpu.shuffle
// CHECK: scf.while
func.func @kimi_k2_bf16(%x: tensor<?x384xbf16>, %b: tensor<384xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<384xf32>) k(8) scoring(sigmoid) renormalize(true) routed_scaling_factor(2.827000e+00) : tensor<?x384xbf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// DeepSeek-V2 (E = 160, 8 groups of 20, 3 kept, group_score(max), softmax):
// 8 lanes of 20 experts (5 16-byte loads); the row's softmax statistics by
// two 3-step butterflies (lowered to shuffles by the pass); a group's score is its best key (no second).
// CHECK-LABEL: gpu.func @route_lanes_0
// CHECK: arith.remui %{{.*}}, %c8{{.*}} : index
// CHECK: scf.if
// CHECK-COUNT-5: llvm.inline_asm
// CHECK: } else {
// CHECK-COUNT-20: memref.load %arg0
// CHECK-COUNT-3: gpu.shuffle  xor %{{.*}} : f32
// CHECK: math.exp
// CHECK-COUNT-3: gpu.shuffle  xor %{{.*}} : f32
// CHECK-COUNT-7: gpu.shuffle  xor %{{.*}} : i32
// CHECK: scf.while
func.func @deepseek_v2(%x: tensor<?x160xf32>) -> (tensor<?x6xf32>, tensor<?x6xi32>) {
  %w, %i = moe.route %x k(6) n_group(8) topk_group(3) group_score(max) routed_scaling_factor(1.600000e+01) : tensor<?x160xf32> -> tensor<?x6xf32>, tensor<?x6xi32>
  return %w, %i : tensor<?x6xf32>, tensor<?x6xi32>
}

// -----

// E = 1024 in 8 groups of 128: a group over 4 lanes of 32 (a whole warp a
// token), its top-2 keys merged by two butterfly steps (4 shuffles), the 7
// other groups' keys at lane offsets 4, 8, .., 28; the rounds by redux.sync.
// CHECK-LABEL: gpu.func @route_lanes_0
// CHECK: arith.remui %{{.*}}, %c32{{.*}} : index
// CHECK-COUNT-4: gpu.shuffle  xor %{{.*}} : i32
// CHECK: %c4_i32{{.*}} = arith.constant 4 : i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c4_i32
// CHECK-COUNT-6: gpu.shuffle  xor %{{.*}} : i32
// CHECK-NOT: gpu.shuffle
// CHECK: scf.while
// CHECK: nvvm.redux.sync  max
// CHECK: nvvm.redux.sync  min
func.func @groups_over_lanes(%x: tensor<?x1024xf32>, %b: tensor<1024xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<1024xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) : tensor<?x1024xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// E = 2048, k = 32 (the warp kernel stops at 1024): 32 lanes of 64 experts,
// 16 16-byte loads a lane; a pick a lane (one slot).
// CHECK-LABEL: gpu.func @route_lanes_0
// CHECK-SAME: workgroup(%{{.*}} : memref<8320xf32, #gpu.address_space<workgroup>>)
// CHECK: arith.remui %{{.*}}, %c32{{.*}} : index
// CHECK: scf.if
// CHECK-COUNT-16: llvm.inline_asm
// CHECK: } else {
func.func @e2048_k32(%x: tensor<?x2048xf32>) -> (tensor<?x32xf32>, tensor<?x32xi32>) {
  %w, %i = moe.route %x k(32) renormalize(true) : tensor<?x2048xf32> -> tensor<?x32xf32>, tensor<?x32xi32>
  return %w, %i : tensor<?x32xf32>, tensor<?x32xi32>
}

// -----

// gpt-oss (E = 128, k = 4, topk_then_score): the choice is the logit itself
// (no scoring before the selection, the logits kept in shared memory); the
// softmax over the 4 picks after the rounds: a max and a sum over the 8
// lanes.
// CHECK-LABEL: gpu.func @route_lanes_0
// Lists of k = 4 never run out: the rounds are one scf.for, no refill.
// CHECK-NOT: llvm.call_intrinsic
// CHECK-NOT: scf.while
// CHECK: scf.for
// CHECK-NOT: scf.while
// CHECK: nvvm.bar.warp.sync
// CHECK-COUNT-3: gpu.shuffle  xor %{{.*}} : f32
// CHECK: math.exp
// CHECK-COUNT-3: gpu.shuffle  xor %{{.*}} : f32
func.func @gpt_oss(%x: tensor<?x128xf32>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.route %x k(4) order(topk_then_score) : tensor<?x128xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}

// -----

// 32 groups of 64 (E = 2048): split over 2 lanes they would take 64, so a
// group a lane, 64 experts each, the 32 groups ranked by 31 shuffles.
// CHECK-LABEL: gpu.func @route_lanes_0
// CHECK-SAME: workgroup(%{{.*}} : memref<8320xf32, #gpu.address_space<workgroup>>)
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// CHECK: arith.remui %{{.*}}, %c32{{.*}} : index
// CHECK-COUNT-31: gpu.shuffle  xor %{{.*}} : i32
// CHECK: scf.while
// CHECK: nvvm.redux.sync  max
func.func @groups_of_64_on_32_lanes(%x: tensor<?x2048xf32>, %b: tensor<2048xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<2048xf32>) k(8) scoring(sigmoid) n_group(32) topk_group(4) renormalize(true) : tensor<?x2048xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// E = 4096, k = 64 (issue #48 item 4): 32 lanes of 128 experts, 32 16-byte
// loads a lane; 128 threads would want 66 KiB of shared memory, so the block
// halves to 64 threads (33 KiB).
// CHECK-LABEL: gpu.func @route_lanes_0
// CHECK-SAME: workgroup(%{{.*}} : memref<8256xf32, #gpu.address_space<workgroup>>)
// CHECK-SAME: known_block_size = array<i32: 64, 1, 1>
// CHECK: scf.if
// CHECK-COUNT-32: llvm.inline_asm
// CHECK: } else {
// CHECK-LABEL: func.func @e4096_k64(
// CHECK: arith.ceildivui %{{.*}}, %c2 : index
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@route_lanes_0 blocks in (%{{.*}}, %{{.*}}, %{{.*}}) threads in (%c64
func.func @e4096_k64(%x: tensor<?x4096xf32>) -> (tensor<?x64xf32>, tensor<?x64xi32>) {
  %w, %i = moe.route %x k(64) renormalize(true) : tensor<?x4096xf32> -> tensor<?x64xf32>, tensor<?x64xi32>
  return %w, %i : tensor<?x64xf32>, tensor<?x64xi32>
}

// -----

// 64 groups of 64 (E = 4096): two whole groups a lane.
// CHECK-LABEL: gpu.func @route_lanes_0
// CHECK-SAME: known_block_size = array<i32: 64, 1, 1>
// CHECK: arith.remui %{{.*}}, %c32{{.*}} : index
func.func @groups_of_64_two_a_lane(%x: tensor<?x4096xbf16>, %b: tensor<4096xf32>) -> (tensor<?x16xf32>, tensor<?x16xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<4096xf32>) k(16) scoring(sigmoid) n_group(64) topk_group(8) renormalize(true) : tensor<?x4096xbf16> -> tensor<?x16xf32>, tensor<?x16xi32>
  return %w, %i : tensor<?x16xf32>, tensor<?x16xi32>
}

// -----

// block-size=1024 on DeepSeek-V3 would want 132 KiB of shared memory: the
// lanes kernel takes 256 threads (33 KiB) instead of failing.
// BLOCK1024-LABEL: gpu.func @route_lanes_0
// BLOCK1024-SAME: workgroup(%{{.*}} : memref<8448xf32, #gpu.address_space<workgroup>>)
// BLOCK1024-SAME: known_block_size = array<i32: 256, 1, 1>
// BLOCK1024: gpu.launch_func async [%{{.*}}] @moe_kernels::@route_lanes_0 blocks in (%{{.*}}, %{{.*}}, %{{.*}}) threads in (%c256
func.func @block_1024(%x: tensor<?x256xf32>, %b: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// 3 groups of 700 (E = 2100, issue #48 item 4): no power of two of lanes
// divides 700 and a whole group is more than 128 experts, so a group spans 8
// lanes of 88 slots (704, the last 4 empty): position v of the lanes' layout
// is expert (v / 704) * 700 + v % 704, read one element a load (the runs
// start anywhere in the row), and a replayed expert e sits at position
// (e / 700) * 704 + e % 700.
// CHECK-LABEL: gpu.func @route_lanes_0(%arg0: memref<?x2100xf32>, %arg1: memref<2100xf32>
// CHECK-SAME: workgroup(%{{.*}} : memref<11392xf32, #gpu.address_space<workgroup>>)
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// CHECK-NOT: llvm.inline_asm
// CHECK: %[[G:.*]] = arith.divui %[[V:.*]], %c704_i32{{.*}} : i32
// CHECK: %[[S:.*]] = arith.muli %[[G]], %c700_i32{{.*}} : i32
// CHECK: %[[O:.*]] = arith.remui %[[V]], %c704_i32{{.*}} : i32
// CHECK: arith.addi %[[S]], %[[O]] : i32
// CHECK-LABEL: func.func @groups_of_700(
func.func @groups_of_700(%x: tensor<?x2100xf32>, %b: tensor<2100xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<2100xf32>) k(8) scoring(sigmoid) n_group(3) topk_group(2) renormalize(true) : tensor<?x2100xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// The same replaying a given choice: the given expert's position.
// CHECK-LABEL: gpu.func @route_lanes_0(%arg0: memref<?x2100xf32>, %arg1: memref<?x8xf32>
// CHECK: %[[G:.*]] = arith.divui %[[E:.*]], %c700_i32{{.*}} : i32
// CHECK: %[[S:.*]] = arith.muli %[[G]], %c704_i32{{.*}} : i32
// CHECK: %[[O:.*]] = arith.remui %[[E]], %c700_i32{{.*}} : i32
// CHECK: arith.addi %[[S]], %[[O]] : i32
func.func @groups_of_700_replay(%x: tensor<?x2100xf32>, %r: tensor<?x8xi64>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x replay(%r : tensor<?x8xi64>) k(8) n_group(3) topk_group(2) : tensor<?x2100xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// 128 f32 logits and biases a lane (E = 4096): the keys are formed in each branch of the aligned/unaligned load,
// which yields 128 keys rather than 256 floats (ptxas spilled 88-180 bytes of those; ptxas-sweep.mlir holds this
// chunk to no local memory).
// CHECK-LABEL: gpu.func @route_lanes_0(%arg0: memref<?x4096xf32>, %arg1: memref<4096xf32>
// CHECK: scf.if {{.*}} -> (i32, i32,
// CHECK-LABEL: func.func @e4096_bias_f32(
func.func @e4096_bias_f32(%x: tensor<?x4096xf32>, %b: tensor<4096xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<4096xf32>) k(8) scoring(sigmoid) n_group(64) topk_group(8) renormalize(true) : tensor<?x4096xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// 128 f32 logits and biases a lane (E = 4096, an elementwise score): loaded and turned into keys 64 slots at a
// time, each chunk's aligned/unaligned branch yielding 128 floats rather than the row's 256, which ptxas spilled
// (88-180 bytes on sm_80/sm_90; ptxas-sweep.mlir holds this chunk to no local memory).
// CHECK-LABEL: gpu.func @route_lanes_0(%arg0: memref<?x4096xf32>, %arg1: memref<4096xf32>
// CHECK-COUNT-2: -> (f32, f32, f32, f32,
// CHECK-NOT: -> (f32, f32, f32, f32,
// CHECK-LABEL: func.func @e4096_f32_bias(
func.func @e4096_f32_bias(%x: tensor<?x4096xf32>, %b: tensor<4096xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<4096xf32>) k(8) scoring(sigmoid) n_group(64) topk_group(8) renormalize(true) : tensor<?x4096xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// The same with a softmax before the choice: the row's statistics from the logits' chunks first (two more reads of
// 64 slots each), then the keys a chunk at a time (ptxas spilled 112 bytes of the 256 floats).
// CHECK-LABEL: gpu.func @route_lanes_0(%arg0: memref<?x4096xf32>, %arg1: memref<4096xf32>
// CHECK-COUNT-6: -> (f32, f32, f32, f32,
// CHECK-NOT: -> (f32, f32, f32, f32,
// CHECK-LABEL: func.func @e4096_f32_softmax_bias(
func.func @e4096_f32_softmax_bias(%x: tensor<?x4096xf32>, %b: tensor<4096xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<4096xf32>) k(8) renormalize(true) : tensor<?x4096xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}
