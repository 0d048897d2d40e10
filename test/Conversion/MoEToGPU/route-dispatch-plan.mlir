// RUN: moe-opt %s --convert-moe-to-gpu="route-map=warp" -split-input-file | FileCheck %s --check-prefixes=CHECK,WARP
// RUN: moe-opt %s --convert-moe-to-gpu="route-map=lanes" -split-input-file | FileCheck %s --check-prefixes=CHECK,LANES
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa" -split-input-file | FileCheck %s --check-prefix=NVVM

// moe.route followed by a moe.dispatch_plan of its indices (DeepSeek-V3's
// router, then the plan the grouped GEMM reads) is lowered as one host code
// (Route.cpp): every result and the plan's one scratch buffer are allocated
// first, then the route kernel and the plan's three kernels are launched back
// to back on the stream, with nothing on the host between them; the error
// word is checked once, at the end.

// CHECK-LABEL: func.func @deepseek_v3_plan(
// CHECK-COUNT-9: bufferization.alloc_tensor
// CHECK: moe.kernel
// CHECK: gpu.wait async
// CHECK-NOT: gpu.memset
// CHECK: gpu.alloc async
// CHECK: llvm.call @moeGpuErrorWord()
// WARP: gpu.launch_func async [%{{.*}}] @moe_kernels::@route_warp_0
// LANES: gpu.launch_func async [%{{.*}}] @moe_kernels::@route_lanes_0
// CHECK-NOT: {{gpu\.(alloc|memset|wait|dealloc)|llvm\.call}}
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@dispatch_counts_0
// CHECK-NOT: {{gpu\.(alloc|memset|wait|dealloc)|llvm\.call}}
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@dispatch_scan_0
// CHECK-NOT: {{gpu\.(alloc|memset|wait|dealloc)|llvm\.call}}
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@dispatch_scatter_0
// CHECK-NEXT: gpu.dealloc async
// CHECK-NEXT: gpu.wait [%{{.*}}]
// CHECK-NEXT: llvm.call @moeGpuCheckErrors()
// CHECK-NOT: moe.dispatch_plan
// CHECK-NOT: moe.kernel
// CHECK: return

// In the host LLVM code: the allocations, then the four launches one after
// the other, then the scratch freed and the stream synchronized.
// NVVM-LABEL: llvm.func @deepseek_v3_plan(
// NVVM-COUNT-10: llvm.call @mgpuMemAlloc(
// NVVM-NEXT: llvm.call @moeGpuErrorWord()
// NVVM-NOT: llvm.call
// NVVM: gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@route_lanes_0
// NVVM-NEXT: gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@dispatch_counts_0
// NVVM-NEXT: gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@dispatch_scan_0
// NVVM-NEXT: gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@dispatch_scatter_0
// NVVM-NEXT: llvm.call @mgpuMemFree(
// NVVM-NEXT: llvm.call @mgpuStreamSynchronize(
func.func @deepseek_v3_plan(%x: tensor<?x256xf32>, %bias: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>, tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>) {
  %w, %i = moe.route %x bias(%bias : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %i num_experts(256) block_size(64) : tensor<?x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  return %w, %i, %c, %o, %ord, %inv, %p, %b, %n : tensor<?x8xf32>, tensor<?x8xi32>, tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}

// -----

// Two plans of the same indices: the first is lowered with the route, the
// second on its own (its own host code after the route's).
// CHECK-LABEL: func.func @two_plans(
// CHECK: moe.kernel
// CHECK: @moe_kernels::@dispatch_counts_0
// CHECK: moe.kernel
// CHECK: @moe_kernels::@dispatch_counts_1
// CHECK-NOT: moe.dispatch_plan
// NVVM-LABEL: llvm.func @two_plans(
func.func @two_plans(%x: tensor<?x64xf32>) -> (tensor<?xi32>, tensor<?xi32>) {
  %w, %i = moe.route %x k(4) : tensor<?x64xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %i num_experts(64) : tensor<?x4xi32> -> tensor<64xi32>, tensor<65xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  %c2, %o2, %ord2, %inv2, %p2, %b2, %n2 = moe.dispatch_plan %i num_experts(64) block_size(16) : tensor<?x4xi32> -> tensor<64xi32>, tensor<65xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  return %ord, %p2 : tensor<?xi32>, tensor<?xi32>
}
