// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | mlir-runner -O3 -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%mlir_async_runtime,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime 2>&1 >/dev/null | FileCheck %s --check-prefix=ERR

// moe.route with the choice given (replay) through the CPU kernel, the portable lowering (cpu-kernels=false) and
// two threads; the expected numbers are worked by hand.

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printI64(i64)
func.func private @printNewline()

func.func @show(%marker: i64, %w: tensor<?x2xf32>, %i: tensor<?x2xi32>) {
  call @printI64(%marker) : (i64) -> ()
  call @printNewline() : () -> ()
  %sw = tensor.cast %w : tensor<?x2xf32> to tensor<*xf32>
  call @printMemrefF32(%sw) : (tensor<*xf32>) -> ()
  %si = tensor.cast %i : tensor<?x2xi32> to tensor<*xi32>
  call @printMemrefI32(%si) : (tensor<*xi32>) -> ()
  return
}

// Softmax over all E even though two experts are given; the bias [0, 0, 9, 0] and the groups (n_group 2, top 1)
// would have chosen otherwise and play no part; scale 2, no renormalization:
//   row 0: x = 0: s = 1/4 each; replay [3, 1] -> w = [0.5, 0.5];
//   row 1: x = [-inf, 0, 0, -inf]: s = [0, 0.5, 0.5, 0]; replay [0, 2] -> w = [0, 1];
//   row 2: every logit -inf: s = 0; replay [2, 2] (a repeated expert is weighed twice) -> w = [0, 0].
// CHECK-LABEL: {{^}}9201
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [3, 2]
// CHECK-NEXT: {{^ *\[+}}0.5, 0.5]
// CHECK-NEXT: {{^ *\[+}}0, 1]
// CHECK-NEXT: {{^ *\[+}}0, 0]
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [3, 2]
// CHECK-NEXT: {{^ *\[+}}3, 1]
// CHECK-NEXT: {{^ *\[+}}0, 2]
// CHECK-NEXT: {{^ *\[+}}2, 2]
func.func @softmax_replay() {
  %in = arith.constant dense<[[0.0, 0.0, 0.0, 0.0], [0xFF800000, 0.0, 0.0, 0xFF800000],
                              [0xFF800000, 0xFF800000, 0xFF800000, 0xFF800000]]> : tensor<3x4xf32>
  %b = arith.constant dense<[0.0, 0.0, 9.0, 0.0]> : tensor<4xf32>
  %r0 = arith.constant dense<[[3, 1], [0, 2], [2, 2]]> : tensor<3x2xi32>
  %x = tensor.cast %in : tensor<3x4xf32> to tensor<?x4xf32>
  %r = tensor.cast %r0 : tensor<3x2xi32> to tensor<?x2xi32>
  %w, %i = moe.route %x bias(%b : tensor<4xf32>) replay(%r : tensor<?x2xi32>) k(2) n_group(2) topk_group(1)
      routed_scaling_factor(2.0) : tensor<?x4xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %m = arith.constant 9201 : i64
  call @show(%m, %w, %i) : (i64, tensor<?x2xf32>, tensor<?x2xi32>) -> ()
  return
}

// topk_then_score: the softmax is over the given logits, in the given order:
//   row 0: x = [1, 2, 3, 4], replay [3, 0] -> softmax([4, 1]) = [e^3, 1] / (1 + e^3) = [0.952574, 0.0474259];
//   row 1: x = 0, replay [1, 2] -> [0.5, 0.5].
// CHECK-LABEL: {{^}}9202
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 2]
// CHECK-NEXT: {{^ *\[+}}{{0\.95257[34]}}, {{0\.047425[89]}}]
// CHECK-NEXT: {{^ *\[+}}0.5, 0.5]
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 2]
// CHECK-NEXT: {{^ *\[+}}3, 0]
// CHECK-NEXT: {{^ *\[+}}1, 2]
func.func @topk_then_score_replay() {
  %in = arith.constant dense<[[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]]> : tensor<2x4xf32>
  %r0 = arith.constant dense<[[3, 0], [1, 2]]> : tensor<2x2xi32>
  %x = tensor.cast %in : tensor<2x4xf32> to tensor<?x4xf32>
  %r = tensor.cast %r0 : tensor<2x2xi32> to tensor<?x2xi32>
  %w, %i = moe.route %x replay(%r : tensor<?x2xi32>) k(2) order(topk_then_score)
      : tensor<?x4xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %m = arith.constant 9202 : i64
  call @show(%m, %w, %i) : (i64, tensor<?x2xf32>, tensor<?x2xi32>) -> ()
  return
}

