// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s --check-prefix=NO-I64
// RUN: moe-opt %s --convert-moe-to-cpu="num-threads=2 vector-bits=256" | FileCheck %s --check-prefix=NO-I64

// topk_renorm: blocks of 32 rows go to the workers. Per row, every score becomes an i32 ordered key (MoE/Kernels/
// TopK.h: -0 canonicalized by + 0, negative floats' magnitude flipped, NaN on top); each of the k rounds (an
// scf.for, never unrolled) takes the largest key (maxsi, then a butterfly of shuffles that leaves it in every
// lane), the lowest index holding it (a max of INT32_MAX - index over the matching lanes: and, no select) and
// knocks that entry out (a scalar store of INT32_MIN). No i64 anywhere: AVX2 has no 64-bit max. The keys live in
// per-worker scratch; a static K of at most 64 vectors runs up to 8 rows' rounds interleaved (a round is one long
// dependency chain), its chunk loops unrolled; a dynamic or long row runs chunk loops. The weights are vector<16xf32> epilogues over the selection, unrolled up to
// k = 64 and a loop beyond (topk_large_k.mlir).

// NO-I64-NOT: vector<{{[0-9]+}}xi64>

// K = 64 = 4 vectors: 8 rows together (32 key vectors, in the worker's scratch).
// CHECK-LABEL: func.func @logits_renormalize
// CHECK-SAME: %[[S:[^:]+]]: tensor<?x64xf32>
// The weights and indices are the kernel's outs (tensor.empty destinations; one-shot bufferization allocates them).
// CHECK-DAG: %[[WE:.+]] = tensor.empty(%{{.+}}) : tensor<?x8xf32>
// CHECK-DAG: %[[IE:.+]] = tensor.empty(%{{.+}}) : tensor<?x8xi32>
// CHECK: %[[R:.+]]:2 = moe.kernel ins(%[[S]] : tensor<?x64xf32>) outs(%[[WE]], %[[IE]] : tensor<?x8xf32>, tensor<?x8xi32>)
// CHECK-NEXT: ^bb0(%[[SB:[^:]+]]: memref<?x64xf32>, %[[W:[^:]+]]: memref<?x8xf32>, %[[I:[^:]+]]: memref<?x8xi32>):
// CHECK: %[[KEYS:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<2x?xi32>
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<2x8x16xf32>
// CHECK: scf.parallel
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c8
// The keys: whole vectors, plain loads.
// CHECK-NOT: vector.maskedload
// CHECK: vector.load %[[SB]]{{.*}} : memref<?x64xf32>, vector<16xf32>
// CHECK: arith.addf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK: arith.bitcast %{{.+}} : vector<16xf32> to vector<16xi32>
// CHECK: arith.cmpf uno, %{{.+}}, %{{.+}} : vector<16xf32>
// The k rounds.
// CHECK: scf.for %{{.+}} = %c0 to %c8 step %c1 {
// CHECK: vector.load %{{.+}} : memref<?xi32, strided<[1], offset: ?>>, vector<16xi32>
// CHECK: arith.maxsi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: vector.shuffle %{{.+}}, %{{.+}} [8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7] : vector<16xi32>, vector<16xi32>
// CHECK: arith.maxsi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: arith.cmpi eq, %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: arith.andi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: %[[IX:.+]] = vector.extract %{{.+}}[0] : i32 from vector<16xi32>
// CHECK: memref.store %[[IX]], %[[I]]
// The knockout.
// CHECK: memref.store %c-2147483648_i32, %{{.+}}[%{{.+}}] : memref<?xi32, strided<[1], offset: ?>>
// Softmax over the selection (its max is the first pick) with the polynomial exp; a -inf row gives zeros.
// CHECK-NOT: math.exp
// CHECK: math.floor %{{.+}} : vector<16xf32>
// CHECK: vector.reduction <add>
// CHECK: arith.divf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK: arith.cmpf oeq
// CHECK: vector.maskedstore %[[W]]
// CHECK: } -> tensor<?x8xf32>, tensor<?x8xi32>
// CHECK: return %[[R]]#0, %[[R]]#1
func.func @logits_renormalize(%s: tensor<?x64xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// renormalize(false): the dense softmax of the row read at the selection (row max, then Σ exp over the row).
// CHECK-LABEL: func.func @logits_dense
// CHECK: arith.maxsi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: scf.for {{.*}} -> (vector<16xf32>)
// CHECK: arith.maximumf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK: vector.reduction <maximumf>
// CHECK: scf.for {{.*}} -> (vector<16xf32>)
// CHECK: math.floor
// CHECK: vector.reduction <add>
// CHECK: vector.maskedstore
func.func @logits_dense(%s: tensor<16x100xf32>) -> (tensor<16x4xf32>, tensor<16x4xi32>) {
  %w, %i = moe.topk_renorm %s k(4) renormalize(false) : tensor<16x100xf32> -> tensor<16x4xf32>, tensor<16x4xi32>
  return %w, %i : tensor<16x4xf32>, tensor<16x4xi32>
}

// Probabilities, f16 scores widened to f32, rank 3 (rows collapsed): no exp, v / Σ v.
// CHECK-LABEL: func.func @probs_f16_rank3
// CHECK: memref.collapse_shape %{{.+}} {{\[}}[0, 1], [2]] : memref<2x8x32xf16> into memref<16x32xf16>
// CHECK: arith.extf %{{.+}} : vector<16xf16> to vector<16xf32>
// CHECK: arith.maxsi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK-NOT: math.floor
// CHECK: vector.reduction <add>
// CHECK: arith.divf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK: vector.maskedstore
func.func @probs_f16_rank3(%s: tensor<2x8x32xf16>) -> (tensor<2x8x2xf32>, tensor<2x8x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) mode(probs) : tensor<2x8x32xf16> -> tensor<2x8x2xf32>, tensor<2x8x2xi32>
  return %w, %i : tensor<2x8x2xf32>, tensor<2x8x2xi32>
}

// k = 100 > 64: the epilogue loops over the 7 chunks of 16 lanes instead of unrolling them.
// CHECK-LABEL: func.func @large_k
// CHECK: arith.maxsi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: scf.for %{{.+}} = %{{.+}} to %c112{{.*}} step %c16{{.*}} iter_args(%{{.+}} = %{{.+}}) -> (vector<16xf32>)
// CHECK: scf.for %{{.+}} = %{{.+}} to %c112{{.*}} step %c16
// CHECK: vector.maskedstore
func.func @large_k(%s: tensor<4x128xf32>) -> (tensor<4x100xf32>, tensor<4x100xi32>) {
  %w, %i = moe.topk_renorm %s k(100) : tensor<4x128xf32> -> tensor<4x100xf32>, tensor<4x100xi32>
  return %w, %i : tensor<4x100xf32>, tensor<4x100xi32>
}
