// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s

// The flash-style backward of attention_posterior (AttentionPosteriorGrad.cpp)
// on similarity_inform's backward kernels (FlashGrad.cpp): e with its
// non-finite entries zeroed, the head means of h* (an operand) and their
// bias, the forward's flash kernel recomputing p and the row log-sum-exp,
// flash_grad_stats, then a query-major kernel (dz into d_scores at h*, d_u)
// and a key-major kernel (d_e, Σ dz u, Σ dz), then dm, d_v and d_wo. Every
// output element has one writer (no atomics); nothing N x Nk is allocated
// besides d_scores.

// The query-major kernel: the logit is the scaled dot + the key's bias + the
// score of h* (read through a [B·H·N, Nk] view), a -inf score excludes the
// pair; dz = S (g - delta) is stored at d_scores[b, h*] (0 when excluded),
// dX = dz / sigma² goes into the tile.
// The first kernel also checks h* on its threads b < B (no host sync, no
// launch of its own): an h* outside [0, H) is recorded in the error word (op
// code 4, kMoEErrorAttentionHead), replaced by head 0 in the heads the later
// kernels read, and flagged so that flash_grad_stats gives the rows of its
// batch element lse' = +inf (G = 0: the element is skipped).
// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @attention_grad_finite_e_0(%{{.*}}: memref<2x96x16xf32>, %{{.*}}: memref<2x96x16xf32>, %[[HIN:.*]]: memref<2xi32>, %[[H:.*]]: index, %[[HSAFE:.*]]: memref<2xi32>, %[[SKIP:.*]]: memref<2xi32>, %[[WORD:.*]]: i64)
// CHECK: math.absf
// CHECK: arith.cmpf one
// CHECK: %[[HV:.*]] = memref.load %[[HIN]][%[[BI:.*]]] : memref<2xi32>
// CHECK-NEXT: %[[HI32:.*]] = arith.index_cast %[[H]] : index to i32
// CHECK: %[[GE0:.*]] = arith.cmpi sge, %[[HV]], %{{.*}} : i32
// CHECK-NEXT: %[[LTH:.*]] = arith.cmpi slt, %[[HV]], %[[HI32]] : i32
// CHECK-NEXT: %[[OK:.*]] = arith.andi %[[GE0]], %[[LTH]] : i1
// CHECK: %[[SAFE:.*]] = arith.select %[[OK]], %[[HV]], %c0_i32{{.*}} : i32
// CHECK-NEXT: memref.store %[[SAFE]], %[[HSAFE]][%[[BI]]]
// CHECK: %[[FLAG:.*]] = arith.select %[[OK]], %c0_i32{{.*}}, %c1_i32 : i32
// CHECK-NEXT: memref.store %[[FLAG]], %[[SKIP]][%[[BI]]]
// CHECK: %[[BAD:.*]] = arith.xori %[[OK]], %true : i1
// CHECK-NEXT: scf.if %[[BAD]] {
// CHECK: llvm.inttoptr %[[WORD]]
// CHECK: llvm.cmpxchg
// CHECK: arith.constant 4 : i64
// CHECK: gpu.return
// CHECK: gpu.func @attention_head_means_0(%{{.*}}: memref<2x4x96x16xf32>, %{{.*}}: memref<64x64xf32>, %{{.*}}: memref<2xi32>, %{{.*}}: memref<2x96x64xf32>, %{{.*}}: memref<2x96xf32>)
// CHECK: gpu.func @attention_posterior_grad_mix_0(%{{.*}}: memref<2x128x64xf32>, %{{.*}}: memref<2x96x64xf32>, %{{.*}}: memref<2x96x16xf32>, %{{.*}}: memref<2x96xf32>, %{{.*}}: memref<2x4x128x96xf32>, %{{.*}}: memref<2xi32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x128xf32>)
// CHECK: gpu.func @flash_grad_stats_0(%[[LSE:.*]]: memref<2x128xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x128xf32>, %[[LSEOUT:.*]]: memref<2x128xf32>, %[[SKIPS:.*]]: memref<2xi32>)
// CHECK: %[[NOKEY:.*]] = arith.cmpf oeq, %{{.*}}, %cst : f32
// CHECK: %[[SK:.*]] = memref.load %[[SKIPS]][%block_id_y] : memref<2xi32>
// CHECK-NEXT: %[[ZERO:.*]] = arith.constant 0 : i32
// CHECK-NEXT: %[[SKIPPED:.*]] = arith.cmpi ne, %[[SK]], %[[ZERO]] : i32
// CHECK-NEXT: %[[INF:.*]] = arith.ori %[[NOKEY]], %[[SKIPPED]] : i1
// CHECK-NEXT: %[[PINF:.*]] = arith.constant 0x7F800000 : f32
// CHECK-NEXT: %[[L:.*]] = arith.select %[[INF]], %[[PINF]], %{{.*}} : f32
// CHECK-NEXT: memref.store %[[L]], %[[LSEOUT]]
// CHECK: gpu.func @attention_posterior_grad_dq_0(%{{.*}}: memref<2x128x64xf32>, %{{.*}}: memref<2x96x64xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x96x16xf32>, %{{.*}}: memref<2x128xf32>, %{{.*}}: memref<2x128xf32>, %[[BIAS:.*]]: memref<2x96xf32>, %[[S:.*]]: memref<2x4x128x96xf32>, %[[HEAD:.*]]: memref<2xi32>, %[[DS:.*]]: memref<2x4x128x96xf32>, %{{.*}}: memref<2x96x64xf32>, %[[DU:.*]]: memref<2x128x64xf32>)
// CHECK-SAME: workgroup(%{{.*}} : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<32x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[SS:.*]] : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[DXS:.*]] : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: memref.load %[[HEAD]]
// CHECK: %[[SV:.*]] = memref.collapse_shape %[[S]] {{\[\[}}0, 1, 2], [3]] : memref<2x4x128x96xf32> into memref<1024x96xf32>
// CHECK: %[[DSV:.*]] = memref.collapse_shape %[[DS]] {{\[\[}}0, 1, 2], [3]] : memref<2x4x128x96xf32> into memref<1024x96xf32>
// CHECK-NOT: arith.minui
// CHECK: scf.for
// CHECK: %[[X:.*]] = arith.divf %{{.*}}, %cst{{.*}} : f32
// CHECK-NEXT: %[[B:.*]] = memref.load %[[BIAS]]
// CHECK-NEXT: %[[XB:.*]] = arith.addf %[[X]], %[[B]] : f32
// CHECK-NEXT: %[[ROW:.*]] = arith.addi
// CHECK-NEXT: %[[SC:.*]] = memref.load %[[SV]][%[[ROW]], %{{.*}}] : memref<1024x96xf32>
// CHECK-NEXT: %[[Z:.*]] = arith.addf %[[XB]], %[[SC]] : f32
// CHECK-NEXT: %[[SEEN:.*]] = arith.cmpf une, %[[SC]], %{{.*}} : f32
// CHECK-NEXT: %[[KEEP:.*]] = arith.andi %{{.*}}, %[[SEEN]] : i1
// CHECK-NEXT: %[[ZL:.*]] = arith.subf %[[Z]], %{{.*}} : f32
// CHECK-NEXT: %[[G:.*]] = math.exp %[[ZL]] : f32
// CHECK-NEXT: %[[GD:.*]] = arith.subf
// CHECK-NEXT: %[[DZ:.*]] = arith.mulf %[[G]], %[[GD]] : f32
// CHECK: %[[DX:.*]] = arith.divf %[[DZ]], %{{.*}} : f32
// CHECK: memref.store %{{.*}}, %[[SS]]
// CHECK: memref.store %{{.*}}, %[[DXS]]
// CHECK: scf.if
// CHECK: %[[DZK:.*]] = arith.select %[[KEEP]], %[[DZ]], %{{.*}} : f32
// CHECK-NEXT: memref.store %[[DZK]], %[[DSV]]
// CHECK: memref.store %{{.*}}, %[[DU]]
// CHECK-NOT: memref.atomic_rmw
// CHECK: gpu.return
// The key-major kernel: three accumulators, the last (Σ dz) with no values
// argument: a row sum of the dX tile stored by lane 0 at [b, j, 0].
// CHECK: gpu.func @attention_posterior_grad_dk_0(%{{.*}}: memref<2x96x64xf32>, %{{.*}}: memref<2x128x64xf32>, %{{.*}}: memref<2x96x16xf32>, %{{.*}}: memref<2x128x16xf32>, %{{.*}}: memref<2x128xf32>, %{{.*}}: memref<2x128xf32>, %{{.*}}: memref<2x96xf32>, %{{.*}}: memref<2x4x128x96xf32>, %{{.*}}: memref<2xi32>, %{{.*}}: memref<2x128x16xf32>, %[[DE:.*]]: memref<2x96x16xf32>, %{{.*}}: memref<2x128x64xf32>, %[[DZU:.*]]: memref<2x96x64xf32>, %[[DZSUM:.*]]: memref<2x96x1xf32>)
// CHECK-SAME: workgroup(%{{.*}} : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<32x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[SS:.*]] : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[DXS:.*]] : memref<16x33xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: memref.store %{{.*}}, %[[DE]]
// CHECK: memref.store %{{.*}}, %[[DZU]]
// CHECK: gpu.barrier
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (f32)
// CHECK: memref.load %[[SS]]
// CHECK: memref.load %[[DXS]]
// CHECK: memref.load %[[DZSUM]]
// CHECK: memref.store %{{.*}}, %[[DZSUM]]
// CHECK-NOT: memref.atomic_rmw
// CHECK: gpu.return
// d_e zeroed where e is not finite; dm = c (Σ dz u - Σ dz · m) in place
// (c = H = 4 here); d_v and d_wo each a thread per output entry, the head
// h* read per sequence.
// CHECK: gpu.func @attention_grad_finite_de_0(
// CHECK: gpu.func @attention_grad_dm_0(%{{.*}}: memref<2x96x64xf32>, %{{.*}}: memref<2x96x1xf32>, %{{.*}}: memref<2x96x64xf32>, %{{.*}}: memref<2x4x96x16xf32>)
// CHECK: arith.constant 4.000000e+00 : f32
// CHECK: gpu.func @attention_grad_dv_0(%{{.*}}: memref<2x96x64xf32>, %{{.*}}: memref<64x64xf32>, %{{.*}}: memref<2xi32>, %{{.*}}: memref<2x4x96x16xf32>)
// CHECK-NOT: memref.atomic_rmw
// CHECK: gpu.func @attention_grad_dwo_0(%{{.*}}: memref<2x96x64xf32>, %{{.*}}: memref<2x4x96x16xf32>, %{{.*}}: memref<2xi32>, %{{.*}}: memref<64x64xf32>)
// CHECK-NOT: memref.atomic_rmw
// CHECK: gpu.return
// Host: d_scores (the moe.kernel's first output) is the only [.., N, Nk]
// buffer; it is zeroed before the query-major kernel writes h*'s entries; the
// launches in stream order.
// CHECK-LABEL: func.func @grad(
// CHECK: bufferization.alloc_tensor() : tensor<2x4x128x96xf32>
// CHECK: moe.kernel
// The last block argument of that type is the output (the first is scores).
// CHECK-NEXT: ^bb0(%{{[^)]*}}, %[[DSB:[^:]+]]: memref<2x4x128x96xf32>
// CHECK-NOT: memref<{{.*}}128x96x
// CHECK-NOT: gpu.alloc async {{.*}} : memref<2x4x128x96xf32>
// The checked heads and the skip flags are [B] temporaries; every later
// kernel reads the checked heads, never the operand (%[[HEADB]]). The first
// kernel runs on at least B threads.
// CHECK: %[[SAFEH:.*]], %{{.*}} = gpu.alloc async {{.*}} : memref<2xi32>
// CHECK-NEXT: %[[SKIPF:.*]], %{{.*}} = gpu.alloc async {{.*}} : memref<2xi32>
// CHECK-NEXT: %[[WORDH:.*]] = llvm.call @moeGpuErrorWord()
// CHECK: arith.maxsi
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_grad_finite_e_0 {{.*}} args({{.*}}, %[[HEADB:[^ ]+]] : memref<2xi32>, %{{.*}} : index, %[[SAFEH]] : memref<2xi32>, %[[SKIPF]] : memref<2xi32>, %[[WORDH]] : i64)
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_head_means_0 {{.*}}, %[[SAFEH]] : memref<2xi32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_posterior_grad_mix_0 {{.*}}, %[[SAFEH]] : memref<2xi32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@flash_grad_stats_0 {{.*}}, %[[SKIPF]] : memref<2xi32>)
// CHECK: gpu.memset async {{.*}} %[[DSB]], %{{.*}} : memref<2x4x128x96xf32>, f32
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_posterior_grad_dq_0 {{.*}}, %[[SAFEH]] : memref<2xi32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_posterior_grad_dk_0 {{.*}}, %[[SAFEH]] : memref<2xi32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_grad_finite_de_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_grad_dm_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_grad_dv_0 {{.*}}, %[[SAFEH]] : memref<2xi32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_grad_dwo_0 {{.*}}, %[[SAFEH]] : memref<2xi32>
// CHECK-NOT: gpu.alloc async {{.*}} : memref<2x4x128x96xf32>
// CHECK: return
func.func @grad(%s: tensor<2x4x128x96xf32>, %u: tensor<2x128x64xf32>, %v: tensor<2x4x96x16xf32>,
                %wo: tensor<64x64xf32>, %e: tensor<2x96x16xf32>, %h: tensor<2xi32>,
                %dp: tensor<2x128x16xf32>) -> (tensor<2x4x128x96xf32>, tensor<2x128x64xf32>, tensor<2x4x96x16xf32>, tensor<64x64xf32>, tensor<2x96x16xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<2xi32>)
      dp(%dp : tensor<2x128x16xf32>) sigma(2.000000e+00)
      : tensor<2x4x128x96xf32>, tensor<2x128x64xf32>, tensor<2x4x96x16xf32>, tensor<64x64xf32>, tensor<2x96x16xf32>
      -> tensor<2x4x128x96xf32>, tensor<2x128x64xf32>, tensor<2x4x96x16xf32>, tensor<64x64xf32>, tensor<2x96x16xf32>
  return %ds, %du, %dv, %dwo, %de : tensor<2x4x128x96xf32>, tensor<2x128x64xf32>, tensor<2x4x96x16xf32>, tensor<64x64xf32>, tensor<2x96x16xf32>
}

