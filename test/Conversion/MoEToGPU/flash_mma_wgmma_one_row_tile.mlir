// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-wgmma=true dynamic-shared-memory-bytes=232448" | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-wgmma=true dynamic-shared-memory-bytes=166912" | FileCheck %s --check-prefix=SM80LIMIT

// flash-mma-wgmma on the kernel of one row tile a warp (D = 256: the 128-row
// form does not fit): the block's 64 rows are one m64 tile, the query's
// fragments (64 registers a thread at D = 256) a shared buffer instead, so
// with 32-key tiles (75,776 bytes of dynamic shared memory: two key buffers
// of 4 swizzled 64-feature panels, the query's 4 panels, two value buffers,
// 1 KiB to align) the kernel asks for 3 blocks a multiprocessor (ptxas: 126
// registers, no spill, against 254 for the mma.sync kernel's 2).

// CHECK-LABEL: gpu.func @similarity_inform_mma_0(
// CHECK-SAME: nvvm.minctasm = 3
// CHECK: gpu.dynamic_shared_memory
// CHECK: memref.view {{.*}} to memref<256x64xbf16, #gpu.address_space<workgroup>>
// CHECK: memref.view {{.*}} to memref<256x64xbf16, #gpu.address_space<workgroup>>
// CHECK: memref.view {{.*}} to memref<64x72xbf16, #gpu.address_space<workgroup>>
// Sixteen k-steps of m64 n32 a tile (the query's panel p past the key
// buffers' 32,768 bytes at 8192 p: 2048 + 512 p in 16-byte units; a k-step
// 32 bytes further).
// CHECK: nvvm.wgmma.fence.aligned
// CHECK: arith.addi %{{.*}}, %c2048_i64 : i64
// CHECK: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 32, k = 16>, D[<f32>, <zero>]
// CHECK-COUNT-3: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK: arith.addi %{{.*}}, %c2560_i64 : i64
// CHECK-COUNT-12: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: gpu.launch_func {{.*}}@similarity_inform_mma_0 {{.*}} dynamic_shared_memory_size %c75776_i32

// With sm_80's limit (163 KiB) two blocks fit.
// SM80LIMIT: nvvm.minctasm = 2
// SM80LIMIT: nvvm.wgmma.mma_async

func.func @causal_d256(%u: tensor<4x4096x256xbf16>, %e: tensor<4x4096x64xbf16>) -> tensor<4x4096x64xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) causal(true) : tensor<4x4096x256xbf16>, tensor<4x4096x64xbf16> -> tensor<4x4096x64xf32>
  return %p : tensor<4x4096x64xf32>
}