// A custom score f(x) = x·x + 1 with renormalization and an i64 choice (a hash table's):
//   row 0: x = [1, -2, 0.5, 3], replay [1, 3]: f = [5, 10] -> [1/3, 2/3];
//   row 1: x = 0, replay [0, 0]: f = [1, 1] -> [0.5, 0.5].
// CHECK-LABEL: {{^}}9203
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 2]
// CHECK-NEXT: {{^ *\[+}}{{0\.33333[34]}}, {{0\.66666[67]}}]
// CHECK-NEXT: {{^ *\[+}}0.5, 0.5]
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 2]
// CHECK-NEXT: {{^ *\[+}}1, 3]
// CHECK-NEXT: {{^ *\[+}}0, 0]
func.func @custom_replay_i64() {
  %in = arith.constant dense<[[1.0, -2.0, 0.5, 3.0], [0.0, 0.0, 0.0, 0.0]]> : tensor<2x4xf32>
  %r0 = arith.constant dense<[[1, 3], [0, 0]]> : tensor<2x2xi64>
  %x = tensor.cast %in : tensor<2x4xf32> to tensor<?x4xf32>
  %r = tensor.cast %r0 : tensor<2x2xi64> to tensor<?x2xi64>
  %w, %i = moe.route %x replay(%r : tensor<?x2xi64>) k(2) scoring(custom) renormalize(true) score {
  ^bb0(%v: f32):
    %one = arith.constant 1.000000e+00 : f32
    %sq = arith.mulf %v, %v : f32
    %s = arith.addf %sq, %one : f32
    moe.yield %s : f32
  } : tensor<?x4xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %m = arith.constant 9203 : i64
  call @show(%m, %w, %i) : (i64, tensor<?x2xf32>, tensor<?x2xi32>) -> ()
  return
}

