// moe-gpu-bufferize: one-shot bufferization of GPU host code, where every buffer is device memory. The outs of a
// moe.kernel become gpu.alloc on a stream of their own, the body takes the buffers' place; what one-shot copies
// (an operand with a strided layout, a conflicting write) is gpu.alloc + gpu.memcpy, never host memref.alloc or
// memref.copy; nothing is deallocated. Then moe-gpu-host-stream joins those streams with the host code's: the
// result allocations are on the op's stream, as convert-moe-to-gpu placed them before it used moe.kernel.
// RUN: moe-opt %s -split-input-file --moe-gpu-bufferize | FileCheck %s
// RUN: moe-opt %s -split-input-file \
// RUN:   --pass-pipeline='builtin.module(moe-gpu-bufferize,canonicalize,func.func(moe-gpu-host-stream))' \
// RUN:   | FileCheck %s --check-prefix=STREAM

module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @a(%x: memref<?x4xf32>, %y: memref<?x4xf32>, %z: memref<4xi32>) kernel { gpu.return }
  }

  // CHECK-LABEL: func.func @outs(
  // CHECK-SAME:      %[[X:.*]]: memref<?x4xf32>) -> (memref<?x4xf32>, memref<4xi32>) {
  // CHECK:         %[[N:.*]] = memref.dim %[[X]], %{{.*}}
  // CHECK:         %[[S0:.*]] = gpu.wait async
  // CHECK-NEXT:    %[[Y:.*]], %[[S1:.*]] = gpu.alloc async [%[[S0]]] (%[[N]]) : memref<?x4xf32>
  // CHECK-NEXT:    gpu.wait [%[[S1]]]
  // CHECK-NEXT:    %[[S2:.*]] = gpu.wait async
  // CHECK-NEXT:    %[[Z:.*]], %[[S3:.*]] = gpu.alloc async [%[[S2]]] () : memref<4xi32>
  // CHECK-NEXT:    gpu.wait [%[[S3]]]
  // CHECK:         %[[T0:.*]] = gpu.wait async
  // CHECK-NEXT:    %[[T1:.*]] = gpu.launch_func async [%[[T0]]] @k::@a {{.*}} args(%[[X]] : memref<?x4xf32>, %[[Y]] : memref<?x4xf32>, %[[Z]] : memref<4xi32>)
  // CHECK-NEXT:    gpu.wait [%[[T1]]]
  // CHECK-NEXT:    return %[[Y]], %[[Z]]
  // CHECK-NOT:     moe.kernel
  // CHECK-NOT:     memref.alloc
  // CHECK-NOT:     dealloc
  // STREAM-LABEL: func.func @outs(
  // STREAM:         %[[T0:.*]] = gpu.wait async
  // STREAM-NEXT:    %{{.*}}, %[[T1:.*]] = gpu.alloc async [%[[T0]]] (%{{.*}}) : memref<?x4xf32>
  // STREAM-NEXT:    %{{.*}}, %[[T2:.*]] = gpu.alloc async [%[[T1]]] () : memref<4xi32>
  // STREAM-NEXT:    %[[T3:.*]] = gpu.launch_func async [%[[T2]]] @k::@a
  // STREAM-NEXT:    gpu.wait [%[[T3]]]
  // STREAM-NEXT:    return
  func.func @outs(%x: tensor<?x4xf32>) -> (tensor<?x4xf32>, tensor<4xi32>) {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %x, %c0 : tensor<?x4xf32>
    %y = bufferization.alloc_tensor(%n) : tensor<?x4xf32>
    %z = bufferization.alloc_tensor() : tensor<4xi32>
    %r:2 = moe.kernel ins(%x : tensor<?x4xf32>) outs(%y, %z : tensor<?x4xf32>, tensor<4xi32>) {
    ^bb0(%xb: memref<?x4xf32>, %yb: memref<?x4xf32>, %zb: memref<4xi32>):
      %c1 = arith.constant 1 : index
      %t0 = gpu.wait async
      %t1 = gpu.launch_func async [%t0] @k::@a blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1)
          args(%xb : memref<?x4xf32>, %yb : memref<?x4xf32>, %zb : memref<4xi32>)
      gpu.wait [%t1]
    } -> tensor<?x4xf32>, tensor<4xi32>
    return %r#0, %r#1 : tensor<?x4xf32>, tensor<4xi32>
  }
}

