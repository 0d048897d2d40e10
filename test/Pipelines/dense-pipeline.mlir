// The dense strategy inside moe-lower-to-llvm: after moe-dense-lower-vectors the matmul is a loop of FMAs on
// 32-wide vectors (the k loop of an 8x32 register tile; no scalar multiply-add is left), spread over the
// workers by scf.parallel; with blas=true it is a cblas_sgemm call per thread tile instead; with dense=false
// it is the scalar loop nest of convert-linalg-to-loops.
// RUN: moe-opt %s --moe-lower-to-llvm="num-threads=2" --mlir-print-ir-after=moe-dense-lower-vectors -o /dev/null 2>&1 \
// RUN:   | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm="num-threads=2 blas=true" | FileCheck %s --check-prefix=BLAS
// RUN: moe-opt %s --moe-lower-to-llvm="num-threads=2 blas=false" | FileCheck %s --check-prefix=NOBLAS
// RUN: moe-opt %s --moe-lower-to-llvm="num-threads=1 dense=false" --mlir-print-ir-after=convert-linalg-to-loops \
// RUN:   -o /dev/null 2>&1 | FileCheck %s --check-prefix=LOOPS

// CHECK-LABEL: func.func @mm
// CHECK:         scf.parallel
// CHECK:           scf.for
// CHECK:             scf.for
// CHECK:               scf.for {{.*}} -> (vector<8x32xf32>)
// CHECK-COUNT-8:         vector.fma {{.*}} : vector<32xf32>
// CHECK-NOT:             arith.mulf {{.*}} : f32
// CHECK:                 scf.yield {{.*}} : vector<8x32xf32>
// CHECK-NOT:     linalg.matmul

// BLAS: llvm.func @cblas_sgemm
// BLAS: llvm.call @cblas_sgemm
// NOBLAS-NOT: cblas_sgemm

// LOOPS-LABEL: func.func @mm
// LOOPS:         scf.for
// LOOPS:           scf.for
// LOOPS:             scf.for
// LOOPS:               arith.mulf {{.*}} : f32
func.func @mm(%a: tensor<512x256xf32>, %b: tensor<256x128xf32>) -> tensor<512x128xf32> {
  %c0 = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<512x128xf32>
  %f = linalg.fill ins(%c0 : f32) outs(%e : tensor<512x128xf32>) -> tensor<512x128xf32>
  %m = linalg.matmul ins(%a, %b : tensor<512x256xf32>, tensor<256x128xf32>) outs(%f : tensor<512x128xf32>) -> tensor<512x128xf32>
  return %m : tensor<512x128xf32>
}