// -----

// Dynamic B, H, N, Nk (bf16 operands): the head scale is H read on the device
// (sitofp of v's dim 1) in the means and dm kernels; head_scale given is a
// constant.

// CHECK: gpu.func @attention_head_means_0(%[[V:.*]]: memref<?x?x?x8xbf16>
// CHECK: memref.dim %[[V]], %c1
// CHECK: arith.sitofp
// CHECK: gpu.func @attention_grad_dm_0(%{{.*}}: memref<?x?x32xf32>, %{{.*}}: memref<?x?x1xf32>, %{{.*}}: memref<?x?x32xf32>, %[[V2:.*]]: memref<?x?x?x8xbf16>)
// CHECK: memref.dim %[[V2]], %c1
// CHECK: arith.sitofp
// CHECK-LABEL: func.func @grad_dynamic(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_posterior_grad_dq_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@attention_posterior_grad_dk_0
func.func @grad_dynamic(%s: tensor<?x?x?x?xbf16>, %u: tensor<?x?x32xbf16>, %v: tensor<?x?x?x8xbf16>,
                        %wo: tensor<32x?xbf16>, %e: tensor<?x?x24xbf16>, %h: tensor<?xi32>, %dp: tensor<?x?x24xf32>)
    -> (tensor<?x?x?x?xf32>, tensor<?x?x32xf32>, tensor<?x?x?x8xf32>, tensor<32x?xf32>, tensor<?x?x24xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<?xi32>)
      dp(%dp : tensor<?x?x24xf32>)
      : tensor<?x?x?x?xbf16>, tensor<?x?x32xbf16>, tensor<?x?x?x8xbf16>, tensor<32x?xbf16>, tensor<?x?x24xbf16>
      -> tensor<?x?x?x?xf32>, tensor<?x?x32xf32>, tensor<?x?x?x8xf32>, tensor<32x?xf32>, tensor<?x?x24xf32>
  return %ds, %du, %dv, %dwo, %de : tensor<?x?x?x?xf32>, tensor<?x?x32xf32>, tensor<?x?x?x8xf32>, tensor<32x?xf32>, tensor<?x?x24xf32>
}
