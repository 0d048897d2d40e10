// RUN: moe-opt %s --moe-legalize-shapes --convert-moe-to-gpu --canonicalize --moe-gpu-bufferize | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa" | FileCheck %s --check-prefix=LLVM

// A moe op with a zero-sized result folds to tensor.empty (moe-legalize-shapes).
// Returned from a GPU function it must still be a device allocation: the
// caller frees every result with moeGpuFree, and a host malloc there was
// cuMemFree's CUDA_ERROR_INVALID_VALUE on the H200. moe-gpu-bufferize makes
// every allocation of one-shot bufferization a gpu.alloc.

// CHECK-LABEL: func.func @no_tokens(
// CHECK-NOT: tensor.empty
// CHECK: gpu.alloc async {{.*}} : memref<0x2xf32>
// CHECK: gpu.alloc async {{.*}} : memref<0x2xi32>
// CHECK-NOT: tensor.empty
// CHECK: return

// LLVM-LABEL: llvm.func @no_tokens(
// LLVM-NOT: llvm.call @malloc
// LLVM: llvm.call @mgpuMemAlloc
// LLVM-NOT: llvm.call @malloc
// LLVM: llvm.return
func.func @no_tokens(%s: tensor<0x16xf32>) -> (tensor<0x2xf32>, tensor<0x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<0x16xf32> -> tensor<0x2xf32>, tensor<0x2xi32>
  return %w, %i : tensor<0x2xf32>, tensor<0x2xi32>
}

// A tensor.empty that is not returned and folds away allocates nothing.
// CHECK-LABEL: func.func @local_empty(
// CHECK-NOT: gpu.alloc
// CHECK: return
func.func @local_empty() -> index {
  %e = tensor.empty() : tensor<4xf32>
  %c0 = arith.constant 0 : index
  %d = tensor.dim %e, %c0 : tensor<4xf32>
  return %d : index
}
