// The causal order of the flash kernels' blocks (flash-causal-balance, on by default; FlashTile.h's
// FlashBlockOrder): under a causal mask a block takes its row tile and batch element from its position
// p = y * tiles + x, %nsmid (S) and the first wave W = min(blocks, 2S): item S + W - 1 - p for p in [S, W), p
// elsewhere; the (item / B)-th heaviest tile of batch element item % B, the heaviest being the last by query and
// the first by key. Without causal, or with flash-causal-balance=false, the grid's order (tile x of element y).
// test/GPU/unit/test_flash_causal_order_simt.py runs the kernels in both orders (the same bits).
// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-grad=true" | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-grad=true flash-causal-balance=false" | FileCheck %s --check-prefix=GRID

// The tensor-core forward (128 rows a block; the kernel without split keys): the tile by query is
// tiles - 1 - rank.
// CHECK-LABEL: gpu.func @similarity_inform_mma_0(
// CHECK-DAG:     %[[BX:.*]] = gpu.block_id  x
// CHECK-DAG:     %[[BY:.*]] = gpu.block_id  y
// CHECK-DAG:     %[[GX:.*]] = gpu.grid_dim  x
// CHECK-DAG:     %[[GY:.*]] = gpu.grid_dim  y
// CHECK:         %[[BLOCKS:.*]] = arith.muli %[[GX]], %[[GY]] : index
// CHECK:         %[[ROW:.*]] = arith.muli %[[BY]], %[[GX]] : index
// CHECK:         %[[POS:.*]] = arith.addi %[[ROW]], %[[BX]] : index
// CHECK:         %[[NSM32:.*]] = nvvm.read.ptx.sreg.nsmid : i32
// CHECK:         %[[NSM:.*]] = arith.index_cast %[[NSM32]] : i32 to index
// CHECK:         %[[TWO:.*]] = arith.addi %[[NSM]], %[[NSM]] : index
// CHECK:         %[[WAVE:.*]] = arith.minui %[[BLOCKS]], %[[TWO]] : index
// CHECK:         %[[PAST:.*]] = arith.cmpi uge, %[[POS]], %[[NSM]] : index
// CHECK:         %[[IN:.*]] = arith.cmpi ult, %[[POS]], %[[WAVE]] : index
// CHECK:         %[[SECOND:.*]] = arith.andi %[[PAST]], %[[IN]] : i1
// CHECK:         %[[END:.*]] = arith.addi %[[NSM]], %[[WAVE]] : index
// CHECK:         %[[NEXT:.*]] = arith.addi %[[POS]], %{{.*}} : index
// CHECK:         %[[REV:.*]] = arith.subi %[[END]], %[[NEXT]] : index
// CHECK:         %[[ITEM:.*]] = arith.select %[[SECOND]], %[[REV]], %[[POS]] : index
// CHECK:         %[[RANK:.*]] = arith.divui %[[ITEM]], %[[GY]] : index
// CHECK:         %[[ELT:.*]] = arith.remui %[[ITEM]], %[[GY]] : index
// CHECK:         %[[LAST:.*]] = arith.subi %[[GX]], %{{.*}} : index
// CHECK:         %[[TILE:.*]] = arith.subi %[[LAST]], %[[RANK]] : index
// CHECK:         arith.muli %[[TILE]], %c128 : index
// The split-key kernel beside it: a tile's lanes are its (element, split) pairs, l = z * B + y; the split
// takes its share of the tile's keys and writes its partial rows.
// CHECK-LABEL: gpu.func @similarity_inform_mma_1(
// CHECK-DAG:     %[[BZ:.*]] = gpu.block_id  z
// CHECK-DAG:     %[[SGY:.*]] = gpu.grid_dim  y
// CHECK-DAG:     %[[SGZ:.*]] = gpu.grid_dim  z
// CHECK:         %[[LANES:.*]] = arith.muli %[[SGY]], %[[SGZ]] : index
// CHECK:         arith.muli %[[BZ]], %[[SGY]] : index
// CHECK:         nvvm.read.ptx.sreg.nsmid
// CHECK:         %[[SRANK:.*]] = arith.divui %[[SITEM:.*]], %[[LANES]] : index
// CHECK:         %[[LANE:.*]] = arith.remui %[[SITEM]], %[[LANES]] : index
// CHECK:         %[[SELT:.*]] = arith.remui %[[LANE]], %[[SGY]] : index
// CHECK:         %[[SPLIT:.*]] = arith.divui %[[LANE]], %[[SGY]] : index
// CHECK:         arith.muli %[[SPLIT]], %{{.*}} : index
// CHECK:         memref.store %{{.*}}, %{{.*}}[%[[SPLIT]], %[[SELT]], %{{.*}}, %{{.*}}] : memref<?x?x?x18xf32>
// GRID-LABEL:  gpu.func @similarity_inform_mma_0(
// GRID-NOT:      nvvm.read.ptx.sreg.nsmid
// GRID:          gpu.return
// GRID-LABEL:  gpu.func @similarity_inform_mma_1(
// GRID-NOT:      nvvm.read.ptx.sreg.nsmid
// GRID:          memref.store %{{.*}}, %{{.*}}[%block_id_z{{.*}}, %block_id_y, %{{.*}}, %{{.*}}] : memref<?x?x?x18xf32>
// GRID:          gpu.return
func.func @forward_mma(%u: tensor<2x300x64xbf16>, %e: tensor<2x300x16xbf16>) -> tensor<2x300x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) causal(true) : tensor<2x300x64xbf16>, tensor<2x300x16xbf16> -> tensor<2x300x16xf32>
  return %p : tensor<2x300x16xf32>
}

