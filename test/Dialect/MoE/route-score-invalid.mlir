// RUN: moe-opt %s -split-input-file -verify-diagnostics

func.func @custom_without_region(%l: tensor<?x16xf32>) {
  // expected-error @+1 {{scoring(custom) needs a 'score' region (one f32 argument, the logit, yielding the f32 score)}}
  %w, %i = moe.route %l k(2) scoring(custom) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @region_with_preset(%l: tensor<?x16xf32>) {
  // expected-error @+1 {{a 'score' region needs scoring(custom), but scoring is 'sigmoid'}}
  %w, %i = moe.route %l k(2) scoring(sigmoid) score {
  ^bb0(%x: f32):
    moe.yield %x : f32
  } : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @two_arguments(%l: tensor<?x16xf32>) {
  // expected-error @+1 {{the 'score' region must have one f32 argument (the logit), but has 2 argument(s) of type(s) 'f32', 'f32'}}
  %w, %i = moe.route %l k(2) scoring(custom) score {
  ^bb0(%x: f32, %y: f32):
    moe.yield %x : f32
  } : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

func.func @f16_argument(%l: tensor<?x16xf32>) {
  // expected-error @+1 {{the 'score' region must have one f32 argument (the logit), but has 1 argument(s) of type(s) 'f16'}}
  %w, %i = moe.route %l k(2) scoring(custom) score {
  ^bb0(%x: f16):
    %y = arith.extf %x : f16 to f32
    moe.yield %y : f32
  } : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

// Not elementwise on scalars: a vector op.
func.func @vector_op(%l: tensor<?x16xf32>) {
  // expected-error @+1 {{'vector.broadcast' is not allowed in the 'score' region: it holds elementwise scalar f32 arith/math ops only}}
  %w, %i = moe.route %l k(2) scoring(custom) score {
  ^bb0(%x: f32):
    %v = vector.broadcast %x : f32 to vector<4xf32>
    %r = vector.extract %v[0] : f32 from vector<4xf32>
    moe.yield %r : f32
  } : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

// An accepted op on the wrong type.
func.func @f64_constant(%l: tensor<?x16xf32>) {
  // expected-error @+1 {{'arith.constant' in the 'score' region has a result of type 'f64': the region is elementwise on scalar 'f32'}}
  %w, %i = moe.route %l k(2) scoring(custom) score {
  ^bb0(%x: f32):
    %c = arith.constant 1.0 : f64
    %t = arith.truncf %c : f64 to f32
    %r = arith.addf %x, %t : f32
    moe.yield %r : f32
  } : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

// The region is isolated from above: its constants live inside it.
func.func @captured_value(%l: tensor<?x16xf32>, %c: f32) {
  // expected-note @+1 {{required by region isolation constraints}}
  %w, %i = moe.route %l k(2) scoring(custom) score {
  ^bb0(%x: f32):
    // expected-error @+1 {{using value defined outside the region}}
    %r = arith.addf %x, %c : f32
    moe.yield %r : f32
  } : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return
}

// -----

// A step function scores, but moe.route_grad cannot differentiate it.
func.func @grad_of_floor(%l: tensor<?x16xf32>, %i: tensor<?x2xi32>, %dw: tensor<?x2xf32>) {
  // expected-error @+1 {{cannot differentiate 'math.floor' in the 'score' region: its derivative is zero almost everywhere (a step function), so no gradient would reach the logits}}
  %d = moe.route_grad %l, %i dw(%dw : tensor<?x2xf32>) scoring(custom) score {
  ^bb0(%x: f32):
    %r = math.floor %x : f32
    moe.yield %r : f32
  } : tensor<?x16xf32>, tensor<?x2xi32> -> tensor<?x16xf32>
  return
}

// -----

func.func @forward_of_floor(%l: tensor<?x16xf32>) -> tensor<?x2xf32> {
  %w, %i = moe.route %l k(2) scoring(custom) score {
  ^bb0(%x: f32):
    %r = math.floor %x : f32
    moe.yield %r : f32
  } : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w : tensor<?x2xf32>
}

// -----

func.func @grad_of_softmax(%l: tensor<?x16xf32>, %i: tensor<?x2xi32>, %dw: tensor<?x2xf32>) {
  // expected-error @+1 {{scoring(softmax) is not elementwise: moe.route_grad differentiates the sigmoid, none and custom scores}}
  %d = moe.route_grad %l, %i dw(%dw : tensor<?x2xf32>) scoring(softmax) : tensor<?x16xf32>, tensor<?x2xi32> -> tensor<?x16xf32>
  return
}

// -----

func.func @grad_dw_shape(%l: tensor<?x16xf32>, %i: tensor<?x2xi32>, %dw: tensor<?x3xf32>) {
  // expected-error @+1 {{dimension 1 of 'dw' (k = 3) must equal dimension 1 of 'indices' (k = 2)}}
  %d = moe.route_grad %l, %i dw(%dw : tensor<?x3xf32>) : tensor<?x16xf32>, tensor<?x2xi32> -> tensor<?x16xf32>
  return
}
