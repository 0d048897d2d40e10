// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// topk_renorm: blocks of 32 rows go to the workers. Per row, every score becomes an i64 candidate
// (ordered key << 32 | INT32_MAX - index: the one order of MoE/Kernels/TopK.h, NaN first, ties to the lowest
// index), stored in per-worker scratch; each of the k rounds (an scf.for, never unrolled) is a vector<8xi64> max
// over the candidates strictly below the previous pick. The weights are vector<16xf32> epilogues over the
// selection, unrolled up to k = 64 and a loop beyond (topk_large_k.mlir).

// CHECK-LABEL: func.func @logits_renormalize
// CHECK-SAME: %[[S:[^:]+]]: tensor<?x64xf32>
// CHECK: %[[SB:.+]] = bufferization.to_buffer %[[S]] read_only
// CHECK: %[[W:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?x8xf32>
// CHECK: %[[I:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?x8xi32>
// CHECK: memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<2x?xi64>
// CHECK: memref.alloc() {alignment = 64 : i64} : memref<2x16xf32>
// CHECK: scf.parallel
// The candidates: key (-0 canonicalized by + 0, negative floats' magnitude flipped, NaN on top) and index.
// CHECK: vector.maskedload %[[SB]]{{.*}} : memref<?x64xf32>, vector<8xi1>, vector<8xf32> into vector<8xf32>
// CHECK: arith.addf %{{.+}}, %{{.+}} : vector<8xf32>
// CHECK: arith.bitcast %{{.+}} : vector<8xf32> to vector<8xi32>
// CHECK: arith.cmpf uno, %{{.+}}, %{{.+}} : vector<8xf32>
// CHECK: arith.shli %{{.+}}, %{{.+}} : vector<8xi64>
// CHECK: vector.store %{{.+}}, %{{.+}} : memref<?xi64, strided<[1], offset: ?>>, vector<8xi64>
// The k rounds.
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %c9223372036854775807_i64) -> (i64)
// CHECK: arith.cmpi slt, %{{.+}}, %{{.+}} : vector<8xi64>
// CHECK: arith.maxsi %{{.+}}, %{{.+}} : vector<8xi64>
// CHECK: vector.reduction <maxsi>, %{{.+}} : vector<8xi64> into i64
// CHECK: memref.store %{{.+}}, %[[I]]
// Softmax over the selection (its max is the first pick) with the polynomial exp; a -inf row gives zeros.
// CHECK-NOT: math.exp
// CHECK: math.floor %{{.+}} : vector<16xf32>
// CHECK: vector.reduction <add>
// CHECK: arith.divf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK: arith.cmpf oeq
// CHECK: vector.maskedstore %[[W]]
// CHECK: %[[WT:.+]] = bufferization.to_tensor %[[W]] restrict writable
// CHECK: %[[IT:.+]] = bufferization.to_tensor %[[I]] restrict writable
// CHECK: return %[[WT]], %[[IT]]
func.func @logits_renormalize(%s: tensor<?x64xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x64xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// renormalize(false): the dense softmax of the row read at the selection (row max, then Σ exp over the row).
// CHECK-LABEL: func.func @logits_dense
// CHECK: vector.reduction <maxsi>
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
// CHECK: arith.extf %{{.+}} : vector<8xf16> to vector<8xf32>
// CHECK: vector.reduction <maxsi>
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
// CHECK: vector.reduction <maxsi>
// CHECK: scf.for %{{.+}} = %{{.+}} to %c112{{.*}} step %c16{{.*}} iter_args(%{{.+}} = %{{.+}}) -> (vector<16xf32>)
// CHECK: scf.for %{{.+}} = %{{.+}} to %c112{{.*}} step %c16
// CHECK: vector.maskedstore
func.func @large_k(%s: tensor<4x128xf32>) -> (tensor<4x100xf32>, tensor<4x100xi32>) {
  %w, %i = moe.topk_renorm %s k(100) : tensor<4x128xf32> -> tensor<4x100xf32>, tensor<4x100xi32>
  return %w, %i : tensor<4x100xf32>, tensor<4x100xi32>
}
