// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64" -split-input-file | FileCheck %s

// attention_posterior with u and e f16/bf16 of one type
// runs its mixing on the tensor-core kernel (FlashMma.cpp). The head-means
// kernel writes the means in the operand type (each f32 mean rounded once;
// the bias stays f32, from the f32 means); the mixing kernel adds, in each
// logit's C-fragment element, dot / sigma^2, then the key's bias, then the
// selected head's score (read per element from add viewed [B·H·N, Nk], the
// row's offset computed once), keys past Nk clamped for the loads and -inf.
// 1.7x the scalar kernel on the H200 (2026-11-26), where the option that kept
// the scalar kernel, flash-mma-posterior=false, lost.

// The head means: a block per 8 keys; wo's slice staged transposed in
// shared memory (a warp loads one row's consecutive columns, lane = column),
// then a thread's feature takes one shared load of wo a column for the 8
// keys, whose values come in 16-byte shared loads.
// CHECK-LABEL: gpu.func @attention_head_means_0
// CHECK-SAME: (%[[V:[^:]+]]: memref<2x4x70x16xf16>, %[[WO:[^:]+]]: memref<64x64xf16>, %{{[^:]+}}: memref<2xi32>, %[[M:[^:]+]]: memref<?x?x64xf16>, %[[BIASOUT:[^:]+]]: memref<?x?xf32>)
// CHECK-SAME: workgroup(%[[WOT:[^ ]+]] : memref<32x129xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[VT:[^ ]+]] : memref<32x8xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{[^ ]+}} : memref<4x8xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: %[[LANE:.+]] = arith.remui %thread_id_x, %c32
// A step's staging in two rounds, each issuing its loads (16 rows of wo,
// a key's columns of v) before its stores.
// CHECK: gpu.barrier
// CHECK-COUNT-16: memref.load %[[WO]]
// CHECK-NOT: memref.store
// CHECK: memref.load %[[V]]
// CHECK-NOT: memref.load
// CHECK: memref.store %{{.+}}, %[[WOT]][%[[LANE]], %{{.+}}]
// CHECK-COUNT-16: memref.load %[[WO]]
// CHECK: gpu.barrier
// CHECK: scf.for %[[C:[^ ]+]] = %{{.+}} to %c32
// CHECK-NEXT: memref.load %[[WOT]][%[[C]], %thread_id_x]
// CHECK-NEXT: arith.constant 0 : index
// CHECK-NEXT: vector.load %[[VT]][%[[C]], %{{.+}}] {alignment = 16 : i64} : {{.+}}, vector<4xf32>
// CHECK-COUNT-8: math.fma
// CHECK: %[[MEAN:.+]] = arith.mulf
// CHECK: %[[H:.+]] = arith.truncf %[[MEAN]] : f32 to f16
// CHECK: memref.store %[[H]], %[[M]]
// CHECK: arith.mulf %[[MEAN]], %[[MEAN]] : f32
// CHECK: memref.store %{{.+}}, %[[BIASOUT]]
// CHECK-LABEL: gpu.func @attention_posterior_mma_0
// CHECK-SAME: (%{{.+}}: memref<2x100x64xf16>, %{{.+}}: memref<?x?x64xf16>, %{{.+}}: memref<2x70x16xf16>, %[[BIAS:.+]]: memref<?x?xf32>, %[[ADD:.+]]: memref<2x4x100x70xf16>, %[[HEAD:.+]]: memref<2xi32>, %{{.+}}: memref<2x100x16xf32>)
// Two cp.async buffers of 32 keys.
// CHECK-SAME: workgroup(%{{.+}} : memref<64x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.+}} : memref<64x24xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: nvvm.minctasm = 2
// CHECK: memref.load %[[HEAD]][%{{.+}}] : memref<2xi32>
// CHECK: %[[ROWS:.+]] = memref.collapse_shape %[[ADD]] {{\[}}[0, 1, 2], [3]] : memref<2x4x100x70xf16> into memref<800x70xf16>
// The first logit in log2 units: dot · log2(e)/sigma^2 (4) + (bias[b, j] +
// add[b, h*, row, j]) · log2(e), one FFMA; in the whole tiles of the first
// loop no key is past Nk: no bounds select.
// CHECK: %[[C:.+]] = arith.constant 0.360673755 : f32
// CHECK: %[[FULL:.+]] = arith.muli %{{.+}}, %c32
// 8 accumulators, the ones block of the row sums, (max, sum) x 2.
// CHECK: %[[ACC:.+]]:16 = scf.for %{{.+}} = %c0 to %[[FULL]] step %c32
// CHECK: nvgpu.ldmatrix
// CHECK: nvgpu.mma.sync({{.*}}) {mmaShape = [16, 8, 16]} : (vector<4x2xf16>, vector<2x2xf16>, vector<2x2xf32>) -> vector<2x2xf32>
// CHECK: %[[COL:.+]] = arith.muli %{{.+}}, %c2{{.*}} : index
// CHECK: %[[COL0:.+]] = arith.addi %[[COL]], %c0{{.*}} : index
// CHECK: %[[J:.+]] = arith.addi %{{.+}}, %[[COL0]] : index
// CHECK-NEXT: %[[B:.+]] = memref.load %[[BIAS]][%{{.+}}, %[[J]]] : memref<?x?xf32>
// CHECK-NEXT: %[[A:.+]] = memref.load %[[ROWS]][%{{.+}}, %[[J]]] : memref<800x70xf16>
// CHECK-NEXT: %[[AF:.+]] = arith.extf %[[A]] : f16 to f32
// CHECK-NEXT: %[[T:.+]] = arith.addf %[[B]], %[[AF]] : f32
// CHECK-NEXT: %[[LOG2E:.+]] = arith.constant 1.44269502 : f32
// CHECK-NEXT: %[[T2:.+]] = arith.mulf %[[T]], %[[LOG2E]] : f32
// CHECK-NEXT: %[[X:.+]] = math.fma %{{.+}}, %[[C]], %[[T2]] : f32
// CHECK-NOT: arith.select
// CHECK: gpu.shuffle  xor
// CHECK: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// CHECK: nvgpu.mma.sync
// CHECK: scf.yield
// The last, partial tile: keys past Nk read key 0 and are -inf.
// CHECK: scf.for %{{.+}} = %[[FULL]] to %{{.+}} step %c32{{.*}} iter_args(%{{.+}} = %[[ACC]]#0,
// CHECK: nvgpu.mma.sync({{.*}}) {mmaShape = [16, 8, 16]} : (vector<4x2xf16>, vector<2x2xf16>, vector<2x2xf32>) -> vector<2x2xf32>
// CHECK: %[[COL:.+]] = arith.muli %{{.+}}, %c2{{.*}} : index
// CHECK: %[[COL0:.+]] = arith.addi %[[COL]], %c0{{.*}} : index
// CHECK: %[[J:.+]] = arith.addi %{{.+}}, %[[COL0]] : index
// CHECK: %[[JOK:.+]] = arith.cmpi slt, %[[J]], %[[NK:[^ ]+]] : index
// CHECK: %[[JS:.+]] = arith.select %[[JOK]], %[[J]], %c0 : index
// CHECK: memref.load %[[BIAS]][%{{.+}}, %[[JS]]] : memref<?x?xf32>
// CHECK: %[[X:.+]] = math.fma %{{.+}}, %[[C]], %{{.+}} : f32
// CHECK: %[[KEEP:.+]] = arith.cmpi slt, %[[J]], %[[NK]] : index
// CHECK: arith.select %[[KEEP]], %[[X]], %cst{{.*}} : f32
// CHECK: gpu.shuffle  xor
// CHECK: llvm.call_intrinsic "llvm.nvvm.ex2.approx.ftz.f"
// CHECK: nvgpu.mma.sync
// CHECK: scf.yield
// CHECK: gpu.return
// CHECK-LABEL: func.func @post_f16(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_head_means_0 {{.*}} : memref<?x?x64xf16>, %{{.+}} : memref<?x?xf32>)
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_posterior_mma_0
func.func @post_f16(%s: tensor<2x4x100x70xf16>, %u: tensor<2x100x64xf16>, %v: tensor<2x4x70x16xf16>, %wo: tensor<64x64xf16>, %e: tensor<2x70x16xf16>) -> (tensor<2x100x16xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<2x4x100x70xf16>, tensor<2x100x64xf16>, tensor<2x4x70x16xf16>, tensor<64x64xf16>, tensor<2x70x16xf16> -> tensor<2x100x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x100x16xf32>, tensor<2xi32>
}

