// Cases of the tensor-core flash kernels (moe-lower-to-nvvm;
// FlashMma.cpp), for bench/gpu/ptxas_report.py: every function is a nospill_
// one. The shapes of the issue's benchmark (D = 64, K = 16; D = 256, K = 64
// causal), the largest tiles (D = K = 256: 32-key tiles), a key mask, odd
// sizes (features and experts padded), and the training forward (lse).
// The nospill_mma_topk_* cases: the fused top-k in the kernel's epilogue
// (similarity_inform_topk): the same shapes, and K = 256 beside D = 16
// (64-key tiles: the accumulators and the epilogue's candidates dominate).
// The nospill_mma_post_* cases: attention_posterior's mixing on the tensor-core
// kernel, the per-key bias and the selected head's scores added to the
// logits' fragments, D = 64 and 256, K = 16 and 64; its _topk form as well.
// Each case also lowers the op's three scalar kernels (entropy, head select,
// head means).

func.func @nospill_mma_f16_d64_k16(%u: tensor<?x?x64xf16>, %e: tensor<?x?x16xf16>) -> tensor<?x?x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<?x?x64xf16>, tensor<?x?x16xf16> -> tensor<?x?x16xf32>
  return %p : tensor<?x?x16xf32>
}
func.func @nospill_mma_bf16_d64_k16(%u: tensor<?x?x64xbf16>, %e: tensor<?x?x16xbf16>) -> tensor<?x?x16xf32> {
  %p = moe.similarity_inform %u, %e : tensor<?x?x64xbf16>, tensor<?x?x16xbf16> -> tensor<?x?x16xf32>
  return %p : tensor<?x?x16xf32>
}
func.func @nospill_mma_bf16_d256_k64_causal(%u: tensor<?x?x256xbf16>, %e: tensor<?x?x64xbf16>) -> tensor<?x?x64xf32> {
  %p = moe.similarity_inform %u, %e causal(true) : tensor<?x?x256xbf16>, tensor<?x?x64xbf16> -> tensor<?x?x64xf32>
  return %p : tensor<?x?x64xf32>
}
func.func @nospill_mma_f16_d256_k256(%u: tensor<?x?x256xf16>, %e: tensor<?x?x256xf16>) -> tensor<?x?x256xf32> {
  %p = moe.similarity_inform %u, %e : tensor<?x?x256xf16>, tensor<?x?x256xf16> -> tensor<?x?x256xf32>
  return %p : tensor<?x?x256xf32>
}
func.func @nospill_mma_bf16_mask_odd(%u: tensor<?x?x40xbf16>, %e: tensor<?x?x12xbf16>, %m: tensor<?x?xi1>) -> tensor<?x?x12xf32> {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<?x?xi1>) causal(true) : tensor<?x?x40xbf16>, tensor<?x?x12xbf16> -> tensor<?x?x12xf32>
  return %p : tensor<?x?x12xf32>
}
func.func @nospill_mma_fwd_lse_f16(%u: tensor<?x?x128xf16>, %e: tensor<?x?x32xf16>) -> (tensor<?x?x32xf32>, tensor<?x?xf32>) {
  %p, %lse = moe.similarity_inform_fwd %u, %e tau(5.000000e-01) causal(true) : tensor<?x?x128xf16>, tensor<?x?x32xf16> -> tensor<?x?x32xf32>, tensor<?x?xf32>
  return %p, %lse : tensor<?x?x32xf32>, tensor<?x?xf32>
}
func.func @nospill_mma_topk_f16_d64_k16(%u: tensor<?x?x64xf16>, %e: tensor<?x?x16xf16>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<?x?x64xf16>, tensor<?x?x16xf16> -> tensor<?x?x2xf32>, tensor<?x?x2xi32>
  return %w, %i : tensor<?x?x2xf32>, tensor<?x?x2xi32>
}
func.func @nospill_mma_topk_bf16_d64_k16_causal(%u: tensor<?x?x64xbf16>, %e: tensor<?x?x16xbf16>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) causal(true) : tensor<?x?x64xbf16>, tensor<?x?x16xbf16> -> tensor<?x?x2xf32>, tensor<?x?x2xi32>
  return %w, %i : tensor<?x?x2xf32>, tensor<?x?x2xi32>
}
func.func @nospill_mma_topk_bf16_d256_k64(%u: tensor<?x?x256xbf16>, %e: tensor<?x?x64xbf16>) -> (tensor<?x?x8xf32>, tensor<?x?x8xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(8) causal(true) : tensor<?x?x256xbf16>, tensor<?x?x64xbf16> -> tensor<?x?x8xf32>, tensor<?x?x8xi32>
  return %w, %i : tensor<?x?x8xf32>, tensor<?x?x8xi32>
}
func.func @nospill_mma_topk_f16_d256_k256(%u: tensor<?x?x256xf16>, %e: tensor<?x?x256xf16>) -> (tensor<?x?x8xf32>, tensor<?x?x8xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(8) renormalize(false) : tensor<?x?x256xf16>, tensor<?x?x256xf16> -> tensor<?x?x8xf32>, tensor<?x?x8xi32>
  return %w, %i : tensor<?x?x8xf32>, tensor<?x?x8xi32>
}
func.func @nospill_mma_topk_f16_d16_k256(%u: tensor<?x?x16xf16>, %e: tensor<?x?x256xf16>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) : tensor<?x?x16xf16>, tensor<?x?x256xf16> -> tensor<?x?x2xf32>, tensor<?x?x2xi32>
  return %w, %i : tensor<?x?x2xf32>, tensor<?x?x2xi32>
}
func.func @nospill_mma_topk_bf16_mask_odd(%u: tensor<?x?x40xbf16>, %e: tensor<?x?x12xbf16>, %m: tensor<?x?xi1>) -> (tensor<?x?x12xf32>, tensor<?x?x12xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e key_mask(%m : tensor<?x?xi1>) k(12) causal(true) : tensor<?x?x40xbf16>, tensor<?x?x12xbf16> -> tensor<?x?x12xf32>, tensor<?x?x12xi32>
  return %w, %i : tensor<?x?x12xf32>, tensor<?x?x12xi32>
}
func.func @nospill_mma_post_f16_d64_k16(%s: tensor<?x4x?x?xf16>, %u: tensor<?x?x64xf16>, %v: tensor<?x4x?x16xf16>, %wo: tensor<64x64xf16>, %e: tensor<?x?x16xf16>) -> (tensor<?x?x16xf32>, tensor<?xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<?x4x?x?xf16>, tensor<?x?x64xf16>, tensor<?x4x?x16xf16>, tensor<64x64xf16>, tensor<?x?x16xf16> -> tensor<?x?x16xf32>, tensor<?xi32>
  return %p, %h : tensor<?x?x16xf32>, tensor<?xi32>
}
func.func @nospill_mma_post_bf16_d64_k64(%s: tensor<?x4x?x?xbf16>, %u: tensor<?x?x64xbf16>, %v: tensor<?x4x?x16xbf16>, %wo: tensor<64x64xbf16>, %e: tensor<?x?x64xbf16>) -> (tensor<?x?x64xf32>, tensor<?xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<?x4x?x?xbf16>, tensor<?x?x64xbf16>, tensor<?x4x?x16xbf16>, tensor<64x64xbf16>, tensor<?x?x64xbf16> -> tensor<?x?x64xf32>, tensor<?xi32>
  return %p, %h : tensor<?x?x64xf32>, tensor<?xi32>
}
func.func @nospill_mma_post_bf16_d256_k16(%s: tensor<?x8x?x?xbf16>, %u: tensor<?x?x256xbf16>, %v: tensor<?x8x?x32xbf16>, %wo: tensor<256x256xbf16>, %e: tensor<?x?x16xbf16>) -> (tensor<?x?x16xf32>, tensor<?xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<?x8x?x?xbf16>, tensor<?x?x256xbf16>, tensor<?x8x?x32xbf16>, tensor<256x256xbf16>, tensor<?x?x16xbf16> -> tensor<?x?x16xf32>, tensor<?xi32>
  return %p, %h : tensor<?x?x16xf32>, tensor<?xi32>
}
func.func @nospill_mma_post_f16_d256_k64(%s: tensor<?x8x?x?xf16>, %u: tensor<?x?x256xf16>, %v: tensor<?x8x?x32xf16>, %wo: tensor<256x256xf16>, %e: tensor<?x?x64xf16>) -> (tensor<?x?x64xf32>, tensor<?xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<?x8x?x?xf16>, tensor<?x?x256xf16>, tensor<?x8x?x32xf16>, tensor<256x256xf16>, tensor<?x?x64xf16> -> tensor<?x?x64xf32>, tensor<?xi32>
  return %p, %h : tensor<?x?x64xf32>, tensor<?xi32>
}
func.func @nospill_mma_post_topk_bf16_d64_k16(%s: tensor<?x4x?x?xbf16>, %u: tensor<?x?x64xbf16>, %v: tensor<?x4x?x16xbf16>, %wo: tensor<64x64xbf16>, %e: tensor<?x?x16xbf16>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) sigma(2.000000e+00) : tensor<?x4x?x?xbf16>, tensor<?x?x64xbf16>, tensor<?x4x?x16xbf16>, tensor<64x64xbf16>, tensor<?x?x16xbf16> -> tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>
  return %w, %i, %h : tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>
}
func.func @nospill_mma_post_topk_f16_d256_k64(%s: tensor<?x8x?x?xf16>, %u: tensor<?x?x256xf16>, %v: tensor<?x8x?x32xf16>, %wo: tensor<256x256xf16>, %e: tensor<?x?x64xf16>) -> (tensor<?x?x8xf32>, tensor<?x?x8xi32>, tensor<?xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(8) sigma(2.000000e+00) : tensor<?x8x?x?xf16>, tensor<?x?x256xf16>, tensor<?x8x?x32xf16>, tensor<256x256xf16>, tensor<?x?x64xf16> -> tensor<?x?x8xf32>, tensor<?x?x8xi32>, tensor<?xi32>
  return %w, %i, %h : tensor<?x?x8xf32>, tensor<?x?x8xi32>, tensor<?xi32>
}
