// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 -split-input-file | FileCheck %s

// The training forward: the flash kernel of similarity_inform writes the row
// log-sum-exp it computes anyway into the second result.

// CHECK-LABEL: func.func @fwd_writes_lse
// CHECK: moe.kernel ins(%{{.+}}, %{{.+}} : tensor<2x100x64xf32>, tensor<2x100x16xf32>) outs(%{{.+}}, %{{.+}} : tensor<2x100x16xf32>, tensor<2x100xf32>)
// CHECK-NEXT: ^bb0(%{{.+}}: memref<2x100x64xf32>, %{{.+}}: memref<2x100x16xf32>, %[[P:.+]]: memref<2x100x16xf32>, %[[LSE:.+]]: memref<2x100xf32>):
// CHECK: math.log
// CHECK: memref.store %{{.+}}, %[[LSE]][%{{.+}}, %{{.+}}] : memref<2x100xf32>
// CHECK: } -> tensor<2x100x16xf32>, tensor<2x100xf32>
func.func @fwd_writes_lse(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>) -> (tensor<2x100x16xf32>, tensor<2x100xf32>) {
  %p, %lse = moe.similarity_inform_fwd %u, %e causal(true)
      : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x16xf32>, tensor<2x100xf32>
  return %p, %lse : tensor<2x100x16xf32>, tensor<2x100xf32>
}

// -----

// The backward with saved(p, lse) reads them and runs no forward pass: its
// only log-sum-exp buffer is the +inf-guarded copy (one [B, Npad] buffer of
// lse' and one of delta), no store into a buffer the forward would fill, and
// no math.log (the forward's lse = m + log(l)).

// CHECK-LABEL: func.func @saved_skips_the_forward
// CHECK: moe.kernel ins(%{{.+}}, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : tensor<2x100x64xf32>, tensor<2x100x16xf32>, tensor<2x100x16xf32>, tensor<2x100x16xf32>, tensor<2x100xf32>)
// CHECK-NEXT: ^bb0(%{{.+}}: memref<2x100x64xf32>, %{{.+}}: memref<2x100x16xf32>, %{{.+}}: memref<2x100x16xf32>, %[[P:.+]]: memref<2x100x16xf32>, %[[LSE:.+]]: memref<2x100xf32>,
// CHECK-NOT: math.log
// CHECK: memref.load %[[LSE]][%{{.+}}, %{{.+}}] : memref<2x100xf32>
// CHECK: vector.maskedload %[[P]][
// CHECK-NOT: math.log
// CHECK: return
func.func @saved_skips_the_forward(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>, %dp: tensor<2x100x16xf32>,
                                   %p: tensor<2x100x16xf32>, %lse: tensor<2x100xf32>)
    -> (tensor<2x100x64xf32>, tensor<2x100x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x100x16xf32>)
      saved(%p, %lse : tensor<2x100x16xf32>, tensor<2x100xf32>) causal(true)
      : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x64xf32>, tensor<2x100x16xf32>
  return %du, %de : tensor<2x100x64xf32>, tensor<2x100x16xf32>
}

// -----

// Without them, the same kernel recomputes both with the forward (its m + log(l)).

// CHECK-LABEL: func.func @recomputes_without_saved
// CHECK: moe.kernel
// CHECK: math.log
// CHECK: return
func.func @recomputes_without_saved(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>, %dp: tensor<2x100x16xf32>)
    -> (tensor<2x100x64xf32>, tensor<2x100x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x100x16xf32>) causal(true)
      : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x64xf32>, tensor<2x100x16xf32>
  return %du, %de : tensor<2x100x64xf32>, tensor<2x100x16xf32>
}
