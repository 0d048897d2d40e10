// Issue #15: dynamic dimensions that are zero at run time (the token count of a decode step that routes nothing,
// an empty batch) give the same defined results as static zeros (test/Integration/CPU/zero_sized.mlir): empty
// results, W = 1 and counts 0 without tokens, a = beta · a without co-selections, p = 0 and head 0 without keys
// (head -1 for head_select(all)). The callees take `?` sizes, so moe-legalize-shapes cannot see the zero: the
// kernels meet it at run time.
// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)

func.func @topk(%s: tensor<?x4xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x4xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

func.func @similarity(%u: tensor<?x?x3xf32>, %e: tensor<?x?x2xf32>) -> tensor<?x?x2xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<?x?x3xf32>, tensor<?x?x2xf32> -> tensor<?x?x2xf32>
  return %p : tensor<?x?x2xf32>
}

func.func @similarity_topk(%u: tensor<?x?x3xf32>, %e: tensor<?x?x4xf32>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<?x?x3xf32>, tensor<?x?x4xf32> -> tensor<?x?x2xf32>, tensor<?x?x2xi32>
  return %w, %i : tensor<?x?x2xf32>, tensor<?x?x2xi32>
}

func.func @posterior(%s: tensor<?x2x?x?xf32>, %u: tensor<?x?x3xf32>, %v: tensor<?x2x?x2xf32>, %wo: tensor<3x4xf32>,
                     %e: tensor<?x?x3xf32>) -> (tensor<?x?x3xf32>, tensor<?xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e
      : tensor<?x2x?x?xf32>, tensor<?x?x3xf32>, tensor<?x2x?x2xf32>, tensor<3x4xf32>, tensor<?x?x3xf32>
      -> tensor<?x?x3xf32>, tensor<?xi32>
  return %p, %h : tensor<?x?x3xf32>, tensor<?xi32>
}

func.func @posterior_all(%s: tensor<?x2x?x?xf32>, %u: tensor<?x?x3xf32>, %v: tensor<?x2x?x2xf32>, %wo: tensor<3x4xf32>,
                         %e: tensor<?x?x3xf32>) -> (tensor<?x?x3xf32>, tensor<?xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all)
      : tensor<?x2x?x?xf32>, tensor<?x?x3xf32>, tensor<?x2x?x2xf32>, tensor<3x4xf32>, tensor<?x?x3xf32>
      -> tensor<?x?x3xf32>, tensor<?xi32>
  return %p, %h : tensor<?x?x3xf32>, tensor<?xi32>
}

func.func @posterior_topk(%s: tensor<?x2x?x?xf32>, %u: tensor<?x?x3xf32>, %v: tensor<?x2x?x2xf32>, %wo: tensor<3x4xf32>,
                          %e: tensor<?x?x3xf32>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2)
      : tensor<?x2x?x?xf32>, tensor<?x?x3xf32>, tensor<?x2x?x2xf32>, tensor<3x4xf32>, tensor<?x?x3xf32>
      -> tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>
  return %w, %i, %h : tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>
}

func.func @mad(%x: tensor<?x3xf32>, %a: tensor<?xi32>) -> (tensor<2x3xf32>, tensor<2xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(2) : tensor<?x3xf32>, tensor<?xi32> -> tensor<2x3xf32>, tensor<2xi32>
  return %w, %c : tensor<2x3xf32>, tensor<2xi32>
}

func.func @adjacency(%a: tensor<2x2xf32>, %i: tensor<?x2xi32>) -> tensor<2x2xf32> {
  %n = moe.adjacency_update %a, %i beta(5.000000e-01) : tensor<2x2xf32>, tensor<?x2xi32> -> tensor<2x2xf32>
  return %n : tensor<2x2xf32>
}

func.func @route(%l: tensor<?x8xf32>, %b: tensor<8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<8xf32>) k(2) scoring(sigmoid) n_group(4) topk_group(2) renormalize(true)
      : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

func.func @plan(%idx: tensor<?x2xi32>) -> (tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
                                           tensor<?xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(3) block_size(2)
      : tensor<?x2xi32> -> tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n
      : tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}

func.func @showF32(%t: tensor<*xf32>) {
  call @printMemrefF32(%t) : (tensor<*xf32>) -> ()
  return
}
func.func @showI32(%t: tensor<*xi32>) {
  call @printMemrefI32(%t) : (tensor<*xi32>) -> ()
  return
}

