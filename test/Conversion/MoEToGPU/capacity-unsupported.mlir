// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file -verify-diagnostics

// Expert capacity and the bias update have CPU lowerings only: the GPU lowering refuses them at the op, which stays.

func.func @plan_with_capacity(%idx: tensor<?x2xi32>) -> tensor<8xi32> {
  // expected-error @+1 {{'moe.dispatch_plan' op GPU lowering does not support 'capacity' yet (the CPU lowerings do)}}
  %c, %o, %ord, %inv, %p, %b, %n, %d = moe.dispatch_plan %idx num_experts(8) capacity(4)
      : tensor<?x2xi32> -> tensor<8xi32>, tensor<9xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
        tensor<1xi32>, tensor<8xi32>
  return %d : tensor<8xi32>
}

// -----

func.func @bias_update(%b: tensor<8xf32>, %c: tensor<8xi32>) -> tensor<8xf32> {
  // expected-error @+1 {{'moe.bias_update' op has no GPU lowering}}
  %n = moe.bias_update %b, %c rate(1.000000e-03) : tensor<8xf32>, tensor<8xi32> -> tensor<8xf32>
  return %n : tensor<8xf32>
}
