// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 -split-input-file | FileCheck %s

// moe.route with the choice given (replay): every index is checked against E before the kernel (op code 5 of
// moeReportIndexError); the kernel reads the [T, k] indices, no candidates (no vector<8xi64> chunk), and scores
// an elementwise score only at the k given experts (no vector pass over the row), in the lanes of one vector.

// CHECK-LABEL: func.func @sigmoid_replay
// CHECK: %[[CODE:.+]] = arith.constant 5 : i32
// CHECK: scf.for
// CHECK: %[[V:.+]] = tensor.extract %{{.+}} : tensor<?x8xi64>
// CHECK: func.call @moeReportIndexError(%[[CODE]], %{{.+}}, %[[V]], %{{.+}})
// CHECK: moe.kernel ins(%{{.+}}, %{{.+}}, %{{.+}} : tensor<?x256xf32>, tensor<256xf32>, tensor<?x8xi64>)
// CHECK-NOT: vector<8xi64>
// CHECK-NOT: vector.maskedload
// The k = 8 given logits in the lanes of one vector<8xf32>, scored by the vector polynomial exp and one divide:
// CHECK: %[[G:.+]] = memref.load %{{.+}} : memref<?x8xi64>
// CHECK: %[[OK:.+]] = arith.andi
// CHECK: %[[SEL:.+]] = arith.select %[[OK]], %[[G]], %{{.+}} : i64
// CHECK: %[[IDX:.+]] = arith.trunci %[[SEL]] : i64 to i32
// CHECK: memref.store %[[IDX]], %{{.+}} : memref<?x8xi32>
// CHECK: %[[L:.+]] = memref.load %{{.+}} : memref<?x256xf32>
// CHECK: vector.insert %[[L]], %{{.+}} [0] : f32 into vector<8xf32>
// CHECK: vector.insert %{{.+}} [7] : f32 into vector<8xf32>
// CHECK-NOT: math.exp
// CHECK: vector.fma
// CHECK: arith.divf %{{.+}} : vector<8xf32>
// CHECK: vector.extract %{{.+}}[7] : f32 from vector<8xf32>
// CHECK-NOT: vector<8xi64>
// CHECK: return
func.func @sigmoid_replay(%l: tensor<?x256xf32>, %b: tensor<256xf32>, %r: tensor<?x8xi64>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) replay(%r : tensor<?x8xi64>) k(8) scoring(sigmoid) n_group(8) topk_group(4)
      renormalize(true) routed_scaling_factor(2.5) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// A softmax score needs the whole row: step 1's vector pass, then the given experts' scores read back.
// CHECK-LABEL: func.func @softmax_replay
// CHECK: moe.kernel
// CHECK-NOT: vector<8xi64>
// CHECK: vector.maskedload
// CHECK: memref.load %{{.+}} : memref<?x4xi32>
// CHECK-NOT: vector<8xi64>
// CHECK: return
func.func @softmax_replay(%l: tensor<?x64xbf16>, %r: tensor<?x4xi32>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.route %l replay(%r : tensor<?x4xi32>) k(4) : tensor<?x64xbf16> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}