func.func @main() {
  // topk_renorm over no tokens.
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [0, 2]
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [0, 2]
  %s0 = arith.constant dense<> : tensor<0x4xf32>
  %s0d = tensor.cast %s0 : tensor<0x4xf32> to tensor<?x4xf32>
  %w0, %i0 = call @topk(%s0d) : (tensor<?x4xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
  %w0u = tensor.cast %w0 : tensor<?x2xf32> to tensor<*xf32>
  %i0u = tensor.cast %i0 : tensor<?x2xi32> to tensor<*xi32>
  call @showF32(%w0u) : (tensor<*xf32>) -> ()
  call @showI32(%i0u) : (tensor<*xi32>) -> ()

  // similarity_inform over no sequences (B = 0), then over sequences without tokens (N = 0).
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [0, 5, 2]
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [2, 0, 2]
  %u1 = arith.constant dense<> : tensor<0x5x3xf32>
  %e1 = arith.constant dense<> : tensor<0x5x2xf32>
  %u1d = tensor.cast %u1 : tensor<0x5x3xf32> to tensor<?x?x3xf32>
  %e1d = tensor.cast %e1 : tensor<0x5x2xf32> to tensor<?x?x2xf32>
  %p1 = call @similarity(%u1d, %e1d) : (tensor<?x?x3xf32>, tensor<?x?x2xf32>) -> tensor<?x?x2xf32>
  %p1u = tensor.cast %p1 : tensor<?x?x2xf32> to tensor<*xf32>
  call @showF32(%p1u) : (tensor<*xf32>) -> ()
  %u2 = arith.constant dense<> : tensor<2x0x3xf32>
  %e2 = arith.constant dense<> : tensor<2x0x2xf32>
  %u2d = tensor.cast %u2 : tensor<2x0x3xf32> to tensor<?x?x3xf32>
  %e2d = tensor.cast %e2 : tensor<2x0x2xf32> to tensor<?x?x2xf32>
  %p2 = call @similarity(%u2d, %e2d) : (tensor<?x?x3xf32>, tensor<?x?x2xf32>) -> tensor<?x?x2xf32>
  %p2u = tensor.cast %p2 : tensor<?x?x2xf32> to tensor<*xf32>
  call @showF32(%p2u) : (tensor<*xf32>) -> ()

  // similarity_inform_topk over sequences without tokens.
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [2, 0, 2]
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [2, 0, 2]
  %e3 = arith.constant dense<> : tensor<2x0x4xf32>
  %e3d = tensor.cast %e3 : tensor<2x0x4xf32> to tensor<?x?x4xf32>
  %w3, %i3 = call @similarity_topk(%u2d, %e3d) : (tensor<?x?x3xf32>, tensor<?x?x4xf32>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>)
  %w3u = tensor.cast %w3 : tensor<?x?x2xf32> to tensor<*xf32>
  %i3u = tensor.cast %i3 : tensor<?x?x2xi32> to tensor<*xi32>
  call @showF32(%w3u) : (tensor<*xf32>) -> ()
  call @showI32(%i3u) : (tensor<*xi32>) -> ()

  // attention_posterior without keys (Nk = 0): every row fully masked, p = 0, every head's mean entropy 0: head 0.
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [1, 2, 3]
  // CHECK-NEXT: {{^ *\[+}}0, 0, 0]
  // CHECK-NEXT: {{^ *\[+}}0, 0, 0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [1]
  // CHECK-NEXT: {{^ *\[+}}0]
  %sc4 = arith.constant dense<> : tensor<1x2x2x0xf32>
  %u4 = arith.constant dense<1.0> : tensor<1x2x3xf32>
  %v4 = arith.constant dense<> : tensor<1x2x0x2xf32>
  %wo4 = arith.constant dense<1.0> : tensor<3x4xf32>
  %e4 = arith.constant dense<> : tensor<1x0x3xf32>
  %sc4d = tensor.cast %sc4 : tensor<1x2x2x0xf32> to tensor<?x2x?x?xf32>
  %u4d = tensor.cast %u4 : tensor<1x2x3xf32> to tensor<?x?x3xf32>
  %v4d = tensor.cast %v4 : tensor<1x2x0x2xf32> to tensor<?x2x?x2xf32>
  %e4d = tensor.cast %e4 : tensor<1x0x3xf32> to tensor<?x?x3xf32>
  %p4, %h4 = call @posterior(%sc4d, %u4d, %v4d, %wo4, %e4d)
      : (tensor<?x2x?x?xf32>, tensor<?x?x3xf32>, tensor<?x2x?x2xf32>, tensor<3x4xf32>, tensor<?x?x3xf32>)
      -> (tensor<?x?x3xf32>, tensor<?xi32>)
  %p4u = tensor.cast %p4 : tensor<?x?x3xf32> to tensor<*xf32>
  %h4u = tensor.cast %h4 : tensor<?xi32> to tensor<*xi32>
  call @showF32(%p4u) : (tensor<*xf32>) -> ()
  call @showI32(%h4u) : (tensor<*xi32>) -> ()

  // head_select(all) without keys: p = 0 and head -1 (no single head) for every sequence.
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [1, 2, 3]
  // CHECK-NEXT: {{^ *\[+}}0, 0, 0]
  // CHECK-NEXT: {{^ *\[+}}0, 0, 0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [1]
  // CHECK-NEXT: {{^ *\[+}}-1]
  %p4a, %h4a = call @posterior_all(%sc4d, %u4d, %v4d, %wo4, %e4d)
      : (tensor<?x2x?x?xf32>, tensor<?x?x3xf32>, tensor<?x2x?x2xf32>, tensor<3x4xf32>, tensor<?x?x3xf32>)
      -> (tensor<?x?x3xf32>, tensor<?xi32>)
  %p4au = tensor.cast %p4a : tensor<?x?x3xf32> to tensor<*xf32>
  %h4au = tensor.cast %h4a : tensor<?xi32> to tensor<*xi32>
  call @showF32(%p4au) : (tensor<*xf32>) -> ()
  call @showI32(%h4au) : (tensor<*xi32>) -> ()

  // attention_posterior over no sequences (B = 0): empty p and head.
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [0, 2, 3]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [0]
  %sc5 = arith.constant dense<> : tensor<0x2x2x4xf32>
  %u5 = arith.constant dense<> : tensor<0x2x3xf32>
  %v5 = arith.constant dense<> : tensor<0x2x4x2xf32>
  %e5 = arith.constant dense<> : tensor<0x4x3xf32>
  %sc5d = tensor.cast %sc5 : tensor<0x2x2x4xf32> to tensor<?x2x?x?xf32>
  %u5d = tensor.cast %u5 : tensor<0x2x3xf32> to tensor<?x?x3xf32>
  %v5d = tensor.cast %v5 : tensor<0x2x4x2xf32> to tensor<?x2x?x2xf32>
  %e5d = tensor.cast %e5 : tensor<0x4x3xf32> to tensor<?x?x3xf32>
  %p5, %h5 = call @posterior(%sc5d, %u5d, %v5d, %wo4, %e5d)
      : (tensor<?x2x?x?xf32>, tensor<?x?x3xf32>, tensor<?x2x?x2xf32>, tensor<3x4xf32>, tensor<?x?x3xf32>)
      -> (tensor<?x?x3xf32>, tensor<?xi32>)
  %p5u = tensor.cast %p5 : tensor<?x?x3xf32> to tensor<*xf32>
  %h5u = tensor.cast %h5 : tensor<?xi32> to tensor<*xi32>
  call @showF32(%p5u) : (tensor<*xf32>) -> ()
  call @showI32(%h5u) : (tensor<*xi32>) -> ()

  // attention_posterior_topk without keys: p = 0 ties everywhere, so the lowest indices 0, 1 with zero weights.
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [1, 2, 2]
  // CHECK-NEXT: {{^ *\[+}}0, 0]
  // CHECK-NEXT: {{^ *\[+}}0, 0]
  // CHECK: rank = 3 offset = {{[0-9]+}} sizes = [1, 2, 2]
  // CHECK-NEXT: {{^ *\[+}}0, 1]
  // CHECK-NEXT: {{^ *\[+}}0, 1]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [1]
  // CHECK-NEXT: {{^ *\[+}}0]
  %w6, %i6, %h6 = call @posterior_topk(%sc4d, %u4d, %v4d, %wo4, %e4d)
      : (tensor<?x2x?x?xf32>, tensor<?x?x3xf32>, tensor<?x2x?x2xf32>, tensor<3x4xf32>, tensor<?x?x3xf32>)
      -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>)
  %w6u = tensor.cast %w6 : tensor<?x?x2xf32> to tensor<*xf32>
  %i6u = tensor.cast %i6 : tensor<?x?x2xi32> to tensor<*xi32>
  %h6u = tensor.cast %h6 : tensor<?xi32> to tensor<*xi32>
  call @showF32(%w6u) : (tensor<*xf32>) -> ()
  call @showI32(%i6u) : (tensor<*xi32>) -> ()
  call @showI32(%h6u) : (tensor<*xi32>) -> ()

  // mad_dispersion over no tokens: every cluster empty, W = 1, counts 0.
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 3]
  // CHECK-NEXT: {{^ *\[+}}1, 1, 1]
  // CHECK-NEXT: {{^ *\[+}}1, 1, 1]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [2]
  // CHECK-NEXT: {{^ *\[+}}0, 0]
  %x7 = arith.constant dense<> : tensor<0x3xf32>
  %a7 = arith.constant dense<> : tensor<0xi32>
  %x7d = tensor.cast %x7 : tensor<0x3xf32> to tensor<?x3xf32>
  %a7d = tensor.cast %a7 : tensor<0xi32> to tensor<?xi32>
  %w7, %c7 = call @mad(%x7d, %a7d) : (tensor<?x3xf32>, tensor<?xi32>) -> (tensor<2x3xf32>, tensor<2xi32>)
  %w7u = tensor.cast %w7 : tensor<2x3xf32> to tensor<*xf32>
  %c7u = tensor.cast %c7 : tensor<2xi32> to tensor<*xi32>
  call @showF32(%w7u) : (tensor<*xf32>) -> ()
  call @showI32(%c7u) : (tensor<*xi32>) -> ()

  // adjacency_update with no tokens: C = 0, a_next = 0.5 · a.
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [2, 2]
  // CHECK-NEXT: {{^ *\[+}}0.5, 1]
  // CHECK-NEXT: {{^ *\[+}}1.5, 2]
  %a8 = arith.constant dense<[[1.0, 2.0], [3.0, 4.0]]> : tensor<2x2xf32>
  %i8 = arith.constant dense<> : tensor<0x2xi32>
  %i8d = tensor.cast %i8 : tensor<0x2xi32> to tensor<?x2xi32>
  %n8 = call @adjacency(%a8, %i8d) : (tensor<2x2xf32>, tensor<?x2xi32>) -> tensor<2x2xf32>
  %n8u = tensor.cast %n8 : tensor<2x2xf32> to tensor<*xf32>
  call @showF32(%n8u) : (tensor<*xf32>) -> ()

  // route (grouped, biased, sigmoid) over no tokens.
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [0, 2]
  // CHECK: rank = 2 offset = {{[0-9]+}} sizes = [0, 2]
  %l9 = arith.constant dense<> : tensor<0x8xf32>
  %b9 = arith.constant dense<0.5> : tensor<8xf32>
  %l9d = tensor.cast %l9 : tensor<0x8xf32> to tensor<?x8xf32>
  %w9, %i9 = call @route(%l9d, %b9) : (tensor<?x8xf32>, tensor<8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)
  %w9u = tensor.cast %w9 : tensor<?x2xf32> to tensor<*xf32>
  %i9u = tensor.cast %i9 : tensor<?x2xi32> to tensor<*xi32>
  call @showF32(%w9u) : (tensor<*xf32>) -> ()
  call @showI32(%i9u) : (tensor<*xi32>) -> ()

  // dispatch_plan of no tokens: counts 0, offsets 0, empty order and inverse; N + E·(B-1) = 3 padding slots
  // (all N = 0), ceil(3/2) = 2 blocks of no expert (-1), nothing used.
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
  // CHECK-NEXT: {{^ *\[+}}0, 0, 0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [4]
  // CHECK-NEXT: {{^ *\[+}}0, 0, 0, 0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [3]
  // CHECK-NEXT: {{^ *\[+}}0, 0, 0]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [2]
  // CHECK-NEXT: {{^ *\[+}}-1, -1]
  // CHECK: rank = 1 offset = {{[0-9]+}} sizes = [1]
  // CHECK-NEXT: {{^ *\[+}}0]
  %idx10 = arith.constant dense<> : tensor<0x2xi32>
  %idx10d = tensor.cast %idx10 : tensor<0x2xi32> to tensor<?x2xi32>
  %c10, %o10, %ord10, %inv10, %p10, %b10, %n10 = call @plan(%idx10d)
      : (tensor<?x2xi32>) -> (tensor<3xi32>, tensor<4xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
                              tensor<?xi32>, tensor<1xi32>)
  %c10u = tensor.cast %c10 : tensor<3xi32> to tensor<*xi32>
  %o10u = tensor.cast %o10 : tensor<4xi32> to tensor<*xi32>
  %ord10u = tensor.cast %ord10 : tensor<?xi32> to tensor<*xi32>
  %inv10u = tensor.cast %inv10 : tensor<?xi32> to tensor<*xi32>
  %p10u = tensor.cast %p10 : tensor<?xi32> to tensor<*xi32>
  %b10u = tensor.cast %b10 : tensor<?xi32> to tensor<*xi32>
  %n10u = tensor.cast %n10 : tensor<1xi32> to tensor<*xi32>
  call @showI32(%c10u) : (tensor<*xi32>) -> ()
  call @showI32(%o10u) : (tensor<*xi32>) -> ()
  call @showI32(%ord10u) : (tensor<*xi32>) -> ()
  call @showI32(%inv10u) : (tensor<*xi32>) -> ()
  call @showI32(%p10u) : (tensor<*xi32>) -> ()
  call @showI32(%b10u) : (tensor<*xi32>) -> ()
  call @showI32(%n10u) : (tensor<*xi32>) -> ()
  return
}
