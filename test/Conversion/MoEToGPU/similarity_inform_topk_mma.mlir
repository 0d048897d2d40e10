// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64" -split-input-file | FileCheck %s

// similarity_inform_topk on f16/bf16 operands of one type runs
// the tensor-core kernel (FlashMma.cpp), whose epilogue selects the top k of
// each row from the mma.sync accumulators with the scalar kernel's register
// top-k (emitRegisterTopk). In the C fragments a row's experts are spread over
// the 4 lanes of a quad, lane tig holding columns 8n + 2·tig + {0, 1}: the
// candidates are packed (key, index) pairs at those columns and each round is
// a 4-lane butterfly (offsets 2 and 1, the 64-bit candidate in two 32-bit
// shuffles). Round r's value and index are stored by lane r % 4 when the row
// exists, which then renormalizes its own entries. The thread's two rows (g
// and g + 8) run one after the other (%flash_base64: the kernel of one row
// tile a warp). 17.8x the scalar kernel on the H200 (2026-11-26), where the
// option that kept the scalar kernel, flash-mma-topk=false, lost.

// CHECK-LABEL: gpu.func @similarity_inform_topk_mma_0
// CHECK-SAME: (%{{.+}}: memref<2x128x64xf16>, %{{.+}}: memref<2x128x64xf16>, %{{.+}}: memref<2x128x16xf16>, %[[W:.+]]: memref<2x128x2xf32>, %[[I:.+]]: memref<2x128x2xi32>)
// Two cp.async buffers; 2 blocks a multiprocessor (the epilogue's
// candidates beside the copies in flight spilled under 4 blocks' 128
// registers).
// CHECK-SAME: workgroup(%{{.+}} : memref<128x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.+}} : memref<128x24xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: scf.for
// CHECK: nvgpu.ldmatrix
// CHECK: nvgpu.mma.sync({{.*}}) {mmaShape = [16, 8, 16]} : (vector<4x2xf16>, vector<2x2xf16>, vector<2x2xf32>) -> vector<2x2xf32>
// The softmax's weights: ex2.approx.ftz, no __nv_expf.
// CHECK-NOT: math.exp
// CHECK: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// CHECK: scf.yield
// CHECK: %[[WR:.+]] = memref.collapse_shape %[[W]] {{\[}}[0, 1], [2]] : memref<2x128x2xf32> into memref<256x2xf32>
// CHECK: %[[IR:.+]] = memref.collapse_shape %[[I]] {{\[}}[0, 1], [2]] : memref<2x128x2xi32> into memref<256x2xi32>
// Row g: the lane's columns 2·tig + 0, 1, 8, 9 (K = 16: no padding).
// CHECK: %[[COL:.+]] = arith.muli %{{.+}}, %c2_i32{{.*}} : i32
// CHECK: arith.addi %c0_i32{{.*}}, %[[COL]] : i32
// CHECK: arith.addi %c1_i32{{.*}}, %[[COL]] : i32
// CHECK: arith.addi %c8_i32{{.*}}, %[[COL]] : i32
// CHECK: arith.addi %c9_i32{{.*}}, %[[COL]] : i32
// CHECK-NOT: arith.cmpi slt, %{{.+}}, %c16_i32
// CHECK: scf.for {{.+}} -> (i64, f32, f32) {
// CHECK: gpu.shuffle  xor %{{.+}}, %c2_i32{{.*}} : i32
// CHECK: gpu.shuffle  xor %{{.+}}, %c2_i32{{.*}} : i32
// CHECK: gpu.shuffle  xor %{{.+}}, %c1_i32{{.*}} : i32
// CHECK: gpu.shuffle  xor %{{.+}}, %c1_i32{{.*}} : i32
// CHECK-NOT: gpu.shuffle
// CHECK: scf.if
// CHECK-NEXT: memref.store %{{.+}}, %[[WR]][%{{.+}}, %{{.+}}] : memref<256x2xf32>
// CHECK-NEXT: memref.store %{{.+}}, %[[IR]][%{{.+}}, %{{.+}}] : memref<256x2xi32>
// Renormalization of the lane's own entries.
// CHECK: memref.load %[[WR]]
// CHECK: arith.divf
// CHECK: memref.store %{{.+}}, %[[WR]]
// Row g + 8: the same.
// CHECK: scf.for {{.+}} -> (i64, f32, f32) {
// CHECK-COUNT-4: gpu.shuffle  xor
// CHECK-NOT: gpu.shuffle
// CHECK: memref.store %{{.+}}, %[[WR]]
// CHECK: memref.store %{{.+}}, %[[IR]]
// CHECK: gpu.return
// CHECK-LABEL: func.func @topk_f16(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@similarity_inform_topk_mma_0
func.func @topk_f16(%u: tensor<2x128x64xf16>, %e: tensor<2x128x16xf16>) -> (tensor<2x128x2xf32>, tensor<2x128x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) causal(true) : tensor<2x128x64xf16>, tensor<2x128x16xf16> -> tensor<2x128x2xf32>, tensor<2x128x2xi32>
  return %w, %i : tensor<2x128x2xf32>, tensor<2x128x2xi32>
}

