// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | mlir-runner -O3 -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime,%mlir_async_runtime | FileCheck %s

// moe.topk_renorm and moe.route with their indices written as i64 (as torch.topk returns them), through the CPU
// kernels (the row-per-lane blocks of 16 experts and their scalar tail rows, the per-row route with NaN and -inf
// rows), the portable lowering and two threads. Expected indices: a stable descending sort (numpy's argsort of the
// negated scores, kind="stable": ties to the lowest index, the dialect's rule) of the 17 x 16 input
// x[r, e] = (3r + 5e) mod 11 - 5, which has ties in every row; the sigmoid is increasing, so route's sigmoid
// picks the same experts. Case 3 is route.mlir's case 1 (its expected indices from Inputs/routing_reference.py).

func.func private @printMemrefI64(tensor<*xi64>)
func.func private @printI64(i64)
func.func private @printNewline()

func.func @input() -> tensor<?x16xf32> {
  %x = arith.constant dense<[[-5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0], [-2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0], [1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0], [4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0], [-4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0], [-1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0], [2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0], [5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0], [-3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0], [0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0], [3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0], [-5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0], [-2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0], [1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0], [4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0], [-4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0], [-1.0, 4.0, -2.0, 3.0, -3.0, 2.0, -4.0, 1.0, -5.0, 0.0, 5.0, -1.0, 4.0, -2.0, 3.0, -3.0]]> : tensor<17x16xf32>
  %d = tensor.cast %x : tensor<17x16xf32> to tensor<?x16xf32>
  return %d : tensor<?x16xf32>
}

func.func @show(%marker: i64, %i: tensor<?x4xi64>) {
  call @printI64(%marker) : (i64) -> ()
  call @printNewline() : () -> ()
  %u = tensor.cast %i : tensor<?x4xi64> to tensor<*xi64>
  call @printMemrefI64(%u) : (tensor<*xi64>) -> ()
  return
}

// CHECK-LABEL: {{^}}9101
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [17, 4]
// CHECK-NEXT: {{^ *\[+}}2, 13, 4, 15]
// CHECK-NEXT: {{^ *\[+}}8, 10, 1, 12]
// CHECK-NEXT: {{^ *\[+}}3, 14, 5, 7]
// CHECK-NEXT: {{^ *\[+}}9, 0, 11, 2]
// CHECK-NEXT: {{^ *\[+}}4, 15, 6, 8]
// CHECK-NEXT: {{^ *\[+}}10, 1, 12, 3]
// CHECK-NEXT: {{^ *\[+}}5, 7, 9, 0]
// CHECK-NEXT: {{^ *\[+}}0, 11, 2, 13]
// CHECK-NEXT: {{^ *\[+}}6, 8, 10, 1]
// CHECK-NEXT: {{^ *\[+}}1, 12, 3, 14]
// CHECK-NEXT: {{^ *\[+}}7, 9, 0, 11]
// CHECK-NEXT: {{^ *\[+}}2, 13, 4, 15]
// CHECK-NEXT: {{^ *\[+}}8, 10, 1, 12]
// CHECK-NEXT: {{^ *\[+}}3, 14, 5, 7]
// CHECK-NEXT: {{^ *\[+}}9, 0, 11, 2]
// CHECK-NEXT: {{^ *\[+}}4, 15, 6, 8]
// CHECK-NEXT: {{^ *\[+}}10, 1, 12, 3]
func.func @topk() {
  %x = call @input() : () -> tensor<?x16xf32>
  %w, %i = moe.topk_renorm %x k(4) : tensor<?x16xf32> -> tensor<?x4xf32>, tensor<?x4xi64>
  %m = arith.constant 9101 : i64
  call @show(%m, %i) : (i64, tensor<?x4xi64>) -> ()
  return
}

// CHECK-LABEL: {{^}}9102
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [17, 4]
// CHECK-NEXT: {{^ *\[+}}2, 13, 4, 15]
// CHECK-NEXT: {{^ *\[+}}8, 10, 1, 12]
// CHECK-NEXT: {{^ *\[+}}3, 14, 5, 7]
// CHECK-NEXT: {{^ *\[+}}9, 0, 11, 2]
// CHECK-NEXT: {{^ *\[+}}4, 15, 6, 8]
// CHECK-NEXT: {{^ *\[+}}10, 1, 12, 3]
// CHECK-NEXT: {{^ *\[+}}5, 7, 9, 0]
// CHECK-NEXT: {{^ *\[+}}0, 11, 2, 13]
// CHECK-NEXT: {{^ *\[+}}6, 8, 10, 1]
// CHECK-NEXT: {{^ *\[+}}1, 12, 3, 14]
// CHECK-NEXT: {{^ *\[+}}7, 9, 0, 11]
// CHECK-NEXT: {{^ *\[+}}2, 13, 4, 15]
// CHECK-NEXT: {{^ *\[+}}8, 10, 1, 12]
// CHECK-NEXT: {{^ *\[+}}3, 14, 5, 7]
// CHECK-NEXT: {{^ *\[+}}9, 0, 11, 2]
// CHECK-NEXT: {{^ *\[+}}4, 15, 6, 8]
// CHECK-NEXT: {{^ *\[+}}10, 1, 12, 3]
func.func @route_sigmoid() {
  %x = call @input() : () -> tensor<?x16xf32>
  %w, %i = moe.route %x k(4) scoring(sigmoid) : tensor<?x16xf32> -> tensor<?x4xf32>, tensor<?x4xi64>
  %m = arith.constant 9102 : i64
  call @show(%m, %i) : (i64, tensor<?x4xi64>) -> ()
  return
}

// CHECK-LABEL: {{^}}9103
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [5, 2]
// CHECK-NEXT: {{^ *\[+}}1, 2]
// CHECK-NEXT: {{^ *\[+}}0, 1]
// CHECK-NEXT: {{^ *\[+}}0, 1]
// CHECK-NEXT: {{^ *\[+}}3, 1]
// CHECK-NEXT: {{^ *\[+}}2, 4]
func.func @route_edges() {
  %marker = arith.constant 9103 : i64
  call @printI64(%marker) : (i64) -> ()
  call @printNewline() : () -> ()
  %in = arith.constant dense<[[1.0, 3.0, 3.0, 2.0, 0.5, -1.0], [0x7FC00000, 1.0, 0x7FC00000, 5.0, 0.0, 0.0], [0xFF800000, 0xFF800000, 0xFF800000, 0xFF800000, 0xFF800000, 0xFF800000], [0xFF800000, 0.0, 0xFF800000, 1.0, 0xFF800000, 0xFF800000], [0.5, -1.0, 2.0, 0.25, 2.0, -3.0]]> : tensor<5x6xf32>
  %d = tensor.cast %in : tensor<5x6xf32> to tensor<?x6xf32>
  %w, %i = moe.route %d k(2) renormalize(true) : tensor<?x6xf32> -> tensor<?x2xf32>, tensor<?x2xi64>
  %u = tensor.cast %i : tensor<?x2xi64> to tensor<*xi64>
  call @printMemrefI64(%u) : (tensor<*xi64>) -> ()
  return
}

func.func @main() {
  call @topk() : () -> ()
  call @route_sigmoid() : () -> ()
  call @route_edges() : () -> ()
  return
}
