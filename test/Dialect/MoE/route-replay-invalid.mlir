// RUN: moe-opt %s -split-input-file -verify-diagnostics

func.func @replay_rank(%l: tensor<?x16xf32>, %r: tensor<?xi32>) {
  // expected-error @+1 {{'replay' must have rank 2 ([T, k])}}
  %w, %i = moe.route %l replay(%r : tensor<?xi32>) k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @replay_columns(%l: tensor<?x16xf32>, %r: tensor<?x3xi32>) {
  // expected-error @+1 {{dimension 1 of 'replay' (3) must equal 'k' (2)}}
  %w, %i = moe.route %l replay(%r : tensor<?x3xi32>) k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @replay_rows(%l: tensor<4x16xf32>, %r: tensor<5x2xi32>) {
  // expected-error @+1 {{'replay'}}
  %w, %i = moe.route %l replay(%r : tensor<5x2xi32>) k(2) : tensor<4x16xf32> -> tensor<4x2xf32>, tensor<4x2xi32>
  return
}

// -----

func.func @replay_float(%l: tensor<?x16xf32>, %r: tensor<?x2xf32>) {
  // expected-error @+1 {{operand #1 must be ranked tensor of 32-bit signless integer or 64-bit signless integer values}}
  %w, %i = moe.route %l replay(%r : tensor<?x2xf32>) k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}
