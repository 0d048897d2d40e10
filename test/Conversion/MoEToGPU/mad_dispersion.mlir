// RUN: moe-opt %s --convert-moe-to-gpu | FileCheck %s

// Deterministic segmented reduction: the only atomics are i32 counts; float
// sums go through per-chunk partials with one writer each, summed in chunk
// order; out-of-range assign values are skipped and recorded in the device
// error word, which the host checks after the op.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @mad_count_0(%{{.*}}: memref<?xi32>, %{{.*}}: memref<16xi32>, %[[WORD:.*]]: i64)
// CHECK: memref.atomic_rmw addi %{{.*}} : (i32, memref<16xi32>) -> i32
// CHECK: llvm.inttoptr %[[WORD]] : i64 to !llvm.ptr<1>
// CHECK: llvm.cmpxchg
// CHECK: gpu.func @mad_chunk_sums_0(
// CHECK-NOT: atomic_rmw
// CHECK: gpu.func @mad_finish_mean_0(
// CHECK: gpu.func @mad_chunk_deviations_0(
// CHECK-NOT: atomic_rmw
// CHECK: math.absf
// CHECK: gpu.func @mad_finish_dispersion_0(
// CHECK: gpu.func @mad_epilogue_0(%{{.*}}: memref<16x352xf32>, %{{.*}}: memref<16xi32>) workgroup(
// CHECK-NOT: atomic_rmw
// CHECK: arith.minimumf
// CHECK: gpu.return
// CHECK-LABEL: func.func @mad(
// CHECK: gpu.memset async
// CHECK: llvm.call @moeGpuErrorWord() : () -> i64
// CHECK-COUNT-6: gpu.launch_func async
// CHECK: gpu.wait [
// CHECK: llvm.call @moeGpuCheckErrors() : () -> i32
func.func @mad(%x: tensor<?x352xf32>, %a: tensor<?xi32>) -> (tensor<16x352xf32>, tensor<16xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(16) : tensor<?x352xf32>, tensor<?xi32> -> tensor<16x352xf32>, tensor<16xi32>
  return %w, %c : tensor<16x352xf32>, tensor<16xi32>
}