// -----

// A returned tensor.empty (a zero-sized moe result folded by moe-legalize-shapes) is a device allocation too.
// CHECK-LABEL: func.func @returned_empty(
// CHECK:         %[[S0:.*]] = gpu.wait async
// CHECK-NEXT:    %[[E:.*]], %[[S1:.*]] = gpu.alloc async [%[[S0]]] () : memref<0x2xf32>
// CHECK-NEXT:    gpu.wait [%[[S1]]]
// CHECK-NEXT:    return %[[E]]
func.func @returned_empty() -> tensor<0x2xf32> {
  %e = tensor.empty() : tensor<0x2xf32>
  return %e : tensor<0x2xf32>
}

// -----

// An in whose buffer has a strided layout (a slice) is copied into an identity-layout buffer for the body: on the
// device.
// CHECK-LABEL: func.func @strided_in(
// CHECK-SAME:      %[[X:.*]]: memref<8x4xf32>)
// CHECK:         %[[V:.*]] = memref.subview %[[X]][2, 0] [2, 4] [1, 1]
// CHECK:         gpu.wait async
// CHECK-NEXT:    gpu.alloc async {{.*}} : memref<2x4xf32>
// CHECK:         %[[S0:.*]] = gpu.wait async
// CHECK-NEXT:    %[[C:.*]], %[[S1:.*]] = gpu.alloc async [%[[S0]]] () : memref<2x4xf32>
// CHECK-NEXT:    gpu.wait [%[[S1]]]
// CHECK-NEXT:    %[[S2:.*]] = gpu.wait async
// CHECK-NEXT:    %[[S3:.*]] = gpu.memcpy async [%[[S2]]] %[[C]], %[[V]]
// CHECK-NEXT:    gpu.wait [%[[S3]]]
// CHECK:         gpu.memset async [%{{.*}}] %{{.*}}, %{{.*}} : memref<2x4xf32>
// CHECK-NOT:     memref.alloc
// CHECK-NOT:     memref.copy
func.func @strided_in(%x: tensor<8x4xf32>) -> tensor<2x4xf32> {
  %s = tensor.extract_slice %x[2, 0] [2, 4] [1, 1] : tensor<8x4xf32> to tensor<2x4xf32>
  %e = bufferization.alloc_tensor() : tensor<2x4xf32>
  %r = moe.kernel ins(%s : tensor<2x4xf32>) outs(%e : tensor<2x4xf32>) {
  ^bb0(%sb: memref<2x4xf32>, %rb: memref<2x4xf32>):
    %zero = arith.constant 0.0 : f32
    %t0 = gpu.wait async
    %t1 = gpu.memset async [%t0] %rb, %zero : memref<2x4xf32>, f32
    gpu.wait [%t1]
  } -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}

// -----

// A write that conflicts with a later read of the same tensor copies it first: on the device.
// CHECK-LABEL: func.func @conflict(
// CHECK-SAME:      %[[X:.*]]: memref<4xf32>,
// CHECK:         %[[S0:.*]] = gpu.wait async
// CHECK-NEXT:    %[[C:.*]], %[[S1:.*]] = gpu.alloc async [%[[S0]]] () : memref<4xf32>
// CHECK-NEXT:    gpu.wait [%[[S1]]]
// CHECK-NEXT:    %[[S2:.*]] = gpu.wait async
// CHECK-NEXT:    %[[S3:.*]] = gpu.memcpy async [%[[S2]]] %[[C]], %[[X]]
// CHECK-NEXT:    gpu.wait [%[[S3]]]
// CHECK:         memref.store %{{.*}}, %[[C]]
// CHECK-NOT:     memref.copy
func.func @conflict(%x: tensor<4xf32>, %f: f32) -> (tensor<4xf32>, tensor<4xf32>) {
  %c0 = arith.constant 0 : index
  %y = tensor.insert %f into %x[%c0] : tensor<4xf32>
  return %x, %y : tensor<4xf32>, tensor<4xf32>
}
