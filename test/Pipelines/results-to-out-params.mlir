// moe-lower-to-llvm="results-to-out-params=true" (the kernels behind torch.ops.moe.*, python/moe_mlir/runtime/
// cache.py): the results become out-params appended to the arguments and the kernels compute them in the caller's
// buffers. The buffers the kernels allocate for their results (dynamic token dimension or static) are gone and no
// copy remains; a result that is not the function's own allocation (here an argument) is still copied.
// RUN: moe-opt %s --moe-lower-to-llvm="results-to-out-params=true" \
// RUN:   --mlir-print-ir-after=buffer-results-to-out-params -o /dev/null 2>&1 | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm="results-to-out-params=true num-threads=2" | FileCheck %s --check-prefix=LLVM
// Default: results are returned (the execution API's calling convention).
// RUN: moe-opt %s --moe-lower-to-llvm | FileCheck %s --check-prefix=RETURNED

// CHECK-LABEL: func.func @topk_renorm(
// CHECK-SAME:      %{{.*}}: memref<?x64xf32>, %[[W:.*]]: memref<?x2xf32>, %[[I:.*]]: memref<?x2xi32>) {
// CHECK-NOT:     memref.alloc{{.*}} : memref<?x2x
// CHECK-NOT:     memref.copy
// CHECK-DAG:     memref.store %{{.*}}, %[[I]]
// CHECK-DAG:     vector.maskedstore %[[W]]
// CHECK-NOT:     memref.copy
// CHECK:         return{{$}}
func.func @topk_renorm(%scores: tensor<?x64xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.topk_renorm %scores k(2) mode(logits) renormalize(true)
      : tensor<?x64xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

// CHECK-LABEL: func.func @similarity_inform(
// CHECK-SAME:      %{{.*}}: memref<?x?x16xf32>, %{{.*}}: memref<?x?x8xf32>, %[[P:.*]]: memref<?x?x8xf32>) {
// CHECK-NOT:     memref.alloc{{.*}} : memref<?x?x8xf32>
// CHECK-NOT:     memref.copy
// CHECK:         return{{$}}
func.func @similarity_inform(%u: tensor<?x?x16xf32>, %e: tensor<?x?x8xf32>) -> tensor<?x?x8xf32> {
  %p = moe.similarity_inform %u, %e tau(5.000000e-01) causal(true)
      : tensor<?x?x16xf32>, tensor<?x?x8xf32> -> tensor<?x?x8xf32>
  return %p : tensor<?x?x8xf32>
}

// Static results ([E, D] weights, [E] counts).
// CHECK-LABEL: func.func @mad_dispersion(
// CHECK-SAME:      %{{.*}}: memref<?x32xf32>, %{{.*}}: memref<?xi32>, %[[WS:.*]]: memref<4x32xf32>, %[[C:.*]]: memref<4xi32>) {
// CHECK-NOT:     memref.alloc{{.*}} : memref<4xi32>
// CHECK-NOT:     memref.copy
// CHECK:         return{{$}}
func.func @mad_dispersion(%x: tensor<?x32xf32>, %a: tensor<?xi32>) -> (tensor<4x32xf32>, tensor<4xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(4) eps(1.000000e-06) clip(1.000000e+01) normalize(feature)
      measure(mad) empty(identity) : tensor<?x32xf32>, tensor<?xi32> -> tensor<4x32xf32>, tensor<4xi32>
  return %w, %c : tensor<4x32xf32>, tensor<4xi32>
}

// A result that is an argument: copied into the out-param.
// CHECK-LABEL: func.func @returns_argument(
// CHECK-SAME:      %[[A:.*]]: memref<8x8xf32>, %[[OUT:.*]]: memref<8x8xf32>) {
// CHECK:         memref.copy %[[A]], %[[OUT]]
func.func @returns_argument(%a: tensor<8x8xf32>) -> tensor<8x8xf32> {
  return %a : tensor<8x8xf32>
}

// The C interface takes one descriptor pointer per input and per output and returns nothing; no copy between the
// kernels' buffers and the caller's is left in the kernels.
// LLVM-LABEL: llvm.func @topk_renorm(
// LLVM-NOT:     memrefCopy
// LLVM-NOT:     llvm.intr.memcpy
// LLVM-LABEL: llvm.func @_mlir_ciface_topk_renorm(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) attributes
// LLVM-LABEL: llvm.func @similarity_inform(
// LLVM-NOT:     memrefCopy
// LLVM-NOT:     llvm.intr.memcpy
// LLVM-LABEL: llvm.func @_mlir_ciface_similarity_inform(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) attributes
// LLVM-LABEL: llvm.func @mad_dispersion(
// LLVM-NOT:     memrefCopy
// LLVM-NOT:     llvm.intr.memcpy
// LLVM-LABEL: llvm.func @_mlir_ciface_mad_dispersion(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) attributes

// RETURNED-LABEL: llvm.func @_mlir_ciface_topk_renorm(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) attributes
