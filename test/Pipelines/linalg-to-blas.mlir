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

// -----

// The importer's expert einsum `td,edf->etf`: a contraction generic whose batch loop (e) A does not read. One
// call per expert; A's batch stride is 0 (the same tokens for every expert), B's and C's are one matrix each.
// CHECK-LABEL: func.func @broadcast_a_generic
// CHECK-DAG:     %[[NT:.*]] = arith.constant 111 : i32
// CHECK-DAG:     %[[M:.*]] = arith.constant 64 : i32
// CHECK-DAG:     %[[N:.*]] = arith.constant 48 : i32
// CHECK-DAG:     %[[K:.*]] = arith.constant 32 : i32
// CHECK:         scf.for %[[E:.*]] = %c0 to %c4 step %c1
// CHECK-NOT:       arith.muli %[[E]], %c0
// CHECK:           arith.muli %[[E]], %c1536
// CHECK:           arith.muli %[[E]], %c3072
// CHECK:           call @cblas_sgemm(%{{.*}}, %[[NT]], %[[NT]], %[[M]], %[[N]], %[[K]], %{{.*}}, %{{.*}}, %[[K]], %{{.*}}, %[[N]], %{{.*}}, %{{.*}}, %[[N]])
// CHECK-NOT:     linalg.generic
func.func @broadcast_a_generic(%u: memref<64x32xf32>, %w: memref<4x32x48xf32>, %y: memref<4x64x48xf32>) {
  linalg.generic {indexing_maps = [affine_map<(e, t, f, d) -> (t, d)>, affine_map<(e, t, f, d) -> (e, d, f)>,
                                   affine_map<(e, t, f, d) -> (e, t, f)>],
                  iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%u, %w : memref<64x32xf32>, memref<4x32x48xf32>) outs(%y : memref<4x64x48xf32>) {
  ^bb0(%x: f32, %v: f32, %acc: f32):
    %p = arith.mulf %x, %v : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Attention scores `q · kᵀ` over [1, H, N, Dh]: a unit loop is ignored, the head loop is the batch, and k's
// transposed layout (unit stride along Dh) is passed as Trans with its row stride as leading dimension.
// CHECK-LABEL: func.func @attention_scores_generic
// CHECK-DAG:     %[[T:.*]] = arith.constant 112 : i32
// CHECK-DAG:     %[[NT:.*]] = arith.constant 111 : i32
// CHECK-DAG:     %[[N:.*]] = arith.constant 64 : i32
// CHECK-DAG:     %[[DH:.*]] = arith.constant 16 : i32
// CHECK:         scf.for %{{.*}} = %c0 to %c2 step %c1
// CHECK:           call @cblas_sgemm(%{{.*}}, %[[NT]], %[[T]], %[[N]], %[[N]], %[[DH]], %{{.*}}, %{{.*}}, %[[DH]], %{{.*}}, %[[DH]], %{{.*}}, %{{.*}}, %[[N]])
func.func @attention_scores_generic(%q: memref<1x2x64x16xf32>, %k: memref<1x2x64x16xf32>, %s: memref<1x2x64x64xf32>) {
  linalg.generic {indexing_maps = [affine_map<(b, h, i, j, d) -> (b, h, i, d)>, affine_map<(b, h, i, j, d) -> (b, h, j, d)>,
                                   affine_map<(b, h, i, j, d) -> (b, h, i, j)>],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%q, %k : memref<1x2x64x16xf32>, memref<1x2x64x16xf32>) outs(%s : memref<1x2x64x64xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %r = arith.addf %acc, %p : f32
    linalg.yield %r : f32
  }
  return
}

// -----

// Not one GEMM per batch element, left to the loops: the gate combine `te,etd->td` (no m loop: t is read by
// both operands), two batch loops of size > 1, and a body that is not a multiply-add.
// CHECK-LABEL: func.func @not_gemms
// CHECK-NOT:     cblas_sgemm
// CHECK-COUNT-3: linalg.generic
func.func @not_gemms(%g: memref<64x4xf32>, %y: memref<4x64x48xf32>, %out: memref<64x48xf32>,
                     %a: memref<2x3x64x32xf32>, %b: memref<2x3x32x48xf32>, %c: memref<2x3x64x48xf32>,
                     %u: memref<64x32xf32>, %w: memref<32x48xf32>, %o: memref<64x48xf32>) {
  linalg.generic {indexing_maps = [affine_map<(t, d, e) -> (t, e)>, affine_map<(t, d, e) -> (e, t, d)>,
                                   affine_map<(t, d, e) -> (t, d)>],
                  iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%g, %y : memref<64x4xf32>, memref<4x64x48xf32>) outs(%out : memref<64x48xf32>) {
  ^bb0(%x: f32, %v: f32, %acc: f32):
    %p = arith.mulf %x, %v : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [affine_map<(p, q, m, n, k) -> (p, q, m, k)>, affine_map<(p, q, m, n, k) -> (p, q, k, n)>,
                                   affine_map<(p, q, m, n, k) -> (p, q, m, n)>],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%a, %b : memref<2x3x64x32xf32>, memref<2x3x32x48xf32>) outs(%c : memref<2x3x64x48xf32>) {
  ^bb0(%x: f32, %v: f32, %acc: f32):
    %p = arith.mulf %x, %v : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (k, n)>,
                                   affine_map<(m, n, k) -> (m, n)>],
                  iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%u, %w : memref<64x32xf32>, memref<32x48xf32>) outs(%o : memref<64x48xf32>) {
  ^bb0(%x: f32, %v: f32, %acc: f32):
    %p = arith.mulf %x, %v : f32
    %s = arith.maximumf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