// A split-key kernel estimated past 176 registers (D = 128, K = 32, the lse: 186) keeps the grid's order: its
// held place spilled. Its direct kernel takes the causal order.
// CHECK-LABEL: gpu.func @similarity_inform_fwd_mma_0(
// CHECK:         nvvm.read.ptx.sreg.nsmid
// CHECK-LABEL: gpu.func @similarity_inform_fwd_mma_1(
// CHECK-NOT:     nvvm.read.ptx.sreg.nsmid
// CHECK:         gpu.return
func.func @forward_split_past_the_estimate(%u: tensor<?x?x128xf16>, %e: tensor<?x?x32xf16>) -> (tensor<?x?x32xf32>, tensor<?x?xf32>) {
  %p, %lse = moe.similarity_inform_fwd %u, %e tau(5.000000e-01) causal(true) : tensor<?x?x128xf16>, tensor<?x?x32xf16> -> tensor<?x?x32xf32>, tensor<?x?xf32>
  return %p, %lse : tensor<?x?x32xf32>, tensor<?x?xf32>
}

// The scalar forward (f32, 16 rows a block).
// CHECK-LABEL: gpu.func @similarity_inform_0(
// CHECK:         nvvm.read.ptx.sreg.nsmid
// CHECK:         %[[RANK:.*]] = arith.divui %{{.*}}, %[[GY:.*]] : index
// CHECK:         arith.remui %{{.*}}, %[[GY]] : index
// CHECK:         %[[LAST:.*]] = arith.subi %{{.*}}, %{{.*}} : index
// CHECK:         %[[TILE:.*]] = arith.subi %[[LAST]], %[[RANK]] : index
// CHECK:         arith.muli %[[TILE]], %c16 : index
// GRID-LABEL:  gpu.func @similarity_inform_0(
// GRID-NOT:      nvvm.read.ptx.sreg.nsmid
// GRID:          gpu.return
func.func @forward_scalar(%u: tensor<2x300x64xf32>, %e: tensor<2x300x16xf32>) -> tensor<2x300x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) causal(true) : tensor<2x300x64xf32>, tensor<2x300x16xf32> -> tensor<2x300x16xf32>
  return %p : tensor<2x300x16xf32>
}

// Without causal: the grid's order (the kernel with split keys and the one without).
// CHECK-LABEL: gpu.func @similarity_inform_mma_2(
// CHECK-NOT:     nvvm.read.ptx.sreg.nsmid
// CHECK:         gpu.return
// CHECK-LABEL: gpu.func @similarity_inform_mma_3(
// CHECK-NOT:     nvvm.read.ptx.sreg.nsmid
// CHECK:         gpu.return
func.func @not_causal(%u: tensor<2x300x64xbf16>, %e: tensor<2x300x16xbf16>) -> tensor<2x300x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) : tensor<2x300x64xbf16>, tensor<2x300x16xbf16> -> tensor<2x300x16xf32>
  return %p : tensor<2x300x16xf32>
}

