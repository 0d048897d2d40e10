// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// Σ counts in f64 by one sequential loop (exact for integer counts, the same rounding on every run for float ones),
// then one elementwise generic: the sign of Σc − E·c_e (0 when equal or NaN) times the f32 rate, added to the bias
// in f32.
// CHECK-LABEL: func.func @update
// CHECK-SAME: %[[B:[^:]+]]: tensor<?xbf16>, %[[C:[^:]+]]: tensor<?xi32>
// CHECK: %[[SUM:.+]] = scf.for {{.*}} -> (f64)
// CHECK: tensor.extract %[[C]]
// CHECK: arith.sitofp %{{.+}} : i32 to f64
// CHECK: arith.addf %{{.+}} : f64
// CHECK: %[[E:.+]] = arith.uitofp %{{.+}} : i64 to f64
// The bias widened to f32, then the update.
// CHECK: arith.extf %{{.+}} : bf16 to f32
// CHECK: linalg.generic
// CHECK: ^bb0(%[[BE:[^:]+]]: f32, %[[CE:[^:]+]]: i32, %{{[^:]+}}: f32):
// CHECK: %[[CF:.+]] = arith.sitofp %[[CE]] : i32 to f64
// CHECK: %[[EC:.+]] = arith.mulf %[[E]], %[[CF]] : f64
// CHECK: %[[D:.+]] = arith.subf %[[SUM]], %[[EC]] : f64
// CHECK: %[[UP:.+]] = arith.cmpf ogt, %[[D]]
// CHECK: %[[DOWN:.+]] = arith.cmpf olt, %[[D]]
// CHECK: %[[S0:.+]] = arith.select %[[DOWN]]
// CHECK: %[[S:.+]] = arith.select %[[UP]], %{{.+}}, %[[S0]] : f32
// CHECK: %[[U:.+]] = arith.mulf %{{.+}}, %[[S]] : f32
// CHECK: arith.addf %[[BE]], %[[U]] : f32
// CHECK-NOT: moe.bias_update
func.func @update(%b: tensor<?xbf16>, %c: tensor<?xi32>) -> tensor<?xf32> {
  %n = moe.bias_update %b, %c rate(1.000000e-03) : tensor<?xbf16>, tensor<?xi32> -> tensor<?xf32>
  return %n : tensor<?xf32>
}
