// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | mlir-runner -O3 -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime,%mlir_async_runtime | FileCheck %s
// RUN: moe-opt %s "--moe-lower-to-llvm=num-threads=1 target-cpu=x86-64-v3" | mlir-runner -e main \
// RUN:   -entry-point-result=void -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s

// moe.hyper_router_grad's CPU kernel on dynamic shapes gives the bits of the same kernel on static shapes (whose
// numerics python/tests/test_hyper_router_grad_kernel.py checks against the float64 closed form), for w2 [1616, 250]
// (E = 16, D = 100: the blocked path over the workers, a column tail on both vector widths) and w1 [250, 40], with a
// hidden unit at a = 0 exactly, one NaN (b1) and negative ones. Per result: the count of entries whose bits differ
// (0) and of nonzero entries (the gradients are not trivially zero; d_w2 has a NaN column).

func.func private @printI64(i64)
func.func private @printNewline()

// in[i, j] = ((i·131 + j·71 + seed) mod 97) / 48.5 − 1.
func.func @fill(%rows: index, %cols: index, %seed: index) -> tensor<?x?xf32> {
  %e = tensor.empty(%rows, %cols) : tensor<?x?xf32>
  %t = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      outs(%e : tensor<?x?xf32>) {
  ^bb0(%out: f32):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %c131 = arith.constant 131 : index
    %c71 = arith.constant 71 : index
    %c97 = arith.constant 97 : index
    %a = arith.muli %i, %c131 : index
    %b = arith.muli %j, %c71 : index
    %s = arith.addi %a, %b : index
    %s2 = arith.addi %s, %seed : index
    %m = arith.remui %s2, %c97 : index
    %mi = arith.index_cast %m : index to i64
    %f = arith.sitofp %mi : i64 to f32
    %scale = arith.constant 48.5 : f32
    %one = arith.constant 1.0 : f32
    %q = arith.divf %f, %scale : f32
    %v = arith.subf %q, %one : f32
    linalg.yield %v : f32
  } -> tensor<?x?xf32>
  return %t : tensor<?x?xf32>
}

func.func @vec(%n: index, %seed: index) -> tensor<?xf32> {
  %c1 = arith.constant 1 : index
  %t = call @fill(%c1, %n, %seed) : (index, index, index) -> tensor<?x?xf32>
  %v = tensor.collapse_shape %t [[0, 1]] : tensor<?x?xf32> into tensor<?xf32>
  return %v : tensor<?xf32>
}

// Prints the count of entries of a and b whose bits differ, then the count of nonzero entries of a.
func.func @compare(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %z = arith.constant 0 : i64
  %one = arith.constant 1 : i64
  %zf = arith.constant 0.0 : f32
  %rows = tensor.dim %a, %c0 : tensor<?x?xf32>
  %cols = tensor.dim %a, %c1 : tensor<?x?xf32>
  %r:2 = scf.for %i = %c0 to %rows step %c1 iter_args(%d0 = %z, %n0 = %z) -> (i64, i64) {
    %s:2 = scf.for %j = %c0 to %cols step %c1 iter_args(%d = %d0, %n = %n0) -> (i64, i64) {
      %x = tensor.extract %a[%i, %j] : tensor<?x?xf32>
      %y = tensor.extract %b[%i, %j] : tensor<?x?xf32>
      %xb = arith.bitcast %x : f32 to i32
      %yb = arith.bitcast %y : f32 to i32
      %ne = arith.cmpi ne, %xb, %yb : i32
      %ne64 = arith.extui %ne : i1 to i64
      %d1 = arith.addi %d, %ne64 : i64
      %nz = arith.cmpf une, %x, %zf : f32
      %nz64 = arith.extui %nz : i1 to i64
      %n1 = arith.addi %n, %nz64 : i64
      scf.yield %d1, %n1 : i64, i64
    }
    scf.yield %s#0, %s#1 : i64, i64
  }
  call @printI64(%r#0) : (i64) -> ()
  call @printNewline() : () -> ()
  call @printI64(%r#1) : (i64) -> ()
  call @printNewline() : () -> ()
  return
}

func.func @compare1(%a: tensor<?xf32>, %b: tensor<?xf32>) {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %a, %c0 : tensor<?xf32>
  %a2 = tensor.expand_shape %a [[0, 1]] output_shape [1, %n] : tensor<?xf32> into tensor<1x?xf32>
  %b2 = tensor.expand_shape %b [[0, 1]] output_shape [1, %n] : tensor<?xf32> into tensor<1x?xf32>
  %a3 = tensor.cast %a2 : tensor<1x?xf32> to tensor<?x?xf32>
  %b3 = tensor.cast %b2 : tensor<1x?xf32> to tensor<?x?xf32>
  call @compare(%a3, %b3) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  return
}

func.func @grad_static(%emb: tensor<40xf32>, %w1: tensor<250x40xf32>, %b1: tensor<250xf32>, %w2: tensor<1616x250xf32>,
                       %b2: tensor<1616xf32>, %dw: tensor<16x100xf32>, %db: tensor<16xf32>)
    -> (tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32>)
    attributes {no_inline} {
  %a, %g1, %g2, %g3, %g4 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<16x100xf32>)
      db(%db : tensor<16xf32>) num_experts(16)
      : tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32>
      -> tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32>
  return %a, %g1, %g2, %g3, %g4 : tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32>
}

func.func @grad_dynamic(%emb: tensor<?xf32>, %w1: tensor<?x?xf32>, %b1: tensor<?xf32>, %w2: tensor<?x?xf32>,
                        %b2: tensor<?xf32>, %dw: tensor<?x?xf32>, %db: tensor<?xf32>)
    -> (tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>) attributes {no_inline} {
  %a, %g1, %g2, %g3, %g4 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<?x?xf32>)
      db(%db : tensor<?xf32>) num_experts(16)
      : tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
      -> tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
  return %a, %g1, %g2, %g3, %g4 : tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
}

