// RUN: moe-opt %s --convert-moe-to-gpu="topk-rounds=list" -split-input-file | FileCheck %s
// ptxas-options: topk-rounds=list

// topk-rounds=list (TopkRenorm.cpp's listMappingOf, RegisterTopk.cpp's
// emitListTopk): lanes per token sized by K, 16-byte loads where the row base
// is aligned (ld.global.nc.v4.b32 in inline assembly) and 4-byte ones where it
// is not, each lane's best candidates sorted in registers, a round = the
// group's best head (max key, then the lowest index holding it) and a pop by
// the winning lane; the lists are refilled outside the round loop.

// K = 128, k = 8: 8 lanes a token (16 tokens a block of 128), 16 scores a lane
// in 4 runs of 4, lists of 4. The rounds run in an inner do-while that stops
// when a lane's list runs out (a warp vote); the outer loop refills.
// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK: %[[LANE:.*]] = arith.remui %{{.*}}, %c8{{.*}} : index
// CHECK: gpu.block_id
// CHECK: arith.muli %{{.*}}, %c16{{.*}} : index
// CHECK: %[[PTR:.*]] = memref.extract_aligned_pointer_as_index %arg0
// CHECK: %[[LOW:.*]] = arith.andi %[[PTR]], %c15
// CHECK: %[[ALIGNED:.*]] = arith.cmpi eq, %[[LOW]]
// CHECK: scf.if %[[ALIGNED]] -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)
// CHECK-COUNT-4: llvm.inline_asm has_side_effects "{ .reg .u64 g; cvta.to.global.u64 g, $4; ld.global.nc.v4.b32 {$0, $1, $2, $3}, [g]; }"
// CHECK: } else {
// CHECK-COUNT-16: memref.load %arg0
// The first fill: every element inserted in index order (strict compares: an
// equal key listed earlier stays ahead).
// CHECK: arith.cmpi sgt
// CHECK: arith.minsi
// CHECK: arith.maxsi
// CHECK: scf.while ({{.*}}) : (i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i32, i1, i32, i32, i1)
// CHECK: scf.while
// A round: butterflies over the 8 lanes (offsets 4, 2, 1) of the max key,
// then of the lowest index among the lanes whose head holds it.
// CHECK: %[[HEADIDX:.*]] = arith.addi %[[P0:.*]], %{{.*}} : i32
// CHECK: gpu.shuffle  xor %[[HEAD:[^,]*]], %c4_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: %[[BEST:.*]] = arith.maxsi
// CHECK: %[[HOLDS:.*]] = arith.cmpi eq, %[[HEAD]], %[[BEST]] : i32
// CHECK: arith.select %[[HOLDS]], %[[HEADIDX]], %c2147483647_i32{{[_0-9]*}} : i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c4_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: %[[WINNER:.*]] = arith.minsi
// The pop: the winning lane shifts its list; its last entry empties.
// CHECK: %[[WON:.*]] = arith.cmpi eq, %[[HEADIDX]], %[[WINNER]] : i32
// CHECK: arith.select %[[WON]], %{{.*}}, %[[HEAD]] : i32
// CHECK: arith.select %[[WON]], %c-2147483648_i32{{[_0-9]*}}, %{{.*}} : i32
// CHECK: nvvm.vote.sync  any %c-1_i32, %{{.*}} -> i1
// CHECK: scf.condition
// The refill, when the rounds stopped before k: the lanes that need it take
// their elements ranking after their last pick (a smaller key, or an equal
// one at a higher position).
// CHECK: %[[STOPPED:.*]] = arith.cmpi slt, %{{.*}}, %c8_i32{{.*}} : i32
// CHECK: scf.if %[[STOPPED]]
// CHECK: %[[BELOW:.*]] = arith.cmpi slt, %{{.*}}, %{{.*}} : i32
// CHECK: %[[SAME:.*]] = arith.cmpi eq
// CHECK: %[[LATER:.*]] = arith.cmpi sgt
// CHECK: %[[TIE:.*]] = arith.andi %[[SAME]], %[[LATER]] : i1
// CHECK: %[[AFTER:.*]] = arith.ori %[[BELOW]], %[[TIE]] : i1
// CHECK: arith.select %[[AFTER]], %{{.*}}, %c-2147483648_i32{{[_0-9]*}} : i32
// After the rounds: the first pick from the group's first lane, the selection
// sum over the group, and lane l stores pick l (coalesced).
// CHECK: gpu.shuffle  idx
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : f32
// CHECK: %[[PICK:.*]] = arith.addi %[[LANE]], %c0{{.*}} : index
// CHECK: memref.store %{{.*}}, %arg1[%{{.*}}, %[[PICK]]] : memref<?x8xf32>
// CHECK: memref.store %{{.*}}, %arg2[%{{.*}}, %[[PICK]]] : memref<?x8xi32>
// CHECK: gpu.return
func.func @topk(%s: tensor<?x128xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x128xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// K = 100 (a multiple of 4, not of 32), k = 3: 8 lanes, 4 runs of 4; the
// last run is padding for lanes 1-7 (index 100 and up): its 16-byte load
// reads column 0 instead and its values are -inf, keys empty. A list of 3
// never runs out (a lane wins at most k = 3 rounds): no refill, no vote, the
// rounds are an scf.for.
// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK: %[[IN:.*]] = arith.cmpi slt, %{{.*}}, %c100{{[_0-9]*}} : index
// CHECK: arith.select %[[IN]], %{{.*}}, %c0{{.*}} : index
// CHECK: scf.for {{.*}} -> (i32, i32, i32, i32, i32, i32, i32, i32, i32)
// CHECK-NOT: nvvm.vote.sync
// CHECK: gpu.return
func.func @topk_padding(%s: tensor<?x100xf32>) -> (tensor<?x3xf32>, tensor<?x3xi32>) {
  %w, %i = moe.topk_renorm %s k(3) mode(probs) renormalize(false) : tensor<?x100xf32> -> tensor<?x3xf32>, tensor<?x3xi32>
  return %w, %i : tensor<?x3xf32>, tensor<?x3xi32>
}

// -----

// K = 1024 f16: a whole warp per token, 32 scores a lane (four 16-byte loads,
// two halves of each word upcast), rounds by redux.sync over the warp.
// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK: arith.remui %{{.*}}, %c32{{.*}} : index
// CHECK: llvm.inline_asm
// CHECK: arith.trunci %{{.*}} : i32 to i16
// CHECK: arith.bitcast %{{.*}} : i16 to f16
// CHECK: arith.extf %{{.*}} : f16 to f32
// CHECK: nvvm.redux.sync  max %{{.*}}, %c-1_i32 : i32 -> i32
// CHECK: nvvm.redux.sync  min %{{.*}}, %c-1_i32 : i32 -> i32
// CHECK: nvvm.vote.sync  any
func.func @topk_warp(%s: tensor<?x1024xf16>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x1024xf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// K = 160 bf16 (20 runs of 8, not a power of two): 8 lanes, 3 runs a lane,
// 24 scores a lane; 8 dense logits, so the row's softmax statistics are
// butterflies over the group too.
// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK: arith.remui %{{.*}}, %c8{{.*}} : index
// CHECK-COUNT-3: llvm.inline_asm
// CHECK: gpu.shuffle  xor %{{.*}} : f32
// CHECK: arith.maximumf
// CHECK: gpu.shuffle  xor %{{.*}} : f32
// CHECK: arith.addf
// CHECK: gpu.return
func.func @topk_dense_160(%s: tensor<?x160xbf16>) -> (tensor<?x6xf32>, tensor<?x6xi32>) {
  %w, %i = moe.topk_renorm %s k(6) renormalize(false) : tensor<?x160xbf16> -> tensor<?x6xf32>, tensor<?x6xi32>
  return %w, %i : tensor<?x6xf32>, tensor<?x6xi32>
}

// -----

// K = 7 (not a multiple of 4): one lane a token, 8 scores (the 8th padding),
// 4-byte loads; its list of 7 holds every element: no reduction, no shuffle.
// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK-NOT: llvm.inline_asm
// CHECK-NOT: gpu.shuffle
// CHECK: scf.for
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.return
func.func @topk_one_lane(%s: tensor<?x7xf32>) -> (tensor<?x7xf32>, tensor<?x7xi32>) {
  %w, %i = moe.topk_renorm %s k(7) : tensor<?x7xf32> -> tensor<?x7xf32>, tensor<?x7xi32>
  return %w, %i : tensor<?x7xf32>, tensor<?x7xi32>
}

// -----

// k = 32 over K = 64: 4 lanes, 8 picks a lane on average, lists of 11, each
// lane keeping 8 picks (slots) for the stores; assembles without spills
// (GPU/ptxas-sweep.mlir), as K = 1024 bf16 with k = 32 and dense logits.
// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK-COUNT-8: memref.store %{{.*}}, %arg2
// CHECK: gpu.return
func.func @topk_k32(%s: tensor<?x64xf32>) -> (tensor<?x32xf32>, tensor<?x32xi32>) {
  %w, %i = moe.topk_renorm %s k(32) : tensor<?x64xf32> -> tensor<?x32xf32>, tensor<?x32xi32>
  return %w, %i : tensor<?x32xf32>, tensor<?x32xi32>
}

// -----

// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK: nvvm.redux.sync  max
func.func @topk_k32_1024(%s: tensor<?x1024xbf16>) -> (tensor<?x32xf32>, tensor<?x32xi32>) {
  %w, %i = moe.topk_renorm %s k(32) renormalize(false) : tensor<?x1024xbf16> -> tensor<?x32xf32>, tensor<?x32xi32>
  return %w, %i : tensor<?x32xf32>, tensor<?x32xi32>
}
