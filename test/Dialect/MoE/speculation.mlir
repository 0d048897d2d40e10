// Side effects as declared: every op is free of memory effects (unused results are erased), but ops that read
// run-time indices may report an error, so, like arith.divsi, they are not speculated out of a loop that may not run.
// RUN: moe-opt %s -loop-invariant-code-motion -canonicalize | FileCheck %s

// CHECK-LABEL: func.func @pure_gate_is_hoisted
// CHECK:         moe.topk_renorm
// CHECK:         scf.for
// CHECK-NOT:     moe.topk_renorm
func.func @pure_gate_is_hoisted(%s: tensor<4x8xf32>, %n: index) -> tensor<4x2xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %init = arith.constant dense<0.0> : tensor<4x2xf32>
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %init) -> tensor<4x2xf32> {
    %w, %idx = moe.topk_renorm %s k(2) : tensor<4x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
    %sum = arith.addf %acc, %w : tensor<4x2xf32>
    scf.yield %sum : tensor<4x2xf32>
  }
  return %r : tensor<4x2xf32>
}

// CHECK-LABEL: func.func @index_readers_stay_in_loop
// CHECK:         scf.for
// CHECK:           moe.mad_dispersion
// CHECK:           moe.adjacency_update
func.func @index_readers_stay_in_loop(%x: tensor<16x4xf32>, %as: tensor<16xi32>, %a: tensor<4x4xf32>,
                                      %idx: tensor<16x2xi32>, %n: index) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %init = arith.constant dense<0.0> : tensor<4x4xf32>
  %r:2 = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %init, %g = %a) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
    %w, %c = moe.mad_dispersion %x, %as num_experts(4) : tensor<16x4xf32>, tensor<16xi32> -> tensor<4x4xf32>, tensor<4xi32>
    %g2 = moe.adjacency_update %a, %idx : tensor<4x4xf32>, tensor<16x2xi32> -> tensor<4x4xf32>
    %sum = arith.addf %acc, %w : tensor<4x4xf32>
    scf.yield %sum, %g2 : tensor<4x4xf32>, tensor<4x4xf32>
  }
  return %r#0, %r#1 : tensor<4x4xf32>, tensor<4x4xf32>
}

// CHECK-LABEL: func.func @unused_index_readers_are_erased
// CHECK-NEXT:    return
func.func @unused_index_readers_are_erased(%x: tensor<16x4xf32>, %as: tensor<16xi32>, %a: tensor<4x4xf32>, %idx: tensor<16x2xi32>) {
  %w, %c = moe.mad_dispersion %x, %as num_experts(4) : tensor<16x4xf32>, tensor<16xi32> -> tensor<4x4xf32>, tensor<4xi32>
  %g = moe.adjacency_update %a, %idx : tensor<4x4xf32>, tensor<16x2xi32> -> tensor<4x4xf32>
  return
}

// attention_posterior_grad reads h* (`head`), a run-time index: not speculated; without it (head_select = all) the
// op is speculatable.
// CHECK-LABEL: func.func @posterior_grad_head
// CHECK:         moe.attention_posterior_grad {{.*}} head_select(all)
// CHECK:         scf.for
// CHECK:           moe.attention_posterior_grad {{.*}} head(
func.func @posterior_grad_head(%s: tensor<2x3x4x5xf32>, %u: tensor<2x4x6xf32>, %v: tensor<2x3x5x2xf32>,
    %wo: tensor<6x6xf32>, %e: tensor<2x5x3xf32>, %h: tensor<2xi32>, %dp: tensor<2x4x3xf32>, %n: index)
    -> (tensor<2x4x6xf32>, tensor<2x4x6xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %init = arith.constant dense<0.0> : tensor<2x4x6xf32>
  %r:2 = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %init, %acc2 = %init)
      -> (tensor<2x4x6xf32>, tensor<2x4x6xf32>) {
    %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<2xi32>)
        dp(%dp : tensor<2x4x3xf32>)
        : tensor<2x3x4x5xf32>, tensor<2x4x6xf32>, tensor<2x3x5x2xf32>, tensor<6x6xf32>, tensor<2x5x3xf32>
        -> tensor<2x3x4x5xf32>, tensor<2x4x6xf32>, tensor<2x3x5x2xf32>, tensor<6x6xf32>, tensor<2x5x3xf32>
    %as, %au, %av, %awo, %ae = moe.attention_posterior_grad %s, %u, %v, %wo, %e dp(%dp : tensor<2x4x3xf32>)
        head_select(all)
        : tensor<2x3x4x5xf32>, tensor<2x4x6xf32>, tensor<2x3x5x2xf32>, tensor<6x6xf32>, tensor<2x5x3xf32>
        -> tensor<2x3x4x5xf32>, tensor<2x4x6xf32>, tensor<2x3x5x2xf32>, tensor<6x6xf32>, tensor<2x5x3xf32>
    %sum = arith.addf %acc, %du : tensor<2x4x6xf32>
    %sum2 = arith.addf %acc2, %au : tensor<2x4x6xf32>
    scf.yield %sum, %sum2 : tensor<2x4x6xf32>, tensor<2x4x6xf32>
  }
  return %r#0, %r#1 : tensor<2x4x6xf32>, tensor<2x4x6xf32>
}
