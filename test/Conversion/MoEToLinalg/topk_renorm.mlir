// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// k argmax rounds run in an scf.for, each one a linalg.generic reduction over
// the last dimension (leading dimensions stay parallel) yielding (value, index).
// CHECK-LABEL: func.func @logits_renormalize
// CHECK-SAME: %[[S:.+]]: tensor<4x128x16xf32>
// CHECK-NOT: tensor.collapse_shape
// CHECK: %[[SEL:.+]]:2 = scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step
// CHECK-SAME: -> (tensor<4x128x2xf32>, tensor<4x128x2xi32>)
// CHECK: linalg.generic
// CHECK-SAME: iterator_types = ["parallel", "parallel", "reduction"]
// CHECK-SAME: ins(%[[S]], %{{.+}}, %{{.+}} : tensor<4x128x16xf32>, tensor<4x128xf32>, tensor<4x128xi32>)
// The one order of every top-k (MoE/Kernels/TopK.h): (ordered key << 32 | INT32_MAX - index) compared as i64.
// CHECK: arith.bitcast %{{.+}} : f32 to i32
// CHECK: arith.cmpf uno
// CHECK: arith.shli %{{.+}}, %{{.+}} : i64
// CHECK: arith.cmpi sgt, %{{.+}}, %{{.+}} : i64
// CHECK: linalg.yield %{{.+}}, %{{.+}} : f32, i32
// CHECK: tensor.insert_slice %{{.+}} into %{{.+}}[0, 0, %[[J]]] [4, 128, 1] [1, 1, 1] : tensor<4x128xf32> into tensor<4x128x2xf32>
// CHECK: scf.yield
// The softmax over the k selected logits: max = first selection.
// CHECK: %[[MAX:.+]] = tensor.extract_slice %[[SEL]]#0[0, 0, 0] [4, 128, 1] [1, 1, 1] : tensor<4x128x2xf32> to tensor<4x128xf32>
// CHECK: %[[SUM:.+]] = linalg.generic {{.*}} ins(%[[SEL]]#0, %[[MAX]] :
// CHECK: math.exp
// CHECK: %[[W:.+]] = linalg.generic {{.*}} ins(%[[SEL]]#0, %[[MAX]], %[[SUM]] :
// CHECK: arith.cmpf oeq, %{{.+}}, %{{.+}}
// CHECK: arith.select
// CHECK: return %[[W]], %[[SEL]]#1
// CHECK-NOT: moe.
func.func @logits_renormalize(%s: tensor<4x128x16xf32>) -> (tensor<4x128x2xf32>, tensor<4x128x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<4x128x16xf32> -> tensor<4x128x2xf32>, tensor<4x128x2xi32>
  return %w, %i : tensor<4x128x2xf32>, tensor<4x128x2xi32>
}

// renormalize(false): the max and the sum run over all K logits.
// CHECK-LABEL: func.func @logits_dense
// CHECK-SAME: %[[S:.+]]: tensor<8x16xf32>
// CHECK: %[[SEL:.+]]:2 = scf.for
// CHECK: %[[MAX:.+]] = linalg.generic {{.*}} ins(%[[S]] : tensor<8x16xf32>)
// CHECK: arith.maximumf
// CHECK: %[[SUM:.+]] = linalg.generic {{.*}} ins(%[[S]], %[[MAX]] : tensor<8x16xf32>, tensor<8xf32>)
// CHECK: linalg.generic {{.*}} ins(%[[SEL]]#0, %[[MAX]], %[[SUM]] :
func.func @logits_dense(%s: tensor<8x16xf32>) -> (tensor<8x2xf32>, tensor<8x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) renormalize(false) : tensor<8x16xf32> -> tensor<8x2xf32>, tensor<8x2xi32>
  return %w, %i : tensor<8x2xf32>, tensor<8x2xi32>
}

// probs: divide by the selected sum, 0 when it is 0; dynamic rows.
// CHECK-LABEL: func.func @probs_renormalize
// CHECK-SAME: %[[S:.+]]: tensor<?x16xbf16>
// CHECK: %[[F:.+]] = linalg.generic {{.*}} ins(%[[S]] : tensor<?x16xbf16>) outs(%{{.+}} : tensor<?x16xf32>)
// CHECK: arith.extf %{{.+}} : bf16 to f32
// CHECK: %[[SEL:.+]]:2 = scf.for {{.*}} -> (tensor<?x4xf32>, tensor<?x4xi32>)
// CHECK: %[[SUM:.+]] = linalg.generic {{.*}} ins(%[[SEL]]#0 : tensor<?x4xf32>)
// CHECK: arith.addf
// CHECK: linalg.generic {{.*}} ins(%[[SEL]]#0, %[[SUM]] :
// CHECK: arith.cmpf oeq
// CHECK: arith.divf
// CHECK: arith.select
// CHECK-NOT: math.exp
// CHECK: return
func.func @probs_renormalize(%s: tensor<?x16xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.topk_renorm %s k(4) mode(probs) : tensor<?x16xbf16> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}

// probs raw: the selected values are the weights.
// CHECK-LABEL: func.func @probs_raw
// CHECK: %[[SEL:.+]]:2 = scf.for
// CHECK: scf.yield
// CHECK-NOT: linalg.generic
// CHECK: return %[[SEL]]#0, %[[SEL]]#1
func.func @probs_raw(%s: tensor<8x16xf32>) -> (tensor<8x1xf32>, tensor<8x1xi32>) {
  %w, %i = moe.topk_renorm %s k(1) mode(probs) renormalize(false) : tensor<8x16xf32> -> tensor<8x1xf32>, tensor<8x1xi32>
  return %w, %i : tensor<8x1xf32>, tensor<8x1xi32>
}

// Rank 1: the rows are rank-0 tensors.
// CHECK-LABEL: func.func @rank_one
// CHECK: scf.for
// CHECK: tensor.extract_slice %{{.+}}[%{{.+}}] [1] [1] : tensor<2xf32> to tensor<f32>
// CHECK: linalg.generic {{.*}}iterator_types = ["reduction"]} ins(%{{.+}}, %{{.+}}, %{{.+}} : tensor<16xf32>, tensor<f32>, tensor<i32>)
func.func @rank_one(%s: tensor<16xf32>) -> (tensor<2xf32>, tensor<2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<16xf32> -> tensor<2xf32>, tensor<2xi32>
  return %w, %i : tensor<2xf32>, tensor<2xi32>
}
