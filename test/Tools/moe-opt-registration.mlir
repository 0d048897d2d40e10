// moe-opt registers the LLVM IR translations: upstream gpu-module-to-binary translates the gpu.module to LLVM IR
// and on to PTX with them, and fails without them ("missing LLVMTranslationDialectInterface registration").
// RUN: moe-opt %s --nvvm-attach-target="chip=sm_90 features=+ptx80" --gpu-module-to-binary="format=isa" | FileCheck %s
// RUN: moe-opt --help | FileCheck %s --check-prefix=HELP
// RUN: moe-opt --help | FileCheck %s --check-prefix=NVVM

// CHECK-LABEL: gpu.binary @kernels
// CHECK-SAME:    #nvvm.target<chip = "sm_90", features = "+ptx80">
// CHECK-SAME:    .target sm_90
// CHECK-SAME:    .entry scale
gpu.module @kernels {
  llvm.func @scale(%p: !llvm.ptr<1>, %s: f32) attributes {nvvm.kernel} {
    %v = llvm.load %p : !llvm.ptr<1> -> f32
    %r = llvm.fmul %v, %s : f32
    llvm.store %r, %p : f32, !llvm.ptr<1>
    llvm.return
  }
}

// The dialect's passes and pipelines are listed by --help.
// HELP-DAG: --convert-moe-to-linalg
// HELP-DAG: --moe-fuse-routing
// HELP-DAG: --moe-split-fused-routing
// HELP-DAG: --moe-lower-to-llvm

// moe-lower-to-nvvm's options of convert-moe-to-gpu show the pass's help (Passes.td, declared there only); the
// pipeline's topk-rounds also takes `auto`, its default.
// NVVM-LABEL: --moe-lower-to-nvvm
// NVVM: --flash-mma-block-rows=<long> - query rows a block of the tensor-core kernel's 4 warps
// NVVM: --flash-mma-grad - similarity_inform_grad with f16/bf16
// NVVM: --flash-mma-key-splits=<long> - with flash-mma-block-rows=128 (where it applies): at most this many blocks
// NVVM-NOT: --flash-mma-sum-mma
// NVVM: --route-map=<string> - how route's kernel maps a token onto lanes:
// NVVM: --shared-memory-bytes=<long> - shared memory per block the kernels may use (bytes)
// NVVM: --topk-rounds=<string> - rounds of the register top-k of topk_renorm {{.*}}; here also `auto` (the default)
