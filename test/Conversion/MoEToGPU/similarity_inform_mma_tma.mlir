// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-wgmma=true flash-mma-tma=true flash-mma-key-splits=1 dynamic-shared-memory-bytes=232448" | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-tma=true flash-mma-key-splits=1 dynamic-shared-memory-bytes=232448" | FileCheck %s --check-prefix=NOWGMMA
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90a format=isa flash-mma-wgmma=true flash-mma-tma=true" | FileCheck %s --check-prefix=SM90A
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa flash-mma-wgmma=true flash-mma-tma=true" | FileCheck %s --check-prefix=SM90

// flash-mma-tma: the wgmma kernel's key tiles (D = 64: one 64-feature panel, 64 keys a tile, three stages) copied
// by the Tensor Memory Accelerator. The host asks the runtime for the keys' tensor map and launches the TMA
// kernel where it made one, the wgmma kernel without TMA (its cp.async copies) where it did not (a base not
// 16-byte aligned, a chip before sm_90, a miss during a stream capture), each over an empty grid where the other
// runs.

// The TMA kernel takes the map as its last argument; its dynamic shared memory is the wgmma kernel's plus the
// three stages' mbarriers (8 bytes each). Thread 0 initializes them, one arrival each (its own, with the bytes),
// and orders the host's write of the map (generic proxy) before the copies' reads of it (tensormap proxy).
// CHECK-LABEL: gpu.func @similarity_inform_mma_0(
// CHECK-SAME: %[[MAP:[^:]*]]: i64) kernel
// CHECK-SAME: nvvm.minctasm = 3
// CHECK: %[[T0:.*]] = arith.cmpi eq, %thread_id_x, %{{.*}} : index
// CHECK-NEXT: scf.if %[[T0]] {
// CHECK: nvvm.mbarrier.init %{{.*}}, %c1_i32 : !llvm.ptr<3>, i32
// CHECK: nvvm.mbarrier.init
// CHECK: nvvm.mbarrier.init
// CHECK-NEXT: nvvm.fence.mbarrier.init
// CHECK-NEXT: %[[M0:.*]] = llvm.inttoptr %[[MAP]] : i64 to !llvm.ptr
// CHECK-NEXT: %[[MB:.*]] = arith.constant 128 : i32
// CHECK-NEXT: nvvm.fence.proxy.acquire <sys> %[[M0]], %[[MB]]
// CHECK-NEXT: }

// The query is still copied once by cp.async; a key tile by thread 0: the stage's mbarrier armed with the tile's
// 8,192 bytes (64 keys x 64 features x 2 bytes, the whole box: keys past N arrive as zeros), then one copy of the
// panel at (feature 0, key j0, batch element) into its shared::cluster address.
// CHECK: nvgpu.device_async_copy %arg0
// CHECK: scf.if
// CHECK: nvvm.mbarrier.arrive.expect_tx %[[BAR:.*]], %c8192_i32 : !llvm.ptr<3>, i32
// CHECK-NEXT: %[[MAPPTR:.*]] = llvm.inttoptr %[[MAP]] : i64 to !llvm.ptr
// CHECK: %[[DST:.*]] = llvm.inttoptr %{{.*}} : i64 to !llvm.ptr<7>
// CHECK: nvvm.cp.async.bulk.tensor.shared.cluster.global %[[DST]], %[[MAPPTR]], %[[BAR]], box[%c0_i32, %{{.*}}, %{{.*}}] : !llvm.ptr<7>, !llvm.ptr
// No cp.async copy of the keys (%arg1) in the TMA kernel.
// CHECK-NOT: nvgpu.device_async_copy %arg1

// A tile's step waits, after the pipeline's barrier, on its stage's mbarrier for the phase of the stage's fills so
// far ((tile - first tile) / 3 mod 2, in 32 bits).
// CHECK: gpu.barrier
// CHECK: %[[FILLS:.*]] = arith.divui %{{.*}}, %c3_i32 : i32
// CHECK: %[[PARITY:.*]] = arith.andi %[[FILLS]], %c1_i32{{.*}} : i32
// CHECK: nvvm.mbarrier.try_wait.parity %{{.*}}, %[[PARITY]], %c10000000_i32 : !llvm.ptr<3>, i32, i32
// CHECK: nvvm.wgmma.mma_async

// The twin without TMA: no map, the keys by cp.async.
// CHECK-LABEL: gpu.func @similarity_inform_mma_1(
// CHECK-SAME: memref<2x?x16xf32>) kernel
// CHECK-NOT: nvvm.mbarrier
// CHECK: nvgpu.device_async_copy %arg1

// The host: the map of the keys [2, N, 64] (bf16: 1) with boxes of 64 features x 64 keys, then both launches.
// CHECK-LABEL: func.func @similarity_inform(
// CHECK: %[[ADDR:.*]] = memref.extract_aligned_pointer_as_index %[[KEYS:[^ ]*]] : memref<2x?x64xbf16> -> index
// CHECK: %[[A64:.*]] = arith.index_cast %[[ADDR]] : index to i64
// CHECK: %[[M:.*]] = llvm.call @moeGpuTensorMap3d(%[[A64]], %c1_i32, %{{.*}}, %{{.*}}, %{{.*}}, %c64_i32, %c64_i32{{.*}}) : (i64, i32, i64, i64, i64, i32, i32) -> i64
// CHECK: %[[MADE:.*]] = arith.cmpi ne, %[[M]], %c0_i64 : i64
// CHECK: %[[G0:.*]] = arith.select %[[MADE]], %{{.*}}, %{{.*}} : index
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@similarity_inform_mma_0 blocks in (%[[G0]], {{.*}} dynamic_shared_memory_size %c51224_i32 args({{.*}}, %[[M]] : i64)
// CHECK: %[[NOTMADE:.*]] = arith.xori %[[MADE]], %true : i1
// CHECK: %[[G1:.*]] = arith.select %[[NOTMADE]], %{{.*}}, %{{.*}} : index
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@similarity_inform_mma_1 blocks in (%[[G1]], {{.*}} dynamic_shared_memory_size %c51200_i32 args(
// CHECK: llvm.func @moeGpuTensorMap3d(i64, i32, i64, i64, i64, i32, i32) -> i64

// Without flash-mma-wgmma the option does nothing: the mma.sync kernel, no map.
// NOWGMMA-NOT: moeGpuTensorMap3d
// NOWGMMA-NOT: nvvm.mbarrier

// The PTX (sm_90a, ISA 8.3 for the tensormap fence): mbarriers in shared memory, the tensor copy counted on one,
// the waits' try_wait loop.
// SM90A: .version 8.3
// SM90A-DAG: mbarrier.init.shared.b64
// SM90A-DAG: fence.mbarrier_init.release.cluster
// SM90A-DAG: fence.proxy.tensormap::generic.acquire.sys
// SM90A-DAG: mbarrier.arrive.expect_tx.shared.b64
// SM90A-DAG: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// SM90A-DAG: mbarrier.try_wait.parity.shared.b64
// SM90A-DAG: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16
// On sm_90 (no wgmma) the option goes with flash-mma-wgmma.
// SM90-NOT: cp.async.bulk.tensor
// SM90-NOT: moeGpuTensorMap3d

func.func @similarity_inform(%u: tensor<2x?x64xbf16>, %e: tensor<2x?x16xbf16>) -> tensor<2x?x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) : tensor<2x?x64xbf16>, tensor<2x?x16xbf16> -> tensor<2x?x16xf32>
  return %p : tensor<2x?x16xf32>
}
