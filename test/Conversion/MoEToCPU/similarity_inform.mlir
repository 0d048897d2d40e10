// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s

// similarity_inform: the flash-style mixing kernel (Flash.h). Keys u are transposed once per 32-key tile into
// [B, tiles, D, 32] (zero padding), the values e packed, and every row tile streams the key tiles with an online
// softmax (vector exp, never math.exp), so nothing of size N x N exists. ws adds one vectorized projection pass
// q = u · ws; key_mask and padding become a 1/0 validity row that turns logits into -inf.

// CHECK-LABEL: func.func @ws_and_mask
// CHECK-SAME: %[[U:[^:]+]]: tensor<2x100x64xf32>, %[[E:[^:]+]]: tensor<2x100x16xf32>, %[[WS:[^:]+]]: tensor<64x64xf32>, %[[M:[^:]+]]: tensor<2x100xi1>
// The kernel reads the operands' buffers and writes p into its out (moe.kernel, bufferized later).
// CHECK: moe.kernel ins(%[[U]], %[[E]], %[[M]], %[[WS]] : {{.*}}) outs(%{{.+}} : tensor<2x100x16xf32>)
// CHECK-NEXT: ^bb0(%{{[^:]+}}: memref<2x100x64xf32>, %{{[^:]+}}: memref<2x100x16xf32>, %[[MB:[^:]+]]: memref<2x100xi1>, %[[WSB:[^:]+]]: memref<64x64xf32>, %{{[^:]+}}: memref<2x100x16xf32>)
// Keys, transposed per tile.
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?x?x32xf32>
// CHECK: scf.parallel
// Key validity (100 keys: padded to 128, and the mask).
// CHECK: %[[VALID:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?x?xf32>
// CHECK: memref.load %[[MB]]
// The projection q = u · ws: one vector FMA per input feature.
// CHECK: %[[Q:.+]] = memref.alloc(%{{.+}}) {alignment = 64 : i64} : memref<?x?x?xf32>
// CHECK: scf.parallel
// CHECK: vector.maskedload %[[WSB]]
// CHECK: vector.fma
// CHECK: vector.maskedstore %{{.+}}, %{{.+}}, %{{.+}} : memref<?x?x?xf32>
// The mixing kernel: QK on vector FMAs, masked logits, online softmax.
// CHECK: scf.parallel
// CHECK: vector.fma {{.*}} : vector<16xf32>
// CHECK: vector.load %[[VALID]]
// CHECK: arith.cmpf one
// CHECK-NOT: math.exp
// CHECK: vector.reduction <maximumf>
// CHECK: vector.maskedstore
// CHECK: } -> tensor<2x100x16xf32>
// CHECK-NOT: 100x100
func.func @ws_and_mask(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>, %ws: tensor<64x64xf32>, %m: tensor<2x100xi1>)
    -> tensor<2x100x16xf32> {
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<64x64xf32>) key_mask(%m : tensor<2x100xi1>)
      : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x16xf32>
  return %p : tensor<2x100x16xf32>
}

// The fused similarity_inform_topk is split: the mixing kernel, then the top-k kernel on its probabilities
// (mode = probs, renormalized: Σ v over the selection, a zero sum gives zero weights).
// CHECK-LABEL: func.func @fused_topk
// CHECK: %[[P:.+]] = moe.kernel
// CHECK: scf.parallel
// CHECK: vector.fma {{.*}} : vector<16xf32>
// CHECK: moe.kernel ins(%[[P]] :
// CHECK: scf.parallel
// CHECK: arith.maxsi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: arith.andi %{{.+}}, %{{.+}} : vector<16xi32>
// CHECK: memref.store %c-2147483648_i32
// CHECK-NOT: math.floor
// CHECK: vector.reduction <add>
// CHECK: arith.divf %{{.+}}, %{{.+}} : vector<16xf32>
// CHECK: arith.cmpf oeq
// CHECK: vector.maskedstore
// CHECK-NOT: moe.
func.func @fused_topk(%u: tensor<1x64x32xf32>, %e: tensor<1x64x16xf32>) -> (tensor<1x64x2xf32>, tensor<1x64x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) causal(true)
      : tensor<1x64x32xf32>, tensor<1x64x16xf32> -> tensor<1x64x2xf32>, tensor<1x64x2xi32>
  return %w, %i : tensor<1x64x2xf32>, tensor<1x64x2xi32>
}
