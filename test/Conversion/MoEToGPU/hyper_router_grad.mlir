// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s

// The hypernetwork's backward (HyperRouterGrad.cpp): the hidden layer by the
// forward's warp-per-row GEMV (butterfly sum, ReLU), dout = [dw | db] a thread
// per entry, then per layer a block-partial kernel (a thread per column, the
// block's rows in order: fma into the partial, dy·x into d_m) and a
// warp-per-column sum of the partials (lanes stride the blocks, then a
// butterfly), gated by the ReLU for the w2 layer. No atomics anywhere.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK-NOT: atomic
// CHECK: gpu.func @hyper_router_grad_hidden_0(%{{.*}}: memref<64x32xf32>, %{{.*}}: memref<32xf32>, %{{.*}}: memref<64xf32>, %{{.*}}: memref<?xf32>)
// CHECK: math.fma
// CHECK-COUNT-5: gpu.shuffle  xor
// CHECK: arith.maximumf
// CHECK: gpu.func @hyper_router_grad_dout_0(%{{.*}}: memref<8x20xf32>, %{{.*}}: memref<8xf32>, %{{.*}}: memref<168xf32>)
// CHECK: arith.remui
// CHECK: scf.if
// CHECK: memref.load %{{.*}} : memref<8xf32>
// CHECK: } else {
// CHECK: memref.load %{{.*}} : memref<8x20xf32>
// CHECK: gpu.func @hyper_router_grad_layer_0(%{{.*}}: memref<168x64xf32>, %{{.*}}: memref<168xf32>, %{{.*}}: memref<?xf32>, %[[P:.*]]: memref<?x?xf32>, %[[DM:.*]]: memref<168x64xf32>)
// CHECK: scf.for
// CHECK: scf.for {{.*}} iter_args
// CHECK: arith.mulf
// CHECK: math.fma
// CHECK: memref.store %{{.*}}, %[[DM]]
// CHECK: memref.store %{{.*}}, %[[P]]
// CHECK: gpu.func @hyper_router_grad_sum_0(%{{.*}}: memref<?x?xf32>, %{{.*}}: memref<64xf32>, %{{.*}}: memref<?xf32>)
// CHECK: scf.for {{.*}} iter_args
// CHECK-COUNT-5: gpu.shuffle  xor
// CHECK: arith.cmpf ugt
// CHECK: gpu.func @hyper_router_grad_layer_1(%{{.*}}: memref<64x32xf32>, %{{.*}}: memref<64xf32>, %{{.*}}: memref<32xf32>, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<64x32xf32>)
// CHECK: gpu.func @hyper_router_grad_sum_1(%{{.*}}: memref<?x?xf32>, %{{.*}}: memref<32xf32>)
// CHECK-NOT: arith.cmpf
// CHECK: gpu.return
// CHECK-LABEL: func.func @grad(
// The five gradients as the outputs of the op's moe.kernel (device buffers
// once moe-gpu-bufferize has run), then h on the stream.
// CHECK-COUNT-5: bufferization.alloc_tensor()
// CHECK: moe.kernel
// CHECK: gpu.alloc async
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@hyper_router_grad_hidden_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@hyper_router_grad_dout_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@hyper_router_grad_layer_0
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@hyper_router_grad_sum_0
// CHECK: gpu.dealloc async
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@hyper_router_grad_layer_1
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@hyper_router_grad_sum_1
// CHECK: gpu.dealloc async
// CHECK: gpu.dealloc async
// CHECK: gpu.wait
// CHECK-NOT: moe.hyper_router_grad
func.func @grad(%emb: tensor<32xf32>, %w1: tensor<64x32xf32>, %b1: tensor<64xf32>, %w2: tensor<168x64xf32>,
                %b2: tensor<168xf32>, %dw: tensor<8x20xf32>, %db: tensor<8xf32>)
    -> (tensor<32xf32>, tensor<64x32xf32>, tensor<64xf32>, tensor<168x64xf32>, tensor<168xf32>) {
  %a, %b, %c, %d, %e = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<8x20xf32>)
      db(%db : tensor<8xf32>) num_experts(8)
      : tensor<32xf32>, tensor<64x32xf32>, tensor<64xf32>, tensor<168x64xf32>, tensor<168xf32>
      -> tensor<32xf32>, tensor<64x32xf32>, tensor<64xf32>, tensor<168x64xf32>, tensor<168xf32>
  return %a, %b, %c, %d, %e : tensor<32xf32>, tensor<64x32xf32>, tensor<64xf32>, tensor<168x64xf32>, tensor<168xf32>
}

// -----

// A frozen hypernetwork (d_w1, d_w2 unused; the torch op's weight_grads=False):
// the layer kernels take no d_m and store only the partials, and neither
// weight gradient is allocated. Dynamic shapes (bf16 weights) come from the
// operands.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @hyper_router_grad_hidden_0(%{{.*}}: memref<?x?xbf16>, %{{.*}}: memref<?xbf16>, %{{.*}}: memref<?xbf16>, %{{.*}}: memref<?xf32>)
// CHECK: gpu.func @hyper_router_grad_layer_0(%{{.*}}: memref<?x?xbf16>, %{{.*}}: memref<?xf32>, %{{.*}}: memref<?xf32>, %[[P:.*]]: memref<?x?xf32>) kernel
// CHECK-NOT: arith.mulf
// CHECK: math.fma
// CHECK: memref.store %{{.*}}, %[[P]]
// CHECK: gpu.func @hyper_router_grad_layer_1(%{{.*}}: memref<?x?xbf16>, %{{.*}}: memref<?xf32>, %{{.*}}: memref<?xbf16>, %{{.*}}: memref<?x?xf32>) kernel
// CHECK-LABEL: func.func @frozen(
// The three gradients (the moe.kernel's outputs) and h, then the first
// launch: no [?, ?] allocation.
// CHECK-NOT: memref<?x?xf32>
// CHECK-COUNT-3: bufferization.alloc_tensor(%{{.*}}) : tensor<?xf32>
// CHECK-NOT: tensor<?x?xf32>
// CHECK: moe.kernel
// CHECK-NOT: memref<?x?xf32>
// CHECK: gpu.alloc async {{.*}} : memref<?xf32>
// CHECK-NOT: memref<?x?xf32>
// CHECK: gpu.launch_func async {{.*}} @moe_kernels::@hyper_router_grad_hidden_0
// CHECK: gpu.wait [
// d_w1 and d_w2: dead stand-ins (canonicalization removes them).
// CHECK: tensor.empty({{.*}}) : tensor<?x?xf32>
// CHECK: tensor.empty({{.*}}) : tensor<?x?xf32>
// CHECK: return
func.func @frozen(%emb: tensor<?xbf16>, %w1: tensor<?x?xbf16>, %b1: tensor<?xbf16>, %w2: tensor<?x?xbf16>,
                  %b2: tensor<?xbf16>, %dw: tensor<4x?xf32>, %db: tensor<4xf32>)
    -> (tensor<?xf32>, tensor<?xf32>, tensor<?xf32>) {
  %a, %b, %c, %d, %e = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x?xf32>)
      db(%db : tensor<4xf32>) num_experts(4)
      : tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16>
      -> tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
  return %a, %c, %e : tensor<?xf32>, tensor<?xf32>, tensor<?xf32>
}
