// RUN: moe-opt %s --convert-moe-to-cpu="num-threads=2 vector-bits=256" | FileCheck %s --check-prefixes=CHECK,AVX2
// RUN: moe-opt %s --convert-moe-to-cpu="num-threads=2 vector-bits=512" | FileCheck %s --check-prefixes=CHECK,AVX512

// moe.route with few experts (E a power of two <= 16, k <= 8), no groups or replay, an elementwise score: each
// block of the target's lanes of rows runs one row per lane (RowLanes.h). The rows are loaded as E whole vectors
// of the flattened logits and transposed by unzip shuffles, the bias is splatted once for all blocks, each column is
// scored (sigmoid's polynomial exp) and inserted into a k-deep network of i32 ordered keys (strict compares), and
// the weights and indices are zipped back to [T, k] and stored whole; the rows past the last whole block take the
// per-row path (packed i64 candidates).

// CHECK-LABEL: func.func @sigmoid_bias_top2_of_16
// CHECK: memref.collapse_shape %{{.+}} {{\[\[}}0, 1]] : memref<?x16xf32> into memref<?xf32>
// CHECK: memref.collapse_shape %{{.+}} {{\[\[}}0, 1]] : memref<?x2xf32> into memref<?xf32>
// CHECK: memref.collapse_shape %{{.+}} {{\[\[}}0, 1]] : memref<?x2xi32> into memref<?xi32>
// The bias, one splat per expert before the workers.
// AVX2: vector.broadcast %{{.+}} : f32 to vector<8xf32>
// AVX512: vector.broadcast %{{.+}} : f32 to vector<16xf32>
// CHECK: scf.parallel
// AVX2: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c8 {
// AVX512: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c16 {
// AVX2: vector.load %{{.+}} : memref<?xf32>, vector<8xf32>
// AVX2: vector.shuffle %{{.+}}, %{{.+}} [0, 2, 4, 6, 8, 10, 12, 14] : vector<8xf32>, vector<8xf32>
// AVX512: vector.load %{{.+}} : memref<?xf32>, vector<16xf32>
// AVX512: vector.shuffle %{{.+}}, %{{.+}} [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30] : vector<16xf32>, vector<16xf32>
// CHECK-NOT: math.exp
// AVX2: arith.cmpi sgt, %{{.+}}, %{{.+}} : vector<8xi32>
// AVX512: arith.cmpi sgt, %{{.+}}, %{{.+}} : vector<16xi32>
// The weights renormalized over the two picks, scaled, zipped back and stored whole.
// AVX2: arith.divf %{{.+}}, %{{.+}} : vector<8xf32>
// AVX2: vector.shuffle %{{.+}}, %{{.+}} [0, 8, 1, 9, 2, 10, 3, 11] : vector<8xf32>, vector<8xf32>
// AVX2: vector.store %{{.+}}, %{{.+}} : memref<?xf32>, vector<8xf32>
// AVX2: vector.shuffle %{{.+}}, %{{.+}} [0, 8, 1, 9, 2, 10, 3, 11] : vector<8xi32>, vector<8xi32>
// AVX2: vector.store %{{.+}}, %{{.+}} : memref<?xi32>, vector<8xi32>
// The rest of the item: the per-row path.
// CHECK: arith.shli %{{.+}}, %{{.+}} : vector<8xi64>
func.func @sigmoid_bias_top2_of_16(%x: tensor<?x16xf32>, %b: tensor<16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<16xf32>) k(2) scoring(sigmoid) renormalize(true) routed_scaling_factor(2.5)
      : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

// Softmax scores, groups, a replay, 12 experts, k = 9, one pick of all E sigmoid scores (the scores are most of the
// time: the per-row path's one vector max is cheaper than the transposes), or a custom score after the selection
// (scored as a scalar per row, where math.tanh is a libm call, and as vectors in the lanes: they would round apart)
// keep the per-row path.
// CHECK-LABEL: func.func @per_row_forms
// CHECK-NOT: memref.collapse_shape
// CHECK: return
func.func @per_row_forms(%x: tensor<?x16xf32>, %y: tensor<?x12xf32>, %r: tensor<?x2xi32>)
    -> (tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x9xf32>, tensor<?x1xf32>,
        tensor<?x2xf32>) {
  %w0, %i0 = moe.route %x k(2) renormalize(true) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %w1, %i1 = moe.route %x k(2) scoring(sigmoid) n_group(4) topk_group(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %w2, %i2 = moe.route %x replay(%r : tensor<?x2xi32>) k(2) scoring(sigmoid) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %w3, %i3 = moe.route %y k(2) scoring(sigmoid) : tensor<?x12xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %w4, %i4 = moe.route %x k(9) scoring(sigmoid) : tensor<?x16xf32> -> tensor<?x9xf32>, tensor<?x9xi32>
  %w5, %i5 = moe.route %x k(1) scoring(sigmoid) : tensor<?x16xf32> -> tensor<?x1xf32>, tensor<?x1xi32>
  %w6, %i6 = moe.route %x k(2) scoring(custom) order(topk_then_score) score {
  ^bb0(%v: f32):
    %t = math.tanh %v : f32
    moe.yield %t : f32
  } : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w0, %w1, %w2, %w3, %w4, %w5, %w6
      : tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x2xf32>, tensor<?x9xf32>, tensor<?x1xf32>,
        tensor<?x2xf32>
}

// order(topk_then_score), Llama 4's router: the choice from the raw logits, the sigmoid of the pick only (no
// division before the compares: the 16 columns are not scored).
// CHECK-LABEL: func.func @llama4_top1_of_16
// CHECK: memref.collapse_shape
// AVX2: vector.shuffle %{{.+}}, %{{.+}} [0, 2, 4, 6, 8, 10, 12, 14] : vector<8xf32>, vector<8xf32>
// AVX2-NOT: arith.divf
// AVX2: arith.cmpi sgt, %{{.+}}, %{{.+}} : vector<8xi32>
// AVX2: arith.divf %{{.+}}, %{{.+}} : vector<8xf32>
// AVX2: vector.store %{{.+}}, %{{.+}} : memref<?xf32>, vector<8xf32>
func.func @llama4_top1_of_16(%x: tensor<?x16xf32>) -> (tensor<?x1xf32>, tensor<?x1xi32>) {
  %w, %i = moe.route %x k(1) scoring(sigmoid) order(topk_then_score) : tensor<?x16xf32> -> tensor<?x1xf32>, tensor<?x1xi32>
  return %w, %i : tensor<?x1xf32>, tensor<?x1xi32>
}
