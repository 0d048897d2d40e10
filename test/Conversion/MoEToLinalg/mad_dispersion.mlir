// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// Out-of-range assign values are reported by a loop before the statistics;
// the statistics themselves never index by assign (one-hot reductions over T
// with the cluster as a parallel dimension), so nothing can write out of bounds.
// CHECK: func.func private @moeReportIndexError(i32, i64, i64, i64)
// CHECK-LABEL: func.func @defaults
// CHECK-SAME: %[[X:[^:]+]]: tensor<?x8xf32>, %[[A:[^:]+]]: tensor<?xi32>
// CHECK: %[[E:.+]] = arith.constant 4 : index
// CHECK: %[[T:.+]] = tensor.dim %[[A]], %{{.+}} : tensor<?xi32>
// CHECK: %[[E64:.+]] = arith.index_cast %[[E]] : index to i64
// CHECK: %[[CODE:.+]] = arith.constant 1 : i32
// CHECK: scf.for %[[TI:.+]] = %{{.+}} to %[[T]] step
// CHECK: %[[V:.+]] = tensor.extract %[[A]][%[[TI]]] : tensor<?xi32>
// CHECK: %[[V64:.+]] = arith.extsi %[[V]] : i32 to i64
// CHECK: scf.if
// CHECK: %[[POS:.+]] = arith.index_cast %[[TI]] : index to i64
// CHECK: func.call @moeReportIndexError(%[[CODE]], %[[POS]], %[[V64]], %[[E64]])
// counts[k] = Σ_t [assign[t] == k]
// CHECK: %[[COUNTS:.+]] = linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]} ins(%[[A]] : tensor<?xi32>) outs(%{{.+}} : tensor<4xi32>)
// CHECK: arith.cmpi eq
// CHECK: arith.extui
// Cluster sums, then means (0 for an empty cluster).
// CHECK: %[[SUMS:.+]] = linalg.generic {{.*}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[A]], %[[X]] : tensor<?xi32>, tensor<?x8xf32>) outs(%{{.+}} : tensor<4x8xf32>)
// CHECK: arith.select
// CHECK: %[[MEAN:.+]] = linalg.generic {{.*}} ins(%[[SUMS]], %[[COUNTS]] :
// Second pass: mean absolute deviation from the cluster mean, W = 1/(s+eps).
// CHECK: %[[DEV:.+]] = linalg.generic {{.*}} ins(%[[A]], %[[X]], %[[MEAN]] :
// CHECK: math.absf
// CHECK: %[[W0:.+]] = linalg.generic {{.*}} ins(%[[DEV]], %[[COUNTS]] :
// CHECK: arith.constant 9.99999974E-5 : f32
// Clip at 10 x the mean over clusters with >= 2 tokens (a rank-0 reduction).
// CHECK: %[[ALL:.+]]:2 = linalg.generic {{.*}}iterator_types = ["reduction", "reduction"]} ins(%[[W0]], %[[COUNTS]] : tensor<4x8xf32>, tensor<4xi32>) outs(%{{.+}}, %{{.+}} : tensor<f32>, tensor<f32>)
// CHECK: arith.cmpi sge, %{{.+}}, %{{.+}} : i32
// CHECK: %[[MEANALL:.+]] = linalg.generic {{.*}} ins(%[[ALL]]#0, %[[ALL]]#1 : tensor<f32>, tensor<f32>)
// CHECK: %[[W1:.+]] = linalg.generic {{.*}} ins(%[[MEANALL]] : tensor<f32>) outs(%[[W0]] : tensor<4x8xf32>)
// CHECK: arith.constant 1.000000e+01 : f32
// CHECK: arith.minimumf
// normalize = feature: per-column mean over the included clusters.
// CHECK: %[[COL:.+]]:2 = linalg.generic {{.*}}iterator_types = ["reduction", "parallel"]} ins(%[[W1]], %[[COUNTS]] : tensor<4x8xf32>, tensor<4xi32>) outs(%{{.+}}, %{{.+}} : tensor<8xf32>, tensor<8xf32>)
// CHECK: %[[COLMEAN:.+]] = linalg.generic {{.*}} ins(%[[COL]]#0, %[[COL]]#1 : tensor<8xf32>, tensor<8xf32>)
// empty = identity: clusters below 2 tokens get 1.
// CHECK: %[[W:.+]] = linalg.generic {{.*}} ins(%[[COLMEAN]], %[[COUNTS]] : tensor<8xf32>, tensor<4xi32>) outs(%[[W1]] : tensor<4x8xf32>)
// CHECK: arith.cmpi sge
// CHECK: arith.select
// CHECK: return %[[W]], %[[COUNTS]]
func.func @defaults(%x: tensor<?x8xf32>, %a: tensor<?xi32>) -> (tensor<4x8xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) : tensor<?x8xf32>, tensor<?xi32> -> tensor<4x8xf32>, tensor<4xi32>
  return %w, %c : tensor<4x8xf32>, tensor<4xi32>
}