// Softmax scores renormalized over the given experts (hash routing): the softmax's normaliser cancels, so the
// kernel reads the row's max and weighs the picks by exp(x - max) over their sum, with the row's rules; scale 2:
//   row 0: x = [1, 2, 3, 4], replay [3, 0] -> 2 [e^3, 1] / (1 + e^3) = [1.905148, 0.0948517];
//   row 1: x = [-inf, 0, 0, -inf], replay [0, 2] -> [0, 2];
//   row 2: every logit -inf, replay [2, 2] -> [0, 0] (never NaN);
//   row 3: a NaN outside the picks, replay [0, 2]: the row's softmax is NaN -> [nan, nan];
//   row 4: a +inf outside the picks, replay [0, 1]: the row's softmax is NaN (inf - inf) -> [nan, nan];
//   row 5: x = [100, -200, -300, 0], replay [1, 2]: both scores underflow to 0 in the row's softmax, a zero sum
//          -> [0, 0] (the picks' own softmax, which order(topk_then_score) would take, gives [2, 0]).
// CHECK-LABEL: {{^}}9205
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [6, 2]
// CHECK-NEXT: {{^ *\[+}}{{1\.90515}}, {{0\.094851[78]}}]
// CHECK-NEXT: {{^ *\[+}}0, 2]
// CHECK-NEXT: {{^ *\[+}}0, 0]
// CHECK-NEXT: {{^ *\[+}}{{-?nan}}, {{-?nan}}]
// CHECK-NEXT: {{^ *\[+}}{{-?nan}}, {{-?nan}}]
// CHECK-NEXT: {{^ *\[+}}0, 0]
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [6, 2]
// CHECK-NEXT: {{^ *\[+}}3, 0]
// CHECK-NEXT: {{^ *\[+}}0, 2]
// CHECK-NEXT: {{^ *\[+}}2, 2]
// CHECK-NEXT: {{^ *\[+}}0, 2]
// CHECK-NEXT: {{^ *\[+}}0, 1]
// CHECK-NEXT: {{^ *\[+}}1, 2]
func.func @renormalized_softmax_replay() {
  %in = arith.constant dense<[[1.0, 2.0, 3.0, 4.0], [0xFF800000, 0.0, 0.0, 0xFF800000],
                              [0xFF800000, 0xFF800000, 0xFF800000, 0xFF800000], [0.0, 0x7FC00000, 0.0, 0.0],
                              [0.0, 0.0, 0.0, 0x7F800000], [100.0, -200.0, -300.0, 0.0]]> : tensor<6x4xf32>
  %r0 = arith.constant dense<[[3, 0], [0, 2], [2, 2], [0, 2], [0, 1], [1, 2]]> : tensor<6x2xi64>
  %x = tensor.cast %in : tensor<6x4xf32> to tensor<?x4xf32>
  %r = tensor.cast %r0 : tensor<6x2xi64> to tensor<?x2xi64>
  %w, %i = moe.route %x replay(%r : tensor<?x2xi64>) k(2) renormalize(true) routed_scaling_factor(2.0)
      : tensor<?x4xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %m = arith.constant 9205 : i64
  call @show(%m, %w, %i) : (i64, tensor<?x2xf32>, tensor<?x2xi32>) -> ()
  return
}

// An index outside [0, E) is reported (the first one) and read as expert 0, never out of bounds:
//   x = [0, ln 3, 0, 0] sigmoid: replay [5, -1] -> both read expert 0: sigmoid(0) = 0.5.
// CHECK-LABEL: {{^}}9204
// ERR: error: moe.route: 'replay' element 0 is 5, outside [0, 4); the pick was read as expert 0
// ERR-NEXT: error: moe.route: 'replay' element 1 is -1, outside [0, 4); the pick was read as expert 0
// ERR-NOT: error
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [1, 2]
// CHECK-NEXT: {{^ *\[+}}0.5, 0.5]
// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [1, 2]
// CHECK-NEXT: {{^ *\[+}}0, 0]
func.func @out_of_range() {
  %m = arith.constant 9204 : i64
  call @printI64(%m) : (i64) -> ()
  call @printNewline() : () -> ()
  %in = arith.constant dense<[[0.0, 1.0986123, 0.0, 0.0]]> : tensor<1x4xf32>
  %r0 = arith.constant dense<[[5, -1]]> : tensor<1x2xi32>
  %x = tensor.cast %in : tensor<1x4xf32> to tensor<?x4xf32>
  %r = tensor.cast %r0 : tensor<1x2xi32> to tensor<?x2xi32>
  %w, %i = moe.route %x replay(%r : tensor<?x2xi32>) k(2) scoring(sigmoid)
      : tensor<?x4xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %sw = tensor.cast %w : tensor<?x2xf32> to tensor<*xf32>
  call @printMemrefF32(%sw) : (tensor<*xf32>) -> ()
  %si = tensor.cast %i : tensor<?x2xi32> to tensor<*xi32>
  call @printMemrefI32(%si) : (tensor<*xi32>) -> ()
  return
}

func.func @main() {
  call @softmax_replay() : () -> ()
  call @topk_then_score_replay() : () -> ()
  call @custom_replay_i64() : () -> ()
  call @renormalized_softmax_replay() : () -> ()
  call @out_of_range() : () -> ()
  return
}
