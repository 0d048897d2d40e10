// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | mlir-runner -O3 -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime,%mlir_async_runtime | FileCheck %s

// A custom score region, f(x) = x·x + 1 (exact in f32 at these logits, so the expected numbers are worked by
// hand), through the CPU kernels, the portable lowering (cpu-kernels=false) and two threads.

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printI64(i64)
func.func private @printNewline()

// moe.route k(2), bias [0, 0, 9, 0] (it chooses, never weighs), renormalize, scale 2:
//   row 0: x = [1, -2, 0.5, 3], f = [2, 5, 1.25, 10], f + b = [2, 5, 10.25, 10] -> experts 2, 3;
//          w = 2 · [1.25, 10] / 11.25 = [0.222222, 1.777778];
//   row 1: x = 0 everywhere, f = 1, f + b = [1, 1, 10, 1] -> experts 2, 0 (the tie to the lower index);
//          w = [1, 1];
//   row 2: x = [-inf, 2, -3, 1], f = [inf, 5, 10, 2], f + b = [inf, 5, 19, 2] -> experts 0, 2;
//          w = 2 · [inf, 10] / inf = [nan, 0].
// CHECK-LABEL: {{^}}9101
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [3, 2]
// CHECK-NEXT: {{^ *\[+}}{{(0\.222222|0\.222223)}}, {{(1\.77778|1\.77777)}}]
// CHECK-NEXT: {{^ *\[+}}1, 1]
// CHECK-NEXT: {{^ *\[+}}{{-?nan}}, 0]
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [3, 2]
// CHECK-NEXT: {{^ *\[+}}2, 3]
// CHECK-NEXT: {{^ *\[+}}2, 0]
// CHECK-NEXT: {{^ *\[+}}0, 2]
func.func @forward() {
  %marker = arith.constant 9101 : i64
  call @printI64(%marker) : (i64) -> ()
  call @printNewline() : () -> ()
  %in = arith.constant dense<[[1.0, -2.0, 0.5, 3.0], [0.0, 0.0, 0.0, 0.0], [0xFF800000, 2.0, -3.0, 1.0]]> : tensor<3x4xf32>
  %b = arith.constant dense<[0.0, 0.0, 9.0, 0.0]> : tensor<4xf32>
  %x = tensor.cast %in : tensor<3x4xf32> to tensor<?x4xf32>
  %w, %i = moe.route %x bias(%b : tensor<4xf32>) k(2) scoring(custom) renormalize(true) routed_scaling_factor(2.0) score {
  ^bb0(%v: f32):
    %one = arith.constant 1.000000e+00 : f32
    %sq = arith.mulf %v, %v : f32
    %r = arith.addf %sq, %one : f32
    moe.yield %r : f32
  } : tensor<?x4xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %sw = tensor.cast %w : tensor<?x2xf32> to tensor<*xf32>
  call @printMemrefF32(%sw) : (tensor<*xf32>) -> ()
  %si = tensor.cast %i : tensor<?x2xi32> to tensor<*xi32>
  call @printMemrefI32(%si) : (tensor<*xi32>) -> ()
  return
}

// moe.route_grad of the same score (f' = 2x), renormalize, scale a = 2: a (dw_l - C/S) / S · f'(x_l) at the
// picks, C = Σ dw·f, S = Σ f:
//   row 0: picks 2, 3: x = [0.5, 3], f = [1.25, 10], S = 11.25, dw = [1, 0], C = 1.25:
//          [2 (8/9) / 11.25 · 1, 2 (-1/9) / 11.25 · 6] = [0.158025, -0.118519] at experts 2, 3;
//   row 1: picks 2, 0: x = [-1, 1], f = [2, 2], S = 4, dw = [1, -1], C = 0: [-1, -1] at experts 2, 0;
//   row 2: picks 0, 2: x = [4, -3], f = [17, 10], S = 27, dw = [0.5, 2], C = 28.5:
//          [2 (0.5 - 28.5/27) / 27 · 8, 2 (2 - 28.5/27) / 27 · (-6)] = [-0.329218, -0.419753] at experts 0, 2;
//   row 3: indices 5 and -1 are out of range: read clamped, never written: zeros.
// CHECK-LABEL: {{^}}9102
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [4, 4]
// CHECK-NEXT: {{^ *\[+}}0, 0, {{(0\.158025|0\.158024)}}, {{(-0\.118519|-0\.118518)}}]
// CHECK-NEXT: {{^ *\[+}}-1, 0, -1, 0]
// CHECK-NEXT: {{^ *\[+}}{{(-0\.329218|-0\.329219)}}, 0, {{(-0\.419753|-0\.419754)}}, 0]
// CHECK-NEXT: {{^ *\[+}}0, 0, 0, 0]
func.func @backward() {
  %marker = arith.constant 9102 : i64
  call @printI64(%marker) : (i64) -> ()
  call @printNewline() : () -> ()
  %in = arith.constant dense<[[1.0, -2.0, 0.5, 3.0], [1.0, 0.0, -1.0, 0.5], [4.0, 2.0, -3.0, 1.0], [1.0, 1.0, 1.0, 1.0]]> : tensor<4x4xf32>
  %idx0 = arith.constant dense<[[2, 3], [2, 0], [0, 2], [5, -1]]> : tensor<4x2xi32>
  %dw0 = arith.constant dense<[[1.0, 0.0], [1.0, -1.0], [0.5, 2.0], [1.0, 1.0]]> : tensor<4x2xf32>
  %x = tensor.cast %in : tensor<4x4xf32> to tensor<?x4xf32>
  %idx = tensor.cast %idx0 : tensor<4x2xi32> to tensor<?x2xi32>
  %dw = tensor.cast %dw0 : tensor<4x2xf32> to tensor<?x2xf32>
  %d = moe.route_grad %x, %idx dw(%dw : tensor<?x2xf32>) scoring(custom) renormalize(true) routed_scaling_factor(2.0) score {
  ^bb0(%v: f32):
    %one = arith.constant 1.000000e+00 : f32
    %sq = arith.mulf %v, %v : f32
    %r = arith.addf %sq, %one : f32
    moe.yield %r : f32
  } : tensor<?x4xf32>, tensor<?x2xi32> -> tensor<?x4xf32>
  %sd = tensor.cast %d : tensor<?x4xf32> to tensor<*xf32>
  call @printMemrefF32(%sd) : (tensor<*xf32>) -> ()
  return
}

func.func @main() {
  call @forward() : () -> ()
  call @backward() : () -> ()
  return
}
