// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64" | FileCheck %s

// The 16-byte and cp.async staging with a key mask and K a multiple of 8 (issue 47): the
// keys are double-buffered by cp.async, and the values, which a masked key
// must zero (cp.async cannot), by the synchronous 16-byte path, into the same
// double buffer. Each iteration stages the next tile (rows 64 - bufRow of the
// buffers) while the warps read their own tile (rows bufRow): the values'
// 16-byte store must land at row 64 - bufRow + jj, like the keys' copies. It
// once stored at row jj, into the buffer being read (a shared-memory race,
// and the next tile's values never written), from the second key tile on:
// N = 150 is three tiles of 64.

// CHECK-LABEL: gpu.func @similarity_inform_mma
// CHECK-SAME: %[[E:[a-z0-9]+]]: memref<2x150x16xbf16>, %[[MASK:[a-z0-9]+]]: memref<2x150xi1>
// CHECK-SAME: workgroup(%[[KS:.+]] : memref<128x72xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[VS:.+]] : memref<128x24xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// Tile 0, before the key loop, at rows 0 + jj of the buffers.
// CHECK: scf.for %[[FLAT0:.+]] = %thread_id_x to %c128{{.*}} step %c128
// CHECK: %[[JJ0:.+]] = arith.divui %[[FLAT0]], %c2
// CHECK: vector.load %[[E]]
// CHECK: memref.load %[[MASK]]
// CHECK: vector.store %{{.+}}, %[[VS]][%[[JJ0]], %{{.+}}] {alignment = 16 : i64}
// CHECK: nvvm.cp.async.commit.group
// The key loop: this tile's rows start at bufRow = (tile % 2) * 64; the next
// tile goes to rows 64 - bufRow.
// CHECK: scf.for %[[J0:.+]] = %c0
// CHECK: nvvm.cp.async.wait.group 0
// CHECK-NEXT: gpu.barrier
// CHECK: %[[BUF:.+]] = arith.muli %{{.+}}, %c64
// CHECK: %[[NEXT:.+]] = arith.addi %[[J0]], %c64
// CHECK: %[[OFF:.+]] = arith.subi %c64{{.*}}, %[[BUF]] : index
// CHECK: scf.if
// The next tile's rows of each buffer: views at row OFF, row jj of the tile
// its row jj.
// CHECK: %[[KN:.+]] = memref.subview %[[KS]][%[[OFF]], 0] [64, 72] [1, 1]
// CHECK: nvgpu.device_async_copy %{{.+}}, %[[KN]][%{{.+}}, %{{.+}}]
// CHECK: %[[VN:.+]] = memref.subview %[[VS]][%[[OFF]], 0] [64, 24] [1, 1]
// CHECK: scf.for %[[FLAT:.+]] = %thread_id_x to %c128{{.*}} step %c128
// CHECK: %[[JJ:.+]] = arith.divui %[[FLAT]], %c2
// CHECK: vector.load %[[E]]
// CHECK: memref.load %[[MASK]]
// CHECK: vector.store %{{.+}}, %[[VN]][%[[JJ]], %{{.+}}] {alignment = 16 : i64}
// CHECK: } else {
// CHECK: nvvm.cp.async.commit.group
// CHECK: %[[KT:.+]] = memref.subview %[[KS]][%[[BUF]], 0] [64, 72] [1, 1]
// CHECK: nvgpu.ldmatrix %[[KT]]
// CHECK: %[[VT:.+]] = memref.subview %[[VS]][%[[BUF]], 0] [64, 24] [1, 1]
// CHECK: nvgpu.ldmatrix %[[VT]]
func.func @sim_masked_k16(%u: tensor<2x150x64xbf16>, %e: tensor<2x150x16xbf16>, %m: tensor<2x150xi1>) -> tensor<2x150x16xf32> {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<2x150xi1>) : tensor<2x150x64xbf16>, tensor<2x150x16xbf16> -> tensor<2x150x16xf32>
  return %p : tensor<2x150x16xf32>
}
