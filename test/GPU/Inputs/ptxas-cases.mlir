// Cases of the ptxas report (bench/gpu/ptxas_report.py). Functions named
// nospill_* must assemble without local memory: all of them.

func.func @nospill_topk_k8_logits(%s: tensor<?x8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>
  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>
}
func.func @nospill_topk_k16_probs_raw(%s: tensor<?x16xbf16>) -> (tensor<?x1xf32>, tensor<?x1xi32>) {
  %w, %i = moe.topk_renorm %s k(1) mode(probs) renormalize(false) : tensor<?x16xbf16> -> tensor<?x1xf32>, tensor<?x1xi32>
  return %w, %i : tensor<?x1xf32>, tensor<?x1xi32>
}
func.func @nospill_topk_k64_dense(%s: tensor<?x64xf16>) -> (tensor<?x6xf32>, tensor<?x6xi32>) {
  %w, %i = moe.topk_renorm %s k(6) renormalize(false) : tensor<?x64xf16> -> tensor<?x6xf32>, tensor<?x6xi32>
  return %w, %i : tensor<?x6xf32>, tensor<?x6xi32>
}
func.func @nospill_topk_k128(%s: tensor<?x128xbf16>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<?x128xbf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}
func.func @nospill_topk_k256(%s: tensor<?x256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) mode(probs) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}
func.func @nospill_topk_k1024(%s: tensor<?x1024xf32>) -> (tensor<?x32xf32>, tensor<?x32xi32>) {
  %w, %i = moe.topk_renorm %s k(32) : tensor<?x1024xf32> -> tensor<?x32xf32>, tensor<?x32xi32>
  return %w, %i : tensor<?x32xf32>, tensor<?x32xi32>
}
func.func @nospill_topk_block_dynamic(%s: tensor<?x?xf32>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.topk_renorm %s k(4) renormalize(false) : tensor<?x?xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}
func.func @nospill_similarity(%u: tensor<?x?x512xf32>, %e: tensor<?x?x16xf32>) -> tensor<?x?x16xf32> {
  %p = moe.similarity_inform %u, %e tau(5.000000e-01) causal(true) : tensor<?x?x512xf32>, tensor<?x?x16xf32> -> tensor<?x?x16xf32>
  return %p : tensor<?x?x16xf32>
}
func.func @nospill_similarity_ws_mask(%u: tensor<2x128x64xbf16>, %e: tensor<2x128x64xf32>, %ws: tensor<64x64xf32>, %m: tensor<2x128xi1>) -> tensor<2x128x64xf32> {
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<64x64xf32>) key_mask(%m : tensor<2x128xi1>) : tensor<2x128x64xbf16>, tensor<2x128x64xf32> -> tensor<2x128x64xf32>
  return %p : tensor<2x128x64xf32>
}
func.func @nospill_similarity_topk(%u: tensor<?x?x512xf32>, %e: tensor<?x?x16xf32>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) causal(true) : tensor<?x?x512xf32>, tensor<?x?x16xf32> -> tensor<?x?x2xf32>, tensor<?x?x2xi32>
  return %w, %i : tensor<?x?x2xf32>, tensor<?x?x2xi32>
}
func.func @nospill_similarity_topk_k256(%u: tensor<?x?x256xf32>, %e: tensor<?x?x256xf32>) -> (tensor<?x?x8xf32>, tensor<?x?x8xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(8) : tensor<?x?x256xf32>, tensor<?x?x256xf32> -> tensor<?x?x8xf32>, tensor<?x?x8xi32>
  return %w, %i : tensor<?x?x8xf32>, tensor<?x?x8xi32>
}
func.func @nospill_attention(%s: tensor<2x8x128x128xf32>, %u: tensor<2x128x512xf32>, %v: tensor<2x8x128x64xf32>, %wo: tensor<512x512xf32>, %e: tensor<2x128x16xf32>) -> (tensor<2x128x16xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<2x8x128x128xf32>, tensor<2x128x512xf32>, tensor<2x8x128x64xf32>, tensor<512x512xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x128x16xf32>, tensor<2xi32>
}
func.func @nospill_attention_topk(%s: tensor<?x8x?x?xbf16>, %u: tensor<?x?x512xbf16>, %v: tensor<?x8x?x64xbf16>, %wo: tensor<512x512xbf16>, %e: tensor<?x?x16xf32>) -> (tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) : tensor<?x8x?x?xbf16>, tensor<?x?x512xbf16>, tensor<?x8x?x64xbf16>, tensor<512x512xbf16>, tensor<?x?x16xf32> -> tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>
  return %w, %i, %h : tensor<?x?x2xf32>, tensor<?x?x2xi32>, tensor<?xi32>
}
func.func @nospill_mad(%x: tensor<?x352xf32>, %a: tensor<?xi32>) -> (tensor<16x352xf32>, tensor<16xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(16) : tensor<?x352xf32>, tensor<?xi32> -> tensor<16x352xf32>, tensor<16xi32>
  return %w, %c : tensor<16x352xf32>, tensor<16xi32>
}
func.func @nospill_mad_expert_variance(%x: tensor<?x?xbf16>, %a: tensor<?xi64>) -> (tensor<8x?xf32>, tensor<8xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(8) normalize(expert) measure(variance) empty(raw) : tensor<?x?xbf16>, tensor<?xi64> -> tensor<8x?xf32>, tensor<8xi32>
  return %w, %c : tensor<8x?xf32>, tensor<8xi32>
}
func.func @nospill_adjacency(%a: tensor<16x16xf32>, %idx: tensor<?x2xi32>) -> tensor<16x16xf32> {
  %n = moe.adjacency_update %a, %idx beta(9.900000e-01) norm(col) include_self(false) : tensor<16x16xf32>, tensor<?x2xi32> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}
