// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// moe.route: blocks of 32 rows go to the workers. Per row: the scores as vector<16xf32> passes (polynomial exp),
// the choice scores (+ bias) as packed vector<8xi64> candidates (the one order of MoE/Kernels/TopK.h), the group
// scores by masked vector maxes (top two per group), topk_group scalar rounds over the group candidates, and the k
// rounds of a vector max over the candidates below the previous pick; the weights over the k picks.

// CHECK-LABEL: func.func @deepseek_v3
// CHECK-SAME: %[[L:[^:]+]]: tensor<?x256xf32>, %[[B:[^:]+]]: tensor<256xf32>
// CHECK-DAG: %[[SCALE:.+]] = arith.constant 2.500000e+00 : f32
// CHECK: %[[R:.+]]:2 = moe.kernel ins(%[[L]], %[[B]] : tensor<?x256xf32>, tensor<256xf32>) outs(%{{.+}}, %{{.+}} : tensor<?x8xf32>, tensor<?x8xi32>)
// CHECK-NEXT: ^bb0(%[[LB:[^:]+]]: memref<?x256xf32>, %[[BB:[^:]+]]: memref<256xf32>, %[[W:[^:]+]]: memref<?x8xf32>, %[[I:[^:]+]]: memref<?x8xi32>):
// Per-worker scratch: scores, candidates, the k weight sources, the 8 group candidates and kept flags.
// CHECK: memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<2x?xf32>
// CHECK: memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<2x?xi64>
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<2x8xf32>
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<2x8xi64>
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<2x8xi32>
// CHECK: scf.parallel
// Sigmoid scores with the polynomial exp (no libm call per lane).
// CHECK-NOT: math.exp
// CHECK: vector.maskedload %[[LB]]{{.*}} : memref<?x256xf32>, vector<16xi1>, vector<16xf32> into vector<16xf32>
// CHECK: math.floor %{{.+}} : vector<16xf32>
// CHECK: arith.divf %{{.+}}, %{{.+}} : vector<16xf32>
// The choice scores: scores + bias, packed.
// CHECK: vector.maskedload %[[BB]]
// CHECK: arith.addf %{{.+}}, %{{.+}} : vector<8xf32>
// CHECK: arith.shli %{{.+}}, %{{.+}} : vector<8xi64>
// Group scores: the best and second best candidate of each group (masked vector maxes), their f32 sum.
// CHECK: scf.for {{.*}} iter_args(%{{.+}} = %{{.+}}) -> (vector<8xi64>)
// CHECK: vector.reduction <maxsi>, %{{.+}} : vector<8xi64> into i64
// CHECK: scf.for {{.*}} iter_args(%{{.+}} = %{{.+}}) -> (vector<8xi64>)
// CHECK: vector.reduction <maxsi>, %{{.+}} : vector<8xi64> into i64
// CHECK: arith.addf %{{.+}}, %{{.+}} : f32
// The top-4 groups: 4 rounds of a scalar max over the 8 group candidates.
// CHECK: scf.for %{{.+}} = %c0 to %c4 step %c1 iter_args(%{{.+}} = %c9223372036854775807_i64) -> (i64)
// CHECK: scf.for %{{.+}} = %c0 to %c8 step %c1 iter_args(%{{.+}} = %c-9223372036854775808_i64) -> (i64)
// The k = 8 rounds over the candidates.
// CHECK: scf.for %{{.+}} = %c0 to %c8 step %c1 iter_args(%{{.+}} = %c9223372036854775807_i64) -> (i64)
// CHECK: arith.cmpi slt, %{{.+}}, %{{.+}} : vector<8xi64>
// CHECK: vector.reduction <maxsi>
// CHECK: memref.store %{{.+}}, %[[I]]
// Renormalize (a zero sum gives zeros), scale by 2.5, store.
// CHECK: arith.cmpf oeq
// CHECK: arith.mulf %{{.+}}, %[[SCALE]] : f32
// CHECK: memref.store %{{.+}}, %[[W]]
// CHECK: } -> tensor<?x8xf32>, tensor<?x8xi32>
// CHECK: return %[[R]]#0, %[[R]]#1
// CHECK-NOT: moe.route
func.func @deepseek_v3(%l: tensor<?x256xf32>, %b: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4)
      renormalize(true) routed_scaling_factor(2.5) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// gpt-oss: the choice is on the raw logits (no scoring pass, no group step), the softmax over the k picks.
// CHECK-LABEL: func.func @gpt_oss
// CHECK: scf.parallel
// CHECK-NOT: vector<16xf32>
// CHECK: arith.shli %{{.+}}, %{{.+}} : vector<8xi64>
// CHECK: scf.for %{{.+}} = %c0 to %c4 step %c1 iter_args(%{{.+}} = %c9223372036854775807_i64) -> (i64)
// CHECK: arith.maximumf %{{.+}}, %{{.+}} : f32
// CHECK: math.floor %{{.+}} : f32
// CHECK-NOT: moe.route
func.func @gpt_oss(%l: tensor<?x128xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.route %l k(4) order(topk_then_score) : tensor<?x128xbf16> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}
