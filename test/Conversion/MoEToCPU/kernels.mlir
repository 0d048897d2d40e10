// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s --check-prefix=NO-NXN
// RUN: moe-opt %s --convert-moe-to-cpu | FileCheck %s --check-prefix=SEQ

// The fast CPU kernels: memref loops with vector<16xf32> arithmetic whose token loops are an scf.parallel
// over the workers (num-threads), and a plain scf.for with num-threads = 1.

// Nowhere is an N x N (128 x 128) buffer or tensor created.
// NO-NXN-NOT: 128x128

// Flash-style similarity_inform: keys packed per 32-key tile, the QK micro-kernel is vector FMAs on 8 rows x 2
// vectors, the online softmax uses the vector exp (no math.exp) and the K-wide accumulators of a block of 4 query
// tiles live in per-worker scratch.
// CHECK-LABEL: func.func @similarity
// CHECK-SAME: %[[U:[^:]+]]: tensor<2x128x64xf32>, %[[E:[^:]+]]: tensor<2x128x16xf32>
// CHECK: %[[P:.+]] = moe.kernel ins(%[[U]], %[[E]] : tensor<2x128x64xf32>, tensor<2x128x16xf32>) outs(%{{.+}} : tensor<2x128x16xf32>)
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<?x?x?x32xf32>
// CHECK: scf.parallel
// CHECK: memref.alloc({{.*}}) {alignment = 64 : i64} : memref<2x4x8x?xf32>
// CHECK: scf.parallel
// CHECK-COUNT-16: vector.fma {{.*}} : vector<16xf32>
// CHECK-NOT: math.exp
// CHECK: vector.reduction <maximumf>
// CHECK: scf.if
// CHECK: vector.maskedstore
// CHECK: } -> tensor<2x128x16xf32>
// CHECK: return %[[P]]
// SEQ-LABEL: func.func @similarity
// SEQ-NOT: scf.parallel
// SEQ: vector.fma
// SEQ-LABEL: func.func @topk
func.func @similarity(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e tau(5.000000e-01) causal(true) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// Top-k: i32 ordered keys, knockout rounds (the max key, the lowest index holding it, knocked out).
// CHECK-LABEL: func.func @topk
// CHECK: scf.parallel
// CHECK: arith.bitcast {{.*}} : vector<16xf32> to vector<16xi32>
// CHECK: arith.maxsi {{.*}} : vector<16xi32>
// CHECK: arith.cmpi eq, {{.*}} : vector<16xi32>
// CHECK: arith.andi {{.*}} : vector<16xi32>
// CHECK: vector.extract {{.*}}[0] : i32 from vector<16xi32>
// CHECK: memref.store %c-2147483648_i32
func.func @topk(%x: tensor<?x64xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.topk_renorm %x k(2) : tensor<?x64xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

// Forms without a kernel are left for convert-moe-to-linalg.
// CHECK-LABEL: func.func @left_alone
// CHECK: moe.topk_renorm
// CHECK: moe.attention_posterior
func.func @left_alone(%x: tensor<64xf32>, %s: tensor<1x2x4x4xf32>, %u: tensor<1x4x8xf32>, %v: tensor<1x2x4x4xf32>,
                      %wo: tensor<8x8xf32>, %e: tensor<1x4x3xf32>) -> (tensor<2xf32>, tensor<1x4x3xf32>) {
  %w, %i = moe.topk_renorm %x k(2) : tensor<64xf32> -> tensor<2xf32>, tensor<2xi32>
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all)
      : tensor<1x2x4x4xf32>, tensor<1x4x8xf32>, tensor<1x2x4x4xf32>, tensor<8x8xf32>, tensor<1x4x3xf32>
      -> tensor<1x4x3xf32>, tensor<1xi32>
  return %w, %p : tensor<2xf32>, tensor<1x4x3xf32>
}
