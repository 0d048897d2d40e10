// RUN: moe-opt %s --convert-moe-to-gpu="route-map=warp" -split-input-file -verify-diagnostics

// The register kernel holds a row in one warp's registers (32 values a lane)
// and the kept groups in the bits of an i64: larger shapes are refused at the
// op, and the op stays.

func.func @too_many_experts(%l: tensor<?x2048xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  // expected-error @+1 {{'moe.route' op GPU lowering needs a static expert count <= 1024}}
  %w, %i = moe.route %l k(8) : tensor<?x2048xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

func.func @dynamic_experts(%l: tensor<?x?xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  // expected-error @+1 {{'moe.route' op GPU lowering needs a static expert count <= 1024}}
  %w, %i = moe.route %l k(2) : tensor<?x?xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

// -----

func.func @many_groups(%l: tensor<?x256xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  // expected-error @+1 {{'moe.route' op GPU lowering supports n_group <= 64}}
  %w, %i = moe.route %l k(2) n_group(128) topk_group(2) : tensor<?x256xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}