// -----

// bf16 (nvvm.mma.sync on the packed registers), dynamic B, N, Nk, D = 40
// padded to 48, f32 scores added to bf16 operands (the score read as is, no
// extension).

// CHECK-LABEL: gpu.func @attention_head_means_0
// CHECK-SAME: memref<?x?x40xbf16>, %{{.+}}: memref<?x?xf32>)
// CHECK: arith.truncf %{{.+}} : f32 to bf16
// CHECK-LABEL: gpu.func @attention_posterior_mma_0
// CHECK-SAME: %[[BIAS:[^:]+]]: memref<?x?xf32>, %[[ADD:[^:]+]]: memref<?x4x?x?xf32>, %{{.+}}: memref<?xi32>
// CHECK-SAME: workgroup(%{{.+}} : memref<64x56xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}
// CHECK: %[[ROWS:.+]] = memref.collapse_shape %[[ADD]] {{\[}}[0, 1, 2], [3]] : memref<?x4x?x?xf32> into memref<?x?xf32>
// CHECK: nvvm.mma.sync {{.+}}multiplicandAPtxType = #nvvm.mma_type<bf16>
// CHECK: memref.load %[[BIAS]]
// CHECK: arith.addf
// CHECK: %[[A:.+]] = memref.load %[[ROWS]][%{{.+}}, %{{.+}}] : memref<?x?xf32>
// CHECK-NEXT: arith.addf %{{.+}}, %[[A]] : f32
func.func @post_bf16(%s: tensor<?x4x?x?xf32>, %u: tensor<?x?x40xbf16>, %v: tensor<?x4x?x8xbf16>, %wo: tensor<40x32xbf16>, %e: tensor<?x?x12xbf16>) -> (tensor<?x?x12xf32>, tensor<?xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(1.500000e+00) head_scale(1.000000e+00) : tensor<?x4x?x?xf32>, tensor<?x?x40xbf16>, tensor<?x4x?x8xbf16>, tensor<40x32xbf16>, tensor<?x?x12xbf16> -> tensor<?x?x12xf32>, tensor<?xi32>
  return %p, %h : tensor<?x?x12xf32>, tensor<?xi32>
}

