// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64" -split-input-file | FileCheck %s

// The tensor-core kernel's row sums come from the tensor cores (issue #47
// item 2; the default since the H200 run of 2026-11-26, which also decided
// the base-2 softmax). P is multiplied by [e | 1]: past the experts'
// accumulator blocks one more block of 4 f32 (12 carried accumulators for
// K = 16, not 8), updated by one more mma.sync per 16 keys whose B operand is
// a constant block of ones (no load); each of its columns is the row's sum of
// the rounded probabilities that enter P.e. No FADD a score, no shuffle of
// the sums, after the loop the sums are read from that block. The rescale of
// the accumulators runs only in a tile where a row max of the warp changed
// (a warp vote: elsewhere every factor is exactly 1). The SIMT interpreter
// runs this kernel against the float64 reference
// (test/GPU/unit/test_flash_mma_simt.py).

// CHECK-LABEL: gpu.func @similarity_inform_mma_0
// CHECK-SAME: workgroup(%[[K:.*]] : memref<128x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[V:.*]] : memref<128x24xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: nvvm.minctasm = 4
// The whole tiles, then the checked ones: 12 accumulators + (max, sum) x 2.
// CHECK: %[[ACC:.+]]:16 = scf.for
// Each row's tile max over the quad (the only shuffles in the loop), then
// its weights, summed nowhere.
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : f32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32{{.*}} : f32
// CHECK: %[[P:.+]] = llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// CHECK-NOT: arith.addf %{{.*}}, %[[P]]
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : f32
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32{{.*}} : f32
// CHECK: %[[P2:.+]] = llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// CHECK-NOT: arith.addf %{{.*}}, %[[P2]]
// CHECK-NOT: gpu.shuffle
// The rescale, only when a row max of the warp changed.
// CHECK: %[[ANY:.+]] = nvvm.vote.sync  any %c-1_i32, %{{.+}} -> i1
// CHECK: scf.if %[[ANY]] -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)
// CHECK: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// CHECK: arith.mulf
// CHECK: } else {
// CHECK-NEXT: scf.yield
// CHECK: %[[ONES:.+]] = arith.constant dense<1.000000e+00> : vector<2x2xf16>
// CHECK: nvgpu.ldmatrix %{{.*}}[{{.*}}] {numTiles = 4 : i32, transpose = true} : memref<64x24xf16
// CHECK: nvgpu.mma.sync
// CHECK: nvgpu.mma.sync
// The sums: P against the ones.
// CHECK: nvgpu.mma.sync(%{{.+}}, %[[ONES]], %{{.+}}) {mmaShape = [16, 8, 16]}
// CHECK-NOT: gpu.shuffle
// CHECK: scf.yield
// The checked tiles (causal diagonal, last), the same body; no quad sums
// after them: the rows' sums are the ones block's elements 0 and 2 (rows g
// and g + 8).
// CHECK: %[[FIN:.+]]:16 = scf.for
// CHECK: nvvm.vote.sync  any
// CHECK-NOT: gpu.shuffle
// CHECK: arith.divf %{{.+}}, %[[FIN]]#8
// CHECK: arith.divf %{{.+}}, %[[FIN]]#10
// CHECK: memref.store %{{.*}} : memref<2x128x16xf32>
// CHECK-LABEL: func.func @sim_f16(
func.func @sim_f16(%u: tensor<2x128x64xf16>, %e: tensor<2x128x16xf16>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<2x128x64xf16>, tensor<2x128x16xf16> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// -----

// Not where the fragments held through the key loop pass 160 registers
// (D = K = 256: 64 of the query, 128 of the accumulators): there the ones
// block's 4 more made the fused top-k spill on sm_80, so each lane sums its
// weights and the quad's sums are added every tile (2 shuffles a row and
// tile, about half an instruction a score beside ~8 HMMA), the rescale every
// tile, no vote. 32 accumulator blocks + (max, sum) x 2 carried.

// CHECK-LABEL: gpu.func @similarity_inform_mma_0
// CHECK-NOT: nvvm.vote.sync
// CHECK-NOT: dense<1.000000e+00> : vector<2x2xbf16>
// CHECK: scf.for %{{.+}} = %c0 to %{{.+}} step %c16{{.*}} iter_args
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : f32
// CHECK-NEXT: arith.maximumf
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32{{.*}} : f32
// CHECK-NEXT: arith.maximumf
// CHECK: %[[P:.+]] = llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// CHECK: gpu.shuffle  xor %{{.*}}, %c1_i32{{.*}} : f32
// CHECK-NEXT: arith.addf
// CHECK: gpu.shuffle  xor %{{.*}}, %c2_i32{{.*}} : f32
// CHECK-NEXT: arith.addf
// CHECK-NOT: nvvm.vote.sync
// CHECK: %[[FIN:.+]]:132 = scf.for
// CHECK-NOT: nvvm.vote.sync
// CHECK-LABEL: func.func @sim_d256(
func.func @sim_d256(%u: tensor<2x64x256xbf16>, %e: tensor<2x64x256xbf16>) -> tensor<2x64x256xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x64x256xbf16>, tensor<2x64x256xbf16> -> tensor<2x64x256xf32>
  return %p : tensor<2x64x256xf32>
}