func.func @nospill_hyper(%emb: tensor<256xf32>, %w1: tensor<256x256xf32>, %b1: tensor<256xf32>, %w2: tensor<4112x256xf32>, %b2: tensor<4112xf32>) -> (tensor<16x256xf32>, tensor<16xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(16) : tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<4112x256xf32>, tensor<4112xf32> -> tensor<16x256xf32>, tensor<16xf32>
  return %w, %b : tensor<16x256xf32>, tensor<16xf32>
}
func.func @nospill_route_deepseek_v3(%l: tensor<?x256xbf16>, %b: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<?x256xbf16> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}
func.func @nospill_route_kimi_k2(%l: tensor<?x384xf32>, %b: tensor<384xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<384xf32>) k(8) scoring(sigmoid) renormalize(true) routed_scaling_factor(2.827000e+00) : tensor<?x384xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}
func.func @nospill_route_gpt_oss(%l: tensor<?x128xbf16>) -> (tensor<?x4xf32>, tensor<?x4xi32>) {
  %w, %i = moe.route %l k(4) order(topk_then_score) : tensor<?x128xbf16> -> tensor<?x4xf32>, tensor<?x4xi32>
  return %w, %i : tensor<?x4xf32>, tensor<?x4xi32>
}
func.func @nospill_dispatch_plan(%idx: tensor<?x8xi32>) -> (tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(256) block_size(64) : tensor<?x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n : tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}
func.func @nospill_topk_renorm_grad(%s: tensor<?x256xbf16>, %i: tensor<?x8xi32>, %dw: tensor<?x8xf32>) -> tensor<?x256xf32> {
  %ds = moe.topk_renorm_grad %s, %i dw(%dw : tensor<?x8xf32>) : tensor<?x256xbf16>, tensor<?x8xi32> -> tensor<?x256xf32>
  return %ds : tensor<?x256xf32>
}
func.func @nospill_similarity_inform_grad(%u: tensor<?x?x64xbf16>, %e: tensor<?x?x16xf32>, %ws: tensor<64x64xf32>, %m: tensor<?x?xi1>, %dp: tensor<?x?x16xf32>) -> (tensor<?x?x64xf32>, tensor<?x?x16xf32>, tensor<64x64xf32>) {
  %du, %de, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<64x64xf32>) key_mask(%m : tensor<?x?xi1>) dp(%dp : tensor<?x?x16xf32>) tau(5.000000e-01) causal(true) : tensor<?x?x64xbf16>, tensor<?x?x16xf32> -> tensor<?x?x64xf32>, tensor<?x?x16xf32>, tensor<64x64xf32>
  return %du, %de, %dws : tensor<?x?x64xf32>, tensor<?x?x16xf32>, tensor<64x64xf32>
}
func.func @nospill_similarity_inform_grad_k256(%u: tensor<?x?x?xf32>, %e: tensor<?x?x256xf32>, %dp: tensor<?x?x256xf32>) -> (tensor<?x?x?xf32>, tensor<?x?x256xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<?x?x256xf32>) : tensor<?x?x?xf32>, tensor<?x?x256xf32> -> tensor<?x?x?xf32>, tensor<?x?x256xf32>
  return %du, %de : tensor<?x?x?xf32>, tensor<?x?x256xf32>
}
func.func @nospill_hyper_bf16_dynamic(%emb: tensor<?xbf16>, %w1: tensor<?x?xbf16>, %b1: tensor<?xbf16>, %w2: tensor<?x?xbf16>, %b2: tensor<?xbf16>) -> (tensor<64x?xf32>, tensor<64xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(64) : tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16> -> tensor<64x?xf32>, tensor<64xf32>
  return %w, %b : tensor<64x?xf32>, tensor<64xf32>
}
func.func @nospill_hyper_router_grad(%emb: tensor<256xf32>, %w1: tensor<256x256xf32>, %b1: tensor<256xf32>, %w2: tensor<65600x256xf32>, %b2: tensor<65600xf32>, %dw: tensor<64x1024xf32>, %db: tensor<64xf32>) -> (tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<65600x256xf32>, tensor<65600xf32>) {
  %a, %c, %d, %e, %f = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<64x1024xf32>) db(%db : tensor<64xf32>) num_experts(64) : tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<65600x256xf32>, tensor<65600xf32> -> tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<65600x256xf32>, tensor<65600xf32>
  return %a, %c, %d, %e, %f : tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<65600x256xf32>, tensor<65600xf32>
}
func.func @nospill_hyper_router_grad_frozen_bf16(%emb: tensor<?xbf16>, %w1: tensor<?x?xbf16>, %b1: tensor<?xbf16>, %w2: tensor<?x?xbf16>, %b2: tensor<?xbf16>, %dw: tensor<256x?xf32>, %db: tensor<256xf32>) -> (tensor<?xf32>, tensor<?xf32>, tensor<?xf32>) {
  %a, %c, %d, %e, %f = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<256x?xf32>) db(%db : tensor<256xf32>) num_experts(256) : tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16> -> tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
  return %a, %d, %f : tensor<?xf32>, tensor<?xf32>, tensor<?xf32>
}
func.func @nospill_attention_posterior_grad(%s: tensor<?x8x?x?xbf16>, %u: tensor<?x?x256xbf16>, %v: tensor<?x8x?x32xbf16>, %wo: tensor<256x256xbf16>, %e: tensor<?x?x16xbf16>, %h: tensor<?xi32>, %dp: tensor<?x?x16xf32>) -> (tensor<?x8x?x?xf32>, tensor<?x?x256xf32>, tensor<?x8x?x32xf32>, tensor<256x256xf32>, tensor<?x?x16xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<?xi32>) dp(%dp : tensor<?x?x16xf32>) sigma(2.000000e+00) : tensor<?x8x?x?xbf16>, tensor<?x?x256xbf16>, tensor<?x8x?x32xbf16>, tensor<256x256xbf16>, tensor<?x?x16xbf16> -> tensor<?x8x?x?xf32>, tensor<?x?x256xf32>, tensor<?x8x?x32xf32>, tensor<256x256xf32>, tensor<?x?x16xf32>
  return %ds, %du, %dv, %dwo, %de : tensor<?x8x?x?xf32>, tensor<?x?x256xf32>, tensor<?x8x?x32xf32>, tensor<256x256xf32>, tensor<?x?x16xf32>
}
func.func @nospill_attention_posterior_grad_k256(%s: tensor<?x8x?x?xf32>, %u: tensor<?x?x512xf32>, %v: tensor<?x8x?x64xf32>, %wo: tensor<512x512xf32>, %e: tensor<?x?x256xf32>, %h: tensor<?xi32>, %dp: tensor<?x?x256xf32>) -> (tensor<?x8x?x?xf32>, tensor<?x?x512xf32>, tensor<?x8x?x64xf32>, tensor<512x512xf32>, tensor<?x?x256xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<?xi32>) dp(%dp : tensor<?x?x256xf32>) head_scale(1.000000e+00) : tensor<?x8x?x?xf32>, tensor<?x?x512xf32>, tensor<?x8x?x64xf32>, tensor<512x512xf32>, tensor<?x?x256xf32> -> tensor<?x8x?x?xf32>, tensor<?x?x512xf32>, tensor<?x8x?x64xf32>, tensor<512x512xf32>, tensor<?x?x256xf32>
  return %ds, %du, %dv, %dwo, %de : tensor<?x8x?x?xf32>, tensor<?x?x512xf32>, tensor<?x8x?x64xf32>, tensor<512x512xf32>, tensor<?x?x256xf32>
}
// The key-major backward configurations that spilled under ptxas's own
// occupancy target (FlashGrad.cpp, kFlashGradBlocksPerSM): the causal
// similarity grad (sm_90 dk, 8 B), its saved-statistics form (sm_90 dk,
// 20 B) and the attention grad (sm_80 dk, 8 B). The harness's simgrad_k256
// and apgrad, which spilled too, are in ptxas-sweep.mlir's inputs.
func.func @nospill_similarity_inform_grad_causal(%u: tensor<2x128x64xf32>, %e: tensor<2x128x16xf32>, %dp: tensor<2x128x16xf32>) -> (tensor<2x128x64xf32>, tensor<2x128x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x128x16xf32>) tau(5.000000e-01) causal(true) : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>
  return %du, %de : tensor<2x128x64xf32>, tensor<2x128x16xf32>
}
func.func @nospill_similarity_inform_grad_saved(%u: tensor<?x?x64xf32>, %e: tensor<?x?x16xf32>, %dp: tensor<?x?x16xf32>, %p: tensor<?x?x16xf32>, %lse: tensor<?x?xf32>) -> (tensor<?x?x64xf32>, tensor<?x?x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<?x?x16xf32>) saved(%p, %lse : tensor<?x?x16xf32>, tensor<?x?xf32>) causal(true) : tensor<?x?x64xf32>, tensor<?x?x16xf32> -> tensor<?x?x64xf32>, tensor<?x?x16xf32>
  return %du, %de : tensor<?x?x64xf32>, tensor<?x?x16xf32>
}
func.func @nospill_attention_posterior_grad_f32(%s: tensor<2x4x128x96xf32>, %u: tensor<2x128x64xf32>, %v: tensor<2x4x96x16xf32>, %wo: tensor<64x64xf32>, %e: tensor<2x96x16xf32>, %h: tensor<2xi32>, %dp: tensor<2x128x16xf32>) -> (tensor<2x4x128x96xf32>, tensor<2x128x64xf32>, tensor<2x4x96x16xf32>, tensor<64x64xf32>, tensor<2x96x16xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<2xi32>) dp(%dp : tensor<2x128x16xf32>) sigma(2.000000e+00) : tensor<2x4x128x96xf32>, tensor<2x128x64xf32>, tensor<2x4x96x16xf32>, tensor<64x64xf32>, tensor<2x96x16xf32> -> tensor<2x4x128x96xf32>, tensor<2x128x64xf32>, tensor<2x4x96x16xf32>, tensor<64x64xf32>, tensor<2x96x16xf32>
  return %ds, %du, %dv, %dwo, %de : tensor<2x4x128x96xf32>, tensor<2x128x64xf32>, tensor<2x4x96x16xf32>, tensor<64x64xf32>, tensor<2x96x16xf32>
}
