// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s --check-prefix=NO-NXN

// similarity_inform_grad: the flash-style backward (FlashGrad.cpp). The forward kernel recomputes p and the row
// log-sum-exp, then two tiled passes stream the similarity tiles from it, query-major (dq) and key-major (de,
// dk), each with two register-blocked dot tiles per block (the scores <q_i, u_j> and the cotangent <dp_i, e_j>),
// the polynomial exp, and the forward's PV loop; nothing of size N x N exists.

// NO-NXN-NOT: 100x100

// CHECK-LABEL: func.func @ws_mask_causal
// CHECK-DAG: %[[INF:.+]] = arith.constant 0x7F800000 : f32
// One kernel; du, de and dws are its outs.
// CHECK: moe.kernel ins({{.*}}) outs({{.*}} : tensor<2x100x64xf32>, tensor<2x100x16xf32>, tensor<64x64xf32>)
// The recomputed forward writes the log-sum-exp [B, N] ...
// CHECK: %[[LSE:.+]] = memref.alloc(%{{.+}}, %{{.+}}) {alignment = 64 : i64} : memref<?x?xf32>
// CHECK: scf.parallel
// CHECK: memref.store %{{.+}}, %[[LSE]]
// ... which becomes lse' (+inf for a row without keys) and delta = <dp_i, p_i>, both padded to 32 keys.
// CHECK: memref.load %[[LSE]]
// CHECK: arith.select %{{.+}}, %{{.+}}, %[[INF]] : f32
// Then the two tiled passes (query-major, key-major), each on its own workers: register-blocked dot tiles,
// the polynomial exp (never math.exp), the PV loop.
// CHECK: scf.parallel
// CHECK: vector.fma {{.*}} : vector<16xf32>
// CHECK: scf.parallel
// CHECK: vector.fma {{.*}} : vector<16xf32>
// du = dk + dq · ws^T and dws = Σ u^T dq, then the three results.
// CHECK: scf.parallel
// CHECK: scf.parallel
// CHECK: } -> tensor<2x100x64xf32>, tensor<2x100x16xf32>, tensor<64x64xf32>
// CHECK: return %{{.+}}, %{{.+}}, %{{.+}} : tensor<2x100x64xf32>, tensor<2x100x16xf32>, tensor<64x64xf32>
// NO-NXN-NOT: math.exp
func.func @ws_mask_causal(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>, %ws: tensor<64x64xf32>,
                          %m: tensor<2x100xi1>, %dp: tensor<2x100x16xf32>)
    -> (tensor<2x100x64xf32>, tensor<2x100x16xf32>, tensor<64x64xf32>) {
  %du, %de, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<64x64xf32>) key_mask(%m : tensor<2x100xi1>)
      dp(%dp : tensor<2x100x16xf32>) tau(0.5) causal(true)
      : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x64xf32>, tensor<2x100x16xf32>, tensor<64x64xf32>
  return %du, %de, %dws : tensor<2x100x64xf32>, tensor<2x100x16xf32>, tensor<64x64xf32>
}

// Dynamic tokens (the torch ops' kernels), no ws, not causal: the one symmetric pass
// (similarity_inform_grad_symmetric.mlir), no dws.
// CHECK-LABEL: func.func @dynamic_tokens
// CHECK-NOT: moe.similarity_inform_grad
// CHECK: return %{{.+}}, %{{.+}} : tensor<?x?x8xf32>, tensor<?x?x4xf32>
func.func @dynamic_tokens(%u: tensor<?x?x8xf32>, %e: tensor<?x?x4xf32>, %dp: tensor<?x?x4xf32>)
    -> (tensor<?x?x8xf32>, tensor<?x?x4xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<?x?x4xf32>)
      : tensor<?x?x8xf32>, tensor<?x?x4xf32> -> tensor<?x?x8xf32>, tensor<?x?x4xf32>
  return %du, %de : tensor<?x?x8xf32>, tensor<?x?x4xf32>
}

// A static zero-sized operand is not the kernel's (the op stays for the caller).
// CHECK-LABEL: func.func @zero_sized
// CHECK: moe.similarity_inform_grad
func.func @zero_sized(%u: tensor<1x5x0xf32>, %e: tensor<1x5x3xf32>, %dp: tensor<1x5x3xf32>)
    -> (tensor<1x5x0xf32>, tensor<1x5x3xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x5x3xf32>)
      : tensor<1x5x0xf32>, tensor<1x5x3xf32> -> tensor<1x5x0xf32>, tensor<1x5x3xf32>
  return %du, %de : tensor<1x5x0xf32>, tensor<1x5x3xf32>
}
