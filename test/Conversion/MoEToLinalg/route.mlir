// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// DeepSeek-V3 with T and E dynamic: bf16 promoted to f32, sigmoid scores (MoE/Kernels' 1 / (1 + exp(0 - x))), + bias (broadcast over the tokens), the
// [T, E] choice scores viewed as [T, 8, E/8], group top-2 (2 rounds) summed (MoE/Kernels' routeGroupScore: best +
// second), top-4 groups (4 rounds), the kept-expert mask, a masked top-8 (8 rounds), the gather of the unbiased scores,
// renormalize (zero sum -> 0) and scale 2.5 in one generic (MoE/Kernels' routeWeight).
// CHECK-LABEL: func.func @deepseek_v3
// CHECK-SAME: %[[L:.+]]: tensor<?x?xbf16>, %[[B:.+]]: tensor<?xf32>
// CHECK: %[[X:.+]] = linalg.generic {{.*}} ins(%[[L]] : tensor<?x?xbf16>)
// CHECK: arith.extf
// CHECK: %[[S:.+]] = linalg.generic {{.*}} ins(%[[X]] : tensor<?x?xf32>)
// CHECK: arith.subf
// CHECK: math.exp
// CHECK: arith.divf
// CHECK: %[[C:.+]] = linalg.generic {{.*}} ins(%[[S]], %[[B]] : tensor<?x?xf32>, tensor<?xf32>)
// CHECK: arith.addf
// CHECK: %[[E:.+]] = tensor.dim %[[C]], %{{.+}} : tensor<?x?xf32>
// CHECK: %[[SIZE:.+]] = arith.divui %{{.+}}, %{{.+}} : index
// CHECK: %[[G:.+]] = tensor.expand_shape %[[C]] {{\[\[}}0], [1, 2]] output_shape [%{{.+}}, 8, %[[SIZE]]] : tensor<?x?xf32> into tensor<?x8x?xf32>
// CHECK: %[[TOP2:.+]]:2 = scf.for {{.*}} -> (tensor<?x8x2xf32>, tensor<?x8x2xi32>)
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[G]],
// CHECK: %[[BEST:.+]] = tensor.extract_slice %[[TOP2]]#0[0, 0, 0]
// CHECK: %[[SECOND:.+]] = tensor.extract_slice %[[TOP2]]#0[0, 0, 1]
// CHECK: %[[GS:.+]] = linalg.generic {{.*}} ins(%[[BEST]], %[[SECOND]] : tensor<?x8xf32>, tensor<?x8xf32>) outs(%{{.+}} : tensor<?x8xf32>)
// CHECK-NEXT: ^bb0(%[[B1:.+]]: f32, %[[B2:.+]]: f32, %{{.+}}: f32):
// CHECK-NEXT: %[[GSUM:.+]] = arith.addf %[[B1]], %[[B2]] : f32
// CHECK-NEXT: linalg.yield %[[GSUM]]
// CHECK: %[[KG:.+]]:2 = scf.for {{.*}} -> (tensor<?x4xf32>, tensor<?x4xi32>)
// CHECK: linalg.generic {{.*}} ins(%[[GS]],
// CHECK: %[[KEPT:.+]] = linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[KG]]#1 : tensor<?x4xi32>) outs(%{{.+}} : tensor<?x?xi1>)
// CHECK: arith.divui
// CHECK: arith.ori
// CHECK: %[[SEL:.+]]:2 = scf.for {{.*}} -> (tensor<?x8xf32>, tensor<?x8xi32>)
// CHECK: linalg.generic {{.*}} ins(%[[C]], %[[KEPT]], %{{.+}}, %{{.+}} : tensor<?x?xf32>, tensor<?x?xi1>,
// CHECK: arith.andi
// CHECK: %[[W:.+]] = linalg.generic {{.*}} ins(%[[SEL]]#1 : tensor<?x8xi32>)
// CHECK: tensor.extract %[[S]][
// CHECK: %[[SUM:.+]] = linalg.generic {{.*}} ins(%[[W]] : tensor<?x8xf32>)
// CHECK: %[[SC:.+]] = linalg.generic {{.*}} ins(%[[W]], %[[SUM]] :
// CHECK: arith.cmpf oeq
// CHECK: arith.divf
// CHECK: arith.select
// CHECK: arith.constant 2.500000e+00 : f32
// CHECK: arith.mulf
// CHECK: return %[[SC]], %[[SEL]]#1
// CHECK-NOT: moe.
func.func @deepseek_v3(%l: tensor<?x?xbf16>, %b: tensor<?xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<?xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true)
      routed_scaling_factor(2.5) : tensor<?x?xbf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// gpt-oss: the top-k runs on the raw logits (no scoring before it, no group mask), then a softmax over the k
// selected logits (max, exp-sum, divide; a -inf max gives 0); no renormalization or scaling generic follows.
// CHECK-LABEL: func.func @gpt_oss
// CHECK-SAME: %[[L:.+]]: tensor<5x32xf32>
// CHECK-NOT: math.exp
// CHECK: %[[SEL:.+]]:2 = scf.for {{.*}} -> (tensor<5x4xf32>, tensor<5x4xi32>)
// CHECK: linalg.generic {{.*}} ins(%[[L]], %{{.+}}, %{{.+}} : tensor<5x32xf32>, tensor<5xf32>, tensor<5xi32>)
// CHECK: %[[G:.+]] = linalg.generic {{.*}} ins(%[[SEL]]#1 : tensor<5x4xi32>)
// CHECK: tensor.extract %[[L]][
// CHECK: %[[MAX:.+]] = linalg.generic {{.*}} ins(%[[G]] : tensor<5x4xf32>)
// CHECK: arith.maximumf
// CHECK: math.exp
// CHECK: %[[W:.+]] = linalg.generic {{.*}} ins(%{{.+}}, %[[MAX]], %{{.+}} : tensor<5x4xf32>, tensor<5xf32>, tensor<5xf32>)
// CHECK: arith.cmpf oeq
// CHECK: arith.divf
// CHECK: arith.select
// CHECK-NOT: linalg.generic
// CHECK: return %[[W]], %[[SEL]]#1
func.func @gpt_oss(%l: tensor<5x32xf32>) -> (tensor<5x4xf32>, tensor<5x4xi32>) {
  %w, %i = moe.route %l k(4) order(topk_then_score) : tensor<5x32xf32> -> tensor<5x4xf32>, tensor<5x4xi32>
  return %w, %i : tensor<5x4xf32>, tensor<5x4xi32>
}
