// The fused routing ops (moe-fuse-routing) compute exactly what the unfused pair computes on the CPU: the portable
// lowering splits them back, so the printed outputs of both forms are identical.
// RUN: moe-opt %s --moe-fuse-routing | FileCheck %s --check-prefix=FUSED
// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | grep -v base@ > %t.unfused
// RUN: moe-opt %s --moe-fuse-routing --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | grep -v base@ > %t.fused
// RUN: diff %t.unfused %t.fused
// RUN: FileCheck %s < %t.fused

// FUSED-LABEL: func.func @main
// FUSED:         moe.similarity_inform_topk
// FUSED-NOT:     moe.topk_renorm

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printMemrefI32(tensor<*xi32>)

// Inputs of batch 0 of test/Integration/CPU/similarity_inform.mlir (case 1). Expected values from float64 numpy,
// written from eq 5/8/11: S = softmax(U Uᵀ / 0.5), p = S E, top-2 by (value desc, index asc), w = p_sel / Σ p_sel,
// giving [0, 1] 0.509364/0.490636, [2, 1] 0.578947/0.421053, [2, 1] 0.777093/0.222907.
// CHECK:      {{\[\[\[}}0, 1]
// CHECK-NEXT: [2, 1]
// CHECK-NEXT: [2, 1]
// CHECK:      {{\[\[\[}}0.50936{{[0-9]*}}, 0.49063{{[0-9]*}}]
// CHECK-NEXT: [0.57894{{[0-9]*}}, 0.42105{{[0-9]*}}]
// CHECK-NEXT: [0.77709{{[0-9]*}}, 0.22290{{[0-9]*}}]
func.func @main() {
  %u = arith.constant dense<[[[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]]> : tensor<1x3x2xf32>
  %e = arith.constant dense<[[[0.5, 0.25, 0.25], [0.125, 0.75, 0.125], [0.0, 0.0, 1.0]]]> : tensor<1x3x3xf32>
  %p = moe.similarity_inform %u, %e tau(0.5) : tensor<1x3x2xf32>, tensor<1x3x3xf32> -> tensor<1x3x3xf32>
  %w, %i = moe.topk_renorm %p k(2) mode(probs) : tensor<1x3x3xf32> -> tensor<1x3x2xf32>, tensor<1x3x2xi32>
  %iu = tensor.cast %i : tensor<1x3x2xi32> to tensor<*xi32>
  call @printMemrefI32(%iu) : (tensor<*xi32>) -> ()
  %wu = tensor.cast %w : tensor<1x3x2xf32> to tensor<*xf32>
  call @printMemrefF32(%wu) : (tensor<*xf32>) -> ()
  return
}
