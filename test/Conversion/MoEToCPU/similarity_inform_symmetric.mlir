// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// similarity_inform without ws and without a causal mask: the logits are symmetric, and the kernel computes each
// pair of 32-row granules once (FlashSymmetric.cpp), with the exact flash kernel as its fallback. The guard:
// N >= 256, the spread of |u|²/2τ over an element's valid keys at most 60, finite values; then the pairs, each
// 8 x 8 block of A accumulated into the rows of R (A) and of J (A^T, a transposed view), and the rows normalized;
// a row sum below 1e-30 with a valid key sends the op to the exact kernel.

// CHECK-LABEL: func.func @plain
// CHECK-DAG: arith.constant 1.000000e-30 : f32
// CHECK-DAG: arith.constant 6.000000e+01 : f32
// CHECK-DAG: %[[MIN_ROWS:.+]] = arith.constant 256 : index
// CHECK: moe.kernel
// The row count first: below 256 rows the set-up covers no batch element (its buffers are empty, its loops run
// zero times), so a decode call pays nothing for the symmetric path.
// CHECK: %[[ENOUGH:.+]] = arith.cmpi uge, %{{.+}}, %[[MIN_ROWS]] : index
// CHECK: %[[SETUP:.+]] = arith.select %[[ENOUGH]], %{{.+}}, %{{.+}} : index
// CHECK: memref.alloc(%[[SETUP]], %{{.+}}) {alignment = 64 : i64} : memref<?x?xf32>
// CHECK: memref.alloc(%[[SETUP]], %{{.+}}, %{{.+}}) {alignment = 64 : i64} : memref<?x?x?xf32>
// CHECK: memref.alloc(%[[SETUP]]) {alignment = 64 : i64} : memref<?x4xf32>
// The norms: |u_j|² / tau / 2, over the same elements.
// CHECK: scf.parallel (%{{.+}}) = (%{{.+}}) to (%{{.+}}) step
// CHECK: vector.fma
// CHECK: vector.reduction <add>
// The guard over the same elements, starting from the row count; then the pairs.
// CHECK: scf.for %{{.+}} = %{{.+}} to %[[SETUP]] step %{{.+}} iter_args(%{{.+}} = %[[ENOUGH]]) -> (i1)
// CHECK: arith.cmpf ole
// CHECK: scf.if %{{.+}} -> (i1)
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?x?x?xf32>
// CHECK: scf.parallel
// CHECK: memref.transpose %{{.+}} (d0, d1) -> (d1, d0)
// CHECK: memref.cast %{{.+}} : memref<8x8xf32, strided<[1, 32], offset: ?>> to memref<8x8xf32, strided<[?, ?], offset: ?>>
// CHECK: arith.select %{{.+}}, %{{.+}}, %{{.+}} : memref<8x8xf32, strided<[?, ?], offset: ?>>
// The rows, then the exact kernel where the path declined or a sum underflowed.
// CHECK: scf.parallel
// CHECK: arith.cmpf ult
// CHECK: scf.if
// CHECK-NOT: memref.transpose
// CHECK: return
func.func @plain(%u: tensor<?x?x64xf32>, %e: tensor<?x?x16xf32>) -> tensor<?x?x16xf32> {
  %p = moe.similarity_inform %u, %e tau(7.000000e-01) causal(false) : tensor<?x?x64xf32>, tensor<?x?x16xf32> -> tensor<?x?x16xf32>
  return %p : tensor<?x?x16xf32>
}

// A causal mask or ws: the logits are not symmetric, the exact kernel alone.
// CHECK-LABEL: func.func @causal
// CHECK-NOT: memref.transpose
// CHECK: return
func.func @causal(%u: tensor<?x?x64xf32>, %e: tensor<?x?x16xf32>) -> tensor<?x?x16xf32> {
  %p = moe.similarity_inform %u, %e tau(7.000000e-01) causal(true) : tensor<?x?x64xf32>, tensor<?x?x16xf32> -> tensor<?x?x16xf32>
  return %p : tensor<?x?x16xf32>
}

// CHECK-LABEL: func.func @with_ws
// CHECK-NOT: memref.transpose
// CHECK: return
func.func @with_ws(%u: tensor<?x?x64xf32>, %e: tensor<?x?x16xf32>, %ws: tensor<64x64xf32>) -> tensor<?x?x16xf32> {
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<64x64xf32>) tau(7.000000e-01) causal(false) : tensor<?x?x64xf32>, tensor<?x?x16xf32> -> tensor<?x?x16xf32>
  return %p : tensor<?x?x16xf32>
}
