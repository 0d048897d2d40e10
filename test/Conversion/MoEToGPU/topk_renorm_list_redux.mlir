// RUN: moe-opt %s --convert-moe-to-gpu="topk-rounds=list-redux" | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa" | FileCheck %s --check-prefix=AUTO

// topk-rounds=list-redux (what moe-lower-to-nvvm's auto picks on sm_80 and later): both register kernels in the
// module, redux's (a warp a token: 4 tokens a 128-thread block) first, then list's (8 lanes a token at K = 256: 16
// tokens a block); the host gives redux the tokens up to 6144 and list the rest, the other launch an
// empty grid that the runtime skips (mgpuLaunchKernel), so that neither waits on a branch.

// CHECK: gpu.func @topk_renorm_warp_0(
// CHECK: nvvm.redux.sync
// CHECK: gpu.func @topk_renorm_warp_1(
// CHECK-LABEL: func.func @topk_dynamic_tokens
// CHECK: %[[FEW:.+]] = arith.cmpi slt, %[[T:.+]], %c6145
// CHECK: %[[RB:.+]] = arith.ceildivui %[[T]], %c4
// CHECK: %[[RG:.+]] = arith.select %[[FEW]], %[[RB]], %{{.+}} : index
// CHECK: %[[R:.+]] = gpu.launch_func async [%{{.+}}] @moe_kernels::@topk_renorm_warp_0 blocks in (%[[RG]],
// CHECK: %[[MANY:.+]] = arith.xori %[[FEW]], %true
// CHECK: %[[LB:.+]] = arith.ceildivui %[[T]], %c16
// CHECK: %[[LG:.+]] = arith.select %[[MANY]], %[[LB]], %{{.+}} : index
// CHECK: gpu.launch_func async [%[[R]]] @moe_kernels::@topk_renorm_warp_1 blocks in (%[[LG]],

// AUTO-LABEL: llvm.func @topk_dynamic_tokens(
// AUTO: gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@topk_renorm_warp_0
// AUTO: gpu.launch_func <%{{.*}} : !llvm.ptr> @moe_kernels::@topk_renorm_warp_1
func.func @topk_dynamic_tokens(%s: tensor<?x256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}