// CHECK-LABEL: d_emb
// CHECK-NEXT: {{^}}0{{$}}
// CHECK-NEXT: {{^}}40{{$}}
// CHECK-LABEL: d_w1
// CHECK-NEXT: {{^}}0{{$}}
// CHECK-NEXT: {{^[1-9][0-9]+$}}
// CHECK-LABEL: d_b1
// CHECK-NEXT: {{^}}0{{$}}
// CHECK-NEXT: {{^[1-9][0-9]+$}}
// CHECK-LABEL: d_w2
// CHECK-NEXT: {{^}}0{{$}}
// CHECK-NEXT: {{^[1-9][0-9]+$}}
// CHECK-LABEL: d_b2
// CHECK-NEXT: {{^}}0{{$}}
// CHECK-NEXT: {{^[1-9][0-9]+$}}
func.func @main() {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c4 = arith.constant 4 : index
  %c5 = arith.constant 5 : index
  %c6 = arith.constant 6 : index
  %c7 = arith.constant 7 : index
  %c16 = arith.constant 16 : index
  %c40 = arith.constant 40 : index
  %c100 = arith.constant 100 : index
  %c250 = arith.constant 250 : index
  %c1616 = arith.constant 1616 : index
  %c0 = arith.constant 0 : index
  %c249 = arith.constant 249 : index
  %zero = arith.constant 0.0 : f32
  %nan = arith.constant 0x7FC00000 : f32
  %emb = call @vec(%c40, %c1) : (index, index) -> tensor<?xf32>
  %w1f = call @fill(%c250, %c40, %c2) : (index, index, index) -> tensor<?x?xf32>
  // Unit 0: a = 0 exactly (a zero row of w1, b1 = 0); unit 249 (the column tail): a NaN.
  %row = tensor.extract_slice %w1f[0, 0] [1, %c40] [1, 1] : tensor<?x?xf32> to tensor<1x?xf32>
  %zrow = linalg.fill ins(%zero : f32) outs(%row : tensor<1x?xf32>) -> tensor<1x?xf32>
  %w1 = tensor.insert_slice %zrow into %w1f[0, 0] [1, %c40] [1, 1] : tensor<1x?xf32> into tensor<?x?xf32>
  %b1f = call @vec(%c250, %c3) : (index, index) -> tensor<?xf32>
  %b1z = tensor.insert %zero into %b1f[%c0] : tensor<?xf32>
  %b1 = tensor.insert %nan into %b1z[%c249] : tensor<?xf32>
  %w2 = call @fill(%c1616, %c250, %c4) : (index, index, index) -> tensor<?x?xf32>
  %b2 = call @vec(%c1616, %c5) : (index, index) -> tensor<?xf32>
  %dw = call @fill(%c16, %c100, %c6) : (index, index, index) -> tensor<?x?xf32>
  %db = call @vec(%c16, %c7) : (index, index) -> tensor<?xf32>

  %se = tensor.cast %emb : tensor<?xf32> to tensor<40xf32>
  %sw1 = tensor.cast %w1 : tensor<?x?xf32> to tensor<250x40xf32>
  %sb1 = tensor.cast %b1 : tensor<?xf32> to tensor<250xf32>
  %sw2 = tensor.cast %w2 : tensor<?x?xf32> to tensor<1616x250xf32>
  %sb2 = tensor.cast %b2 : tensor<?xf32> to tensor<1616xf32>
  %sdw = tensor.cast %dw : tensor<?x?xf32> to tensor<16x100xf32>
  %sdb = tensor.cast %db : tensor<?xf32> to tensor<16xf32>
  %s:5 = call @grad_static(%se, %sw1, %sb1, %sw2, %sb2, %sdw, %sdb)
      : (tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32>,
         tensor<16x100xf32>, tensor<16xf32>)
      -> (tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32>)
  %d:5 = call @grad_dynamic(%emb, %w1, %b1, %w2, %b2, %dw, %db)
      : (tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>,
         tensor<?xf32>) -> (tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>)

  %s0 = tensor.cast %s#0 : tensor<40xf32> to tensor<?xf32>
  %s1 = tensor.cast %s#1 : tensor<250x40xf32> to tensor<?x?xf32>
  %s2 = tensor.cast %s#2 : tensor<250xf32> to tensor<?xf32>
  %s3 = tensor.cast %s#3 : tensor<1616x250xf32> to tensor<?x?xf32>
  %s4 = tensor.cast %s#4 : tensor<1616xf32> to tensor<?xf32>
  vector.print str "d_emb\n"
  call @compare1(%d#0, %s0) : (tensor<?xf32>, tensor<?xf32>) -> ()
  vector.print str "d_w1\n"
  call @compare(%d#1, %s1) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  vector.print str "d_b1\n"
  call @compare1(%d#2, %s2) : (tensor<?xf32>, tensor<?xf32>) -> ()
  vector.print str "d_w2\n"
  call @compare(%d#3, %s3) : (tensor<?x?xf32>, tensor<?x?xf32>) -> ()
  vector.print str "d_b2\n"
  call @compare1(%d#4, %s4) : (tensor<?xf32>, tensor<?xf32>) -> ()
  return
}
