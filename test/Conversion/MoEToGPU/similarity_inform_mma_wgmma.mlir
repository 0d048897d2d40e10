// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-wgmma=true flash-mma-key-splits=1 dynamic-shared-memory-bytes=232448" | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu="flash-mma-wgmma=true flash-mma-key-splits=1" | FileCheck %s --check-prefix=NOROOM
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90a format=isa flash-mma-wgmma=true" | FileCheck %s --check-prefix=SM90A
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa flash-mma-wgmma=true" | FileCheck %s --check-prefix=SM90

// flash-mma-wgmma: the 128-row tensor-core kernel (D = 64, K = 16) takes Q·Kᵀ
// on Hopper's warpgroup MMA. Its dynamic shared memory starts at the first
// 1024-byte boundary (the 128-byte swizzle repeats every 8 rows of 128 bytes
// and the hardware applies it to the address): three key tiles of 64 x 64
// (24,576 bytes, unpadded), the query's 128 rows (16,384) and the values'
// three padded tiles (9,216), 51,200 bytes with the 1 KiB of slack.

// Three blocks a multiprocessor (no query fragments in the registers).
// CHECK-LABEL: gpu.func @similarity_inform_mma_0(
// CHECK-SAME: nvvm.minctasm = 3
// CHECK: %[[SMEM:.*]] = gpu.dynamic_shared_memory
// CHECK: %[[ADDR:.*]] = memref.extract_aligned_pointer_as_index %[[SMEM]]
// CHECK: %[[MOD:.*]] = arith.remui %[[ADDR]], %{{.*}} : index
// CHECK: %[[GAP:.*]] = arith.subi %{{.*}}, %[[MOD]] : index
// CHECK: %[[START:.*]] = arith.remui %[[GAP]], %{{.*}} : index
// CHECK: %[[ALIGNED:.*]] = arith.addi %[[ADDR]], %[[START]] : index
// CHECK: memref.view %[[SMEM]][%[[START]]][] : {{.*}} to memref<192x64xbf16, #gpu.address_space<workgroup>>
// CHECK: memref.view %[[SMEM]][%{{.*}}][] : {{.*}} to memref<128x64xbf16, #gpu.address_space<workgroup>>
// CHECK: memref.view %[[SMEM]][%{{.*}}][] : {{.*}} to memref<192x24xbf16, #gpu.address_space<workgroup>>

// The descriptor's low word at the aligned start: (address & 0x3FFFF) >> 4,
// the leading offset 1 (bit 16); the constant high word joined to it: the
// 8-row stride of 1024 bytes (64 << 32) and the 128-byte swizzle (1 << 62).
// The query's descriptors add their offsets to that; the keys' (per tile) add
// theirs to the low word in 32 bits and join the high word last.
// CHECK: %[[A32:.*]] = arith.index_cast %[[ALIGNED]] : index to i32
// CHECK: %[[LOW:.*]] = arith.andi %[[A32]], %c262143_i32 : i32
// CHECK: %[[FIELD:.*]] = arith.shrui %[[LOW]], %c4_i32 : i32
// CHECK: %[[DLOW:.*]] = arith.ori %[[FIELD]], %c65536_i32 : i32
// CHECK-NEXT: %[[DWIDE:.*]] = arith.extui %[[DLOW]] : i32 to i64
// CHECK-NEXT: %[[HIGH:.*]] = arith.constant 4611686293305294848 : i64
// CHECK-NEXT: %[[DESC:.*]] = arith.ori %[[DWIDE]], %[[HIGH]] : i64

// The query's rows and the key tiles are copied into the swizzle: the 16-byte
// chunk of a row XOR the row mod 8.
// CHECK: arith.xori
// CHECK: nvgpu.device_async_copy %arg0[{{.*}}], %{{.*}}[{{.*}}], 8, {{.*}} to memref<128x64xbf16, #gpu.address_space<workgroup>>
// CHECK: arith.xori
// CHECK: nvgpu.device_async_copy %arg1[{{.*}}], %{{.*}}[{{.*}}], 8, {{.*}} to memref<192x64xbf16, #gpu.address_space<workgroup>>

// Each tile (first in the lazy rescale's hot loop): the copies made visible
// to the async proxy before the barrier, then per row tile four k-steps, the
// first without the accumulator; the query's descriptor past the keys' 24,576
// bytes (1536 in 16-byte units), 32 bytes (2 units) a k-step; both chains
// waited for at once.
// CHECK: scf.while
// CHECK: scf.while
// CHECK: nvvm.cp.async.wait.group 1
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: gpu.barrier
// CHECK: nvvm.wgmma.fence.aligned
// CHECK: %[[QDESC:.*]] = arith.addi %[[DESC]], %c1536_i64 : i64
// CHECK: %[[KWIDE:.*]] = arith.extui %{{.*}} : i32 to i64
// CHECK-NEXT: %[[KHIGH:.*]] = arith.constant 4611686293305294848 : i64
// CHECK-NEXT: %[[KDESC:.*]] = arith.ori %[[KWIDE]], %[[KHIGH]] : i64
// CHECK-NEXT: nvvm.wgmma.mma_async %[[QDESC]], %[[KDESC]], {{.*}} <m = 64, n = 64, k = 16>, D[<f32>, <zero>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <col>]
// CHECK: arith.addi %[[DESC]], %c1538_i64 : i64
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK: arith.addi %[[DESC]], %c2048_i64 : i64
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <zero>]
// CHECK-COUNT-3: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
// Each row tile's 32 accumulators through an empty asm with side effects
// (ordered after the wait: no use of them is scheduled before it).
// CHECK-COUNT-2: llvm.inline_asm has_side_effects "", "=f,{{(=f,)+}}0,1,2,
// The hot loop leaves on the block's vote, not a warp's: the warpgroup's
// MMA of the next tile stays one loop's for its 4 warps.
// CHECK-NOT: nvvm.vote.sync
// CHECK: nvvm.barrier #nvvm.reduction<or> %{{.*}} -> i32
// The checked tiles after it (their rescale's vote is a warp's, around no
// wgmma).
// CHECK: scf.for
// CHECK: nvvm.wgmma.mma_async
// CHECK: nvvm.vote.sync any
// CHECK: gpu.launch_func {{.*}}@similarity_inform_mma_0 {{.*}} dynamic_shared_memory_size %c51200_i32

// Without the chip's opt-in maximum the buffers do not fit: the mma.sync
// kernel.
// NOROOM-LABEL: gpu.func @similarity_inform_mma_0(
// NOROOM-NOT: wgmma
// NOROOM: nvgpu.ldmatrix
// NOROOM-NOT: wgmma

// The pipeline applies the option on sm_90a only: wgmma PTX there, and
// mma.sync on sm_90 (whose PTX has no wgmma).
// SM90A: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16
// SM90-NOT: wgmma
// SM90: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
// SM90-NOT: wgmma

func.func @similarity_inform(%u: tensor<1x16384x64xbf16>, %e: tensor<1x16384x16xbf16>) -> tensor<1x16384x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) : tensor<1x16384x64xbf16>, tensor<1x16384x16xbf16> -> tensor<1x16384x16xf32>
  return %p : tensor<1x16384x16xf32>
}
