// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64" -split-input-file | FileCheck %s --check-prefixes=CHECK,NAT
// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64 flash-mma-base2=true" -split-input-file | FileCheck %s --check-prefixes=CHECK,BASE2

// flash-mma: similarity_inform on f16/bf16 operands runs the tensor-core
// kernel (FlashMma.cpp): a block of 4 warps per 64 query rows, key tiles of
// 64 keys staged with their values in padded workgroup tiles, the query
// fragments loaded once, and per tile ldmatrix + mma.sync m16n8k16 for the
// logits and for the mixing, with the online softmax over the quads (4-lane
// reductions) in between (the f32-path kernel's option, flash-mma=false, was
// deleted after the H100 run of 2026-11-24 chose this kernel).

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @similarity_inform_mma_0(%{{.*}}: memref<2x128x64xf16>, %{{.*}}: memref<2x128x64xf16>, %{{.*}}: memref<2x128x16xf16>, %{{.*}}: memref<2x128x16xf32>)
// CHECK-SAME: workgroup(%[[K:.*]] : memref<64x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[V:.*]] : memref<64x24xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>
// CHECK-SAME: nvvm.minctasm = 4
// The query fragments, once, before the key loop.
// CHECK: vector.from_elements {{.*}} : vector<4x2xf16>
// Default (NAT): the natural-log softmax of the last GPU run, one key loop.
// NAT: scf.for
// flash-mma-base2 (BASE2): the softmax in base 2: c = log2(e)/tau folded into one FFMA a score,
// 2^x by ex2.approx.ftz (no division by tau, no __nv_expf). Keys [0, fullEnd)
// are whole tiles below the block's diagonal (fullEnd = min(Nk, rowBase + 1)
// rounded down to 64): that loop has no bounds or causal select; the
// diagonal tile runs in the second, checked loop, with the same state.
// BASE2: %[[KEYEND:.+]] = arith.minui
// BASE2: %[[C:.+]] = arith.constant 1.44269502 : f32
// BASE2: %[[FULL:.+]] = arith.muli %{{.+}}, %c64
// BASE2: %[[ACC:.+]]:12 = scf.for %{{.+}} = %c0 to %[[FULL]] step %c64
// CHECK: gpu.barrier
// CHECK: memref.store %{{.*}}, %[[K]]
// CHECK: memref.store %{{.*}}, %[[V]]
// CHECK: gpu.barrier
// Logits: two 8-key blocks per ldmatrix x4, an MMA each.
// CHECK: nvgpu.ldmatrix %[[K]][{{.*}}] {numTiles = 4 : i32, transpose = false} : memref<64x72xf16, #gpu.address_space<workgroup>> -> vector<4x2xf16>
// CHECK: nvgpu.mma.sync({{.*}}) {mmaShape = [16, 8, 16]} : (vector<4x2xf16>, vector<2x2xf16>, vector<2x2xf32>) -> vector<2x2xf32>
// Causal: keys past the row are -inf; the row max over the quad.
// NAT: arith.cmpi ule
// BASE2-NOT: arith.cmpi ule
// BASE2-NOT: arith.divf
// The row max of the raw dots over the quad, times c: m2 in log2 units.
// BASE2: %[[TMAX:.+]] = arith.maximumf
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : f32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32{{.*}} : f32
// CHECK-NOT: gpu.shuffle  xor %{{.*}}, %c4_i32
// NAT-NOT: ex2.approx
// NAT: math.exp
// The tile's sum over the quad, every tile (2 shuffles a row and tile).
// NAT: %[[SH:[^ ,]+]], %{{[^ ]+}} = gpu.shuffle  xor %[[TS:[^ ,]+]], %c1_i32{{.*}} : f32
// NAT-NEXT: arith.addf %[[TS]], %[[SH]] : f32
// Mixing: P rounded to f16 in registers, the values through ldmatrix.trans.
// NAT: arith.truncf %{{.*}} : f32 to f16
// BASE2: %[[M2T:.+]] = arith.mulf %{{.+}}, %[[C]] : f32
// BASE2: %[[M2:.+]] = arith.maximumf %{{.+}}, %[[M2T]] : f32
// The max starts at -FLT_MAX, not -inf: a row without keys subtracts it from
// -inf logits (p = 0), so the max is the shift, with no select.
// BASE2-NOT: arith.select
// The accumulator's factor 2^(m2_old - m2), then each weight 2^(s c - m2).
// BASE2: %[[D:.+]] = arith.subf %{{.+}}, %[[M2]] : f32
// BASE2: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"(%[[D]]) : (f32) -> f32
// BASE2: %[[NEG:.+]] = arith.negf %[[M2]] : f32
// BASE2: %[[X:.+]] = math.fma %{{.+}}, %[[C]], %[[NEG]] : f32
// BASE2: %[[P:.+]] = llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"(%[[X]]) : (f32) -> f32
// This lane's partial sum: no shuffle of the sums in the loop.
// BASE2: arith.addf %{{.+}}, %[[P]] : f32
// BASE2-NOT: math.exp
// Mixing: P rounded to f16 two at a time (cvt.rn.f16x2.f32), the values
// through ldmatrix.trans.
// BASE2: arith.truncf %{{.*}} : vector<2xf32> to vector<2xf16>
// CHECK: nvgpu.ldmatrix %[[V]][{{.*}}] {numTiles = 4 : i32, transpose = true} : memref<64x24xf16, #gpu.address_space<workgroup>> -> vector<4x2xf16>
// CHECK: nvgpu.mma.sync
// BASE2-NOT: gpu.shuffle
// CHECK: scf.yield
// The checked tiles: from fullEnd to the block's key end, the same state.
// BASE2: %[[FIN:.+]]:12 = scf.for %{{.+}} = %[[FULL]] to %[[KEYEND]] step %c64{{.*}} iter_args(%{{.+}} = %[[ACC]]#0,
// BASE2: arith.cmpi ule
// BASE2: math.fma
// BASE2: scf.yield
// The quad's four partial sums, once per row after the key loops.
// BASE2: gpu.shuffle  xor %[[FIN]]#9, %c1_i32{{.*}} : f32
// BASE2: gpu.shuffle  xor %{{.*}}, %c2_i32{{.*}} : f32
// BASE2: gpu.shuffle  xor %[[FIN]]#11, %c1_i32{{.*}} : f32
// CHECK: memref.store %{{.*}} : memref<2x128x16xf32>
// CHECK-LABEL: func.func @sim_f16(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_mma_0
func.func @sim_f16(%u: tensor<2x128x64xf16>, %e: tensor<2x128x16xf16>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<2x128x64xf16>, tensor<2x128x16xf16> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// -----

// bf16: nvvm.mma.sync on the fragments' 32-bit registers (MLIR 22's
// nvgpu.mma.sync has no bf16 mapping). D = 256, K = 256: 32-key tiles fit
// the 48 KiB of shared memory, 2 blocks per multiprocessor; the training
// forward also writes the log-sum-exp.

// CHECK: gpu.func @similarity_inform_fwd_mma_0
// CHECK-SAME: workgroup(%[[K:.*]] : memref<32x264xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[V:.*]] : memref<32x264xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: nvgpu.ldmatrix %[[K]]
// CHECK: vector.bitcast %{{.*}} : vector<2xbf16> to vector<1xi32>
// CHECK: nvvm.mma.sync A[{{.*}}] B[{{.*}}] C[{{.*}}] {layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, multiplicandAPtxType = #nvvm.mma_type<bf16>, multiplicandBPtxType = #nvvm.mma_type<bf16>, shape = #nvvm.shape<m = 16, n = 8, k = 16>} : (i32, i32, f32) -> !llvm.struct<(f32, f32, f32, f32)>
// CHECK: nvgpu.ldmatrix %[[V]][{{.*}}] {numTiles = 4 : i32, transpose = true}
// CHECK: memref.store %{{.*}} : memref<?x?xf32>
func.func @fwd_bf16(%u: tensor<?x?x256xbf16>, %e: tensor<?x?x256xbf16>) -> (tensor<?x?x256xf32>, tensor<?x?xf32>) {
  %p, %lse = moe.similarity_inform_fwd %u, %e : tensor<?x?x256xbf16>, tensor<?x?x256xbf16> -> tensor<?x?x256xf32>, tensor<?x?xf32>
  return %p, %lse : tensor<?x?x256xf32>, tensor<?x?xf32>
}

// -----

// Where the tensor-core kernel does not apply, the scalar one runs: f32
// operands (exact by default), mixed types, ws (q = u · ws is f32), the fused
// top-k (unless flash-mma-topk: similarity_inform_topk_mma.mlir).

// CHECK-LABEL: func.func @f32_exact(
// CHECK: @moe_kernels::@similarity_inform_{{[0-9]+}}
// CHECK-LABEL: func.func @mixed(
// CHECK: @moe_kernels::@similarity_inform_{{[0-9]+}}
// CHECK-LABEL: func.func @with_ws(
// CHECK: @moe_kernels::@similarity_inform_{{[0-9]+}}
// CHECK-LABEL: func.func @fused_topk(
// CHECK: @moe_kernels::@similarity_inform_topk_{{[0-9]+}}
// CHECK-NOT: _mma_
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
