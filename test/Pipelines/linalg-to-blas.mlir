// RUN: moe-opt %s --split-input-file --moe-linalg-to-blas="blas-min-flops=4096" --cse | FileCheck %s

// A row-major f32 matmul becomes one cblas_sgemm (RowMajor = 101, NoTrans = 111; M, N, K; lda, ldb, ldc from
// the strides; beta = 0 since the fill before it zeroes the output, and the fill is gone).
// CHECK:       func.func private @cblas_sgemm(i32, i32, i32, i32, i32, i32, f32, !llvm.ptr, i32, !llvm.ptr, i32, f32, !llvm.ptr, i32)
// CHECK-LABEL: func.func @plain
// CHECK-NOT:     linalg.
// CHECK-DAG:     %[[ORDER:.*]] = arith.constant 101 : i32
// CHECK-DAG:     %[[NT:.*]] = arith.constant 111 : i32
// CHECK-DAG:     %[[M:.*]] = arith.constant 64 : i32
// CHECK-DAG:     %[[N:.*]] = arith.constant 48 : i32
// CHECK-DAG:     %[[K:.*]] = arith.constant 32 : i32
// CHECK-DAG:     %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-DAG:     %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK:         call @cblas_sgemm(%[[ORDER]], %[[NT]], %[[NT]], %[[M]], %[[N]], %[[K]], %[[ONE]], %{{.*}}, %[[K]], %{{.*}}, %[[N]], %[[ZERO]], %{{.*}}, %[[N]])
func.func @plain(%a: memref<64x32xf32>, %b: memref<32x48xf32>, %c: memref<64x48xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<64x48xf32>)
  linalg.matmul ins(%a, %b : memref<64x32xf32>, memref<32x48xf32>) outs(%c : memref<64x48xf32>)
  return
}

// -----

// A transposed view (unit stride on rows) is passed as Trans (112) with its column stride as leading
// dimension; the output keeps accumulating (beta = 1) and the pointer includes the view's offset.
// CHECK-LABEL: func.func @transposed_b
// CHECK-DAG:     %[[T:.*]] = arith.constant 112 : i32
// CHECK-DAG:     %[[LDB:.*]] = arith.constant 40 : i32
// CHECK-DAG:     %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK:         call @cblas_sgemm(%{{.*}}, %{{.*}}, %[[T]], %{{.*}}, %{{.*}}, %{{.*}}, %[[ONE]], %{{.*}}, %{{.*}}, %{{.*}}, %[[LDB]], %[[ONE]], %{{.*}}, %{{.*}})
func.func @transposed_b(%a: memref<64x32xf32>, %bt: memref<48x40xf32>, %c: memref<64x48xf32>) {
  %view = memref.subview %bt[0, 8] [48, 32] [1, 1] : memref<48x40xf32> to memref<48x32xf32, strided<[40, 1], offset: 8>>
  %b = memref.transpose %view (i, j) -> (j, i) : memref<48x32xf32, strided<[40, 1], offset: 8>> to memref<32x48xf32, strided<[1, 40], offset: 8>>
  linalg.matmul ins(%a, %b : memref<64x32xf32>, memref<32x48xf32, strided<[1, 40], offset: 8>>) outs(%c : memref<64x48xf32>)
  return
}

// -----

// A batch_matmul is a loop of calls, each operand advanced by its batch stride.
// CHECK-LABEL: func.func @batched
// CHECK:         scf.for %[[B:.*]] = %c0 to %c4 step %c1
// CHECK:           arith.muli %[[B]], %c2048
// CHECK:           call @cblas_sgemm
func.func @batched(%a: memref<4x64x32xf32>, %b: memref<4x32x48xf32>, %c: memref<4x64x48xf32>) {
  linalg.batch_matmul ins(%a, %b : memref<4x64x32xf32>, memref<4x32x48xf32>) outs(%c : memref<4x64x48xf32>)
  return
}

// -----

// Left alone: below blas-min-flops, f64, dynamic strides, and a tensor matmul (buffers only).
// CHECK-LABEL: func.func @left_alone
// CHECK-NOT:     cblas_sgemm
// CHECK-COUNT-4: linalg.matmul
func.func @left_alone(%a: memref<8x8xf32>, %c: memref<8x8xf32>, %d: memref<64x64xf64>,
                      %s: memref<64x64xf32, strided<[?, ?]>>, %t: tensor<64x64xf32>) -> tensor<64x64xf32> {
  linalg.matmul ins(%a, %a : memref<8x8xf32>, memref<8x8xf32>) outs(%c : memref<8x8xf32>)
  linalg.matmul ins(%d, %d : memref<64x64xf64>, memref<64x64xf64>) outs(%d : memref<64x64xf64>)
  linalg.matmul ins(%s, %s : memref<64x64xf32, strided<[?, ?]>>, memref<64x64xf32, strided<[?, ?]>>) outs(%s : memref<64x64xf32, strided<[?, ?]>>)
  %r = linalg.matmul ins(%t, %t : tensor<64x64xf32>, tensor<64x64xf32>) outs(%t : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %r : tensor<64x64xf32>
}

// -----

// A thread tile of a matmul marked by moe-dense-tile-and-vectorize goes to BLAS whatever its size.
// CHECK-LABEL: func.func @marked_tile
// CHECK:         call @cblas_sgemm
func.func @marked_tile(%a: memref<8x8xf32>, %c: memref<8x8xf32>) {
  linalg.matmul {moe.blas} ins(%a, %a : memref<8x8xf32>, memref<8x8xf32>) outs(%c : memref<8x8xf32>)
  return
}