// The tensor-core backward: by query the heaviest tile is the last, by key the first (the tile is the rank).
// CHECK-LABEL: gpu.func @similarity_inform_grad_dq_mma_0(
// CHECK:         nvvm.read.ptx.sreg.nsmid
// CHECK:         %[[RANK:.*]] = arith.divui %{{.*}}, %[[GY:.*]] : index
// CHECK:         arith.remui %{{.*}}, %[[GY]] : index
// CHECK:         %[[LAST:.*]] = arith.subi %{{.*}}, %{{.*}} : index
// CHECK:         %[[TILE:.*]] = arith.subi %[[LAST]], %[[RANK]] : index
// CHECK:         arith.muli %[[TILE]], %c64 : index
// CHECK-LABEL: gpu.func @similarity_inform_grad_dk_mma_0(
// CHECK:         nvvm.read.ptx.sreg.nsmid
// CHECK:         %[[RANK:.*]] = arith.divui %{{.*}}, %[[GY:.*]] : index
// CHECK-NEXT:    arith.remui %{{.*}}, %[[GY]] : index
// CHECK-NOT:     arith.subi
// CHECK:         arith.muli %[[RANK]], %c64 : index
// GRID-LABEL:  gpu.func @similarity_inform_grad_dq_mma_0(
// GRID-NOT:      nvvm.read.ptx.sreg.nsmid
// GRID:          gpu.return
// GRID-LABEL:  gpu.func @similarity_inform_grad_dk_mma_0(
// GRID-NOT:      nvvm.read.ptx.sreg.nsmid
// GRID:          gpu.return
func.func @backward_mma(%u: tensor<2x300x64xbf16>, %e: tensor<2x300x16xbf16>, %dp: tensor<2x300x16xf32>, %p: tensor<2x300x16xf32>, %lse: tensor<2x300xf32>) -> (tensor<2x300x64xf32>, tensor<2x300x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x300x16xf32>) saved(%p, %lse : tensor<2x300x16xf32>, tensor<2x300xf32>) tau(1.000000e+00) causal(true) : tensor<2x300x64xbf16>, tensor<2x300x16xbf16> -> tensor<2x300x64xf32>, tensor<2x300x16xf32>
  return %du, %de : tensor<2x300x64xf32>, tensor<2x300x16xf32>
}

// The scalar backward (f32): the same two orders.
// CHECK-LABEL: gpu.func @similarity_inform_grad_dq_0(
// CHECK:         nvvm.read.ptx.sreg.nsmid
// CHECK:         %[[RANK:.*]] = arith.divui %{{.*}}, %[[GY:.*]] : index
// CHECK:         arith.remui %{{.*}}, %[[GY]] : index
// CHECK:         %[[LAST:.*]] = arith.subi %{{.*}}, %{{.*}} : index
// CHECK:         %[[TILE:.*]] = arith.subi %[[LAST]], %[[RANK]] : index
// CHECK:         arith.muli %[[TILE]], %c16 : index
// CHECK-LABEL: gpu.func @similarity_inform_grad_dk_0(
// CHECK:         nvvm.read.ptx.sreg.nsmid
// CHECK:         %[[RANK:.*]] = arith.divui %{{.*}}, %[[GY:.*]] : index
// CHECK-NEXT:    arith.remui %{{.*}}, %[[GY]] : index
// CHECK-NOT:     arith.subi
// CHECK:         arith.muli %[[RANK]], %c16 : index
// GRID-LABEL:  gpu.func @similarity_inform_grad_dq_0(
// GRID-NOT:      nvvm.read.ptx.sreg.nsmid
// GRID:          gpu.return
// GRID-LABEL:  gpu.func @similarity_inform_grad_dk_0(
// GRID-NOT:      nvvm.read.ptx.sreg.nsmid
// GRID:          gpu.return
func.func @backward_scalar(%u: tensor<2x300x64xf32>, %e: tensor<2x300x16xf32>, %dp: tensor<2x300x16xf32>, %p: tensor<2x300x16xf32>, %lse: tensor<2x300xf32>) -> (tensor<2x300x64xf32>, tensor<2x300x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x300x16xf32>) saved(%p, %lse : tensor<2x300x16xf32>, tensor<2x300xf32>) tau(1.000000e+00) causal(true) : tensor<2x300x64xf32>, tensor<2x300x16xf32> -> tensor<2x300x64xf32>, tensor<2x300x16xf32>
  return %du, %de : tensor<2x300x64xf32>, tensor<2x300x16xf32>
}
