// RUN: moe-opt %s --convert-moe-to-cpu=num-threads=2 | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | FileCheck %s --check-prefix=LLVM

// hyper_router_grad has no dedicated kernel: convert-moe-to-cpu leaves it as it is for the portable lowering
// (HyperRouterGrad.cpp: vecmat and outer products that the dense pipeline compiles), while the forward op next to
// it gets its kernel; the whole CPU pipeline lowers both.

// CHECK-LABEL: func.func @fwd_bwd
// CHECK-NOT: moe.hyper_router %
// CHECK: moe.hyper_router_grad %{{.+}} num_experts(16)
// LLVM-LABEL: llvm.func @fwd_bwd
// LLVM-NOT: moe.
func.func @fwd_bwd(%emb: tensor<64xf32>, %w1: tensor<32x64xf32>, %b1: tensor<32xf32>, %w2: tensor<1040x32xf32>,
                   %b2: tensor<1040xf32>, %dw: tensor<16x64xf32>, %db: tensor<16xf32>)
    -> (tensor<16x64xf32>, tensor<64xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(16)
      : tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
      -> tensor<16x64xf32>, tensor<16xf32>
  %a, %g1, %g2, %g3, %g4 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<16x64xf32>)
      db(%db : tensor<16xf32>) num_experts(16)
      : tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
      -> tensor<64xf32>, tensor<32x64xf32>, tensor<32xf32>, tensor<1040x32xf32>, tensor<1040xf32>
  return %w, %a : tensor<16x64xf32>, tensor<64xf32>
}
