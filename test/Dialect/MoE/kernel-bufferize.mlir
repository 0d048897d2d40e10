// One-shot bufferization of moe.kernel (KernelOpBufferize.cpp): the body is inlined on the operands' buffers.
// As in the pipelines (MoE/Pipelines/Bufferize.h): across functions, identity layouts at the boundaries.
// RUN: moe-opt %s --one-shot-bufferize="bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map" \
// RUN:   | FileCheck %s
// Without function boundaries: the function arguments' buffers have unknown layouts, so the ins are copied into
// identity-layout buffers (never cast: a strided buffer passed as a contiguous one would be read wrongly).
// RUN: moe-opt %s --one-shot-bufferize | FileCheck %s --check-prefix=LOCAL

// An out from tensor.empty is one allocation, written by the body and returned; the in is read in place.
// CHECK-LABEL: func.func @empty_out(
// CHECK-SAME:      %[[X:.*]]: memref<?xf32>, %[[N:.*]]: index) -> memref<?xf32>
// CHECK-NEXT:    %[[A:.*]] = memref.alloc(%[[N]]) {{.*}}: memref<?xf32>
// CHECK-NEXT:    memref.copy %[[X]], %[[A]] : memref<?xf32> to memref<?xf32>
// CHECK-NEXT:    return %[[A]]
// CHECK-NOT:     moe.kernel
// LOCAL-LABEL: func.func @empty_out(
// LOCAL:         %[[XB:.*]] = bufferization.to_buffer %{{.*}} : tensor<?xf32> to memref<?xf32, strided<[?], offset: ?>>
// LOCAL:         %[[A:.*]] = memref.alloc(%{{.*}}) {{.*}}: memref<?xf32>
// LOCAL:         %[[XC:.*]] = memref.alloc(%{{.*}}) {{.*}}: memref<?xf32>
// LOCAL-NEXT:    memref.copy %[[XB]], %[[XC]]
// LOCAL-NEXT:    memref.copy %[[XC]], %[[A]] : memref<?xf32> to memref<?xf32>
// LOCAL-NOT:     moe.kernel
func.func @empty_out(%x: tensor<?xf32>, %n: index) -> tensor<?xf32> {
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = moe.kernel ins(%x : tensor<?xf32>) outs(%e : tensor<?xf32>) {
  ^bb0(%xb: memref<?xf32>, %ob: memref<?xf32>):
    memref.copy %xb, %ob : memref<?xf32> to memref<?xf32>
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}

// An out that is a writable function argument (the function's result) is written in place: no allocation, no
// copy.
// CHECK-LABEL: func.func @in_place(
// CHECK-SAME:      %[[X:.*]]: memref<4xf32>, %[[D:.*]]: memref<4xf32>)
// CHECK-NOT:     memref.alloc
// CHECK:         memref.copy %[[X]], %[[D]]
// CHECK-NOT:     memref.alloc
// CHECK:         return
func.func @in_place(%x: tensor<4xf32>, %d: tensor<4xf32> {bufferization.writable = true}) -> tensor<4xf32> {
  %r = moe.kernel ins(%x : tensor<4xf32>) outs(%d : tensor<4xf32>) {
  ^bb0(%xb: memref<4xf32>, %ob: memref<4xf32>):
    memref.copy %xb, %ob : memref<4xf32> to memref<4xf32>
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// The out is not read by the kernel: when its tensor is still needed afterwards, the kernel gets a fresh buffer and
// the old contents are not copied into it.
// CHECK-LABEL: func.func @out_still_used(
// CHECK-SAME:      %[[X:.*]]: memref<4xf32>, %[[D:.*]]: memref<4xf32>)
// CHECK:         %[[A:.*]] = memref.alloc() {{.*}}: memref<4xf32>
// CHECK-NEXT:    memref.copy %[[X]], %[[A]]
// CHECK-NOT:     memref.copy
// CHECK:         return %[[A]], %[[D]]
func.func @out_still_used(%x: tensor<4xf32>, %d: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %r = moe.kernel ins(%x : tensor<4xf32>) outs(%d : tensor<4xf32>) {
  ^bb0(%xb: memref<4xf32>, %ob: memref<4xf32>):
    memref.copy %xb, %ob : memref<4xf32> to memref<4xf32>
  } -> tensor<4xf32>
  return %r, %d : tensor<4xf32>, tensor<4xf32>
}

// A strided in (a slice) is copied into a contiguous buffer for the kernel.
// CHECK-LABEL: func.func @strided_in(
// CHECK:         %[[S:.*]] = memref.subview %{{.*}}[0, 0] [4, 1] [1, 1] : memref<4x8xf32> to memref<4xf32, strided<[8]>>
// CHECK-NEXT:    %[[O:.*]] = memref.alloc() {{.*}}: memref<4xf32>
// CHECK:         %[[C:.*]] = memref.alloc() {{.*}}: memref<4xf32>
// CHECK-NEXT:    memref.copy %[[S]], %[[C]]
// CHECK-NEXT:    memref.copy %[[C]], %[[O]] : memref<4xf32> to memref<4xf32>
func.func @strided_in(%x: tensor<4x8xf32>) -> tensor<4xf32> {
  %s = tensor.extract_slice %x[0, 0] [4, 1] [1, 1] : tensor<4x8xf32> to tensor<4xf32>
  %e = tensor.empty() : tensor<4xf32>
  %r = moe.kernel ins(%s : tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%sb: memref<4xf32>, %ob: memref<4xf32>):
    memref.copy %sb, %ob : memref<4xf32> to memref<4xf32>
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
