// Every verifier rule of moe.kernel (MoEKernelOp.td), one rule per case.
// RUN: moe-opt %s -split-input-file -verify-diagnostics

func.func @arg_count(%x: tensor<4xf32>, %o: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'moe.kernel' op expected 2 block arguments (one per operand), got 1}}
  %r = moe.kernel ins(%x : tensor<4xf32>) outs(%o : tensor<4xf32>) {
  ^bb0(%xb: memref<4xf32>):
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @arg_shape(%x: tensor<4xf32>, %o: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{block argument #1 must be an identity-layout memref of a shape compatible with operand #1 and its element type ('memref<4xf32>' in some memory space), got 'memref<5xf32>'}}
  %r = moe.kernel ins(%x : tensor<4xf32>) outs(%o : tensor<4xf32>) {
  ^bb0(%xb: memref<4xf32>, %ob: memref<5xf32>):
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @arg_element_type(%x: tensor<4xf32>, %o: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{block argument #0 must be an identity-layout memref of a shape compatible with operand #0 and its element type ('memref<4xf32>' in some memory space), got 'memref<4xf16>'}}
  %r = moe.kernel ins(%x : tensor<4xf32>) outs(%o : tensor<4xf32>) {
  ^bb0(%xb: memref<4xf16>, %ob: memref<4xf32>):
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @arg_layout(%x: tensor<4xf32>, %o: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{block argument #0 must be an identity-layout memref}}
  %r = moe.kernel ins(%x : tensor<4xf32>) outs(%o : tensor<4xf32>) {
  ^bb0(%xb: memref<4xf32, strided<[2]>>, %ob: memref<4xf32>):
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @arg_not_memref(%x: tensor<4xf32>, %o: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{block argument #0 must be an identity-layout memref}}
  %r = moe.kernel ins(%x : tensor<4xf32>) outs(%o : tensor<4xf32>) {
  ^bb0(%xb: tensor<4xf32>, %ob: memref<4xf32>):
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @result_type(%x: tensor<4xf32>, %o: tensor<4xf32>) -> tensor<5xf32> {
  // expected-error @+1 {{expected type of operand #1 ('tensor<4xf32>') to match type of corresponding result ('tensor<5xf32>')}}
  %r = moe.kernel ins(%x : tensor<4xf32>) outs(%o : tensor<4xf32>) {
  ^bb0(%xb: memref<4xf32>, %ob: memref<4xf32>):
  } -> tensor<5xf32>
  return %r : tensor<5xf32>
}

// -----

func.func @result_count(%x: tensor<4xf32>, %o: tensor<4xf32>) {
  // expected-error @+1 {{expected the number of tensor results (0) to be equal to the number of output tensors (1)}}
  moe.kernel ins(%x : tensor<4xf32>) outs(%o : tensor<4xf32>) {
  ^bb0(%xb: memref<4xf32>, %ob: memref<4xf32>):
  }
  return
}

// -----

// All memory access goes through the block arguments: a tensor from above is an operand the op does not declare.
func.func @tensor_from_above(%x: tensor<4xf32>, %o: tensor<4xf32>) -> tensor<4xf32> {
  %c0 = arith.constant 0 : index
  %r = moe.kernel outs(%o : tensor<4xf32>) {
  ^bb0(%ob: memref<4xf32>):
    // expected-error @+1 {{'tensor.extract' op uses a tensor or memref defined outside its enclosing moe.kernel; pass it as an operand of the kernel instead}}
    %v = tensor.extract %x[%c0] : tensor<4xf32>
    memref.store %v, %ob[%c0] : memref<4xf32>
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

// ... and so is a buffer from above, which the kernel could otherwise write behind bufferization's back.
func.func @memref_from_above(%m: memref<4xf32>, %o: tensor<4xf32>) -> tensor<4xf32> {
  %r = moe.kernel outs(%o : tensor<4xf32>) {
  ^bb0(%ob: memref<4xf32>):
    // expected-error @+1 {{'memref.copy' op uses a tensor or memref defined outside its enclosing moe.kernel}}
    memref.copy %ob, %m : memref<4xf32> to memref<4xf32>
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}

// -----

func.func @terminator_outside() {
  // expected-error @+1 {{'moe.kernel_end' op expects parent op 'moe.kernel'}}
  moe.kernel_end
  return
}
