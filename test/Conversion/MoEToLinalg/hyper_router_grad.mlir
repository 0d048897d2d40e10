// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-linalg --canonicalize | FileCheck %s --check-prefix=FROZEN

// The portable backward of hyper_router: the hidden layer recomputed (matvec + bias + ReLU), dout = [dw | db]
// flattened, then d_w2 = dout ⊗ h, dh = w2ᵀ · dout (vecmat), the ReLU mask, d_w1 = da ⊗ emb, d_emb = w1ᵀ · da.

// CHECK-LABEL: func.func @all_gradients
// CHECK-SAME: %[[EMB:[^:]+]]: tensor<8xf32>, %[[W1:[^:]+]]: tensor<6x8xf32>, %[[B1:[^:]+]]: tensor<6xf32>, %[[W2:[^:]+]]: tensor<20x6xf32>, %[[B2:[^:]+]]: tensor<20xf32>, %[[DW:[^:]+]]: tensor<4x4xf32>, %[[DB:[^:]+]]: tensor<4xf32>
// CHECK: %[[A:.+]] = linalg.matvec ins(%[[W1]], %[[EMB]] : tensor<6x8xf32>, tensor<8xf32>)
// CHECK: %[[H:.+]] = linalg.generic {{.*}} ins(%[[B1]] : tensor<6xf32>) outs(%[[A]] : tensor<6xf32>)
// CHECK: arith.maximumf
// CHECK: %[[T0:.+]] = tensor.insert_slice %[[DW]] into %{{.+}}[0, 0] [4, 4] [1, 1] : tensor<4x4xf32> into tensor<4x5xf32>
// CHECK: %[[T1:.+]] = tensor.insert_slice %[[DB]] into %[[T0]][0, 4] [4, 1] [1, 1] : tensor<4xf32> into tensor<4x5xf32>
// CHECK: %[[DOUT:.+]] = tensor.collapse_shape %[[T1]] {{\[\[}}0, 1]] : tensor<4x5xf32> into tensor<20xf32>
// CHECK: %[[DW2:.+]] = linalg.generic {{.*}} ins(%[[DOUT]], %[[H]] : tensor<20xf32>, tensor<6xf32>) outs(%{{.+}} : tensor<20x6xf32>)
// CHECK: arith.mulf
// CHECK: %[[DH:.+]] = linalg.vecmat ins(%[[DOUT]], %[[W2]] : tensor<20xf32>, tensor<20x6xf32>)
// CHECK: %[[DA:.+]] = linalg.generic {{.*}} ins(%[[DH]], %[[H]] : tensor<6xf32>, tensor<6xf32>)
// CHECK: arith.cmpf ugt
// CHECK: arith.select
// CHECK: %[[DW1:.+]] = linalg.generic {{.*}} ins(%[[DA]], %[[EMB]] : tensor<6xf32>, tensor<8xf32>) outs(%{{.+}} : tensor<6x8xf32>)
// CHECK: %[[DEMB:.+]] = linalg.vecmat ins(%[[DA]], %[[W1]] : tensor<6xf32>, tensor<6x8xf32>)
// CHECK: return %[[DEMB]], %[[DW1]], %[[DA]], %[[DW2]], %[[DOUT]]
func.func @all_gradients(%emb: tensor<8xf32>, %w1: tensor<6x8xf32>, %b1: tensor<6xf32>, %w2: tensor<20x6xf32>,
                         %b2: tensor<20xf32>, %dw: tensor<4x4xf32>, %db: tensor<4xf32>)
    -> (tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>) {
  %a, %b, %c, %d, %e = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>)
      db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
  return %a, %b, %c, %d, %e : tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
}

// A frozen hypernetwork (002 §1.10): only d_emb is used, so the outer products d_w1 and d_w2 are dead code.
// FROZEN-LABEL: func.func @frozen
// FROZEN-NOT: tensor<20x6xf32> into
// FROZEN-NOT: outs({{.*}} : tensor<20x6xf32>)
// FROZEN-NOT: outs({{.*}} : tensor<6x8xf32>)
// FROZEN: linalg.vecmat
// FROZEN: linalg.vecmat
// FROZEN: return
func.func @frozen(%emb: tensor<8xf32>, %w1: tensor<6x8xf32>, %b1: tensor<6xf32>, %w2: tensor<20x6xf32>,
                  %b2: tensor<20xf32>, %dw: tensor<4x4xf32>, %db: tensor<4xf32>) -> tensor<8xf32> {
  %a, %b, %c, %d, %e = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x4xf32>)
      db(%db : tensor<4xf32>) num_experts(4)
      : tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
      -> tensor<8xf32>, tensor<6x8xf32>, tensor<6xf32>, tensor<20x6xf32>, tensor<20xf32>
  return %a : tensor<8xf32>
}

// bf16 operands are read as f32; a dynamic D follows dw.
// CHECK-LABEL: func.func @dynamic_bf16
// CHECK: arith.extf
// CHECK: tensor.collapse_shape %{{.+}} {{\[\[}}0, 1]] : tensor<2x?xf32> into tensor<?xf32>
// CHECK-NOT: moe.hyper_router_grad
func.func @dynamic_bf16(%emb: tensor<?xbf16>, %w1: tensor<?x?xbf16>, %b1: tensor<?xbf16>, %w2: tensor<?x?xbf16>,
                        %b2: tensor<?xbf16>, %dw: tensor<2x?xf32>, %db: tensor<2xf32>) -> (tensor<?xf32>, tensor<?xf32>) {
  %a, %b, %c, %d, %e = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<2x?xf32>)
      db(%db : tensor<2xf32>) num_experts(2)
      : tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16>
      -> tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
  return %a, %e : tensor<?xf32>, tensor<?xf32>
}
