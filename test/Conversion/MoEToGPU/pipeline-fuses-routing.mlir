// moe-lower-to-nvvm fuses a mixing op with its probs-mode gate first: the Similarity-Inform gate written as two ops
// (eq 8 then eq 11) runs as one kernel whose epilogue selects the experts; p never goes to device memory.
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa" | FileCheck %s

// CHECK-LABEL: llvm.func @similarity_gate(
// CHECK:         gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@similarity_inform_topk_0
// CHECK-NOT:     gpu.launch_func
// CHECK:         llvm.call @mgpuStreamSynchronize(
func.func @similarity_gate(%u: tensor<?x?x64xf32>, %e: tensor<?x?x16xf32>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>) {
  %p = moe.similarity_inform %u, %e : tensor<?x?x64xf32>, tensor<?x?x16xf32> -> tensor<?x?x16xf32>
  %w, %i = moe.topk_renorm %p k(2) mode(probs) : tensor<?x?x16xf32> -> tensor<?x?x2xf32>, tensor<?x?x2xi32>
  return %w, %i : tensor<?x?x2xf32>, tensor<?x?x2xi32>
}
