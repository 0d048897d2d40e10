// Expert capacity (moe.dispatch_plan capacity(C)): the plan of the kept assignments and the dropped count per
// expert, through the CPU kernel (1 and 2 threads) and the portable lowering. The expected numbers are Switch
// Transformer's cumsum rule (slot-major for k > 1) and V-MoE's weight-sorted order, computed in plain PyTorch (the
// rules of python/tests/test_capacity.py), not by our lowerings.
// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | mlir-runner -O3 -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%mlir_async_runtime,%moe_cpu_runtime | FileCheck %s

// indices [6, 2] over E = 3:  [[0, 1], [0, 2], [0, 1], [1, 0], [2, 2], [0, 1]]
// weights:                     [[0.5, 0.25], [0.5, NaN], [0.75, -0.0], [0.5, 0.0], [0.25, 0.25], [0.9, 0.5]]

func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printI64(i64)
func.func private @printNewline()

func.func @show(%t: tensor<?xi32>) {
  %u = tensor.cast %t : tensor<?xi32> to tensor<*xi32>
  call @printMemrefI32(%u) : (tensor<*xi32>) -> ()
  return
}

func.func @mark(%m: i64) {
  call @printI64(%m) : (i64) -> ()
  call @printNewline() : () -> ()
  return
}

// slot-major then token: t2's and t5's first choices find expert 0 full
// CHECK-LABEL: {{^}}9101
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
// CHECK-NEXT: {{^ *\[+}}2, 2, 2]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [4]
// CHECK-NEXT: {{^ *\[+}}0, 2, 4, 6]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [12]
// CHECK-NEXT: {{^ *\[+}}0, 2, 1, 6, 3, 8, -1, -1, -1, -1, -1, -1]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [12]
// CHECK-NEXT: {{^ *\[+}}0, 2, 1, 4, -1, -1, 3, -1, 5, -1, -1, -1]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
// CHECK-NEXT: {{^ *\[+}}3, 2, 1]
func.func @case1(%idx: tensor<?x2xi32>, %w: tensor<?x2xf32>) {
  %m = arith.constant 9101 : i64
  call @mark(%m) : (i64) -> ()
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(3) capacity(2)
      : tensor<?x2xi32> -> tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<3xi32>
  %c2 = tensor.cast %c : tensor<3xi32> to tensor<?xi32>
  %o2 = tensor.cast %o : tensor<4xi32> to tensor<?xi32>
  %d2 = tensor.cast %d : tensor<3xi32> to tensor<?xi32>
  call @show(%c2) : (tensor<?xi32>) -> ()
  call @show(%o2) : (tensor<?xi32>) -> ()
  call @show(%ord) : (tensor<?xi32>) -> ()
  call @show(%inv) : (tensor<?xi32>) -> ()
  call @show(%d2) : (tensor<?xi32>) -> ()
  return
}

// by weight: NaN first, 0.9 and 0.75 fill expert 0, equal weights (0.5, 0.25; -0.0 = 0.0) in the position order
// CHECK-LABEL: {{^}}9102
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
// CHECK-NEXT: {{^ *\[+}}2, 2, 2]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [4]
// CHECK-NEXT: {{^ *\[+}}0, 2, 4, 6]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [12]
// CHECK-NEXT: {{^ *\[+}}4, 10, 6, 11, 3, 8, -1, -1, -1, -1, -1, -1]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [12]
// CHECK-NEXT: {{^ *\[+}}-1, -1, -1, 4, 0, -1, 2, -1, 5, -1, 1, 3]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
// CHECK-NEXT: {{^ *\[+}}3, 2, 1]
func.func @case2(%idx: tensor<?x2xi32>, %w: tensor<?x2xf32>) {
  %m = arith.constant 9102 : i64
  call @mark(%m) : (i64) -> ()
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(3) capacity(2) drop(probability) weights(%w : tensor<?x2xf32>)
      : tensor<?x2xi32> -> tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<3xi32>
  %c2 = tensor.cast %c : tensor<3xi32> to tensor<?xi32>
  %o2 = tensor.cast %o : tensor<4xi32> to tensor<?xi32>
  %d2 = tensor.cast %d : tensor<3xi32> to tensor<?xi32>
  call @show(%c2) : (tensor<?xi32>) -> ()
  call @show(%o2) : (tensor<?xi32>) -> ()
  call @show(%ord) : (tensor<?xi32>) -> ()
  call @show(%inv) : (tensor<?xi32>) -> ()
  call @show(%d2) : (tensor<?xi32>) -> ()
  return
}

