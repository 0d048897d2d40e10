// RUN: moe-opt %s --moe-lower-to-nvvm="chip=sm_90 format=isa %flash_base64" -o %t.mlir
// RUN: grep -o '\.shared \.align [0-9]* \.b8 __wg_[a-z_]*[0-9_]*' %t.mlir | FileCheck %s
// RUN: grep -o '\.shared \.align [0-9]* \.b8 __wg_[a-z_]*[0-9_]*' %t.mlir | FileCheck %s --check-prefix=NOT

// Every workgroup buffer of the flash kernels is 16-byte aligned in the PTX
// (llvm.align on the attribution, FlashTile.h's kFlashSharedAlign): ldmatrix
// rows, cp.async copies and st.shared.v4 need 16-byte addresses, which the
// padded row strides keep only from an aligned base (LLVM's default is the
// element's alignment: 2 for f16/bf16, 4 for f32). The scalar kernel (f32),
// the tensor-core kernel (bf16) with its fused top-k and attention_posterior
// forms, and the backward's kernel. (attention_posterior's entropy and head
// means kernels keep their f32 reduction slots at 4: no vector access.)

// CHECK-DAG: .shared .align 16 .b8 __wg_similarity_inform_0_0
// CHECK-DAG: .shared .align 16 .b8 __wg_similarity_inform_0_3
// CHECK-DAG: .shared .align 16 .b8 __wg_similarity_inform_mma_0_0
// CHECK-DAG: .shared .align 16 .b8 __wg_similarity_inform_mma_0_1
// CHECK-DAG: .shared .align 16 .b8 __wg_similarity_inform_topk_mma_0_1
// CHECK-DAG: .shared .align 16 .b8 __wg_attention_posterior_mma_0_1
// CHECK-DAG: .shared .align 16 .b8 __wg_similarity_inform_grad_mix_0_3
// CHECK-DAG: .shared .align 16 .b8 __wg_similarity_inform_grad_dk_0_3
// CHECK-DAG: .shared .align 4 .b8 __wg_attention_entropy_0_0
// NOT-NOT: .shared .align {{[1248]}} .b8 __wg_similarity
// NOT-NOT: .shared .align {{[1248]}} .b8 __wg_attention_posterior

func.func @scalar_f32(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>) -> tensor<2x100x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x16xf32>
  return %p : tensor<2x100x16xf32>
}
func.func @mma_bf16(%u: tensor<2x100x64xbf16>, %e: tensor<2x100x16xbf16>) -> tensor<2x100x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<2x100x64xbf16>, tensor<2x100x16xbf16> -> tensor<2x100x16xf32>
  return %p : tensor<2x100x16xf32>
}
func.func @mma_topk_bf16(%u: tensor<2x100x64xbf16>, %e: tensor<2x100x16xbf16>) -> (tensor<2x100x2xf32>, tensor<2x100x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<2x100x64xbf16>, tensor<2x100x16xbf16> -> tensor<2x100x2xf32>, tensor<2x100x2xi32>
  return %w, %i : tensor<2x100x2xf32>, tensor<2x100x2xi32>
}
func.func @posterior_bf16(%s: tensor<?x4x?x?xbf16>, %u: tensor<?x?x64xbf16>, %v: tensor<?x4x?x16xbf16>, %wo: tensor<64x64xbf16>, %e: tensor<?x?x64xbf16>) -> (tensor<?x?x64xf32>, tensor<?xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<?x4x?x?xbf16>, tensor<?x?x64xbf16>, tensor<?x4x?x16xbf16>, tensor<64x64xbf16>, tensor<?x?x64xbf16> -> tensor<?x?x64xf32>, tensor<?xi32>
  return %p, %h : tensor<?x?x64xf32>, tensor<?xi32>
}
func.func @grad_f32(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>, %dp: tensor<2x128x16xf32>) -> (tensor<2x128x64xf32>, tensor<2x128x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x128x16xf32>) tau(5.000000e-01) causal(true) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>
  return %du, %de : tensor<2x128x64xf32>, tensor<2x128x16xf32>
}
