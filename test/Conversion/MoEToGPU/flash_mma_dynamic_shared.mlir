// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-dynamic-shared=true dynamic-shared-memory-bytes=232448" | FileCheck %s --check-prefix=DYN
// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-dynamic-shared=true dynamic-shared-memory-bytes=166912" | FileCheck %s --check-prefix=STATIC
// RUN: moe-opt %s --convert-moe-to-gpu="dynamic-shared-memory-bytes=232448" | FileCheck %s --check-prefix=STATIC
// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-dynamic-shared=true" | FileCheck %s --check-prefix=STATIC
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa flash-mma-dynamic-shared=true" | FileCheck %s --check-prefix=SM90
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_80 format=isa flash-mma-dynamic-shared=true" | FileCheck %s --check-prefix=SM80
// RUN: not moe-opt %s --convert-moe-to-gpu="dynamic-shared-memory-bytes=-1" 2>&1 | FileCheck %s --check-prefix=OPTION

// flash-mma-dynamic-shared: the tensor-core kernel of one row tile (D = 256)
// takes 64-key tiles in dynamic shared memory where two cp.async buffers of
// them (2 x 64 x (264 + 72) bf16 = 86,016 bytes) pass the 48 KiB of static
// shared memory, up to the chip's opt-in maximum a block, and where the two
// blocks a multiprocessor is meant to hold fit it (the maximum plus 1 KiB,
// each block reserving 1 KiB): sm_90's 227 KiB, not sm_80's 163 KiB. Off, or
// without a limit (the pass alone: 0), or on sm_80: 32-key tiles in static
// shared memory, as before.

// DYN-LABEL: gpu.func @similarity_inform_mma_0(
// DYN-NOT: workgroup(
// DYN: %[[SMEM:.*]] = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
// DYN: memref.view %[[SMEM]][%{{.*}}][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<128x264xbf16, #gpu.address_space<workgroup>>
// DYN: memref.view %[[SMEM]][%{{.*}}][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<128x72xbf16, #gpu.address_space<workgroup>>
// DYN: gpu.launch_func {{.*}}@similarity_inform_mma_0 {{.*}} dynamic_shared_memory_size %c86016_i32

// STATIC-LABEL: gpu.func @similarity_inform_mma_0(
// STATIC-SAME: workgroup(%{{.*}} : memref<64x264xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<64x72xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// STATIC-NOT: gpu.dynamic_shared_memory
// STATIC-NOT: dynamic_shared_memory_size

// The pipeline sets dynamic-shared-memory-bytes from its chip: the launch's
// 86,016 bytes on sm_90 (the runtime opts the kernel in past 48 KiB), none on
// sm_80.
// SM90: llvm.mlir.constant(86016 : i32)
// SM80-NOT: 86016

// OPTION: convert-moe-to-gpu: dynamic-shared-memory-bytes must be 0 or positive, got -1

func.func @causal_d256(%u: tensor<4x4096x256xbf16>, %e: tensor<4x4096x64xbf16>) -> tensor<4x4096x64xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) causal(true) : tensor<4x4096x256xbf16>, tensor<4x4096x64xbf16> -> tensor<4x4096x64xf32>
  return %p : tensor<4x4096x64xf32>
}
