// RUN: moe-opt %s --convert-moe-to-cpu -split-input-file | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s --check-prefix=GPU

// The CPU flash kernels take every softmax weight exp(d) as 0 where d < -87
// (exp(d) below the smallest normal f32): a subnormal operand costs the x86
// FMA units a microcode assist (CK::softmaxWeight). The exp runs on the
// clamped d, and the select drops it. The GPU kernels have no such cost and
// keep exp(d).

// CHECK-LABEL: func.func @mix
// CHECK-DAG: %[[FLOOR:.+]] = arith.constant dense<-8.700000e+01> : vector<16xf32>
// CHECK-DAG: %[[ZERO:.+]] = arith.constant dense<0.000000e+00> : vector<16xf32>
// CHECK: %[[TINY:.+]] = arith.cmpf olt, %[[D:.+]], %[[FLOOR]] : vector<16xf32>
// CHECK-NEXT: %[[CLAMPED:.+]] = arith.select %[[TINY]], %[[FLOOR]], %[[D]] : vector<16xi1>, vector<16xf32>
// CHECK: %[[NAN:.+]] = arith.cmpf uno, %[[CLAMPED]], %[[CLAMPED]] : vector<16xf32>
// CHECK-NEXT: %[[EXP:.+]] = arith.select %[[NAN]], %[[CLAMPED]], %{{.+}} : vector<16xi1>, vector<16xf32>
// CHECK-NEXT: arith.select %[[TINY]], %[[ZERO]], %[[EXP]] : vector<16xi1>, vector<16xf32>
// GPU-LABEL: func.func @mix
// GPU-NOT: -8.700000e+01
// GPU: return
func.func @mix(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>) -> tensor<2x100x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x16xf32>
  return %p : tensor<2x100x16xf32>
}

// -----

// The backward: S = exp(x - lse) is flushed the same way, and the logit
// cotangent dX = S (g - delta) / tau, which is subnormal for small S, is
// flushed where |dX| is below the smallest normal f32 before the
// accumulators broadcast it.

// CHECK-LABEL: func.func @grad
// CHECK-DAG: %[[MIN:.+]] = arith.constant dense<1.17549435E-38> : vector<16xf32>
// CHECK-DAG: %[[FLOOR:.+]] = arith.constant dense<-8.700000e+01> : vector<16xf32>
// CHECK: arith.cmpf olt, %{{.+}}, %[[FLOOR]] : vector<16xf32>
// CHECK: %[[ABS:.+]] = math.absf %{{.+}} : vector<16xf32>
// CHECK-NEXT: %[[TINY:.+]] = arith.cmpf olt, %[[ABS]], %[[MIN]] : vector<16xf32>
// CHECK-NEXT: arith.select %[[TINY]], %{{.+}}, %{{.+}} : vector<16xi1>, vector<16xf32>
// GPU-LABEL: func.func @grad
// GPU-NOT: -8.700000e+01
// GPU-NOT: 1.17549435E-38
// GPU: return
func.func @grad(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>, %dp: tensor<2x100x16xf32>)
    -> (tensor<2x100x64xf32>, tensor<2x100x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x100x16xf32>) causal(true)
      : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x64xf32>, tensor<2x100x16xf32>
  return %du, %de : tensor<2x100x64xf32>, tensor<2x100x16xf32>
}
