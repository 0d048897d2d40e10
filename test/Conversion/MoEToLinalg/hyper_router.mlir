// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// Two linalg.matvec with bias (+ ReLU on the hidden layer), the [E, D+1]
// row-major view and the two slices.
// CHECK-LABEL: func.func @static
// CHECK-SAME: %[[EMB:[^:]+]]: tensor<256xf32>, %[[W1:[^:]+]]: tensor<256x256xf32>, %[[B1:[^:]+]]: tensor<256xf32>, %[[W2:[^:]+]]: tensor<4112x256xf32>, %[[B2:[^:]+]]: tensor<4112xf32>
// CHECK: %[[HMV:.+]] = linalg.matvec ins(%[[W1]], %[[EMB]] : tensor<256x256xf32>, tensor<256xf32>) outs(%{{.+}} : tensor<256xf32>)
// CHECK: %[[H:.+]] = linalg.generic {{.*}} ins(%[[B1]] : tensor<256xf32>) outs(%[[HMV]] : tensor<256xf32>)
// CHECK: arith.addf
// CHECK: arith.maximumf
// CHECK: %[[OMV:.+]] = linalg.matvec ins(%[[W2]], %[[H]] : tensor<4112x256xf32>, tensor<256xf32>) outs(%{{.+}} : tensor<4112xf32>)
// CHECK: %[[OUT:.+]] = linalg.generic {{.*}} ins(%[[B2]] : tensor<4112xf32>) outs(%[[OMV]] : tensor<4112xf32>)
// CHECK-NOT: arith.maximumf
// CHECK: %[[TABLE:.+]] = tensor.expand_shape %[[OUT]] {{\[}}[0, 1]] output_shape [16, 257] : tensor<4112xf32> into tensor<16x257xf32>
// CHECK: %[[W:.+]] = tensor.extract_slice %[[TABLE]][0, 0] [16, 256] [1, 1] : tensor<16x257xf32> to tensor<16x256xf32>
// CHECK: %[[B:.+]] = tensor.extract_slice %[[TABLE]][0, 256] [16, 1] [1, 1] : tensor<16x257xf32> to tensor<16xf32>
// CHECK: return %[[W]], %[[B]]
func.func @static(%emb: tensor<256xf32>, %w1: tensor<256x256xf32>, %b1: tensor<256xf32>, %w2: tensor<4112x256xf32>, %b2: tensor<4112xf32>) -> (tensor<16x256xf32>, tensor<16xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(16) : tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<4112x256xf32>, tensor<4112xf32> -> tensor<16x256xf32>, tensor<16xf32>
  return %w, %b : tensor<16x256xf32>, tensor<16xf32>
}

// Dynamic E*(D+1): D+1 = rows / E at run time; bf16 operands extended first.
// CHECK-LABEL: func.func @dynamic_rows
// CHECK-SAME: %[[W2:[^:]+]]: tensor<?x8xbf16>
// CHECK: %[[W2F:.+]] = linalg.generic {{.*}} ins(%[[W2]] : tensor<?x8xbf16>)
// CHECK: arith.extf
// CHECK: %[[OMV:.+]] = linalg.matvec ins(%[[W2F]], %{{.+}} : tensor<?x8xf32>, tensor<8xf32>)
// CHECK: %[[OUT:.+]] = linalg.generic
// CHECK: %[[ROWS:.+]] = tensor.dim %[[OUT]], %{{.+}} : tensor<?xf32>
// CHECK: %[[COLS:.+]] = arith.divui %[[ROWS]], %{{.+}} : index
// CHECK: %[[TABLE:.+]] = tensor.expand_shape %[[OUT]] {{\[}}[0, 1]] output_shape [4, %[[COLS]]] : tensor<?xf32> into tensor<4x?xf32>
// CHECK: %[[D:.+]] = arith.subi %[[COLS]], %{{.+}} : index
// CHECK: tensor.extract_slice %[[TABLE]][0, 0] [4, %[[D]]] [1, 1] : tensor<4x?xf32> to tensor<4x?xf32>
// CHECK: tensor.extract_slice %[[TABLE]][0, %[[D]]] [4, 1] [1, 1] : tensor<4x?xf32> to tensor<4xf32>
func.func @dynamic_rows(%emb: tensor<4xbf16>, %w1: tensor<8x4xbf16>, %b1: tensor<8xbf16>, %w2: tensor<?x8xbf16>, %b2: tensor<?xbf16>) -> (tensor<4x?xf32>, tensor<4xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4) : tensor<4xbf16>, tensor<8x4xbf16>, tensor<8xbf16>, tensor<?x8xbf16>, tensor<?xbf16> -> tensor<4x?xf32>, tensor<4xf32>
  return %w, %b : tensor<4x?xf32>, tensor<4xf32>
}