// capacity 0: everything dropped
// CHECK-LABEL: {{^}}9103
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
// CHECK-NEXT: {{^ *\[+}}0, 0, 0]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [4]
// CHECK-NEXT: {{^ *\[+}}0, 0, 0, 0]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [12]
// CHECK-NEXT: {{^ *\[+}}-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [12]
// CHECK-NEXT: {{^ *\[+}}-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
// CHECK-NEXT: {{^ *\[+}}5, 4, 3]
func.func @case3(%idx: tensor<?x2xi32>, %w: tensor<?x2xf32>) {
  %m = arith.constant 9103 : i64
  call @mark(%m) : (i64) -> ()
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(3) capacity(0)
      : tensor<?x2xi32> -> tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<3xi32>
  %c2 = tensor.cast %c : tensor<3xi32> to tensor<?xi32>
  %o2 = tensor.cast %o : tensor<4xi32> to tensor<?xi32>
  %d2 = tensor.cast %d : tensor<3xi32> to tensor<?xi32>
  call @show(%c2) : (tensor<?xi32>) -> ()
  call @show(%o2) : (tensor<?xi32>) -> ()
  call @show(%ord) : (tensor<?xi32>) -> ()
  call @show(%inv) : (tensor<?xi32>) -> ()
  call @show(%d2) : (tensor<?xi32>) -> ()
  return
}

// capacity 1 by weight
// CHECK-LABEL: {{^}}9104
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
// CHECK-NEXT: {{^ *\[+}}1, 1, 1]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [4]
// CHECK-NEXT: {{^ *\[+}}0, 1, 2, 3]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [12]
// CHECK-NEXT: {{^ *\[+}}10, 6, 3, -1, -1, -1, -1, -1, -1, -1, -1, -1]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [12]
// CHECK-NEXT: {{^ *\[+}}-1, -1, -1, 2, -1, -1, 1, -1, -1, -1, 0, -1]
// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
// CHECK-NEXT: {{^ *\[+}}4, 3, 2]
func.func @case4(%idx: tensor<?x2xi32>, %w: tensor<?x2xf32>) {
  %m = arith.constant 9104 : i64
  call @mark(%m) : (i64) -> ()
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(3) capacity(1) drop(probability) weights(%w : tensor<?x2xf32>)
      : tensor<?x2xi32> -> tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<3xi32>
  %c2 = tensor.cast %c : tensor<3xi32> to tensor<?xi32>
  %o2 = tensor.cast %o : tensor<4xi32> to tensor<?xi32>
  %d2 = tensor.cast %d : tensor<3xi32> to tensor<?xi32>
  call @show(%c2) : (tensor<?xi32>) -> ()
  call @show(%o2) : (tensor<?xi32>) -> ()
  call @show(%ord) : (tensor<?xi32>) -> ()
  call @show(%inv) : (tensor<?xi32>) -> ()
  call @show(%d2) : (tensor<?xi32>) -> ()
  return
}

func.func @main() {
  %idx = arith.constant dense<[[0, 1], [0, 2], [0, 1], [1, 0], [2, 2], [0, 1]]> : tensor<6x2xi32>
  %w = arith.constant dense<[[0.5, 0.25], [0.5, 0x7FC00000], [0.75, -0.0], [0.5, 0.0], [0.25, 0.25], [0.9, 0.5]]>
      : tensor<6x2xf32>
  %i = tensor.cast %idx : tensor<6x2xi32> to tensor<?x2xi32>
  %v = tensor.cast %w : tensor<6x2xf32> to tensor<?x2xf32>
  call @case1(%i, %v) : (tensor<?x2xi32>, tensor<?x2xf32>) -> ()
  call @case2(%i, %v) : (tensor<?x2xi32>, tensor<?x2xf32>) -> ()
  call @case3(%i, %v) : (tensor<?x2xi32>, tensor<?x2xf32>) -> ()
  call @case4(%i, %v) : (tensor<?x2xi32>, tensor<?x2xf32>) -> ()
  return
}
