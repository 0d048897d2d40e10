// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64 flash-mma-wide-staging=true" -split-input-file | FileCheck %s
// RUN: moe-opt %s --convert-moe-to-gpu="%flash_base64" -split-input-file | FileCheck %s --check-prefix=OFF

// flash-mma-wide-staging: the tensor-core kernel stages keys (D = 64) and
// values (K = 16) with 16-byte vectors of 8 elements where the operand's base
// is 16-byte aligned (checked in the kernel), else with the element loop.

// CHECK-LABEL: gpu.func @similarity_inform_mma
// CHECK-SAME: (%{{.+}}: memref<2x128x64xbf16>, %[[KEYS:.+]]: memref<2x128x64xbf16>, %[[E:.+]]: memref<2x128x16xbf16>,
// CHECK: %[[KP:.+]] = memref.extract_aligned_pointer_as_index %[[KEYS]]
// CHECK: arith.remui %[[KP]], %c16
// CHECK: %[[VP:.+]] = memref.extract_aligned_pointer_as_index %[[E]]
// CHECK: arith.remui %[[VP]], %c16
// CHECK: scf.if
// CHECK: vector.load %[[KEYS]][{{.+}}] {alignment = 16 : i64} : memref<2x128x64xbf16>, vector<8xbf16>
// CHECK: vector.store {{.+}} {alignment = 16 : i64} : memref<64x72xbf16, #gpu.address_space<workgroup>>, vector<8xbf16>
// CHECK: } else {
// CHECK: memref.load %[[KEYS]]
// CHECK: scf.if
// CHECK: vector.load %[[E]][{{.+}}] {alignment = 16 : i64} : memref<2x128x16xbf16>, vector<8xbf16>
// CHECK: vector.store {{.+}} {alignment = 16 : i64} : memref<64x24xbf16, #gpu.address_space<workgroup>>, vector<8xbf16>
// CHECK: } else {
// CHECK: memref.load %[[E]]
// CHECK: nvgpu.ldmatrix
// OFF-LABEL: gpu.func @similarity_inform_mma
// OFF-NOT: vector.load
// OFF-NOT: extract_aligned_pointer
// OFF: nvgpu.ldmatrix
func.func @sim_bf16(%u: tensor<2x128x64xbf16>, %e: tensor<2x128x16xbf16>) -> tensor<2x128x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x128x64xbf16>, tensor<2x128x16xbf16> -> tensor<2x128x16xf32>
  return %p : tensor<2x128x16xf32>
}

// -----

// D = 40 and K = 12: the keys in vectors (40 = 5 x 8), the values element by
// element (12 is not a multiple of 8).

// CHECK-LABEL: gpu.func @similarity_inform_mma
// CHECK-SAME: (%{{.+}}: memref<2x70x40xf16>, %[[KEYS:.+]]: memref<2x70x40xf16>, %[[E:.+]]: memref<2x70x12xf16>,
// CHECK: memref.extract_aligned_pointer_as_index %[[KEYS]]
// CHECK-NOT: memref.extract_aligned_pointer_as_index
// CHECK: vector.load %[[KEYS]][{{.+}}] {alignment = 16 : i64} : memref<2x70x40xf16>, vector<8xf16>
// CHECK: vector.store {{.+}} : memref<64x56xf16, #gpu.address_space<workgroup>>, vector<8xf16>
// CHECK-NOT: vector.load
// CHECK: nvgpu.ldmatrix
func.func @sim_f16(%u: tensor<2x70x40xf16>, %e: tensor<2x70x12xf16>) -> tensor<2x70x12xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x70x40xf16>, tensor<2x70x12xf16> -> tensor<2x70x12xf32>
  return %p : tensor<2x70x12xf32>
}
