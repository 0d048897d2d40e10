// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64" -split-input-file | FileCheck %s

// The cp.async staging (the default since the H200 run of 2026-11-26, which
// deleted the synchronous element staging as an option; it stays the
// fallback of a misaligned base): the tensor-core kernel of one row tile a
// warp double-buffers its key and value tiles (two tiles of 64 keys in each workgroup buffer). Tile 0 is
// copied with cp.async before the key loop; each iteration waits for its
// tile's copies, passes one barrier, starts the next tile's copies into the
// other buffer (rows 64 - its own offset) when there is a next tile, commits
// them, and reads its own buffer through ldmatrix at its row offset. An
// operand whose base is not 16-byte aligned is staged element by element into
// the same buffers.

// CHECK-LABEL: gpu.func @similarity_inform_mma
// CHECK-SAME: (%{{.+}}: memref<2x128x64xbf16>, %[[KEYS:.+]]: memref<2x128x64xbf16>, %[[E:.+]]: memref<2x128x16xbf16>,
// CHECK-SAME: workgroup(%[[KS:.+]] : memref<128x72xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[VS:.+]] : memref<128x24xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: %[[KP:.+]] = memref.extract_aligned_pointer_as_index %[[KEYS]]
// CHECK: %[[VP:.+]] = memref.extract_aligned_pointer_as_index %[[E]]
// CHECK: scf.if
// CHECK: nvgpu.device_async_copy %[[KEYS]][{{.+}}], %[[KS]][{{.+}}], 8, %{{.+}} {bypassL1}
// CHECK: } else {
// CHECK: memref.load %[[KEYS]]
// CHECK: nvgpu.device_async_copy %[[E]][{{.+}}], %[[VS]][{{.+}}], 8, %{{.+}} {bypassL1}
// CHECK: nvvm.cp.async.commit.group
// CHECK: scf.for
// CHECK-NEXT: nvvm.cp.async.wait.group 0
// CHECK-NEXT: gpu.barrier
// CHECK: %[[NEXT:.+]] = arith.addi %{{.+}}, %c64
// CHECK: %[[MORE:.+]] = arith.cmpi slt, %[[NEXT]]
// CHECK: scf.if %[[MORE]] {
// The other buffer's rows, a view at a dynamic row: the copies' addresses are
// its base plus ones that do not change in the loop.
// CHECK: %[[KN:.+]] = memref.subview %[[KS]][%{{.+}}, 0] [64, 72] [1, 1]
// CHECK: nvgpu.device_async_copy %[[KEYS]][{{.+}}], %[[KN]][
// CHECK: %[[VN:.+]] = memref.subview %[[VS]][%{{.+}}, 0] [64, 24] [1, 1]
// CHECK: nvgpu.device_async_copy %[[E]][{{.+}}], %[[VN]][
// CHECK: nvvm.cp.async.commit.group
// CHECK-NOT: gpu.barrier
// CHECK: %[[KT:.+]] = memref.subview %[[KS]][%{{.+}}, 0] [64, 72] [1, 1]
// CHECK: nvgpu.ldmatrix %[[KT]]
// CHECK-NOT: gpu.barrier
// CHECK: %[[VT:.+]] = memref.subview %[[VS]][%{{.+}}, 0] [64, 24] [1, 1]
// CHECK: nvgpu.ldmatrix %[[VT]]{{.+}}transpose = true
// CHECK-NOT: gpu.barrier
// CHECK: scf.yield
func.func @sim_bf16(%u: tensor<2x128x64xbf16>, %e: tensor<2x128x16xbf16>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x128x64xbf16>, tensor<2x128x16xbf16> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// -----

// D = 40 and K = 12: the keys by cp.async (40 = 5 x 8), the values element by
// element (12 is not a multiple of 8), both double-buffered.

// CHECK-LABEL: gpu.func @similarity_inform_mma
// CHECK-SAME: (%{{.+}}: memref<2x70x40xf16>, %[[KEYS:.+]]: memref<2x70x40xf16>, %[[E:.+]]: memref<2x70x12xf16>,
// CHECK-SAME: workgroup(%[[KS:.+]] : memref<128x56xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[VS:.+]] : memref<128x24xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: memref.extract_aligned_pointer_as_index %[[KEYS]]
// CHECK-NOT: memref.extract_aligned_pointer_as_index
// CHECK: nvgpu.device_async_copy %[[KEYS]]
// CHECK-NOT: nvgpu.device_async_copy %[[E]]
// CHECK: memref.store %{{.+}}, %[[VS]]
// CHECK: nvvm.cp.async.commit.group
func.func @sim_f16(%u: tensor<2x70x40xf16>, %e: tensor<2x70x12xf16>) -> tensor<2x70x12xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x70x40xf16>, tensor<2x70x12xf16> -> tensor<2x70x12xf32>
  return %p : tensor<2x70x12xf32>
}

// -----

// A key mask: the keys by cp.async, the values (masked keys' values are zeros
// in the tile, which cp.async cannot do) by their synchronous 16-byte vectors
// (similarity_inform_mma_masked_staging.mlir), element by element from a
// misaligned base.

// CHECK-LABEL: gpu.func @similarity_inform_mma
// CHECK-SAME: (%{{.+}}: memref<?x?x32xbf16>, %[[KEYS:.+]]: memref<?x?x32xbf16>, %[[E:.+]]: memref<?x?x8xbf16>, %[[MASK:.+]]: memref<?x?xi1>,
// CHECK: nvgpu.device_async_copy %[[KEYS]]
// CHECK-NOT: nvgpu.device_async_copy %[[E]]
// CHECK: memref.load %[[MASK]]
// CHECK: nvvm.cp.async.commit.group
func.func @sim_masked(%u: tensor<?x?x32xbf16>, %e: tensor<?x?x8xbf16>, %m: tensor<?x?xi1>) -> tensor<?x?x8xf32> {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<?x?xi1>) : tensor<?x?x32xbf16>, tensor<?x?x8xbf16> -> tensor<?x?x8xf32>
  return %p : tensor<?x?x8xf32>
}
