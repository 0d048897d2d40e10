// RUN: moe-opt %s --convert-moe-to-gpu="route-map=warp" -split-input-file -verify-diagnostics

// Past the register kernel's 1024 experts a shape runs the lanes kernel or
// the loop kernel (route-loop.mlir); what no kernel takes is refused at the
// op, and the op stays: a dynamic expert count, more than 64 groups (the kept
// groups are the bits of an i64).

func.func @dynamic_experts(%l: tensor<?x?xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  // expected-error @+1 {{'moe.route' op GPU lowering needs a static expert count}}
  %w, %i = moe.route %l k(2) : tensor<?x?xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

// -----

func.func @many_groups(%l: tensor<?x256xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  // expected-error @+1 {{'moe.route' op GPU lowering supports n_group <= 64}}
  %w, %i = moe.route %l k(2) n_group(128) topk_group(2) : tensor<?x256xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}
