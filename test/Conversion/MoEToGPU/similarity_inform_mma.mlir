// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64" -split-input-file | FileCheck %s

// similarity_inform on f16/bf16 operands runs the tensor-core kernel
// (FlashMma.cpp), here the form of one 16-row MMA tile a warp (%flash_base64:
// 64 query rows a block, no key splits; the 128-row default is in
// similarity_inform_mma_block_rows.mlir): key tiles of 64 keys staged with
// their values in padded workgroup tiles by cp.async, two buffers, the next
// tile's copies in flight while this one is computed; the query fragments
// loaded once, and per tile ldmatrix + mma.sync m16n8k16 for the logits and
// for the mixing, with the online softmax over the quads (4-lane reductions)
// in between. The f32-path kernel (flash-mma=false, 2026-11-24) and the
// natural-exp softmax, element staging and FADD row sums (2026-11-26) lost
// their GPU runs and are gone.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_mma_0(%{{.*}}: memref<2x128x64xf16>, %{{.*}}: memref<2x128x64xf16>, %{{.*}}: memref<2x128x16xf16>, %{{.*}}: memref<2x128x16xf32>)
// Two buffers of 64 keys each (cp.async double buffering).
// CHECK-SAME: workgroup(%[[K:.*]] : memref<128x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[V:.*]] : memref<128x24xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// CHECK-SAME: nvvm.minctasm = 4
// The query fragments, once, before the key loop.
// CHECK: vector.from_elements {{.*}} : vector<4x2xf16>
// The base-2 softmax's max starts at -FLT_MAX (a row without keys subtracts
// it from -inf logits: p = 0, no select).
// CHECK: %[[KEYEND:.+]] = arith.minui
// CHECK: arith.constant -3.40282347E+38 : f32
// Tile 0's copies before the loop: 16 bytes a copy where the base is
// aligned, element by element where it is not, into the same buffer.
// CHECK: nvgpu.device_async_copy {{.*}}, %[[K]][{{.*}}], 8, {{.*}} {bypassL1}
// CHECK: memref.store %{{.*}}, %[[K]]
// CHECK: nvgpu.device_async_copy {{.*}}, %[[V]][{{.*}}], 8, {{.*}} {bypassL1}
// CHECK: nvvm.cp.async.commit.group
// The softmax in base 2: c = log2(e)/tau folded into one FFMA a score, 2^x
// by ex2.approx.ftz (no division by tau, no __nv_expf). Keys [0, fullEnd)
// are whole tiles below the block's diagonal (fullEnd = min(Nk, rowBase + 1)
// rounded down to 64): that loop has no bounds or causal select; the
// diagonal tile runs in the second, checked loop, with the same state. The
// state: two 8-expert accumulator blocks, the ones block of the row sums,
// and each row's max and (unused) partial sum.
// CHECK: %[[C:.+]] = arith.constant 1.44269502 : f32
// CHECK: %[[FULL:.+]] = arith.muli %{{.+}}, %c64
// CHECK: %[[ACC:.+]]:16 = scf.for %{{.+}} = %c0 to %[[FULL]] step %c64
// Wait for this tile's copies, a barrier, then the next tile's copies into
// the other buffer: one barrier a tile.
// CHECK-NEXT: nvvm.cp.async.wait.group 0
// CHECK-NEXT: gpu.barrier
// CHECK: nvgpu.device_async_copy
// CHECK: nvvm.cp.async.commit.group
// CHECK-NOT: gpu.barrier
// Logits: two 8-key blocks per ldmatrix x4, an MMA each.
// CHECK: nvgpu.ldmatrix %{{.*}}[{{.*}}] {numTiles = 4 : i32, transpose = false} : memref<64x72xf16, strided<[72, 1], offset: ?>, #gpu.address_space<workgroup>> -> vector<4x2xf16>
// CHECK: nvgpu.mma.sync({{.*}}) {mmaShape = [16, 8, 16]} : (vector<4x2xf16>, vector<2x2xf16>, vector<2x2xf32>) -> vector<2x2xf32>
// No causal select and no division in the whole tiles.
// CHECK-NOT: arith.cmpi ule
// CHECK-NOT: arith.divf
// The row max of the raw dots over the quad, times c: m2 in log2 units.
// CHECK: %[[TMAX:.+]] = arith.maximumf
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : f32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32{{.*}} : f32
// CHECK-NOT: gpu.shuffle  xor %{{.*}}, %c4_i32
// CHECK: %[[M2T:.+]] = arith.mulf %{{.+}}, %[[C]] : f32
// CHECK: %[[M2:.+]] = arith.maximumf %{{.+}}, %[[M2T]] : f32
// CHECK-NOT: arith.select
// Each weight 2^(s c - m2): one FFMA and one EX2.
// CHECK: %[[NEG:.+]] = arith.negf %[[M2]] : f32
// CHECK: %[[X:.+]] = math.fma %{{.+}}, %[[C]], %[[NEG]] : f32
// CHECK: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"(%[[X]]) : (f32) -> f32
// CHECK-NOT: math.exp
// The accumulators (and the sums with them) rescaled by 2^(m2_old - m2)
// only where a row max of the warp changed (a vote: elsewhere the factor is
// exactly 1).
// CHECK: nvvm.vote.sync  any
// CHECK: scf.if
// CHECK: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// Mixing: P rounded to f16 two at a time (cvt.rn.f16x2.f32), the values
// through ldmatrix.trans; the row sums as P times a block of ones, no FADD
// of the weights and no shuffle of the sums.
// CHECK: %[[ONES:.+]] = arith.constant dense<1.000000e+00> : vector<2x2xf16>
// CHECK: arith.truncf %{{.*}} : vector<2xf32> to vector<2xf16>
// CHECK: nvgpu.ldmatrix %{{.*}}[{{.*}}] {numTiles = 4 : i32, transpose = true} : memref<64x24xf16, strided<[24, 1], offset: ?>, #gpu.address_space<workgroup>> -> vector<4x2xf16>
// CHECK: nvgpu.mma.sync
// CHECK: nvgpu.mma.sync(%{{.*}}, %[[ONES]], %{{.*}})
// CHECK-NOT: gpu.shuffle
// CHECK: scf.yield
// The checked tiles: from fullEnd to the block's key end, the same state.
// CHECK: %[[FIN:.+]]:16 = scf.for %{{.+}} = %[[FULL]] to %[[KEYEND]] step %c64{{.*}} iter_args(%{{.+}} = %[[ACC]]#0,
// CHECK: arith.cmpi ule
// CHECK: math.fma
// CHECK: scf.yield
// The sums come from the ones block: no shuffle after the key loops.
// CHECK-NOT: gpu.shuffle
// CHECK: memref.store %{{.*}} : memref<2x128x16xf32>
// CHECK-LABEL: func.func @sim_f16(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_mma_0
func.func @sim_f16(%u: tensor<2x128x64xf16>, %e: tensor<2x128x16xf16>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<2x128x64xf16>, tensor<2x128x16xf16> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// -----

// bf16: nvvm.mma.sync on the fragments' 32-bit registers (MLIR 22's
// nvgpu.mma.sync has no bf16 mapping). D = 256, K = 256: two cp.async
// buffers of 16-key tiles fit the 48 KiB of shared memory, 2 blocks per
// multiprocessor; the training forward also writes the log-sum-exp.

// CHECK: gpu.func @similarity_inform_fwd_mma_0
// CHECK-SAME: workgroup(%[[K:.*]] : memref<32x264xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[V:.*]] : memref<32x264xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: nvgpu.ldmatrix %{{.*}} : memref<16x264xbf16, strided<[264, 1], offset: ?>, #gpu.address_space<workgroup>>
// CHECK: vector.bitcast %{{.*}} : vector<2xbf16> to vector<1xi32>
// CHECK: nvvm.mma.sync A[{{.*}}] B[{{.*}}] C[{{.*}}] {layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, multiplicandAPtxType = #nvvm.mma_type<bf16>, multiplicandBPtxType = #nvvm.mma_type<bf16>, shape = #nvvm.shape<m = 16, n = 8, k = 16>} : (i32, i32, f32) -> !llvm.struct<(f32, f32, f32, f32)>
// CHECK: nvgpu.ldmatrix %{{.*}}[{{.*}}] {numTiles = 4 : i32, transpose = true}
// CHECK: memref.store %{{.*}} : memref<?x?xf32>
func.func @fwd_bf16(%u: tensor<?x?x256xbf16>, %e: tensor<?x?x256xbf16>) -> (tensor<?x?x256xf32>, tensor<?x?xf32>) {
  %p, %lse = moe.similarity_inform_fwd %u, %e : tensor<?x?x256xbf16>, tensor<?x?x256xbf16> -> tensor<?x?x256xf32>, tensor<?x?xf32>
  return %p, %lse : tensor<?x?x256xf32>, tensor<?x?xf32>
}

// -----

// Where the tensor-core kernel does not apply, the scalar one runs: f32
// operands (exact by default), mixed types, ws (q = u · ws is f32). The
// fused top-k of f16/bf16 operands runs on tensor cores
// (similarity_inform_topk_mma.mlir).

// CHECK-LABEL: func.func @f32_exact(
// CHECK: @moe_kernels::@similarity_inform_{{[0-9]+}}
// CHECK-LABEL: func.func @mixed(
// CHECK: @moe_kernels::@similarity_inform_{{[0-9]+}}
// CHECK-LABEL: func.func @with_ws(
// CHECK: @moe_kernels::@similarity_inform_{{[0-9]+}}
// CHECK-LABEL: func.func @fused_topk(
// CHECK: @moe_kernels::@similarity_inform_topk_mma_{{[0-9]+}}
func.func @f32_exact(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}
func.func @mixed(%u: tensor<2x128x64xbf16>, %e: tensor<2x128x16xf32>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x128x64xbf16>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}
func.func @with_ws(%u: tensor<2x128x64xf16>, %e: tensor<2x128x16xf16>, %ws: tensor<64x64xf32>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<64x64xf32>) : tensor<2x128x64xf16>, tensor<2x128x16xf16> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}
func.func @fused_topk(%u: tensor<2x128x64xf16>, %e: tensor<2x128x16xf16>) -> (tensor<2x128x2xf32>, tensor<2x128x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<2x128x64xf16>, tensor<2x128x16xf16> -> tensor<2x128x2xf32>, tensor<2x128x2xi32>
  return %w, %i : tensor<2x128x2xf32>, tensor<2x128x2xi32>
}
