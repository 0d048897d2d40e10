// REQUIRES: ptxas
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=fatbin" | FileCheck %s --check-prefix=FATBIN
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_80 format=bin" | FileCheck %s --check-prefix=CUBIN
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=fatbin" | mlir-translate --mlir-to-llvmir | FileCheck %s --check-prefix=LLVMIR

// bin and fatbin go through the toolkit's ptxas (and fatbinary): the object
// is a binary, loaded with mgpuModuleLoad.

// FATBIN: gpu.binary @moe_kernels  [#gpu.object<#nvvm.target<O = 3, chip = "sm_90", features = "+ptx80">, properties = {ISAToBinaryTimeInMs
// FATBIN-NOT: assembly =
// CUBIN: gpu.binary @moe_kernels  [#gpu.object<#nvvm.target<O = 3, chip = "sm_80", features = "+ptx80">, properties = {ISAToBinaryTimeInMs
// CUBIN-SAME: bin = "\7FELF
// LLVMIR: declare ptr @mgpuModuleLoad(ptr, i64)

func.func @gate(%logits: tensor<?x64xf32>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.topk_renorm %logits k(4) : tensor<?x64xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}
