// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s --check-prefix=NO-EXP

// attention_posterior_grad, head_select = min_entropy: the flash-style backward at the forward's head h* (an
// operand). The forward's head means of h* (tiled transposed keys) and the forward kernel recompute p and the row
// log-sum-exp; d_scores is zeroed, then two tiled passes (FlashGrad.cpp) stream the posterior tiles from the
// log-sum-exp, query-major (d_u; the posterior weights G written into d_scores[b, h*]); then key-major over that G
// (KeyMajorSums: dz = G (<dp_i, e_j> - delta_i) over G, d_e, Σ dz u, Σ dz, no logit recomputed), then dm, d_v
// and d_wo per key / per block of rows of wo. The only N x Nk buffer is the result d_scores. An h* outside [0, H) is reported first (moeReportIndexError, op code 4), read as head 0 by
// the passes and its batch element skipped (lse' = +inf on its rows: every G, so every gradient of it, is 0).

// CHECK-LABEL: func.func @min_entropy
// CHECK-SAME: %[[HT:[^:]+]]: tensor<2xi32>, %{{[^:]+}}: tensor<2x40x5xf32>)
// The check of h* against H = 4 (the portable lowering's, on the tensor), before the kernel.
// CHECK-DAG: %[[PINF:.+]] = arith.constant 0x7F800000 : f32
// CHECK-DAG: %[[BOUND:.+]] = arith.index_cast %c4 : index to i64
// CHECK: scf.for
// CHECK: tensor.extract %[[HT]]
// CHECK: func.call @moeReportIndexError(%c4_i32, %{{.+}}, %{{.+}}, %[[BOUND]])
// One kernel; the five gradients are its outs, d_scores the first.
// CHECK: moe.kernel ins({{.*}}) outs({{.*}} : tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<{{[0-9x]+}}xf32>, tensor<2x36x{{[0-9]+}}xf32>)
// CHECK-NEXT: ^bb0({{.*}}, %[[HB:[^:]+]]: memref<2xi32>, %{{[^:]+}}: memref<2x40x5xf32>, %[[DS:[^:]+]]: memref<2x4x40x36xf32>, %{{[^:]+}}: memref<2x40x12xf32>,
// The heads the passes read: h*, or 0 where it is out of range.
// CHECK: %[[SAFE:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?xi32>
// CHECK: %[[HV:.+]] = memref.load %[[HB]]
// CHECK: %[[OK:.+]] = arith.andi
// CHECK: %[[SEL:.+]] = arith.select %[[OK]], %[[HV]], %c0_i32 : i32
// CHECK-NEXT: memref.store %[[SEL]], %[[SAFE]]
// The head means of h* in the flash layout [B, tiles, D, 32] and their norms; the recomputed forward writes the
// log-sum-exp [B, N] ...
// CHECK-NOT: memref.load %[[HB]]
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?x?x32xf32>
// CHECK: memref.alloc(%{{[a-z_0-9]+}}, %{{[a-z_0-9]+}}) {alignment = 64 : i64} : memref<?x?xf32>
// The head means read the checked heads, never the operand.
// CHECK-NOT: memref.load %[[HB]]
// CHECK: memref.load %[[SAFE]]
// CHECK: scf.parallel
// CHECK: %[[LSE:[a-z_0-9]+]] = memref.alloc(%{{[a-z_0-9]+}}, %{{[a-z_0-9]+}}) {alignment = 64 : i64} : memref<?x?xf32>
// CHECK: scf.parallel
// CHECK: memref.store %{{.+}}, %[[LSE]][
// ... which becomes lse' (+inf without keys) and delta = <dp_i, p_i> ...
// CHECK: %[[LSEP:[a-z_0-9]+]] = memref.alloc(%{{[a-z_0-9]+}}, %{{[a-z_0-9]+}}) {alignment = 64 : i64} : memref<?x?xf32>
// CHECK: memref.load %[[LSE]][
// ... and +inf on every row of a batch element whose h* is out of range.
// CHECK: memref.load %[[HB]]
// CHECK: %[[BAD:.+]] = arith.xori %{{.+}}, %true : i1
// CHECK-NEXT: scf.if %[[BAD]] {
// CHECK-NEXT: scf.for
// CHECK-NEXT: memref.store %[[PINF]], %[[LSEP]]
// The result d_scores [B, H, N, Nk], zeroed on its own workers ...
// CHECK: scf.parallel
// ... then the query-major pass: dot tiles, G stored into d_scores at h*.
// CHECK: scf.parallel
// CHECK: vector.fma {{.*}} : vector<16xf32>
// CHECK: math.floor
// CHECK: vector.maskedstore %[[DS]][
// The key-major pass reads G back from d_scores (the rows ahead prefetched, for writing), dots <dp_i, e_j> for
// the tile's keys and writes dz over G, whole vectors or the ragged last tile; it recomputes no logit: no exp
// (its range reduction, math.floor, marks one) from there to the results.
// CHECK: memref.prefetch %[[DS]][{{.*}}], write, locality<3>, data
// CHECK: vector.maskedload %[[DS]][
// CHECK: vector.fma {{.*}} : vector<16xf32>
// CHECK: vector.store %{{.+}}, %[[DS]][
// CHECK: vector.maskedstore %[[DS]][
// CHECK-NOT: math.floor
// The five results.
// CHECK: } -> tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>,
// CHECK-NOT: memref.load %[[HB]]
// CHECK: return %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
// NO-EXP-NOT: math.exp
// NO-EXP-LABEL: func.func @all_heads
func.func @min_entropy(%s: tensor<2x4x40x36xf32>, %u: tensor<2x40x12xf32>, %v: tensor<2x4x36x3xf32>,
    %wo: tensor<12x12xf32>, %e: tensor<2x36x5xf32>, %h: tensor<2xi32>, %dp: tensor<2x40x5xf32>)
    -> (tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<2xi32>)
      dp(%dp : tensor<2x40x5xf32>) sigma(2.0)
      : tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
      -> tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
  return %ds, %du, %dv, %dwo, %de
      : tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
}

// head_select = all has no fast kernel (nor has its forward): the op is left to the portable lowering.
// CHECK-LABEL: func.func @all_heads
// CHECK: moe.attention_posterior_grad {{.*}} head_select(all)
func.func @all_heads(%s: tensor<2x4x40x36xf32>, %u: tensor<2x40x12xf32>, %v: tensor<2x4x36x3xf32>,
    %wo: tensor<12x12xf32>, %e: tensor<2x36x5xf32>, %dp: tensor<2x40x5xf32>) -> tensor<2x40x12xf32> {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e dp(%dp : tensor<2x40x5xf32>)
      head_select(all)
      : tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
      -> tensor<2x4x40x36xf32>, tensor<2x40x12xf32>, tensor<2x4x36x3xf32>, tensor<12x12xf32>, tensor<2x36x5xf32>
  return %du : tensor<2x40x12xf32>
}
