// adjacency_update's mask-rows and counting strategies (AdjacencyUpdate.cpp) compiled for AVX2 and AVX-512, one
// worker and two: raw counts (norm none, beta 0) with repeated experts in a token's slots (counted once) and
// out-of-range indices (reported and skipped). Expected counts worked out by hand from the token sets below. The
// second run compiles for the host (16 lanes on an AVX-512 machine; the Python tests pin x86-64-v4 there).
// RUN: moe-opt %s --moe-lower-to-llvm="target-cpu=x86-64-v3" | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime 2>&1 | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime 2>&1 | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm="target-cpu=x86-64-v3 num-threads=2" | mlir-runner -O3 -e main \
// RUN:   -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime,%mlir_async_runtime 2>&1 | FileCheck %s

func.func private @printMemrefF32(tensor<*xf32>)

// E = 10, k = 3 (mask rows on both targets). Tokens: {0, 9} (9 twice), {3} (-1 skipped), {2, 0} (12 skipped),
// {9, 0, 5}.
// CHECK: error: moe.adjacency_update: 'idx' element 4 is -1, outside [0, 10); the element was skipped
// CHECK: error: moe.adjacency_update: 'idx' element 6 is 12, outside [0, 10); the element was skipped
// CHECK: sizes = [10, 10]
// CHECK-NEXT: [3,   0,   1,   0,   0,   1,   0,   0,   0,   2]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [1,   0,   1,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [0,   0,   0,   1,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [1,   0,   0,   0,   0,   1,   0,   0,   0,   1]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [2,   0,   0,   0,   0,   1,   0,   0,   0,   2]
func.func @rows() {
  %a = arith.constant dense<0.5> : tensor<10x10xf32>
  %i = arith.constant dense<[[0, 9, 9], [3, -1, 3], [12, 2, 0], [9, 0, 5]]> : tensor<4x3xi32>
  %idx = tensor.cast %i : tensor<4x3xi32> to tensor<?x3xi32>
  %n = moe.adjacency_update %a, %idx beta(0.0) norm(none) : tensor<10x10xf32>, tensor<?x3xi32> -> tensor<10x10xf32>
  %p = tensor.cast %n : tensor<10x10xf32> to tensor<*xf32>
  call @printMemrefF32(%p) : (tensor<*xf32>) -> ()
  return
}

// E = 40, k = 1 (counting on both targets: more than one vector per row): the diagonal counts each expert's tokens
// (39 twice, 0 and 2 once; 40 skipped).
// CHECK: error: moe.adjacency_update: 'idx' element 2 is 40, outside [0, 40); the element was skipped
// CHECK: sizes = [3, 3]
// CHECK-NEXT: [1,   0,   0]
// CHECK-NEXT: [0,   0,   0]
// CHECK-NEXT: [0,   0,   1]
func.func @counting() {
  %a = arith.constant dense<0.5> : tensor<40x40xf32>
  %i = arith.constant dense<[[39], [0], [40], [39], [2]]> : tensor<5x1xi32>
  %idx = tensor.cast %i : tensor<5x1xi32> to tensor<?x1xi32>
  %n = moe.adjacency_update %a, %idx beta(0.0) norm(none) : tensor<40x40xf32>, tensor<?x1xi32> -> tensor<40x40xf32>
  // Print the corners [0, 3) x [0, 3) and [37, 40) x [37, 40).
  %s = tensor.extract_slice %n[0, 0] [3, 3] [1, 1] : tensor<40x40xf32> to tensor<3x3xf32>
  %p = tensor.cast %s : tensor<3x3xf32> to tensor<*xf32>
  call @printMemrefF32(%p) : (tensor<*xf32>) -> ()
  %c = tensor.extract_slice %n[37, 37] [3, 3] [1, 1] : tensor<40x40xf32> to tensor<3x3xf32>
  %q = tensor.cast %c : tensor<3x3xf32> to tensor<*xf32>
  call @printMemrefF32(%q) : (tensor<*xf32>) -> ()
  return
}
// CHECK: sizes = [3, 3]
// CHECK-NEXT: [0,   0,   0]
// CHECK-NEXT: [0,   0,   0]
// CHECK-NEXT: [0,   0,   2]

// The same tokens with k unknown at compile time (the slots read in a loop): the same counts.
// CHECK: error: moe.adjacency_update: 'idx' element 4 is -1, outside [0, 10); the element was skipped
// CHECK: error: moe.adjacency_update: 'idx' element 6 is 12, outside [0, 10); the element was skipped
// CHECK: sizes = [10, 10]
// CHECK-NEXT: [3,   0,   1,   0,   0,   1,   0,   0,   0,   2]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [1,   0,   1,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [0,   0,   0,   1,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [1,   0,   0,   0,   0,   1,   0,   0,   0,   1]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [0,   0,   0,   0,   0,   0,   0,   0,   0,   0]
// CHECK-NEXT: [2,   0,   0,   0,   0,   1,   0,   0,   0,   2]
func.func @rows_dynamic_k() {
  %a = arith.constant dense<0.5> : tensor<10x10xf32>
  %i = arith.constant dense<[[0, 9, 9], [3, -1, 3], [12, 2, 0], [9, 0, 5]]> : tensor<4x3xi32>
  %idx = tensor.cast %i : tensor<4x3xi32> to tensor<?x?xi32>
  %n = moe.adjacency_update %a, %idx beta(0.0) norm(none) : tensor<10x10xf32>, tensor<?x?xi32> -> tensor<10x10xf32>
  %p = tensor.cast %n : tensor<10x10xf32> to tensor<*xf32>
  call @printMemrefF32(%p) : (tensor<*xf32>) -> ()
  return
}

func.func @main() {
  call @rows() : () -> ()
  call @counting() : () -> ()
  call @rows_dynamic_k() : () -> ()
  return
}
