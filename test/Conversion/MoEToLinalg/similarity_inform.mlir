// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s --check-prefix=NO-NXN

// Nowhere in this file is an N x N (128 x 128) tensor created.
// NO-NXN-NOT: 128x128

// The similarity matrix (N x N = 128 x 128) is never created: an scf.for over
// the keys keeps the running max/sum [B, N] and a K-wide accumulator.
// CHECK-LABEL: func.func @streams_keys
// CHECK-SAME: %[[U:[^:]+]]: tensor<2x128x64xf32>, %[[E:[^:]+]]: tensor<2x128x16xf32>
// CHECK-NOT: tensor<2x128x128xf32>
// CHECK-NOT: tensor<128x128xf32>
// CHECK: %[[N:.+]] = tensor.dim %[[U]], %c1
// CHECK: %[[LOOP:.+]]:7 = scf.for %[[J:.+]] = %{{.+}} to %[[N]] step %{{.+}} iter_args(
// CHECK-SAME: -> (tensor<2x128xf32>, tensor<2x128xf32>, tensor<2x128x16xf32>,
// CHECK: %[[KEY:.+]] = tensor.extract_slice %[[U]][0, %[[J]], 0] [2, 1, 64] [1, 1, 1] : tensor<2x128x64xf32> to tensor<2x64xf32>
// CHECK: %[[DOT:.+]] = linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[U]], %[[KEY]] :
// The logit is scaled by 1/tau; no mask, no causal rule.
// CHECK: %[[LOGIT:.+]] = linalg.generic {{.*}} outs(%[[DOT]] : tensor<2x128xf32>)
// CHECK: arith.divf %{{.+}}, %{{.+}} : f32
// CHECK-NOT: arith.cmpi ule
// CHECK: linalg.yield
// Online softmax step: NaN-propagating max, rescale factor and new term.
// CHECK: %[[STATS:.+]]:5 = linalg.generic {{.*}} ins(%[[LOGIT]] : tensor<2x128xf32>)
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: math.exp
// CHECK: %[[VAL:.+]] = tensor.extract_slice %[[E]][0, %[[J]], 0] [2, 1, 16] [1, 1, 1] : tensor<2x128x16xf32> to tensor<2x16xf32>
// CHECK: linalg.generic {{.*}} ins(%[[STATS]]#2, %[[STATS]]#3, %[[STATS]]#4, %[[VAL]] : {{.*}}) outs(%{{.+}} : tensor<2x128x16xf32>)
// CHECK: scf.yield
// Rows with no unmasked key -> 0, others acc / l.
// CHECK: %[[P:.+]] = linalg.generic {{.*}} ins(%[[LOOP]]#0, %[[LOOP]]#1, %[[LOOP]]#2 :
// CHECK: arith.cmpf oeq
// CHECK: arith.divf
// CHECK: arith.select
// CHECK: return %[[P]]
func.func @streams_keys(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e tau(5.000000e-01) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// causal: key j is valid for query i when j <= i; key_mask[b, j] is read per key.
// CHECK-LABEL: func.func @causal_key_mask
// CHECK-SAME: %[[M:[^:]+]]: tensor<2x128xi1>
// CHECK-NOT: tensor<2x128x128xf32>
// CHECK: scf.for %[[J:[^ ]+]] =
// CHECK: %[[MJ:.+]] = tensor.extract_slice %[[M]][0, %[[J]]] [2, 1] [1, 1] : tensor<2x128xi1> to tensor<2xi1>
// CHECK: linalg.generic {{.*}} ins(%[[MJ]] : tensor<2xi1>)
// CHECK: ^bb0(%[[VALID:.+]]: i1, %{{.+}}: f32):
// CHECK: %[[I:.+]] = linalg.index 1 : index
// CHECK: %[[CAUSAL:.+]] = arith.cmpi ule, %[[J]], %[[I]] : index
// CHECK: %[[BOTH:.+]] = arith.andi %[[CAUSAL]], %[[VALID]] : i1
// CHECK: arith.select %[[BOTH]], %{{.+}}, %{{.+}} : f32
func.func @causal_key_mask(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>, %m: tensor<2x128xi1>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<2x128xi1>) causal(true) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// ws: the queries q = u ws are one contraction over D, done once before the
// key loop; the keys stay u (in f32 after extf).
// CHECK-LABEL: func.func @projected_dynamic
// CHECK-SAME: %[[U:[^:]+]]: tensor<?x?x64xf16>
// CHECK-SAME: %[[WS:[^:]+]]: tensor<64x64xf16>
// CHECK: %[[UF:.+]] = linalg.generic {{.*}} ins(%[[U]] : tensor<?x?x64xf16>) outs(%{{.+}} : tensor<?x?x64xf32>)
// CHECK: %[[WF:.+]] = linalg.generic {{.*}} ins(%[[WS]] : tensor<64x64xf16>)
// CHECK: %[[Q3:.+]] = linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%[[UF]], %[[WF]] : tensor<?x?x64xf32>, tensor<64x64xf32>) outs(%{{.+}} : tensor<?x?x64xf32>)
// CHECK: scf.for
// CHECK: %[[KEY:.+]] = tensor.extract_slice %[[UF]]
// CHECK: linalg.generic {{.*}} ins(%[[Q3]], %[[KEY]] :
func.func @projected_dynamic(%u: tensor<?x?x64xf16>, %e: tensor<?x?x16xf16>, %ws: tensor<64x64xf16>) -> tensor<?x?x16xf32> {
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<64x64xf16>) : tensor<?x?x64xf16>, tensor<?x?x16xf16> -> tensor<?x?x16xf32>
  return %p : tensor<?x?x16xf32>
}
