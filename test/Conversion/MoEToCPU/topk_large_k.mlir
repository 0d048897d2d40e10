// Compile time does not grow with k: the selection's epilogue (fill, sums, weights) is a loop over 16-lane chunks
// beyond k = 64, and the k rounds are an scf.for, so k = 65536 compiles to LLVM in a fraction of a second (it took
// over 20 s when the epilogue was unrolled in k). The 2 s limit leaves a wide margin for a loaded machine.
// RUN: timeout 2 moe-opt %s --moe-lower-to-llvm -o /dev/null
// RUN: moe-opt %s --convert-moe-to-cpu | FileCheck %s

// CHECK-LABEL: func.func @topk_65536
// The k rounds over the keys in scratch (K = 65536 is too long for registers): the max, the lowest index holding
// it, a scalar knockout store.
// CHECK: scf.for %{{.+}} = %{{.+}} to %c65536{{.*}} step %c1{{.*}} {
// CHECK: vector.reduction <maxsi>, %{{.+}} : vector<16xi32> into i32
// CHECK: vector.reduction <minsi>, %{{.+}} : vector<16xi32> into i32
// CHECK: memref.store %{{.+}}, %{{.+}} : memref<?xi32, strided<[1], offset: ?>>
// The epilogue: Σ exp over the selection, then the weights, each one loop over 4096 chunks of 16 lanes.
// CHECK: scf.for %{{.+}} = %{{.+}} to %c65536{{.*}} step %c16{{.*}} iter_args(%{{.+}} = %{{.+}}) -> (vector<16xf32>)
// CHECK: scf.for %{{.+}} = %{{.+}} to %c65536{{.*}} step %c16
// CHECK: vector.maskedstore
func.func @topk_65536(%x: tensor<1x65536xf32>) -> (tensor<1x65536xf32>, tensor<1x65536xi32>) {
  %w, %i = moe.topk_renorm %x k(65536) : tensor<1x65536xf32> -> tensor<1x65536xf32>, tensor<1x65536xi32>
  return %w, %i : tensor<1x65536xf32>, tensor<1x65536xi32>
}
