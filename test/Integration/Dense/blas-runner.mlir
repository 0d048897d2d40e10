// moe-lower-to-llvm with blas=true through mlir-runner (the library passed with -shared-libs) and the same
// numbers from the generated code (blas=false, two workers) and from plain loops (dense=false).
// RUN: moe-opt %s --moe-lower-to-llvm="blas=true blas-min-flops=1" | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%openblas | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm="blas=false num-threads=2" | mlir-runner -O3 -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%mlir_async_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm="dense=false" | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm="blas=true blas-min-flops=1" | FileCheck %s --check-prefix=CALL

// CALL: llvm.call @cblas_sgemm

// a = [[1, 2, 3], [4, 5, 6]], b = [[1, 0, 2, -1], [0, 1, 1, 2], [3, -2, 0, 1]] (3x4):
// a b = [[10, -4, 4, 6], [22, -7, 13, 12]]; with a batch of two where the second is 2 a b.
// CHECK:      [10,   -4,   4,   6]
// CHECK-NEXT: [22,   -7,   13,   12]
// CHECK:      {{\[}}[10,   -4,   4,   6],
// CHECK-NEXT:  [22,   -7,   13,   12]],
// CHECK-NEXT: {{\[}}[20,   -8,   8,   12],
// CHECK-NEXT:  [44,   -14,   26,   24]]]
func.func @mm(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<2x4xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x4xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x4xf32>) -> tensor<2x4xf32>
  %m = linalg.matmul ins(%a, %b : tensor<2x3xf32>, tensor<3x4xf32>) outs(%f : tensor<2x4xf32>) -> tensor<2x4xf32>
  return %m : tensor<2x4xf32>
}

func.func @bmm(%a: tensor<2x2x3xf32>, %b: tensor<2x3x4xf32>) -> tensor<2x2x4xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x2x4xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
  %m = linalg.batch_matmul ins(%a, %b : tensor<2x2x3xf32>, tensor<2x3x4xf32>) outs(%f : tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
  return %m : tensor<2x2x4xf32>
}

func.func private @printMemrefF32(tensor<*xf32>)

func.func @main() {
  %a = arith.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]> : tensor<2x3xf32>
  %b = arith.constant dense<[[1.0, 0.0, 2.0, -1.0], [0.0, 1.0, 1.0, 2.0], [3.0, -2.0, 0.0, 1.0]]> : tensor<3x4xf32>
  %r = call @mm(%a, %b) : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %ur = tensor.cast %r : tensor<2x4xf32> to tensor<*xf32>
  call @printMemrefF32(%ur) : (tensor<*xf32>) -> ()
  %ba = arith.constant dense<[[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]]> : tensor<2x2x3xf32>
  %bb = arith.constant dense<[[[1.0, 0.0, 2.0, -1.0], [0.0, 1.0, 1.0, 2.0], [3.0, -2.0, 0.0, 1.0]], [[1.0, 0.0, 2.0, -1.0], [0.0, 1.0, 1.0, 2.0], [3.0, -2.0, 0.0, 1.0]]]> : tensor<2x3x4xf32>
  %br = call @bmm(%ba, %bb) : (tensor<2x2x3xf32>, tensor<2x3x4xf32>) -> tensor<2x2x4xf32>
  %ubr = tensor.cast %br : tensor<2x2x4xf32> to tensor<*xf32>
  call @printMemrefF32(%ubr) : (tensor<*xf32>) -> ()
  return
}
