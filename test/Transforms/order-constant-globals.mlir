// RUN: moe-opt %s -split-input-file --one-shot-bufferize=bufferize-function-boundaries --moe-order-constant-globals | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-lower-to-llvm > %t.1
// RUN: moe-opt %s -split-input-file --moe-lower-to-llvm > %t.2
// RUN: moe-opt %s -split-input-file --moe-lower-to-llvm > %t.3
// RUN: diff %t.1 %t.2
// RUN: diff %t.1 %t.3

// moe-order-constant-globals: bufferization's constant globals move to the top of the module in the order of their
// first use and take the names __constant_<shape>, __constant_<shape>_0, ... in that order; other globals, and
// constants nobody reads, keep their names and places. (Upstream module bufferization creates them in an order
// that depends on addresses; the RUN lines above lower the modules three times and expect the same text: the
// second module's five functions, each with its own tensor constants, gave a different order of globals almost
// every run before.)

// CHECK-LABEL: module
// CHECK-NEXT: memref.global "private" constant @__constant_2xf32 : memref<2xf32> = dense<[3.000000e+00, 4.000000e+00]>
// CHECK-NEXT: memref.global "private" constant @__constant_3xi32 : memref<3xi32> = dense<[1, 2, 3]>
// CHECK-NEXT: memref.global "private" constant @__constant_2xf32_0 : memref<2xf32> = dense<[1.000000e+00, 2.000000e+00]>
// CHECK-NEXT: memref.global "private" @state : memref<2xf32>
// CHECK-NEXT: memref.global "private" constant @__constant_1xf32 : memref<1xf32> = dense<5.000000e+00>
// CHECK-LABEL: func.func @first
// CHECK: memref.get_global @__constant_2xf32 : memref<2xf32>
// CHECK: memref.get_global @__constant_3xi32 : memref<3xi32>
// CHECK-LABEL: func.func @second
// CHECK: memref.get_global @__constant_2xf32_0 : memref<2xf32>
// CHECK: memref.get_global @__constant_2xf32 : memref<2xf32>
// CHECK: memref.get_global @state
module {
  memref.global "private" @state : memref<2xf32>
  memref.global "private" constant @__constant_2xf32 : memref<2xf32> = dense<[1.0, 2.0]>
  memref.global "private" constant @__constant_1xf32 : memref<1xf32> = dense<5.0>
  memref.global "private" constant @__constant_3xi32 : memref<3xi32> = dense<[1, 2, 3]>
  memref.global "private" constant @__constant_2xf32_0 : memref<2xf32> = dense<[3.0, 4.0]>
  func.func @first() -> (memref<2xf32>, memref<3xi32>) {
    %a = memref.get_global @__constant_2xf32_0 : memref<2xf32>
    %b = memref.get_global @__constant_3xi32 : memref<3xi32>
    return %a, %b : memref<2xf32>, memref<3xi32>
  }
  func.func @second() -> (memref<2xf32>, memref<2xf32>, memref<2xf32>) {
    %a = memref.get_global @__constant_2xf32 : memref<2xf32>
    %b = memref.get_global @__constant_2xf32_0 : memref<2xf32>
    %c = memref.get_global @state : memref<2xf32>
    return %a, %b, %c : memref<2xf32>, memref<2xf32>, memref<2xf32>
  }
}

// -----

// CHECK-LABEL: module
// CHECK-NEXT: memref.global "private" constant @__constant_2xf32 {{.*}} dense<[1.000000e+00, 2.000000e+00]>
// CHECK-NEXT: memref.global "private" constant @__constant_2xf32_0 {{.*}} dense<[3.000000e+00, 4.000000e+00]>
// CHECK-NEXT: memref.global "private" constant @__constant_3xf32
// CHECK-NEXT: memref.global "private" constant @__constant_2x2xf32
// CHECK-NEXT: memref.global "private" constant @__constant_4xi32
func.func @a() -> tensor<2xf32> {
  %c = arith.constant dense<[1.0, 2.0]> : tensor<2xf32>
  return %c : tensor<2xf32>
}
func.func @b() -> tensor<2xf32> {
  %c = arith.constant dense<[3.0, 4.0]> : tensor<2xf32>
  return %c : tensor<2xf32>
}
func.func @c() -> tensor<3xf32> {
  %c = arith.constant dense<[5.0, 6.0, 7.0]> : tensor<3xf32>
  return %c : tensor<3xf32>
}
func.func @d() -> tensor<2x2xf32> {
  %c = arith.constant dense<[[1.0, 0.0], [0.0, 1.0]]> : tensor<2x2xf32>
  return %c : tensor<2x2xf32>
}
func.func @e() -> tensor<4xi32> {
  %c = arith.constant dense<[1, 2, 3, 4]> : tensor<4xi32>
  return %c : tensor<4xi32>
}
