// Round trip of moe.kernel (MoEKernelOp.td): print, parse and print again must agree, in the custom form and
// through the generic form (where the implicit moe.kernel_end appears).
// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC

// CHECK-LABEL: func.func @copy
// CHECK:         %[[E:.*]] = tensor.empty(%{{.*}}) : tensor<?xf32>
// CHECK:         %[[R:.*]] = moe.kernel ins(%{{.*}} : tensor<?xf32>) outs(%[[E]] : tensor<?xf32>) {
// CHECK-NEXT:    ^bb0(%[[X:.*]]: memref<?xf32>, %[[O:.*]]: memref<?xf32>):
// CHECK-NEXT:      memref.copy %[[X]], %[[O]] : memref<?xf32> to memref<?xf32>
// CHECK-NEXT:    } -> tensor<?xf32>
// CHECK:         return %[[R]]
// GENERIC-LABEL: sym_name = "copy"
// GENERIC:         "moe.kernel"(%{{.*}}, %{{.*}}) <{operandSegmentSizes = array<i32: 1, 1>}>
// GENERIC:         "moe.kernel_end"() : () -> ()
func.func @copy(%x: tensor<?xf32>, %n: index) -> tensor<?xf32> {
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = moe.kernel ins(%x : tensor<?xf32>) outs(%e : tensor<?xf32>) {
  ^bb0(%xb: memref<?xf32>, %ob: memref<?xf32>):
    memref.copy %xb, %ob : memref<?xf32> to memref<?xf32>
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}

// No ins, two outs of different element types; index values from above are allowed.
// CHECK-LABEL: func.func @outs_only
// CHECK:         %{{.*}}:2 = moe.kernel outs(%{{.*}}, %{{.*}} : tensor<4xf32>, tensor<2x3xi32>) {
// CHECK-NEXT:    ^bb0(%{{.*}}: memref<4xf32>, %{{.*}}: memref<2x3xi32>):
// CHECK:         } -> tensor<4xf32>, tensor<2x3xi32>
func.func @outs_only(%a: tensor<4xf32>, %b: tensor<2x3xi32>, %i: index) -> (tensor<4xf32>, tensor<2x3xi32>) {
  %f = arith.constant 1.0 : f32
  %c = arith.constant 7 : i32
  %r:2 = moe.kernel outs(%a, %b : tensor<4xf32>, tensor<2x3xi32>) {
  ^bb0(%ab: memref<4xf32>, %bb: memref<2x3xi32>):
    linalg.fill ins(%f : f32) outs(%ab : memref<4xf32>)
    linalg.fill ins(%c : i32) outs(%bb : memref<2x3xi32>)
    memref.store %f, %ab[%i] : memref<4xf32>
  } -> tensor<4xf32>, tensor<2x3xi32>
  return %r#0, %r#1 : tensor<4xf32>, tensor<2x3xi32>
}