// variance, expert rows, no clip, raw empty clusters (every cluster counts),
// i64 assign compared in i64; bf16 tokens extended first.
// CHECK-LABEL: func.func @variance_expert_raw
// CHECK-SAME: %[[X:[^:]+]]: tensor<16x8xbf16>, %[[A:[^:]+]]: tensor<16xi64>
// CHECK: scf.for
// CHECK-NOT: arith.extsi
// CHECK: func.call @moeReportIndexError
// CHECK: %[[XF:.+]] = linalg.generic {{.*}} ins(%[[X]] : tensor<16x8xbf16>)
// CHECK: linalg.generic {{.*}} ins(%[[A]] : tensor<16xi64>)
// CHECK: arith.index_cast %{{.+}} : index to i64
// CHECK: %[[DEV:.+]] = linalg.generic {{.*}} ins(%[[A]], %[[XF]], %{{.+}} :
// CHECK: %[[D:.+]] = arith.subf
// CHECK: arith.mulf %[[D]], %[[D]] : f32
// CHECK-NOT: arith.minimumf
// CHECK-NOT: arith.cmpi sge
// CHECK: linalg.generic {{.*}}iterator_types = ["parallel", "reduction"]} ins(%{{.+}}, %{{.+}} : tensor<4x8xf32>, tensor<4xi32>) outs(%{{.+}}, %{{.+}} : tensor<4xf32>, tensor<4xf32>)
// CHECK: return
func.func @variance_expert_raw(%x: tensor<16x8xbf16>, %a: tensor<16xi64>) -> (tensor<4x8xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) clip(0.000000e+00) normalize(expert) measure(variance) empty(raw) : tensor<16x8xbf16>, tensor<16xi64> -> tensor<4x8xf32>, tensor<4xi32>
  return %w, %c : tensor<4x8xf32>, tensor<4xi32>
}

// normalize = global: one scalar mean (rank-0 reductions).
// CHECK-LABEL: func.func @global
// CHECK: linalg.generic {{.*}}iterator_types = ["reduction", "reduction"]} {{.*}} outs(%{{.+}}, %{{.+}} : tensor<f32>, tensor<f32>)
// CHECK: arith.minimumf
// CHECK: linalg.generic {{.*}}iterator_types = ["reduction", "reduction"]} {{.*}} outs(%{{.+}}, %{{.+}} : tensor<f32>, tensor<f32>)
// CHECK: %[[SCALE:.+]] = linalg.generic {{.*}} ins(%{{.+}}, %{{.+}} : tensor<f32>, tensor<f32>)
// CHECK: linalg.generic {{.*}} ins(%[[SCALE]], %{{.+}} : tensor<f32>, tensor<4xi32>)
func.func @global(%x: tensor<16x8xf32>, %a: tensor<16xi32>) -> (tensor<4x8xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) normalize(global) : tensor<16x8xf32>, tensor<16xi32> -> tensor<4x8xf32>, tensor<4xi32>
  return %w, %c : tensor<4x8xf32>, tensor<4xi32>
}