// -----

// bf16 (nvvm.mma.sync on the packed registers), dynamic N, K = 12 padded to 16
// in the tiles, k = K, raw probabilities: the candidates of columns 8 + 2·tig
// and 9 + 2·tig, which reach the padding, are "none" past K = 12 (a padded
// expert is never selected), and the stored values are the weights (no
// renormalization pass).

// CHECK-LABEL: gpu.func @similarity_inform_topk_mma_0
// CHECK-SAME: %[[W:[^:]+]]: memref<?x?x12xf32>, %[[I:[^:]+]]: memref<?x?x12xi32>)
// CHECK-SAME: workgroup(%{{.+}} : memref<128x56xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.+}} : memref<128x24xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: nvvm.mma.sync {{.+}}multiplicandAPtxType = #nvvm.mma_type<bf16>
// CHECK: scf.yield
// CHECK: %[[WR:.+]] = memref.collapse_shape %[[W]] {{\[}}[0, 1], [2]] : memref<?x?x12xf32> into memref<?x12xf32>
// CHECK: %[[COL:.+]] = arith.muli %{{.+}}, %c2_i32{{.*}} : i32
// CHECK-NOT: arith.cmpi slt, %{{.+}}, %c12_i32
// CHECK: %[[C8:.+]] = arith.addi %c8_i32, %[[COL]] : i32
// CHECK: %[[PAD8:.+]] = arith.cmpi slt, %[[C8]], %c12_i32 : i32
// CHECK: arith.select %[[PAD8]], %{{.+}}, %c-9223372036854775808_i64 : i64
// CHECK: %[[C9:.+]] = arith.addi %c9_i32, %[[COL]] : i32
// CHECK: %[[PAD9:.+]] = arith.cmpi slt, %[[C9]], %c12_i32{{.*}} : i32
// CHECK: scf.for {{.+}} -> (i64, f32, f32) {
// CHECK-COUNT-4: gpu.shuffle  xor
// CHECK: memref.store %{{.+}}, %[[WR]][%{{.+}}, %{{.+}}] : memref<?x12xf32>
// CHECK: scf.yield
// CHECK-NOT: memref.load %[[WR]]
// CHECK: gpu.return
func.func @topk_bf16_kK(%u: tensor<?x?x40xbf16>, %e: tensor<?x?x12xbf16>) -> (tensor<?x?x12xf32>, tensor<?x?x12xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(12) renormalize(false) : tensor<?x?x40xbf16>, tensor<?x?x12xbf16> -> tensor<?x?x12xf32>, tensor<?x?x12xi32>
  return %w, %i : tensor<?x?x12xf32>, tensor<?x?x12xi32>
}

// -----

// Where the tensor-core kernel does not apply, the scalar one runs the fused
// op: f32 operands, ws (q = u · ws is f32).

// CHECK-LABEL: func.func @topk_f32(
// CHECK: @moe_kernels::@similarity_inform_topk_{{[0-9]+}}
// CHECK-LABEL: func.func @topk_ws(
// CHECK: @moe_kernels::@similarity_inform_topk_{{[0-9]+}}
// CHECK-NOT: _mma_
func.func @topk_f32(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>) -> (tensor<2x128x2xf32>, tensor<2x128x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x2xf32>, tensor<2x128x2xi32>
  return %w, %i : tensor<2x128x2xf32>, tensor<2x128x2xi32>
}
func.func @topk_ws(%u: tensor<2x128x64xf16>, %e: tensor<2x128x16xf16>, %ws: tensor<64x64xf32>) -> (tensor<2x128x2xf32>, tensor<2x128x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e ws(%ws : tensor<64x64xf32>) k(2) : tensor<2x128x64xf16>, tensor<2x128x16xf16> -> tensor<2x128x2xf32>, tensor<2x128x2xi32>
  return %w, %i : tensor<2x128x2xf32>, tensor<2x128x2xi32>
}
