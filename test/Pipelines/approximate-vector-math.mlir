// RUN: moe-opt %s --moe-approximate-vector-math | FileCheck %s

// Vector exp, log, tanh and erf become polynomial arithmetic (LLVM would scalarize them into libm calls); a
// scalar exp stays for libm; a vector rsqrt stays (sqrt and a division are native).
// CHECK-LABEL: func.func @vector_math
// CHECK-NOT:     math.exp {{.*}} : vector
// CHECK-NOT:     math.log {{.*}} : vector
// CHECK-NOT:     math.tanh
// CHECK-NOT:     math.erf
// CHECK:         math.rsqrt {{.*}} : vector<16xf32>
// CHECK:         math.exp {{.*}} : f32
// CHECK:         return
func.func @vector_math(%v: vector<16xf32>, %s: f32) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, f32) {
  %e = math.exp %v : vector<16xf32>
  %l = math.log %v : vector<16xf32>
  %t = math.tanh %v : vector<16xf32>
  %r = math.erf %v : vector<16xf32>
  %q = math.rsqrt %v : vector<16xf32>
  %x = math.exp %s : f32
  return %e, %l, %t, %r, %q, %x : vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, f32
}
