// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s

// Sub-warp register path (K = 16: 16 lanes per token, 8 tokens per block):
// candidates in registers, k rounds of a 4-step butterfly max on (key, index)
// halves, the host launching on one stream.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @topk_renorm_warp_0(%{{.*}}: memref<?x16xf32>, %{{.*}}: memref<?x2xf32>, %{{.*}}: memref<?x2xi32>) kernel attributes {known_block_size = array<i32: 128, 1, 1>}
// CHECK-NOT: workgroup
// CHECK: arith.cmpf uno
// CHECK: scf.for {{.*}} iter_args({{.*}}) -> (i64, f32, f32)
// CHECK-COUNT-2: gpu.shuffle  xor %{{.*}}, %c8_i32
// CHECK-COUNT-2: gpu.shuffle  xor %{{.*}}, %c4_i32
// CHECK-COUNT-2: gpu.shuffle  xor %{{.*}}, %c2_i32
// CHECK-COUNT-2: gpu.shuffle  xor %{{.*}}, %c1_i32
// CHECK: math.exp
// CHECK: scf.if
// CHECK: memref.store {{.*}} : memref<?x2xf32>
// CHECK: memref.store {{.*}} : memref<?x2xi32>
// CHECK-NOT: gpu.barrier
// CHECK: gpu.return
// The host code is a destination-style moe.kernel: the operand is an in, the results are outs allocated by
// one-shot bufferization (alloc_tensor, sized from the operand), the body launches on one stream.
// CHECK-LABEL: func.func @topk(
// CHECK-SAME:      %[[S:.*]]: tensor<?x16xf32>)
// CHECK: %[[N:.*]] = tensor.dim %[[S]], %{{.*}} : tensor<?x16xf32>
// CHECK: %[[WD:.*]] = bufferization.alloc_tensor(%[[N]]) : tensor<?x2xf32>
// CHECK: %[[N2:.*]] = tensor.dim %[[S]], %{{.*}} : tensor<?x16xf32>
// CHECK: %[[ID:.*]] = bufferization.alloc_tensor(%[[N2]]) : tensor<?x2xi32>
// CHECK: %[[R:.*]]:2 = moe.kernel ins(%[[S]] : tensor<?x16xf32>) outs(%[[WD]], %[[ID]] : tensor<?x2xf32>, tensor<?x2xi32>) {
// CHECK-NEXT: ^bb0(%[[SB:.*]]: memref<?x16xf32>, %[[W:.*]]: memref<?x2xf32>, %[[I:.*]]: memref<?x2xi32>):
// CHECK-NEXT:   %[[T0:.*]] = gpu.wait async
// CHECK-NOT:    gpu.alloc
// CHECK:        %[[T1:.*]] = gpu.launch_func async [%[[T0]]] @moe_kernels::@topk_renorm_warp_0 blocks in (%{{.*}}, %{{.*}}, %{{.*}}) threads in (%{{.*}}, %{{.*}}, %{{.*}}) args(%[[SB]] : memref<?x16xf32>, %[[W]] : memref<?x2xf32>, %[[I]] : memref<?x2xi32>)
// CHECK-NEXT:   gpu.wait [%[[T1]]]
// CHECK-NEXT: } -> tensor<?x2xf32>, tensor<?x2xi32>
// CHECK-NEXT: return %[[R]]#0, %[[R]]#1
func.func @topk(%s: tensor<?x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x16xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}

// -----

// A leading shape is collapsed to rows; bf16 loads are extended to f32; raw
// probabilities need no epilogue.

// CHECK: gpu.func @topk_renorm_warp_0(%{{.*}}: memref<12x256xbf16>, %{{.*}}: memref<12x1xf32>, %{{.*}}: memref<12x1xi32>)
// CHECK: arith.extf %{{.*}} : bf16 to f32
// CHECK-COUNT-10: gpu.shuffle  xor
// CHECK-NOT: math.exp
// CHECK: gpu.return
// CHECK-LABEL: func.func @topk_probs(
// CHECK: memref.collapse_shape %{{.*}} {{\[\[}}0, 1], [2]] : memref<3x4x256xbf16> into memref<12x256xbf16>
func.func @topk_probs(%s: tensor<3x4x256xbf16>) -> (tensor<3x4x1xf32>, tensor<3x4x1xi32>) {
  %w, %i = moe.topk_renorm %s k(1) mode(probs) renormalize(false) : tensor<3x4x256xbf16> -> tensor<3x4x1xf32>, tensor<3x4x1xi32>
  return %w, %i : tensor<3x4x1xf32>, tensor<3x4x1xi32>
}

// -----

// Dynamic (or > 1024) expert counts: a block of 256 threads per token, a
// strided scan per round and a block reduction through workgroup memory.

// CHECK: gpu.func @topk_renorm_block_0(%{{.*}}: memref<?x?xf32>, %{{.*}}: memref<?x4xf32>, %{{.*}}: memref<?x4xi32>) workgroup(%[[S64:.*]] : memref<8xi64, #gpu.address_space<workgroup>>, %[[S32:.*]] : memref<8xf32, #gpu.address_space<workgroup>>) kernel attributes {known_block_size = array<i32: 256, 1, 1>}
// CHECK: gpu.shuffle  xor
// CHECK: memref.store %{{.*}}, %[[S32]]
// CHECK: gpu.barrier
// CHECK: scf.for
// CHECK: memref.store %{{.*}}, %[[S64]]
// CHECK: gpu.barrier
// CHECK-LABEL: func.func @topk_block(
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@topk_renorm_block_0
func.func @topk_block(%s: tensor<?x?xf32>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.topk_renorm %s k(4) renormalize(false) : tensor<?x?xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}
