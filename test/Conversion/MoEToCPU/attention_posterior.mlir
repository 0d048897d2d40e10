// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// attention_posterior, head_select = min_entropy:
//  1. prior statistics of every attention row (max, Σ exp, Σ exp·s) in vector<16> passes with the polynomial exp,
//  2. h*[b] = argmin of the mean row entropy (math.log per row) in the dialect's top-k order with reversed keys
//     (NaN first, ties to the lowest head: ~key packed with the index, compared as i64),
//  3. head means of h* only, one key tile at a time in the flash kernel's tiled transposed key layout
//     [B, tiles, D, 32]: the tile's values transposed into a per-worker [Dh, 32] scratch, then per block of 4
//     model rows, Σ_c wo[d, c] (scalars broadcast; wo read in place) · vT[c, :] in vectors over the keys, stored
//     whole (no shuffle, no scatter),
//  4. the posterior mix by the flash kernel. Nothing of size N x N is formed.
// Each parallel stage is guarded by its work (multiply-adds < 2^20: run on the calling thread).

// CHECK-LABEL: func.func @min_entropy
// CHECK-SAME: %[[S:[^:]+]]: tensor<2x8x128x96xf32>
// One kernel; p and the chosen heads are its outs.
// CHECK: %[[R:.+]]:2 = moe.kernel ins(%[[S]], {{.*}}) outs(%{{.+}}, %{{.+}} : tensor<2x128x16xf32>, tensor<2xi32>)
// CHECK-NEXT: ^bb0({{.*}}, %{{[^:]+}}: memref<2x128x16xf32>, %[[HEAD:[^:]+]]: memref<2xi32>):
// CHECK: scf.parallel
// CHECK: vector.reduction <maximumf>
// CHECK-NOT: math.exp
// CHECK: math.floor %{{.+}} : vector<16xf32>
// CHECK: vector.reduction <add>
// CHECK: math.log
// CHECK: arith.xori %{{.+}}, %c-1_i32 : i32
// CHECK: arith.shli %{{.+}}, %{{.+}} : i64
// CHECK: arith.cmpi sgt, %{{.+}}, %{{.+}} : i64
// CHECK: memref.store %{{.+}}, %[[HEAD]]
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?x?x32xf32>
// CHECK-NOT: memref<?x?x?xf32>
// CHECK: %[[SMALL:.+]] = arith.cmpi ult, %{{.+}}, %c1048576 : index
// CHECK-NEXT: scf.if %[[SMALL]]
// CHECK: %[[VT:.+]] = memref.subview %{{.+}} : memref<2x?x32xf32> to memref<?x32xf32, strided<[32, 1], offset: ?>>
// CHECK: memref.store %{{.+}}, %[[VT]][
// CHECK: vector.load %[[VT]][
// CHECK: memref.load %{{.+}} : memref<512x512xf32>
// CHECK: vector.fma
// CHECK-NOT: vector.shuffle
// CHECK: vector.store %{{.+}} : memref<?x?x?x32xf32>, vector<16xf32>
// CHECK-NOT: vector.shuffle
// CHECK: } else {
// CHECK: scf.parallel
// CHECK: arith.cmpi ult, %{{.+}}, %c1048576 : index
// CHECK: scf.parallel
// CHECK: vector.fma
// CHECK: vector.maskedstore
// CHECK: } -> tensor<2x128x16xf32>, tensor<2xi32>
// CHECK: return %[[R]]#0, %[[R]]#1
// CHECK-NOT: 128x128
func.func @min_entropy(%s: tensor<2x8x128x96xf32>, %u: tensor<2x128x512xf32>, %v: tensor<2x8x96x64xf32>,
                       %wo: tensor<512x512xf32>, %e: tensor<2x96x16xf32>) -> (tensor<2x128x16xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00)
      : tensor<2x8x128x96xf32>, tensor<2x128x512xf32>, tensor<2x8x96x64xf32>, tensor<512x512xf32>, tensor<2x96x16xf32>
      -> tensor<2x128x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x128x16xf32>, tensor<2xi32>
}

// The fused attention_posterior_topk is split: the posterior kernel above, then the top-k kernel on its
// probabilities (mode = probs: no exp in the epilogue).
// CHECK-LABEL: func.func @fused_topk
// CHECK: %[[P:.+]]:2 = moe.kernel
// CHECK: arith.cmpi sgt, %{{.+}}, %{{.+}} : i64
// CHECK: vector.fma
// CHECK: moe.kernel ins(%[[P]]#0 :
// CHECK: memref.collapse_shape
// CHECK: arith.maxsi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: arith.andi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: memref.store %c-2147483648_i32
// CHECK: arith.divf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK: vector.maskedstore
// CHECK-NOT: moe.
func.func @fused_topk(%s: tensor<2x8x128x96xf32>, %u: tensor<2x128x512xf32>, %v: tensor<2x8x96x64xf32>,
                      %wo: tensor<512x512xf32>, %e: tensor<2x96x16xf32>)
    -> (tensor<2x128x2xf32>, tensor<2x128x2xi32>, tensor<2xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2)
      : tensor<2x8x128x96xf32>, tensor<2x128x512xf32>, tensor<2x8x96x64xf32>, tensor<512x512xf32>, tensor<2x96x16xf32>
      -> tensor<2x128x2xf32>, tensor<2x128x2xi32>, tensor<2xi32>
  return %w, %i, %h : tensor<2x128x2xf32>, tensor<2x128x2xi32>, tensor<2xi32>
}