// -----

// The _topk form: the same logits, the register
// top-k in the epilogue (4-lane butterflies).

// CHECK-LABEL: gpu.func @attention_posterior_topk_mma_0
// CHECK: memref.collapse_shape
// CHECK: nvgpu.mma.sync
// CHECK: memref.load %{{.+}} : memref<?x?xf32>
// CHECK: scf.yield
// CHECK: gpu.shuffle  xor %{{.+}}, %c2_i32{{.*}} : i32
// CHECK-LABEL: func.func @post_topk_f16(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_posterior_topk_mma_0
func.func @post_topk_f16(%s: tensor<2x4x100x70xf16>, %u: tensor<2x100x64xf16>, %v: tensor<2x4x70x16xf16>, %wo: tensor<64x64xf16>, %e: tensor<2x70x16xf16>) -> (tensor<2x100x2xf32>, tensor<2x100x2xi32>, tensor<2xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) sigma(2.000000e+00) : tensor<2x4x100x70xf16>, tensor<2x100x64xf16>, tensor<2x4x70x16xf16>, tensor<64x64xf16>, tensor<2x70x16xf16> -> tensor<2x100x2xf32>, tensor<2x100x2xi32>, tensor<2xi32>
  return %w, %i, %h : tensor<2x100x2xf32>, tensor<2x100x2xi32>, tensor<2xi32>
}

// -----

// f32 stays on the scalar kernel.

// CHECK-LABEL: func.func @post_f32(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_posterior_0
// CHECK-NOT: _mma_
func.func @post_f32(%s: tensor<2x4x50x60xf32>, %u: tensor<2x50x32xf32>, %v: tensor<2x4x60x8xf32>, %wo: tensor<32x32xf32>, %e: tensor<2x60x16xf32>) -> (tensor<2x50x16xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32> -> tensor<2x50x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x50x16xf32>, tensor<2xi32>
}
