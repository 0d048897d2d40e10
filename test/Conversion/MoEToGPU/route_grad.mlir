// RUN: moe-opt %s --convert-moe-to-gpu -split-input-file | FileCheck %s

// moe.route_grad on the GPU (RouteGrad.cpp): a block of 128 threads zeroes its 128 rows of dlogits (the threads
// along each row), waits at a barrier, then each thread runs its row's picks: the sums S = Σ f, C = Σ dw·f in one
// loop, then the gradients added at the picked experts in a second (an out-of-range index read clamped, never
// written: the add sits under the range test). The derivative of the score is inlined: sigmoid's f (1 - f) here.

// CHECK-LABEL: gpu.module @moe_kernels
// CHECK: gpu.func @route_grad_0(%[[X:.+]]: memref<?x64xbf16>, %[[I:.+]]: memref<?x8xi32>, %[[G:.+]]: memref<?x8xf32>, %[[O:.+]]: memref<?x64xf32>) kernel attributes {known_block_size = array<i32: 128, 1, 1>}
// CHECK: scf.for
// CHECK: scf.for %{{.+}} = %{{.+}} to %{{.+}} step %c128
// CHECK: memref.store %{{.+}}, %[[O]]
// CHECK: gpu.barrier
// CHECK: scf.if
// CHECK: scf.for {{.+}} iter_args({{.+}}) -> (f32, f32)
// CHECK: memref.load %[[I]]
// CHECK: memref.load %[[X]]
// CHECK: math.exp
// CHECK: scf.yield
// CHECK: scf.for
// CHECK: arith.divf
// CHECK: scf.if
// CHECK: memref.load %[[O]]
// CHECK: arith.addf
// CHECK: memref.store %{{.+}}, %[[O]]
// CHECK-LABEL: func.func @sigmoid_renormalized
// CHECK: gpu.launch_func {{.+}} @moe_kernels::@route_grad_0
func.func @sigmoid_renormalized(%x: tensor<?x64xbf16>, %i: tensor<?x8xi32>, %dw: tensor<?x8xf32>) -> tensor<?x64xf32> {
  %d = moe.route_grad %x, %i dw(%dw : tensor<?x8xf32>) scoring(sigmoid) renormalize(true) routed_scaling_factor(2.5)
      : tensor<?x64xbf16>, tensor<?x8xi32> -> tensor<?x64xf32>
  return %d : tensor<?x64xf32>
}

// -----

// A custom score (DeepSeek-V4's sqrtsoftplus): the region and its symbolic derivative inlined per pick; no
// renormalization: one loop over the picks.
// CHECK-LABEL: gpu.func @route_grad_0
// CHECK: gpu.barrier
// CHECK-NOT: iter_args
// CHECK: math.log1p
// CHECK: math.sqrt
// CHECK-LABEL: func.func @sqrtsoftplus
func.func @sqrtsoftplus(%x: tensor<?x256xf32>, %i: tensor<?x8xi32>, %dw: tensor<?x8xf32>) -> tensor<?x256xf32> {
  %d = moe.route_grad %x, %i dw(%dw : tensor<?x8xf32>) scoring(custom) score {
  ^bb0(%v: f32):
    %zero = arith.constant 0.000000e+00 : f32
    %a = math.absf %v : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %l = math.log1p %e : f32
    %m = arith.maximumf %v, %zero : f32
    %sp = arith.addf %l, %m : f32
    %r = math.sqrt %sp : f32
    moe.yield %r : f32
  } : tensor<?x256xf32>, tensor<?x8xi32> -> tensor<?x256xf32>
  return %d : tensor<?x256xf32>
}
