// moe-gpu-host-stream: the per-op stream chains of a function become one; the host waits once, before the return
// (or before an op with host side effects), and not at all with wait-at-return=false.
// RUN: moe-opt %s -split-input-file --pass-pipeline='builtin.module(func.func(moe-gpu-host-stream))' | FileCheck %s
// RUN: moe-opt %s -split-input-file \
// RUN:   --pass-pipeline='builtin.module(func.func(moe-gpu-host-stream{wait-at-return=false}))' \
// RUN:   | FileCheck %s --check-prefix=NOWAIT

module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @a(%x: memref<?xf32>) kernel { gpu.return }
  }

  // CHECK-LABEL: func.func @two_ops(
  // CHECK-SAME:      %[[X:.*]]: memref<?xf32>, %[[N:.*]]: index)
  // CHECK:         %[[T0:.*]] = gpu.wait async
  // CHECK-NEXT:    %[[T1:.*]] = gpu.launch_func async [%[[T0]]] @k::@a
  // CHECK-NEXT:    %[[M:.*]], %[[T2:.*]] = gpu.alloc async [%[[T1]]] (%[[N]])
  // CHECK-NEXT:    %[[T3:.*]] = gpu.launch_func async [%[[T2]]] @k::@a
  // CHECK-NEXT:    %[[T4:.*]] = gpu.dealloc async [%[[T3]]] %[[M]]
  // CHECK-NEXT:    gpu.wait [%[[T4]]]
  // CHECK-NEXT:    return
  // NOWAIT-LABEL: func.func @two_ops(
  // NOWAIT:         %[[T0:.*]] = gpu.wait async
  // NOWAIT-NEXT:    %[[T1:.*]] = gpu.launch_func async [%[[T0]]] @k::@a
  // NOWAIT-NEXT:    %{{.*}}, %[[T2:.*]] = gpu.alloc async [%[[T1]]]
  // NOWAIT-NEXT:    %[[T3:.*]] = gpu.launch_func async [%[[T2]]] @k::@a
  // NOWAIT-NEXT:    gpu.dealloc async [%[[T3]]]
  // NOWAIT-NOT:     gpu.wait
  // NOWAIT:         return
  func.func @two_ops(%x: memref<?xf32>, %n: index) {
    %c1 = arith.constant 1 : index
    %t0 = gpu.wait async
    %t1 = gpu.launch_func async [%t0] @k::@a blocks in (%n, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%x : memref<?xf32>)
    gpu.wait [%t1]
    %t2 = gpu.wait async
    %m, %t3 = gpu.alloc async [%t2] (%n) : memref<?xf32>
    %t4 = gpu.launch_func async [%t3] @k::@a blocks in (%n, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%m : memref<?xf32>)
    %t5 = gpu.dealloc async [%t4] %m : memref<?xf32>
    gpu.wait [%t5]
    return
  }
}

// -----

// The error check reads the error word after a host wait: the wait stays before it, the next op starts a new
// stream. With wait-at-return=false the check goes (the caller polls the word) and everything is one chain. The
// call that returns the error word's address orders nothing.
module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @a(%x: memref<?xf32>, %w: i64) kernel { gpu.return }
  }
  llvm.func @moeGpuErrorWord() -> i64
  llvm.func @moeGpuCheckErrors() -> i32

  // CHECK-LABEL: func.func @checked(
  // CHECK:         %[[T0:.*]] = gpu.wait async
  // CHECK-NEXT:    %[[W:.*]] = llvm.call @moeGpuErrorWord()
  // CHECK-NEXT:    %[[T1:.*]] = gpu.launch_func async [%[[T0]]] @k::@a
  // CHECK-NEXT:    gpu.wait [%[[T1]]]
  // CHECK-NEXT:    llvm.call @moeGpuCheckErrors()
  // CHECK-NEXT:    %[[T2:.*]] = gpu.wait async
  // CHECK-NEXT:    %[[T3:.*]] = gpu.launch_func async [%[[T2]]] @k::@a
  // CHECK-NEXT:    gpu.wait [%[[T3]]]
  // CHECK-NEXT:    return
  // NOWAIT-LABEL: func.func @checked(
  // NOWAIT:         %[[T0:.*]] = gpu.wait async
  // NOWAIT-NEXT:    llvm.call @moeGpuErrorWord()
  // NOWAIT-NEXT:    %[[T1:.*]] = gpu.launch_func async [%[[T0]]] @k::@a
  // NOWAIT-NEXT:    gpu.launch_func async [%[[T1]]] @k::@a
  // NOWAIT-NEXT:    return
  func.func @checked(%x: memref<?xf32>, %n: index) {
    %c1 = arith.constant 1 : index
    %t0 = gpu.wait async
    %w = llvm.call @moeGpuErrorWord() : () -> i64
    %t1 = gpu.launch_func async [%t0] @k::@a blocks in (%n, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%x : memref<?xf32>, %w : i64)
    gpu.wait [%t1]
    %e = llvm.call @moeGpuCheckErrors() : () -> i32
    %t2 = gpu.wait async
    %t3 = gpu.launch_func async [%t2] @k::@a blocks in (%n, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%x : memref<?xf32>, %w : i64)
    gpu.wait [%t3]
    return
  }
}

// -----

// A host op with side effects between two ops (a host store into a memref) needs the first op's results: the
// host waits before it.
module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @a(%x: memref<?xf32>) kernel { gpu.return }
  }
  // CHECK-LABEL: func.func @host_store(
  // CHECK:         %[[T1:.*]] = gpu.launch_func async
  // CHECK-NEXT:    gpu.wait [%[[T1]]]
  // CHECK-NEXT:    memref.store
  // CHECK-NEXT:    %[[T2:.*]] = gpu.wait async
  // NOWAIT-LABEL: func.func @host_store(
  // NOWAIT:         %[[T1:.*]] = gpu.launch_func async
  // NOWAIT-NEXT:    gpu.wait [%[[T1]]]
  // NOWAIT-NEXT:    memref.store
  func.func @host_store(%x: memref<?xf32>, %h: memref<1xf32>, %n: index, %v: f32) {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %t0 = gpu.wait async
    %t1 = gpu.launch_func async [%t0] @k::@a blocks in (%n, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%x : memref<?xf32>)
    gpu.wait [%t1]
    memref.store %v, %h[%c0] : memref<1xf32>
    %t2 = gpu.wait async
    %t3 = gpu.launch_func async [%t2] @k::@a blocks in (%n, %c1, %c1) threads in (%c1, %c1, %c1)
        args(%x : memref<?xf32>)
    gpu.wait [%t3]
    return
  }
}
