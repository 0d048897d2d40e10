// RUN: moe-opt %s --convert-moe-to-gpu | FileCheck %s

// Integer co-selection counts (i32 atomics: exact), then a block per column
// (norm = col) with a fixed-order block reduction and the moving average.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @adjacency_counts_0(%{{.*}}: memref<?x2xi32>, %{{.*}}: memref<16x16xi32>, %{{.*}}: i64)
// CHECK: llvm.cmpxchg
// CHECK: memref.atomic_rmw addi %{{.*}} : (i32, memref<16x16xi32>) -> i32
// CHECK: gpu.func @adjacency_update_0(%{{.*}}: memref<16x16xf16>, %{{.*}}: memref<16x16xi32>, %{{.*}}: memref<16x16xf32>) workgroup(
// CHECK: gpu.shuffle  xor
// CHECK: gpu.barrier
// CHECK: arith.extf %{{.*}} : f16 to f32
// CHECK-LABEL: func.func @adj(
// CHECK: gpu.memset async
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@adjacency_counts_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@adjacency_update_0 blocks in (%c16{{.*}}
// CHECK: gpu.dealloc async
// CHECK: llvm.call @moeGpuCheckErrors()
func.func @adj(%a: tensor<16x16xf16>, %idx: tensor<?x2xi32>) -> tensor<16x16xf32> {
  %n = moe.adjacency_update %a, %idx beta(9.900000e-01) norm(col) include_self(false) : tensor<16x16xf16>, tensor<?x2xi32> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}
