// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s --check-prefix=NO-NXNK

// The N x Nk posterior (and any copy of the scores) is never stored: scores is
// read in place by reductions and by tensor.extract inside the key loop.
// NO-NXNK-NOT: tensor<2x128x96xf32>
// NO-NXNK-NOT: tensor<128x96xf32>
// NO-NXNK-NOT: tensor<2x8x128x96xf32> {{.*}}outs

// Phase 1: per-row max, Σexp and Σexp·s read from scores, the mean entropy per
// head over the unmasked rows, then the argmin over heads.
// CHECK-LABEL: func.func @min_entropy
// CHECK-SAME: %[[S:[^:]+]]: tensor<2x8x128x96xf32>, %[[U:[^:]+]]: tensor<2x128x512xf32>, %[[V:[^:]+]]: tensor<2x8x96x64xf32>, %[[WO:[^:]+]]: tensor<512x512xf32>, %[[E:[^:]+]]: tensor<2x96x16xf32>
// CHECK: %[[MAX:.+]] = linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "parallel", "reduction"]} ins(%[[S]] : tensor<2x8x128x96xf32>) outs(%{{.+}} : tensor<2x8x128xf32>)
// CHECK: arith.maximumf
// CHECK: %[[SUMS:.+]]:2 = linalg.generic {{.*}} ins(%[[S]], %[[MAX]] :
// CHECK: %[[ENT:.+]]:2 = linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[MAX]], %[[SUMS]]#0, %[[SUMS]]#1 :
// CHECK: math.log
// CHECK: %[[HEAD:.+]]:2 = linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]} ins(%[[ENT]]#0, %[[ENT]]#1 : tensor<2x8xf32>, tensor<2x8xf32>) outs(%{{.+}}, %{{.+}} : tensor<2xf32>, tensor<2xi32>)
// The argmin is the top-k order with reversed keys (MoE/Kernels/TopK.h): ~key, packed with the index, compared as i64.
// CHECK: arith.xori %{{.+}}, %c-1_i32
// CHECK: arith.cmpi sgt, %{{.+}}, %{{.+}} : i64
// Phase 2: head means of h*[b], per batch element: slices at the head, transpose, matmul.
// CHECK: %[[MEANS:.+]] = scf.for %[[B:.+]] = %{{.+}} to %{{.+}} step %{{.+}} iter_args(%{{.+}} = %{{.+}}) -> (tensor<2x96x512xf32>)
// CHECK: %[[H32:.+]] = tensor.extract %[[HEAD]]#1[%[[B]]] : tensor<2xi32>
// CHECK: %[[H:.+]] = arith.index_cast %[[H32]] : i32 to index
// CHECK: %[[VB:.+]] = tensor.extract_slice %[[V]][%[[B]], %[[H]], 0, 0] [1, 1, 96, 64] [1, 1, 1, 1] : tensor<2x8x96x64xf32> to tensor<96x64xf32>
// CHECK: %[[COL:.+]] = arith.muli %[[H]], %{{.+}} : index
// CHECK: %[[BLK:.+]] = tensor.extract_slice %[[WO]][0, %[[COL]]] [512, 64] [1, 1] : tensor<512x512xf32> to tensor<512x64xf32>
// CHECK: %[[BLKT:.+]] = linalg.transpose ins(%[[BLK]] : tensor<512x64xf32>) outs(%{{.+}} : tensor<64x512xf32>) permutation = [1, 0]
// CHECK: linalg.matmul ins(%[[VB]], %[[BLKT]] : tensor<96x64xf32>, tensor<64x512xf32>)
// head_scale defaults to H = 8.
// CHECK: %[[SCALED:.+]] = linalg.generic {{.*}} outs(%[[MEANS]] : tensor<2x96x512xf32>)
// CHECK: arith.mulf %{{.+}}, %{{.+}} : f32
// CHECK: %[[NORM2:.+]] = linalg.generic {{.*}} ins(%[[SCALED]] : tensor<2x96x512xf32>) outs(%{{.+}} : tensor<2x96xf32>)
// Phase 3: stream the Nk = 96 keys.
// CHECK: %[[LOOP:.+]]:7 = scf.for %[[J:.+]] = %{{.+}} to %{{.+}} step
// CHECK: %[[MJ:.+]] = tensor.extract_slice %[[SCALED]][0, %[[J]], 0] [2, 1, 512] [1, 1, 1] : tensor<2x96x512xf32> to tensor<2x512xf32>
// CHECK: %[[DOT:.+]] = linalg.generic {{.*}} ins(%[[U]], %[[MJ]] :
// CHECK: linalg.generic {{.*}} ins(%{{.+}}, %[[HEAD]]#1 : tensor<2xf32>, tensor<2xi32>) outs(%[[DOT]] : tensor<2x128xf32>)
// CHECK: %[[BI:.+]] = linalg.index 0 : index
// CHECK: %[[II:.+]] = linalg.index 1 : index
// CHECK: %[[HI:.+]] = arith.index_cast %{{.+}} : i32 to index
// CHECK: tensor.extract %[[S]][%[[BI]], %[[HI]], %[[II]], %[[J]]] : tensor<2x8x128x96xf32>
// CHECK: arith.maximumf
// CHECK: tensor.extract_slice %[[E]][0, %[[J]], 0] [2, 1, 16]
// CHECK: scf.yield
// CHECK: %[[P:.+]] = linalg.generic {{.*}} ins(%[[LOOP]]#0, %[[LOOP]]#1, %[[LOOP]]#2 :
// CHECK: return %[[P]], %[[HEAD]]#1
func.func @min_entropy(%s: tensor<2x8x128x96xf32>, %u: tensor<2x128x512xf32>, %v: tensor<2x8x96x64xf32>, %wo: tensor<512x512xf32>, %e: tensor<2x96x16xf32>) -> (tensor<2x128x16xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<2x8x128x96xf32>, tensor<2x128x512xf32>, tensor<2x8x96x64xf32>, tensor<512x512xf32>, tensor<2x96x16xf32> -> tensor<2x128x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x128x16xf32>, tensor<2xi32>
}

