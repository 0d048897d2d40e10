// The CUDA kernels of torch.ops.moe.* (python/moe_mlir/runtime/cache.py): moe-lower-to-nvvm with
// results-to-out-params and wait-at-return=false. The outputs come from the caller (no device allocation for them),
// the launch goes to the stream gpu-to-llvm gets from mgpuStreamCreate (the runtime's ambient stream, PyTorch's
// current one) and the function returns without synchronizing or destroying it.
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa results-to-out-params=true wait-at-return=false" \
// RUN:   | FileCheck %s
// The default: results returned, one host wait per function (not per op).
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa" | FileCheck %s --check-prefix=DEFAULT

// CHECK-LABEL: llvm.func @kernel(
// CHECK-NOT:     llvm.call @mgpuMemAlloc(
// CHECK:         llvm.call @mgpuStreamCreate()
// CHECK-NOT:     llvm.call @mgpuMemAlloc(
// CHECK:         gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@topk_renorm_warp_0
// CHECK-NOT:     llvm.call @mgpuStreamSynchronize(
// CHECK-NOT:     llvm.call @mgpuStreamDestroy(
// CHECK:         llvm.return
// CHECK:       llvm.func @_mlir_ciface_kernel(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) attributes

// CHECK-LABEL: llvm.func @two_ops(
// CHECK-COUNT-1: llvm.call @mgpuStreamCreate()
// CHECK-NOT:     llvm.call @mgpuStreamCreate()
// CHECK-NOT:     llvm.call @mgpuStreamSynchronize(
// CHECK:         llvm.return

// DEFAULT-LABEL: llvm.func @kernel(
// DEFAULT:         llvm.call @mgpuStreamCreate()
// DEFAULT:         llvm.call @mgpuMemAlloc(
// DEFAULT:         llvm.call @mgpuStreamSynchronize(
// DEFAULT:         llvm.call @mgpuStreamDestroy(
// DEFAULT-LABEL: llvm.func @two_ops(
// DEFAULT:         llvm.call @mgpuStreamCreate()
// DEFAULT-NOT:     llvm.call @mgpuStreamCreate()
// DEFAULT-NOT:     llvm.call @mgpuStreamSynchronize(
// DEFAULT:         gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@topk_renorm_warp_{{[0-9]+}}
// DEFAULT-NOT:     llvm.call @mgpuStreamCreate()
// DEFAULT-NOT:     llvm.call @mgpuStreamSynchronize(
// DEFAULT:         gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@topk_renorm_warp_{{[0-9]+}}
// DEFAULT:         llvm.call @mgpuStreamSynchronize(
// DEFAULT-NOT:     llvm.call @mgpuStreamSynchronize(
// DEFAULT:         llvm.return

func.func @kernel(%scores: tensor<?x64xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.topk_renorm %scores k(2) mode(logits) renormalize(true)
      : tensor<?x64xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

// Two ops of one function: one stream, no wait between them.
func.func @two_ops(%a: tensor<?x64xf32>, %b: tensor<?x32xf32>) -> (tensor<?x2xf32>, tensor<?x4xf32>) {
  %w, %i = moe.topk_renorm %a k(2) : tensor<?x64xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  %w2, %i2 = moe.topk_renorm %b k(4) : tensor<?x32xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %w2 : tensor<?x2xf32>, tensor<?x4xf32>
}
