// RUN: moe-opt %s --convert-moe-to-gpu="topk-rounds=redux" -split-input-file | FileCheck %s
// RUN: not moe-opt %s --convert-moe-to-gpu="topk-rounds=bitonic" 2>&1 | FileCheck %s --check-prefix=BAD

// topk-rounds=redux: 32-bit ordered keys carried through the rounds; a round
// is the group's max key (redux.sync max), the lowest index holding it
// (redux.sync min) and a knock-out of that entry with INT32_MIN.

// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK-DAG: %[[GONE:.*]] = arith.constant -2147483648 : i32
// CHECK-DAG: %[[NOIDX:.*]] = arith.constant 2147483647 : i32
// A whole warp per token (K = 128): every lane is a member.
// CHECK-DAG: %[[ALL:.*]] = arith.constant -1 : i32
// CHECK: %[[R:.*]]:6 = scf.for %{{.*}} iter_args(%[[K0:.*]] = %{{.*}}, %[[K1:.*]] = %{{.*}}, %[[K2:.*]] = %{{.*}}, %[[K3:.*]] = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) -> (i32, i32, i32, i32, f32, f32)
// CHECK: arith.maxsi %[[K0]], %[[K1]]
// CHECK: %[[BEST:.*]] = nvvm.redux.sync  max %{{.*}}, %[[ALL]] : i32 -> i32
// CHECK: arith.cmpi eq, %[[K0]], %[[BEST]]
// CHECK: arith.minsi %[[NOIDX]]
// CHECK: %[[WIN:.*]] = nvvm.redux.sync  min %{{.*}}, %[[ALL]] : i32 -> i32
// CHECK: %[[HIT:.*]] = arith.cmpi eq, %{{.*}}, %[[WIN]]
// CHECK: arith.select %[[HIT]], %[[GONE]], %[[K0]]
// CHECK: memref.store %[[WIN]], %{{.*}} : memref<?x8xi32>
// CHECK-NOT: gpu.shuffle
// CHECK: gpu.return
func.func @topk(%s: tensor<?x128xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x128xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}

// -----

// K = 12: groups of 16 lanes, two tokens per warp; the member mask is the
// group's 16 lanes (0xffff shifted to the group's first lane), and the
// padding lanes (index >= 12) start knocked out.
// CHECK-LABEL: gpu.func @topk_renorm_warp_0
// CHECK: %[[KEY:.*]] = arith.select %{{.*}}, %{{.*}}, %c-2147483648_i32 : i32
// CHECK: %[[MASK:.*]] = arith.shli %c65535_i32, %{{.*}} : i32
// CHECK: scf.for %{{.*}} iter_args(%{{.*}} = %[[KEY]], %{{.*}}) -> (i32, f32, f32)
// CHECK: nvvm.redux.sync  max %{{.*}}, %[[MASK]]
// CHECK: nvvm.redux.sync  min %{{.*}}, %[[MASK]]
func.func @topk12(%s: tensor<?x12xf16>) -> (tensor<?x3xf32>, tensor<?x3xi32>) {
  %w, %i = moe.topk_renorm %s k(3) mode(probs) : tensor<?x12xf16> -> tensor<?x3xf32>, tensor<?x3xi32>
  return %w, %i : tensor<?x3xf32>, tensor<?x3xi32>
}

// BAD: convert-moe-to-gpu: topk-rounds must be butterfly, redux, list or list-redux, got 'bitonic'
