// Zero-sized dimensions are valid: each op below has one and its result is the defined one (DIALECT.md, the op
// docs), through the fast kernels and through the portable lowering. Expected values by hand, next to each case.
// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)

func.func @showF32(%t: tensor<*xf32>) {
  call @printMemrefF32(%t) : (tensor<*xf32>) -> ()
  return
}
func.func @showI32(%t: tensor<*xi32>) {
  call @printMemrefI32(%t) : (tensor<*xi32>) -> ()
  return
}

func.func @main() {
  // topk_renorm over no tokens: empty weights and indices of the right shape.
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [0, 2]
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [0, 2]
  %s0 = arith.constant dense<> : tensor<0x4xf32>
  %w0, %i0 = moe.topk_renorm %s0 k(2) : tensor<0x4xf32> -> tensor<0x2xf32>, tensor<0x2xi32>
  %w0u = tensor.cast %w0 : tensor<0x2xf32> to tensor<*xf32>
  %i0u = tensor.cast %i0 : tensor<0x2xi32> to tensor<*xi32>
  call @showF32(%w0u) : (tensor<*xf32>) -> ()
  call @showI32(%i0u) : (tensor<*xi32>) -> ()

  // similarity_inform with D = 0: every logit is 0, so S is uniform over the causal keys j <= i:
  // p0 = e0 = [1, 0], p1 = (e0 + e1)/2 = [0.5, 0.5], p2 = (e0 + e1 + e2)/3 = [2/3, 2/3].
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [1, 3, 2]
  // CHECK-NEXT: {{^ *\[+}}1, 0]
  // CHECK-NEXT: {{^ *\[+}}0.5, 0.5]
  // CHECK-NEXT: {{^ *\[+}}0.666667, 0.666667]
  %u1 = arith.constant dense<> : tensor<1x3x0xf32>
  %e1 = arith.constant dense<[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]> : tensor<1x3x2xf32>
  %p1 = moe.similarity_inform %u1, %e1 causal(true) : tensor<1x3x0xf32>, tensor<1x3x2xf32> -> tensor<1x3x2xf32>
  %p1u = tensor.cast %p1 : tensor<1x3x2xf32> to tensor<*xf32>
  call @showF32(%p1u) : (tensor<*xf32>) -> ()

  // attention_posterior without keys (Nk = 0): every query row is fully masked, p = 0; no row enters the mean
  // entropy, so every head has mean 0 and the lowest, 0, is selected.
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [1, 2, 3]
  // CHECK-NEXT: {{^ *\[+}}0, 0, 0]
  // CHECK-NEXT: {{^ *\[+}}0, 0, 0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [1]
  // CHECK-NEXT: {{^ *\[+}}0]
  %sc2 = arith.constant dense<> : tensor<1x2x2x0xf32>
  %u2 = arith.constant dense<1.0> : tensor<1x2x3xf32>
  %v2 = arith.constant dense<> : tensor<1x2x0x2xf32>
  %wo2 = arith.constant dense<1.0> : tensor<3x4xf32>
  %e2 = arith.constant dense<> : tensor<1x0x3xf32>
  %p2, %h2 = moe.attention_posterior %sc2, %u2, %v2, %wo2, %e2
      : tensor<1x2x2x0xf32>, tensor<1x2x3xf32>, tensor<1x2x0x2xf32>, tensor<3x4xf32>, tensor<1x0x3xf32>
      -> tensor<1x2x3xf32>, tensor<1xi32>
  %p2u = tensor.cast %p2 : tensor<1x2x3xf32> to tensor<*xf32>
  %h2u = tensor.cast %h2 : tensor<1xi32> to tensor<*xi32>
  call @showF32(%p2u) : (tensor<*xf32>) -> ()
  call @showI32(%h2u) : (tensor<*xi32>) -> ()

  // attention_posterior without experts (K = 0): p is empty, the head still follows from the scores: head 0's
  // row [0, 0] has entropy ln 2, head 1's row [0, -inf] entropy 0, so head 1.
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [1, 1, 0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [1]
  // CHECK-NEXT: {{^ *\[+}}1]
  %sc3 = arith.constant dense<[[[[0.0, 0.0]], [[0.0, 0xFF800000]]]]> : tensor<1x2x1x2xf32>
  %u3 = arith.constant dense<1.0> : tensor<1x1x1xf32>
  %v3 = arith.constant dense<1.0> : tensor<1x2x2x1xf32>
  %wo3 = arith.constant dense<1.0> : tensor<1x2xf32>
  %e3 = arith.constant dense<> : tensor<1x2x0xf32>
  %p3, %h3 = moe.attention_posterior %sc3, %u3, %v3, %wo3, %e3
      : tensor<1x2x1x2xf32>, tensor<1x1x1xf32>, tensor<1x2x2x1xf32>, tensor<1x2xf32>, tensor<1x2x0xf32>
      -> tensor<1x1x0xf32>, tensor<1xi32>
  %p3u = tensor.cast %p3 : tensor<1x1x0xf32> to tensor<*xf32>
  %h3u = tensor.cast %h3 : tensor<1xi32> to tensor<*xi32>
  call @showF32(%p3u) : (tensor<*xf32>) -> ()
  call @showI32(%h3u) : (tensor<*xi32>) -> ()

  // mad_dispersion over no tokens: every cluster is empty, W = 1 (M_k = I), counts 0.
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 3]
  // CHECK-NEXT: {{^ *\[+}}1, 1, 1]
  // CHECK-NEXT: {{^ *\[+}}1, 1, 1]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [2]
  // CHECK-NEXT: {{^ *\[+}}0, 0]
  %x4 = arith.constant dense<> : tensor<0x3xf32>
  %a4 = arith.constant dense<> : tensor<0xi32>
  %w4, %c4 = moe.mad_dispersion %x4, %a4 num_experts(2) : tensor<0x3xf32>, tensor<0xi32> -> tensor<2x3xf32>, tensor<2xi32>
  %w4u = tensor.cast %w4 : tensor<2x3xf32> to tensor<*xf32>
  %c4u = tensor.cast %c4 : tensor<2xi32> to tensor<*xi32>
  call @showF32(%w4u) : (tensor<*xf32>) -> ()
  call @showI32(%c4u) : (tensor<*xi32>) -> ()

  // mad_dispersion without features (D = 0): W is empty, the counts are still counted.
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [2]
  // CHECK-NEXT: {{^ *\[+}}1, 2]
  %x5 = arith.constant dense<> : tensor<3x0xf32>
  %a5 = arith.constant dense<[1, 0, 1]> : tensor<3xi32>
  %w5, %c5 = moe.mad_dispersion %x5, %a5 num_experts(2) : tensor<3x0xf32>, tensor<3xi32> -> tensor<2x0xf32>, tensor<2xi32>
  %w5u = tensor.cast %w5 : tensor<2x0xf32> to tensor<*xf32>
  %c5u = tensor.cast %c5 : tensor<2xi32> to tensor<*xi32>
  call @showF32(%w5u) : (tensor<*xf32>) -> ()
  call @showI32(%c5u) : (tensor<*xi32>) -> ()

  // adjacency_update with no tokens: C = 0, so a_next = beta · a = 0.5 · a.
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 2]
  // CHECK-NEXT: {{^ *\[+}}0.5, 1]
  // CHECK-NEXT: {{^ *\[+}}1.5, 2]
  %a6 = arith.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %i6 = arith.constant dense<> : tensor<0x2xi32>
  %n6 = moe.adjacency_update %a6, %i6 beta(5.000000e-01) : tensor<2x2xf32>, tensor<0x2xi32> -> tensor<2x2xf32>
  %n6u = tensor.cast %n6 : tensor<2x2xf32> to tensor<*xf32>
  call @showF32(%n6u) : (tensor<*xf32>) -> ()

  // hyper_router with an empty embedding (De = 0): hidden = relu(b1) = [1, 0]; out = w2 · [1, 0] + b2 =
  // [1, 2, 3, 5] -> w = [[1], [3]], b = [2, 5].
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 1]
  // CHECK-NEXT: {{^ *\[+}}1]
  // CHECK-NEXT: {{^ *\[+}}3]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [2]
  // CHECK-NEXT: {{^ *\[+}}2, 5]
  %emb7 = arith.constant dense<> : tensor<0xf32>
  %w17 = arith.constant dense<> : tensor<2x0xf32>
  %b17 = arith.constant dense<[1.0, -1.0]> : tensor<2xf32>
  %w27 = arith.constant dense<[[1.0, 9.0], [2.0, 9.0], [3.0, 9.0], [4.0, 9.0]]> : tensor<4x2xf32>
  %b27 = arith.constant dense<[0.0, 0.0, 0.0, 1.0]> : tensor<4xf32>
  %w7, %b7 = moe.hyper_router %emb7, %w17, %b17, %w27, %b27 num_experts(2)
      : tensor<0xf32>, tensor<2x0xf32>, tensor<2xf32>, tensor<4x2xf32>, tensor<4xf32> -> tensor<2x1xf32>, tensor<2xf32>
  %w7u = tensor.cast %w7 : tensor<2x1xf32> to tensor<*xf32>
  %b7u = tensor.cast %b7 : tensor<2xf32> to tensor<*xf32>
  call @showF32(%w7u) : (tensor<*xf32>) -> ()
  call @showF32(%b7u) : (tensor<*xf32>) -> ()
  return
}
