// moe-gpu-results-to-out-params: memref results of public functions become out-params; a result the function
// allocates with gpu.alloc is computed in the out-param (allocation gone, stream order kept), any other result is
// copied into it on the device.
// RUN: moe-opt %s --moe-gpu-results-to-out-params | FileCheck %s

module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @a(%x: memref<?x4xf32>) kernel { gpu.return }
  }

  // CHECK-LABEL: func.func @allocated(
  // CHECK-SAME:      %[[N:.*]]: index, %[[OUT:.*]]: memref<?x4xf32>) -> i32 {
  // CHECK:         %[[T0:.*]] = gpu.wait async
  // CHECK-NOT:     gpu.alloc
  // CHECK:         %[[T1:.*]] = gpu.launch_func async [%[[T0]]] @k::@a {{.*}} args(%[[OUT]] : memref<?x4xf32>)
  // CHECK-NEXT:    gpu.wait [%[[T1]]]
  // CHECK-NEXT:    return %{{.*}} : i32
  func.func @allocated(%n: index) -> (memref<?x4xf32>, i32) {
    %c1 = arith.constant 1 : index
    %c7 = arith.constant 7 : i32
    %t0 = gpu.wait async
    %m, %t1 = gpu.alloc async [%t0] (%n) : memref<?x4xf32>
    %t2 = gpu.launch_func async [%t1] @k::@a blocks in (%n, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%m : memref<?x4xf32>)
    gpu.wait [%t2]
    return %m, %c7 : memref<?x4xf32>, i32
  }

  // CHECK-LABEL: func.func @argument(
  // CHECK-SAME:      %[[A:.*]]: memref<8x4xf32>, %[[OUT:.*]]: memref<8x4xf32>) {
  // CHECK:         %[[T0:.*]] = gpu.wait async
  // CHECK-NEXT:    %[[T1:.*]] = gpu.memcpy async [%[[T0]]] %[[OUT]], %[[A]]
  // CHECK-NEXT:    gpu.wait [%[[T1]]]
  // CHECK-NEXT:    return{{$}}
  func.func @argument(%a: memref<8x4xf32>) -> memref<8x4xf32> {
    return %a : memref<8x4xf32>
  }

  // Private functions keep their results.
  // CHECK-LABEL: func.func private @helper() -> memref<4xf32>
  func.func private @helper() -> memref<4xf32> {
    %m = memref.alloc() : memref<4xf32>
    return %m : memref<4xf32>
  }
}