// head_select(all): an scf.for over the heads wraps head means + key loop and
// mixes them with a second online softmax over z_h = lse(posterior) - lse(prior);
// head = -1. head_scale replaces H.
// CHECK-LABEL: func.func @all_heads
// CHECK-SAME: %[[S:[^:]+]]: tensor<2x8x128x96xf32>
// CHECK: %[[MAX:.+]] = linalg.generic {{.*}} ins(%[[S]] :
// CHECK: %[[SUMS:.+]]:2 = linalg.generic {{.*}} ins(%[[S]], %[[MAX]] :
// CHECK-NOT: arith.cmpi sgt, %{{.+}}, %{{.+}} : i64
// CHECK: %[[HEADS:.+]]:6 = scf.for %[[H:.+]] = %{{.+}} to %{{.+}} step
// CHECK: %[[H32:.+]] = arith.index_cast %[[H]] : index to i32
// CHECK: %[[HT:.+]] = linalg.fill ins(%[[H32]] : i32) outs(%{{.+}} : tensor<2xi32>)
// CHECK: scf.for
// CHECK: linalg.matmul
// CHECK: %[[POST:.+]]:7 = scf.for
// CHECK: arith.constant 5.000000e-01 : f32
// CHECK: %[[PMAX:.+]] = tensor.extract_slice %[[MAX]][0, %[[H]], 0] [2, 1, 128] [1, 1, 1] : tensor<2x8x128xf32> to tensor<2x128xf32>
// CHECK: %[[PSUM:.+]] = tensor.extract_slice %[[SUMS]]#0[0, %[[H]], 0] [2, 1, 128] [1, 1, 1] : tensor<2x8x128xf32> to tensor<2x128xf32>
// CHECK: linalg.generic {{.*}} ins(%[[POST]]#0, %[[POST]]#1, %[[PMAX]], %[[PSUM]] :
// CHECK: math.log
// CHECK: math.log
// CHECK: arith.maximumf
// CHECK: linalg.generic {{.*}} ins(%{{.+}}, %{{.+}}, %{{.+}}, %[[POST]]#1, %[[POST]]#2 :
// CHECK: scf.yield
// CHECK: %[[P:.+]] = linalg.generic {{.*}} ins(%[[HEADS]]#0, %[[HEADS]]#1, %[[HEADS]]#2 :
// CHECK: %[[MINUS1:.+]] = arith.constant -1 : i32
// CHECK: %[[HEAD:.+]] = linalg.fill ins(%[[MINUS1]] : i32) outs(%{{.+}} : tensor<2xi32>)
// CHECK: return %[[P]], %[[HEAD]]
func.func @all_heads(%s: tensor<2x8x128x96xf32>, %u: tensor<2x128x512xf32>, %v: tensor<2x8x96x64xf32>, %wo: tensor<512x512xf32>, %e: tensor<2x96x16xf32>) -> (tensor<2x128x16xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e head_select(all) head_scale(1.000000e+00) : tensor<2x8x128x96xf32>, tensor<2x128x512xf32>, tensor<2x8x96x64xf32>, tensor<512x512xf32>, tensor<2x96x16xf32> -> tensor<2x128x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x128x16xf32>, tensor<2xi32>
}

// bf16 scores are read and extended element by element (no f32 copy of the
// [B, H, N, Nk] scores); dynamic H without head_scale reads H from the shape.
// CHECK-LABEL: func.func @bf16_dynamic_heads
// CHECK-SAME: %[[S:[^:]+]]: tensor<1x?x4x4xbf16>
// CHECK-NOT: tensor<1x?x4x4xf32>
// CHECK: %[[H:.+]] = tensor.dim %[[S]], %c1
// CHECK: linalg.generic {{.*}} ins(%[[S]] : tensor<1x?x4x4xbf16>)
// CHECK: arith.extf %{{.+}} : bf16 to f32
// CHECK: scf.for
// CHECK: %[[H64:.+]] = arith.index_cast %[[H]] : index to i64
// CHECK: %[[HF:.+]] = arith.sitofp %[[H64]] : i64 to f32
// CHECK: arith.mulf %[[HF]], %{{.+}} : f32
// CHECK: scf.for
// CHECK: %[[X:.+]] = tensor.extract %[[S]][{{.+}}] : tensor<1x?x4x4xbf16>
// CHECK: arith.extf %[[X]] : bf16 to f32
func.func @bf16_dynamic_heads(%s: tensor<1x?x4x4xbf16>, %u: tensor<1x4x8xbf16>, %v: tensor<1x?x4x2xbf16>, %wo: tensor<8x?xbf16>, %e: tensor<1x4x3xbf16>) -> (tensor<1x4x3xf32>, tensor<1xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e : tensor<1x?x4x4xbf16>, tensor<1x4x8xbf16>, tensor<1x?x4x2xbf16>, tensor<8x?xbf16>, tensor<1x4x3xbf16> -> tensor<1x4x3xf32>, tensor<1xi32>
  return %p, %h : tensor<1x4x3xf32>, tensor<1xi32>
}
