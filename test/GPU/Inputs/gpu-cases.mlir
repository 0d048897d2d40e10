// The functions the GPU harness (test/GPU/run_gpu_tests.py) calls on device
// tensors and compares against PyTorch. Built ahead of time by
// tools/moe-aot/moe-aot.py; names and signatures are the harness's contract.

func.func @topk_logits(%s: tensor<300x16xf32>) -> (tensor<300x2xf32>, tensor<300x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<300x16xf32> -> tensor<300x2xf32>, tensor<300x2xi32>
  return %w, %i : tensor<300x2xf32>, tensor<300x2xi32>
}
func.func @topk_probs_raw(%s: tensor<300x256xbf16>) -> (tensor<300x8xf32>, tensor<300x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) mode(probs) renormalize(false) : tensor<300x256xbf16> -> tensor<300x8xf32>, tensor<300x8xi32>
  return %w, %i : tensor<300x8xf32>, tensor<300x8xi32>
}
func.func @topk_dense(%s: tensor<300x64xf16>) -> (tensor<300x6xf32>, tensor<300x6xi32>) {
  %w, %i = moe.topk_renorm %s k(6) renormalize(false) : tensor<300x64xf16> -> tensor<300x6xf32>, tensor<300x6xi32>
  return %w, %i : tensor<300x6xf32>, tensor<300x6xi32>
}
func.func @topk_probs_renorm(%s: tensor<7x5x60xf32>) -> (tensor<7x5x3xf32>, tensor<7x5x3xi32>) {
  %w, %i = moe.topk_renorm %s k(3) mode(probs) : tensor<7x5x60xf32> -> tensor<7x5x3xf32>, tensor<7x5x3xi32>
  return %w, %i : tensor<7x5x3xf32>, tensor<7x5x3xi32>
}
func.func @topk_k1024(%s: tensor<50x1024xf32>) -> (tensor<50x40xf32>, tensor<50x40xi32>) {
  %w, %i = moe.topk_renorm %s k(40) : tensor<50x1024xf32> -> tensor<50x40xf32>, tensor<50x40xi32>
  return %w, %i : tensor<50x40xf32>, tensor<50x40xi32>
}
func.func @topk_block(%s: tensor<40x2048xf32>) -> (tensor<40x4xf32>, tensor<40x4xi32>) {
  %w, %i = moe.topk_renorm %s k(4) renormalize(false) : tensor<40x2048xf32> -> tensor<40x4xf32>, tensor<40x4xi32>
  return %w, %i : tensor<40x4xf32>, tensor<40x4xi32>
}
func.func @sim_causal(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>) -> tensor<2x100x16xf32> {
  %p = moe.similarity_inform %u, %e tau(5.000000e-01) causal(true) : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x16xf32>
  return %p : tensor<2x100x16xf32>
}
func.func @sim_ws_mask(%u: tensor<2x70x40xbf16>, %e: tensor<2x70x24xf32>, %ws: tensor<40x40xf32>, %m: tensor<2x70xi1>) -> tensor<2x70x24xf32> {
  %p = moe.similarity_inform %u, %e ws(%ws : tensor<40x40xf32>) key_mask(%m : tensor<2x70xi1>) tau(4.000000e+00) : tensor<2x70x40xbf16>, tensor<2x70x24xf32> -> tensor<2x70x24xf32>
  return %p : tensor<2x70x24xf32>
}
func.func @sim_topk(%u: tensor<2x100x64xf32>, %e: tensor<2x100x16xf32>) -> (tensor<2x100x2xf32>, tensor<2x100x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) tau(5.000000e-01) causal(true) : tensor<2x100x64xf32>, tensor<2x100x16xf32> -> tensor<2x100x2xf32>, tensor<2x100x2xi32>
  return %w, %i : tensor<2x100x2xf32>, tensor<2x100x2xi32>
}
func.func @attn(%s: tensor<2x4x50x60xf32>, %u: tensor<2x50x32xf32>, %v: tensor<2x4x60x8xf32>, %wo: tensor<32x32xf32>, %e: tensor<2x60x16xf32>) -> (tensor<2x50x16xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32> -> tensor<2x50x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x50x16xf32>, tensor<2xi32>
}
func.func @attn_topk(%s: tensor<2x4x50x60xf32>, %u: tensor<2x50x32xf32>, %v: tensor<2x4x60x8xf32>, %wo: tensor<32x32xf32>, %e: tensor<2x60x16xf32>) -> (tensor<2x50x2xf32>, tensor<2x50x2xi32>, tensor<2xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(2) sigma(2.000000e+00) : tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32> -> tensor<2x50x2xf32>, tensor<2x50x2xi32>, tensor<2xi32>
  return %w, %i, %h : tensor<2x50x2xf32>, tensor<2x50x2xi32>, tensor<2xi32>
}
func.func @mad(%x: tensor<500x40xf32>, %a: tensor<500xi32>) -> (tensor<8x40xf32>, tensor<8xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(8) : tensor<500x40xf32>, tensor<500xi32> -> tensor<8x40xf32>, tensor<8xi32>
  return %w, %c : tensor<8x40xf32>, tensor<8xi32>
}
func.func @mad_var(%x: tensor<500x40xf32>, %a: tensor<500xi64>) -> (tensor<8x40xf32>, tensor<8xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(8) normalize(expert) measure(variance) empty(raw) : tensor<500x40xf32>, tensor<500xi64> -> tensor<8x40xf32>, tensor<8xi32>
  return %w, %c : tensor<8x40xf32>, tensor<8xi32>
}
func.func @adj_row(%a: tensor<16x16xf32>, %idx: tensor<300x3xi32>) -> tensor<16x16xf32> {
  %n = moe.adjacency_update %a, %idx : tensor<16x16xf32>, tensor<300x3xi32> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}
func.func @adj_col(%a: tensor<16x16xf32>, %idx: tensor<300x3xi32>) -> tensor<16x16xf32> {
  %n = moe.adjacency_update %a, %idx beta(5.000000e-01) norm(col) include_self(false) : tensor<16x16xf32>, tensor<300x3xi32> -> tensor<16x16xf32>
  return %n : tensor<16x16xf32>
}
func.func @hyper(%emb: tensor<32xf32>, %w1: tensor<48x32xf32>, %b1: tensor<48xf32>, %w2: tensor<168x48xf32>, %b2: tensor<168xf32>) -> (tensor<8x20xf32>, tensor<8xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(8) : tensor<32xf32>, tensor<48x32xf32>, tensor<48xf32>, tensor<168x48xf32>, tensor<168xf32> -> tensor<8x20xf32>, tensor<8xf32>
  return %w, %b : tensor<8x20xf32>, tensor<8xf32>
}

// More modes, dtypes and sizes: k = K, a single token, zero tokens, the
// non-causal and causal+masked mixing in f16/f32, bf16 attention with an
// explicit head_scale, global normalization without clipping, no
// normalization, bf16 hypernetwork. (head_select(all) has no GPU lowering.)
func.func @topk_k_eq_K(%s: tensor<64x16xf32>) -> (tensor<64x16xf32>, tensor<64x16xi32>) {
  %w, %i = moe.topk_renorm %s k(16) : tensor<64x16xf32> -> tensor<64x16xf32>, tensor<64x16xi32>
  return %w, %i : tensor<64x16xf32>, tensor<64x16xi32>
}
func.func @topk_one_token(%s: tensor<1x8xf16>) -> (tensor<1x3xf32>, tensor<1x3xi32>) {
  %w, %i = moe.topk_renorm %s k(3) mode(probs) : tensor<1x8xf16> -> tensor<1x3xf32>, tensor<1x3xi32>
  return %w, %i : tensor<1x3xf32>, tensor<1x3xi32>
}
func.func @topk_no_tokens(%s: tensor<0x16xf32>) -> (tensor<0x2xf32>, tensor<0x2xi32>) {
  %w, %i = moe.topk_renorm %s k(2) : tensor<0x16xf32> -> tensor<0x2xf32>, tensor<0x2xi32>
  return %w, %i : tensor<0x2xf32>, tensor<0x2xi32>
}
// The shapes topk-rounds=list maps differently, at 6200 tokens: past the 6144 up to which the default
// on sm_80+ (list-redux) runs redux, so they check the list kernel (topk-rounds=redux: that one): K not a power of two, k up to 32, f16/bf16 rows
// of 16-byte vectors, a padding run (K = 100), K not a multiple of the vector (62: 4-byte loads).
func.func @topk_shapes_160_bf16(%s: tensor<6200x160xbf16>) -> (tensor<6200x8xf32>, tensor<6200x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<6200x160xbf16> -> tensor<6200x8xf32>, tensor<6200x8xi32>
  return %w, %i : tensor<6200x8xf32>, tensor<6200x8xi32>
}
func.func @topk_shapes_288_k32(%s: tensor<6200x288xf32>) -> (tensor<6200x32xf32>, tensor<6200x32xi32>) {
  %w, %i = moe.topk_renorm %s k(32) : tensor<6200x288xf32> -> tensor<6200x32xf32>, tensor<6200x32xi32>
  return %w, %i : tensor<6200x32xf32>, tensor<6200x32xi32>
}
func.func @topk_shapes_384_f16(%s: tensor<6200x384xf16>) -> (tensor<6200x8xf32>, tensor<6200x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) mode(probs) : tensor<6200x384xf16> -> tensor<6200x8xf32>, tensor<6200x8xi32>
  return %w, %i : tensor<6200x8xf32>, tensor<6200x8xi32>
}
func.func @topk_shapes_896_dense(%s: tensor<6200x896xf32>) -> (tensor<6200x8xf32>, tensor<6200x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) renormalize(false) : tensor<6200x896xf32> -> tensor<6200x8xf32>, tensor<6200x8xi32>
  return %w, %i : tensor<6200x8xf32>, tensor<6200x8xi32>
}
func.func @topk_shapes_100_raw(%s: tensor<6200x100xf32>) -> (tensor<6200x20xf32>, tensor<6200x20xi32>) {
  %w, %i = moe.topk_renorm %s k(20) mode(probs) renormalize(false) : tensor<6200x100xf32> -> tensor<6200x20xf32>, tensor<6200x20xi32>
  return %w, %i : tensor<6200x20xf32>, tensor<6200x20xi32>
}
func.func @topk_shapes_62(%s: tensor<6200x62xf32>) -> (tensor<6200x5xf32>, tensor<6200x5xi32>) {
  %w, %i = moe.topk_renorm %s k(5) : tensor<6200x62xf32> -> tensor<6200x5xf32>, tensor<6200x5xi32>
  return %w, %i : tensor<6200x5xf32>, tensor<6200x5xi32>
}
func.func @sim_plain_f16(%u: tensor<3x33x24xf16>, %e: tensor<3x33x8xf16>) -> tensor<3x33x8xf32> {
  %p = moe.similarity_inform %u, %e : tensor<3x33x24xf16>, tensor<3x33x8xf16> -> tensor<3x33x8xf32>
  return %p : tensor<3x33x8xf32>
}
// f16/bf16 operands of one type: the tensor-core kernel under flash-mma
// (FlashMma.cpp; row and feature tails, a key mask, a fully masked element),
// the scalar one otherwise.
func.func @sim_mma_bf16_causal(%u: tensor<2x100x64xbf16>, %e: tensor<2x100x16xbf16>) -> tensor<2x100x16xf32> {
  %p = moe.similarity_inform %u, %e tau(5.000000e-01) causal(true) : tensor<2x100x64xbf16>, tensor<2x100x16xbf16> -> tensor<2x100x16xf32>
  return %p : tensor<2x100x16xf32>
}
// D = 256, K = 64, causal, three key tiles of 64: one row tile a warp, 32-key tiles in static shared memory.
func.func @sim_mma_bf16_causal_d256(%u: tensor<2x150x256xbf16>, %e: tensor<2x150x64xbf16>) -> tensor<2x150x64xf32> {
  %p = moe.similarity_inform %u, %e tau(2.000000e+00) causal(true) : tensor<2x150x256xbf16>, tensor<2x150x64xbf16> -> tensor<2x150x64xf32>
  return %p : tensor<2x150x64xf32>
}
func.func @sim_mma_f16_mask(%u: tensor<2x70x40xf16>, %e: tensor<2x70x12xf16>, %m: tensor<2x70xi1>) -> tensor<2x70x12xf32> {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<2x70xi1>) : tensor<2x70x40xf16>, tensor<2x70x12xf16> -> tensor<2x70x12xf32>
  return %p : tensor<2x70x12xf32>
}
// A key mask with K a multiple of 8 and three key tiles: the keys come by
// cp.async into the tile buffers and the values by the synchronous 16-byte
// stores of the masked path, which wrote the current buffer's rows instead of
// the next one's (issue 47).
func.func @sim_mma_bf16_mask_k16(%u: tensor<2x150x64xbf16>, %e: tensor<2x150x16xbf16>, %m: tensor<2x150xi1>) -> tensor<2x150x16xf32> {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<2x150xi1>) : tensor<2x150x64xbf16>, tensor<2x150x16xbf16> -> tensor<2x150x16xf32>
  return %p : tensor<2x150x16xf32>
}
// The fused top-k on f16/bf16 operands of one type: the tensor-core kernel's
// epilogue (with split keys the top-k combine). N = 100 and 70 (rows past N
// in the last 64- or 128-row block), a key mask with a
// fully masked element, a NaN expert, tied experts, k = K = 12 (experts
// padded to 16 in the tiles), raw probabilities.
func.func @sim_topk_mma_f16(%u: tensor<3x100x64xf16>, %e: tensor<3x100x16xf16>, %m: tensor<3x100xi1>) -> (tensor<3x100x3xf32>, tensor<3x100x3xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e key_mask(%m : tensor<3x100xi1>) k(3) : tensor<3x100x64xf16>, tensor<3x100x16xf16> -> tensor<3x100x3xf32>, tensor<3x100x3xi32>
  return %w, %i : tensor<3x100x3xf32>, tensor<3x100x3xi32>
}
func.func @sim_topk_mma_bf16_kK(%u: tensor<2x70x40xbf16>, %e: tensor<2x70x12xbf16>) -> (tensor<2x70x12xf32>, tensor<2x70x12xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(12) renormalize(false) tau(5.000000e-01) causal(true) : tensor<2x70x40xbf16>, tensor<2x70x12xbf16> -> tensor<2x70x12xf32>, tensor<2x70x12xi32>
  return %w, %i : tensor<2x70x12xf32>, tensor<2x70x12xi32>
}
func.func @sim_causal_mask(%u: tensor<2x45x16xf32>, %e: tensor<2x45x8xf32>, %m: tensor<2x45xi1>) -> tensor<2x45x8xf32> {
  %p = moe.similarity_inform %u, %e key_mask(%m : tensor<2x45xi1>) tau(2.500000e-01) causal(true) : tensor<2x45x16xf32>, tensor<2x45x8xf32> -> tensor<2x45x8xf32>
  return %p : tensor<2x45x8xf32>
}
func.func @sim_one(%u: tensor<1x1x8xf32>, %e: tensor<1x1x4xf32>) -> tensor<1x1x4xf32> {
  %p = moe.similarity_inform %u, %e : tensor<1x1x8xf32>, tensor<1x1x4xf32> -> tensor<1x1x4xf32>
  return %p : tensor<1x1x4xf32>
}
// attention_posterior on f16/bf16 u and e: the tensor-core kernel (its _topk
// form too). N = 100 and 70 (rows past N in the last 64-row block), Nk = 70
// and 45 (not multiples of the key tile), D = 40 (padded to 48), K = 12
// (padded to 16).
func.func @attn_mma_f16(%s: tensor<2x4x100x70xf16>, %u: tensor<2x100x64xf16>, %v: tensor<2x4x70x16xf16>, %wo: tensor<64x64xf16>, %e: tensor<2x70x16xf16>) -> (tensor<2x100x16xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<2x4x100x70xf16>, tensor<2x100x64xf16>, tensor<2x4x70x16xf16>, tensor<64x64xf16>, tensor<2x70x16xf16> -> tensor<2x100x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x100x16xf32>, tensor<2xi32>
}
func.func @attn_mma_bf16(%s: tensor<2x4x70x45xbf16>, %u: tensor<2x70x40xbf16>, %v: tensor<2x4x45x8xbf16>, %wo: tensor<40x32xbf16>, %e: tensor<2x45x12xbf16>) -> (tensor<2x70x12xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(1.500000e+00) head_scale(1.000000e+00) : tensor<2x4x70x45xbf16>, tensor<2x70x40xbf16>, tensor<2x4x45x8xbf16>, tensor<40x32xbf16>, tensor<2x45x12xbf16> -> tensor<2x70x12xf32>, tensor<2xi32>
  return %p, %h : tensor<2x70x12xf32>, tensor<2xi32>
}
func.func @attn_topk_mma_f16(%s: tensor<2x4x100x70xf16>, %u: tensor<2x100x64xf16>, %v: tensor<2x4x70x16xf16>, %wo: tensor<64x64xf16>, %e: tensor<2x70x16xf16>) -> (tensor<2x100x3xf32>, tensor<2x100x3xi32>, tensor<2xi32>) {
  %w, %i, %h = moe.attention_posterior_topk %s, %u, %v, %wo, %e k(3) sigma(2.000000e+00) : tensor<2x4x100x70xf16>, tensor<2x100x64xf16>, tensor<2x4x70x16xf16>, tensor<64x64xf16>, tensor<2x70x16xf16> -> tensor<2x100x3xf32>, tensor<2x100x3xi32>, tensor<2xi32>
  return %w, %i, %h : tensor<2x100x3xf32>, tensor<2x100x3xi32>, tensor<2xi32>
}
func.func @attn_bf16(%s: tensor<2x4x50x60xbf16>, %u: tensor<2x50x32xbf16>, %v: tensor<2x4x60x8xbf16>, %wo: tensor<32x32xbf16>, %e: tensor<2x60x16xbf16>) -> (tensor<2x50x16xf32>, tensor<2xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) head_scale(1.000000e+00) : tensor<2x4x50x60xbf16>, tensor<2x50x32xbf16>, tensor<2x4x60x8xbf16>, tensor<32x32xbf16>, tensor<2x60x16xbf16> -> tensor<2x50x16xf32>, tensor<2xi32>
  return %p, %h : tensor<2x50x16xf32>, tensor<2xi32>
}
func.func @mad_global(%x: tensor<300x24xf16>, %a: tensor<300xi32>) -> (tensor<6x24xf32>, tensor<6xi32>) {
  %w, %c = moe.mad_dispersion %x, %a num_experts(6) eps(1.000000e-03) clip(0.000000e+00) normalize(global) : tensor<300x24xf16>, tensor<300xi32> -> tensor<6x24xf32>, tensor<6xi32>
  return %w, %c : tensor<6x24xf32>, tensor<6xi32>
}
func.func @adj_none(%a: tensor<8x8xf16>, %idx: tensor<100x2xi64>) -> tensor<8x8xf32> {
  %n = moe.adjacency_update %a, %idx beta(2.500000e-01) norm(none) : tensor<8x8xf16>, tensor<100x2xi64> -> tensor<8x8xf32>
  return %n : tensor<8x8xf32>
}
func.func @hyper_bf16(%emb: tensor<16xbf16>, %w1: tensor<24x16xbf16>, %b1: tensor<24xbf16>, %w2: tensor<36x24xbf16>, %b2: tensor<36xbf16>) -> (tensor<4x8xf32>, tensor<4xf32>) {
  %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(4) : tensor<16xbf16>, tensor<24x16xbf16>, tensor<24xbf16>, tensor<36x24xbf16>, tensor<36xbf16> -> tensor<4x8xf32>, tensor<4xf32>
  return %w, %b : tensor<4x8xf32>, tensor<4xf32>
}

// The hypernetwork's backward: static f32 with every gradient; a frozen
// hypernetwork (d_w1, d_w2 unused) in bf16 with dynamic shapes.
func.func @hyper_grad(%emb: tensor<40xf32>, %w1: tensor<250x40xf32>, %b1: tensor<250xf32>, %w2: tensor<1616x250xf32>, %b2: tensor<1616xf32>, %dw: tensor<16x100xf32>, %db: tensor<16xf32>) -> (tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32>) {
  %a, %c, %d, %e, %f = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<16x100xf32>) db(%db : tensor<16xf32>) num_experts(16) : tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32> -> tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32>
  return %a, %c, %d, %e, %f : tensor<40xf32>, tensor<250x40xf32>, tensor<250xf32>, tensor<1616x250xf32>, tensor<1616xf32>
}
func.func @hyper_grad_frozen_bf16(%emb: tensor<?xbf16>, %w1: tensor<?x?xbf16>, %b1: tensor<?xbf16>, %w2: tensor<?x?xbf16>, %b2: tensor<?xbf16>, %dw: tensor<4x?xf32>, %db: tensor<4xf32>) -> (tensor<?xf32>, tensor<?xf32>, tensor<?xf32>) {
  %a, %c, %d, %e, %f = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2 dw(%dw : tensor<4x?xf32>) db(%db : tensor<4xf32>) num_experts(4) : tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16>, tensor<?x?xbf16>, tensor<?xbf16> -> tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>, tensor<?x?xf32>, tensor<?xf32>
  return %a, %d, %f : tensor<?xf32>, tensor<?xf32>, tensor<?xf32>
}

// Production routing (moe.route, moe.dispatch_plan).
func.func @route_deepseek_v3(%l: tensor<300x256xf32>, %b: tensor<256xf32>) -> (tensor<300x8xf32>, tensor<300x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<300x256xf32> -> tensor<300x8xf32>, tensor<300x8xi32>
  return %w, %i : tensor<300x8xf32>, tensor<300x8xi32>
}
func.func @route_deepseek_v4(%l: tensor<300x256xf32>, %b: tensor<256xf32>) -> (tensor<300x8xf32>, tensor<300x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(custom) renormalize(true) routed_scaling_factor(2.500000e+00) score {
  ^bb0(%x: f32):
    %zero = arith.constant 0.000000e+00 : f32
    %a = math.absf %x : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %s = math.log1p %e : f32
    %m = arith.maximumf %x, %zero : f32
    %sp = arith.addf %s, %m : f32
    %r = math.sqrt %sp : f32
    moe.yield %r : f32
  } : tensor<300x256xf32> -> tensor<300x8xf32>, tensor<300x8xi32>
  return %w, %i : tensor<300x8xf32>, tensor<300x8xi32>
}
func.func @route_kimi_k2(%l: tensor<64x384xbf16>, %b: tensor<384xf32>) -> (tensor<64x8xf32>, tensor<64x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<384xf32>) k(8) scoring(sigmoid) renormalize(true) routed_scaling_factor(2.827000e+00) : tensor<64x384xbf16> -> tensor<64x8xf32>, tensor<64x8xi32>
  return %w, %i : tensor<64x8xf32>, tensor<64x8xi32>
}
func.func @route_deepseek_v2(%l: tensor<40x160xf32>) -> (tensor<40x6xf32>, tensor<40x6xi32>) {
  %w, %i = moe.route %l k(6) n_group(8) topk_group(3) group_score(max) routed_scaling_factor(1.600000e+01) : tensor<40x160xf32> -> tensor<40x6xf32>, tensor<40x6xi32>
  return %w, %i : tensor<40x6xf32>, tensor<40x6xi32>
}
func.func @route_qwen3(%l: tensor<77x128xf16>) -> (tensor<77x8xf32>, tensor<77x8xi32>) {
  %w, %i = moe.route %l k(8) renormalize(true) : tensor<77x128xf16> -> tensor<77x8xf32>, tensor<77x8xi32>
  return %w, %i : tensor<77x8xf32>, tensor<77x8xi32>
}
func.func @route_gpt_oss(%l: tensor<100x20xf32>) -> (tensor<100x4xf32>, tensor<100x4xi32>) {
  %w, %i = moe.route %l k(4) order(topk_then_score) : tensor<100x20xf32> -> tensor<100x4xf32>, tensor<100x4xi32>
  return %w, %i : tensor<100x4xf32>, tensor<100x4xi32>
}
func.func @route_llama4(%l: tensor<50x16xf32>) -> (tensor<50x1xf32>, tensor<50x1xi32>) {
  %w, %i = moe.route %l k(1) scoring(sigmoid) order(topk_then_score) : tensor<50x16xf32> -> tensor<50x1xf32>, tensor<50x1xi32>
  return %w, %i : tensor<50x1xf32>, tensor<50x1xi32>
}
func.func @route_k_eq_e(%l: tensor<9x6xf32>) -> (tensor<9x6xf32>, tensor<9x6xi32>) {
  %w, %i = moe.route %l k(6) renormalize(true) : tensor<9x6xf32> -> tensor<9x6xf32>, tensor<9x6xi32>
  return %w, %i : tensor<9x6xf32>, tensor<9x6xi32>
}
// The shapes of route-map=lanes's mappings (RouteLanes.cpp; in the default build, the warp kernel's): E not a
// power of two, k = 32, groups over 2 and 4 lanes, 8 groups a lane, 6 groups on 8 lanes, f16/bf16.
func.func @route_shapes_288_k32(%l: tensor<300x288xf32>) -> (tensor<300x32xf32>, tensor<300x32xi32>) {
  %w, %i = moe.route %l k(32) renormalize(true) : tensor<300x288xf32> -> tensor<300x32xf32>, tensor<300x32xi32>
  return %w, %i : tensor<300x32xf32>, tensor<300x32xi32>
}
func.func @route_shapes_896_bf16(%l: tensor<300x896xbf16>, %b: tensor<896xf32>) -> (tensor<300x16xf32>, tensor<300x16xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<896xf32>) k(16) scoring(sigmoid) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<300x896xbf16> -> tensor<300x16xf32>, tensor<300x16xi32>
  return %w, %i : tensor<300x16xf32>, tensor<300x16xi32>
}
func.func @route_shapes_1024_g8(%l: tensor<200x1024xf32>, %b: tensor<1024xf32>) -> (tensor<200x8xf32>, tensor<200x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<1024xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<200x1024xf32> -> tensor<200x8xf32>, tensor<200x8xi32>
  return %w, %i : tensor<200x8xf32>, tensor<200x8xi32>
}
func.func @route_shapes_256_g4_f16(%l: tensor<300x256xf16>) -> (tensor<300x8xf32>, tensor<300x8xi32>) {
  %w, %i = moe.route %l k(8) n_group(4) topk_group(2) group_score(max) renormalize(true) : tensor<300x256xf16> -> tensor<300x8xf32>, tensor<300x8xi32>
  return %w, %i : tensor<300x8xf32>, tensor<300x8xi32>
}
func.func @route_shapes_192_g6(%l: tensor<300x192xf32>, %b: tensor<192xf32>) -> (tensor<300x6xf32>, tensor<300x6xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<192xf32>) k(6) scoring(sigmoid) n_group(6) topk_group(3) renormalize(true) : tensor<300x192xf32> -> tensor<300x6xf32>, tensor<300x6xi32>
  return %w, %i : tensor<300x6xf32>, tensor<300x6xi32>
}
func.func @route_shapes_64_g16(%l: tensor<300x64xf32>) -> (tensor<300x8xf32>, tensor<300x8xi32>) {
  %w, %i = moe.route %l k(8) n_group(16) topk_group(4) renormalize(true) : tensor<300x64xf32> -> tensor<300x8xf32>, tensor<300x8xi32>
  return %w, %i : tensor<300x8xf32>, tensor<300x8xi32>
}
// Groups that split neither evenly over lanes nor whole on one, past 1024 experts: 3 of 700 spread over 8 lanes of
// 88 slots, the last 4 empty (route-map=lanes's padded layout).
func.func @route_shapes_2100_g3(%l: tensor<150x2100xf32>, %b: tensor<2100xf32>) -> (tensor<150x8xf32>, tensor<150x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<2100xf32>) k(8) scoring(sigmoid) n_group(3) topk_group(2) renormalize(true) : tensor<150x2100xf32> -> tensor<150x8xf32>, tensor<150x8xi32>
  return %w, %i : tensor<150x8xf32>, tensor<150x8xi32>
}
// 128 f32 logits and biases a lane: the lanes kernel forms the keys 64 slots at a time.
func.func @route_shapes_4096_f32_bias(%l: tensor<70x4096xf32>, %b: tensor<4096xf32>) -> (tensor<70x8xf32>, tensor<70x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<4096xf32>) k(8) scoring(sigmoid) n_group(64) topk_group(8) renormalize(true) : tensor<70x4096xf32> -> tensor<70x8xf32>, tensor<70x8xi32>
  return %w, %i : tensor<70x8xf32>, tensor<70x8xi32>
}

// Shapes the lanes' layout does not take, past 1024 experts: the loop kernel (5 groups of 819; 64 of 65, 8 kept).
func.func @route_shapes_4095_g5(%l: tensor<70x4095xf32>, %b: tensor<4095xf32>) -> (tensor<70x8xf32>, tensor<70x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<4095xf32>) k(8) scoring(sigmoid) n_group(5) topk_group(2) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<70x4095xf32> -> tensor<70x8xf32>, tensor<70x8xi32>
  return %w, %i : tensor<70x8xf32>, tensor<70x8xi32>
}

func.func @route_shapes_4160_g64_bf16(%l: tensor<70x4160xbf16>, %b: tensor<4160xf32>) -> (tensor<70x8xf32>, tensor<70x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<4160xf32>) k(8) scoring(sigmoid) n_group(64) topk_group(8) renormalize(true) : tensor<70x4160xbf16> -> tensor<70x8xf32>, tensor<70x8xi32>
  return %w, %i : tensor<70x8xf32>, tensor<70x8xi32>
}

// Routing replay (the choice given): on the kernel that routes the shape (route-map=lanes by default), so that a
// router's own choice replayed gives its weights bit for bit; i64 and i32 indices.
func.func @route_deepseek_v3_replay(%l: tensor<300x256xf32>, %b: tensor<256xf32>, %r: tensor<300x8xi64>) -> (tensor<300x8xf32>, tensor<300x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) replay(%r : tensor<300x8xi64>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<300x256xf32> -> tensor<300x8xf32>, tensor<300x8xi32>
  return %w, %i : tensor<300x8xf32>, tensor<300x8xi32>
}
func.func @route_deepseek_v2_replay(%l: tensor<40x160xf32>, %r: tensor<40x6xi32>) -> (tensor<40x6xf32>, tensor<40x6xi32>) {
  %w, %i = moe.route %l replay(%r : tensor<40x6xi32>) k(6) n_group(8) topk_group(3) group_score(max) routed_scaling_factor(1.600000e+01) : tensor<40x160xf32> -> tensor<40x6xf32>, tensor<40x6xi32>
  return %w, %i : tensor<40x6xf32>, tensor<40x6xi32>
}
func.func @route_no_tokens(%l: tensor<?x256xf32>, %b: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>) {
  %w, %i = moe.route %l bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  return %w, %i : tensor<?x8xf32>, tensor<?x8xi32>
}
func.func @plan_deepseek(%idx: tensor<?x8xi32>) -> (tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(256) block_size(64) : tensor<?x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n : tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}
// DeepSeek-V3's route followed by the plan of its picks: one host code, four kernels back to back (Route.cpp).
func.func @route_plan_deepseek(%l: tensor<?x256xf32>, %bias: tensor<256xf32>) -> (tensor<?x8xf32>, tensor<?x8xi32>, tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>) {
  %w, %i = moe.route %l bias(%bias : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %i num_experts(256) block_size(64) : tensor<?x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  return %w, %i, %c, %o, %ord, %inv, %p, %b, %n : tensor<?x8xf32>, tensor<?x8xi32>, tensor<256xi32>, tensor<257xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}
func.func @plan_small(%idx: tensor<?x3xi64>) -> (tensor<7xi32>, tensor<8xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(7) : tensor<?x3xi64> -> tensor<7xi32>, tensor<8xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n : tensor<7xi32>, tensor<8xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}
func.func @simgrad_causal(%u: tensor<2x67x40xf32>, %e: tensor<2x67x16xf32>, %dp: tensor<2x67x16xf32>) -> (tensor<2x67x40xf32>, tensor<2x67x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x67x16xf32>) tau(5.000000e-01) causal(true) : tensor<2x67x40xf32>, tensor<2x67x16xf32> -> tensor<2x67x40xf32>, tensor<2x67x16xf32>
  return %du, %de : tensor<2x67x40xf32>, tensor<2x67x16xf32>
}
func.func @simgrad_ws_mask(%u: tensor<2x70x40xbf16>, %e: tensor<2x70x24xf32>, %ws: tensor<40x40xf32>, %m: tensor<2x70xi1>, %dp: tensor<2x70x24xf32>) -> (tensor<2x70x40xf32>, tensor<2x70x24xf32>, tensor<40x40xf32>) {
  %du, %de, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<40x40xf32>) key_mask(%m : tensor<2x70xi1>) dp(%dp : tensor<2x70x24xf32>) tau(4.000000e+00) : tensor<2x70x40xbf16>, tensor<2x70x24xf32> -> tensor<2x70x40xf32>, tensor<2x70x24xf32>, tensor<40x40xf32>
  return %du, %de, %dws : tensor<2x70x40xf32>, tensor<2x70x24xf32>, tensor<40x40xf32>
}
func.func @simgrad_causal_mask(%u: tensor<2x45x16xf32>, %e: tensor<2x45x8xf32>, %m: tensor<2x45xi1>, %dp: tensor<2x45x8xf32>) -> (tensor<2x45x16xf32>, tensor<2x45x8xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<2x45xi1>) dp(%dp : tensor<2x45x8xf32>) tau(2.500000e-01) causal(true) : tensor<2x45x16xf32>, tensor<2x45x8xf32> -> tensor<2x45x16xf32>, tensor<2x45x8xf32>
  return %du, %de : tensor<2x45x16xf32>, tensor<2x45x8xf32>
}
func.func @simgrad_one(%u: tensor<1x1x8xf32>, %e: tensor<1x1x4xf32>, %dp: tensor<1x1x4xf32>) -> (tensor<1x1x8xf32>, tensor<1x1x4xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x1x4xf32>) : tensor<1x1x8xf32>, tensor<1x1x4xf32> -> tensor<1x1x8xf32>, tensor<1x1x4xf32>
  return %du, %de : tensor<1x1x8xf32>, tensor<1x1x4xf32>
}
func.func @simgrad_k256(%u: tensor<1x33x24xf16>, %e: tensor<1x33x256xf32>, %ws: tensor<24x24xf32>, %dp: tensor<1x33x256xf32>) -> (tensor<1x33x24xf32>, tensor<1x33x256xf32>, tensor<24x24xf32>) {
  %du, %de, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<24x24xf32>) dp(%dp : tensor<1x33x256xf32>) causal(true) : tensor<1x33x24xf16>, tensor<1x33x256xf32> -> tensor<1x33x24xf32>, tensor<1x33x256xf32>, tensor<24x24xf32>
  return %du, %de, %dws : tensor<1x33x24xf32>, tensor<1x33x256xf32>, tensor<24x24xf32>
}
func.func @simgrad_mma_bf16(%u: tensor<2x200x64xbf16>, %e: tensor<2x200x16xbf16>, %m: tensor<2x200xi1>, %dp: tensor<2x200x16xf32>) -> (tensor<2x200x64xf32>, tensor<2x200x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<2x200xi1>) dp(%dp : tensor<2x200x16xf32>) tau(5.000000e-01) causal(true) : tensor<2x200x64xbf16>, tensor<2x200x16xbf16> -> tensor<2x200x64xf32>, tensor<2x200x16xf32>
  return %du, %de : tensor<2x200x64xf32>, tensor<2x200x16xf32>
}
func.func @simgrad_mma_f16_wide(%u: tensor<1x?x128xf16>, %e: tensor<1x?x64xf16>, %dp: tensor<1x?x64xf32>) -> (tensor<1x?x128xf32>, tensor<1x?x64xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x?x64xf32>) tau(2.000000e+00) : tensor<1x?x128xf16>, tensor<1x?x64xf16> -> tensor<1x?x128xf32>, tensor<1x?x64xf32>
  return %du, %de : tensor<1x?x128xf32>, tensor<1x?x64xf32>
}
func.func @simgrad_mma_bf16_d256(%u: tensor<2x?x256xbf16>, %e: tensor<2x?x64xbf16>, %m: tensor<2x?xi1>, %dp: tensor<2x?x64xf32>) -> (tensor<2x?x256xf32>, tensor<2x?x64xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e key_mask(%m : tensor<2x?xi1>) dp(%dp : tensor<2x?x64xf32>) tau(2.000000e+00) causal(true) : tensor<2x?x256xbf16>, tensor<2x?x64xbf16> -> tensor<2x?x256xf32>, tensor<2x?x64xf32>
  return %du, %de : tensor<2x?x256xf32>, tensor<2x?x64xf32>
}
func.func @apgrad(%s: tensor<2x4x50x60xf32>, %u: tensor<2x50x32xf32>, %v: tensor<2x4x60x8xf32>, %wo: tensor<32x32xf32>, %e: tensor<2x60x16xf32>, %h: tensor<2xi32>, %dp: tensor<2x50x16xf32>) -> (tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<2xi32>) dp(%dp : tensor<2x50x16xf32>) sigma(2.000000e+00) : tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32> -> tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32>
  return %ds, %du, %dv, %dwo, %de : tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32>
}
func.func @apgrad_bf16(%s: tensor<2x4x50x60xbf16>, %u: tensor<2x50x32xbf16>, %v: tensor<2x4x60x8xbf16>, %wo: tensor<32x32xbf16>, %e: tensor<2x60x16xbf16>, %h: tensor<2xi32>, %dp: tensor<2x50x16xf32>) -> (tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<2xi32>) dp(%dp : tensor<2x50x16xf32>) sigma(2.000000e+00) head_scale(1.000000e+00) : tensor<2x4x50x60xbf16>, tensor<2x50x32xbf16>, tensor<2x4x60x8xbf16>, tensor<32x32xbf16>, tensor<2x60x16xbf16> -> tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32>
  return %ds, %du, %dv, %dwo, %de : tensor<2x4x50x60xf32>, tensor<2x50x32xf32>, tensor<2x4x60x8xf32>, tensor<32x32xf32>, tensor<2x60x16xf32>
}
func.func @apgrad_one(%s: tensor<1x2x1x33xf32>, %u: tensor<1x1x12xf32>, %v: tensor<1x2x33x4xf32>, %wo: tensor<12x8xf32>, %e: tensor<1x33x8xf32>, %h: tensor<1xi32>, %dp: tensor<1x1x8xf32>) -> (tensor<1x2x1x33xf32>, tensor<1x1x12xf32>, tensor<1x2x33x4xf32>, tensor<12x8xf32>, tensor<1x33x8xf32>) {
  %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %s, %u, %v, %wo, %e head(%h : tensor<1xi32>) dp(%dp : tensor<1x1x8xf32>) sigma(5.000000e-01) : tensor<1x2x1x33xf32>, tensor<1x1x12xf32>, tensor<1x2x33x4xf32>, tensor<12x8xf32>, tensor<1x33x8xf32> -> tensor<1x2x1x33xf32>, tensor<1x1x12xf32>, tensor<1x2x33x4xf32>, tensor<12x8xf32>, tensor<1x33x8xf32>
  return %ds, %du, %dv, %dwo, %de : tensor<1x2x1x33xf32>, tensor<1x1x12xf32>, tensor<1x2x33x4xf32>, tensor<12x8xf32>, tensor<1x33x8xf32>
}

// The load-balancing ops (MoEBalanceOps.td; RouterStats.cpp, RouterZLoss.cpp),
// whose GPU kernels sit behind moe-lower-to-nvvm balance-kernels=true (on by
// default; scripts/gpu-check.sh and the line below still name it for this
// file). Every row kernel is a warp per row striding
// over the experts 32 at a time and router_stats/router_z_loss cut the tokens
// into row blocks of 64: E = 8 (one partial chunk), 64, 100 (a lane tail), 256
// and 2048 (many chunks; router_stats_sum over several thread blocks), T past
// one row block with a short last block, one and zero tokens (the token
// dimension is dynamic), f32/bf16 logits, f32/bf16 token masks, k = 1 and
// k = E, a dynamic E.
// ptxas-options: balance-kernels=true
func.func @bal_stats_e8(%l: tensor<?x8xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l k(2) : tensor<?x8xf32> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
  return %c, %p, %w : tensor<8xf32>, tensor<8xf32>, tensor<f32>
}
func.func @bal_stats_e8_kE_mask(%l: tensor<?x8xf32>, %m: tensor<?xf32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<?xf32>) k(8) : tensor<?x8xf32> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
  return %c, %p, %w : tensor<8xf32>, tensor<8xf32>, tensor<f32>
}
func.func @bal_stats_e64_bf16_mask(%l: tensor<?x64xbf16>, %m: tensor<?xf32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<?xf32>) k(2) : tensor<?x64xbf16> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
  return %c, %p, %w : tensor<64xf32>, tensor<64xf32>, tensor<f32>
}
func.func @bal_stats_e64_kE(%l: tensor<?x64xf32>) -> (tensor<64xf32>, tensor<64xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l k(64) : tensor<?x64xf32> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
  return %c, %p, %w : tensor<64xf32>, tensor<64xf32>, tensor<f32>
}
func.func @bal_stats_e100_k1(%l: tensor<?x100xf32>) -> (tensor<100xf32>, tensor<100xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l k(1) : tensor<?x100xf32> -> tensor<100xf32>, tensor<100xf32>, tensor<f32>
  return %c, %p, %w : tensor<100xf32>, tensor<100xf32>, tensor<f32>
}
func.func @bal_stats_e256_bf16mask(%l: tensor<?x256xf32>, %m: tensor<?xbf16>) -> (tensor<256xf32>, tensor<256xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<?xbf16>) k(8) : tensor<?x256xf32> -> tensor<256xf32>, tensor<256xf32>, tensor<f32>
  return %c, %p, %w : tensor<256xf32>, tensor<256xf32>, tensor<f32>
}
func.func @bal_stats_e2048_bf16(%l: tensor<?x2048xbf16>) -> (tensor<2048xf32>, tensor<2048xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l k(4) : tensor<?x2048xbf16> -> tensor<2048xf32>, tensor<2048xf32>, tensor<f32>
  return %c, %p, %w : tensor<2048xf32>, tensor<2048xf32>, tensor<f32>
}
func.func @bal_stats_dyn(%l: tensor<?x?xf32>, %m: tensor<?xf32>) -> (tensor<?xf32>, tensor<?xf32>, tensor<f32>) {
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<?xf32>) k(3) : tensor<?x?xf32> -> tensor<?xf32>, tensor<?xf32>, tensor<f32>
  return %c, %p, %w : tensor<?xf32>, tensor<?xf32>, tensor<f32>
}
func.func @bal_stats_grad_e8(%l: tensor<?x8xf32>, %w: tensor<f32>, %g: tensor<8xf32>) -> tensor<?x8xf32> {
  %d = moe.router_stats_grad %l weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<8xf32>) : tensor<?x8xf32> -> tensor<?x8xf32>
  return %d : tensor<?x8xf32>
}
func.func @bal_stats_grad_e64_bf16_mask(%l: tensor<?x64xbf16>, %m: tensor<?xf32>, %w: tensor<f32>, %g: tensor<64xf32>) -> tensor<?x64xf32> {
  %d = moe.router_stats_grad %l token_mask(%m : tensor<?xf32>) weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<64xf32>) : tensor<?x64xbf16> -> tensor<?x64xf32>
  return %d : tensor<?x64xf32>
}
func.func @bal_stats_grad_e100_mask(%l: tensor<?x100xf32>, %m: tensor<?xf32>, %w: tensor<f32>, %g: tensor<100xf32>) -> tensor<?x100xf32> {
  %d = moe.router_stats_grad %l token_mask(%m : tensor<?xf32>) weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<100xf32>) : tensor<?x100xf32> -> tensor<?x100xf32>
  return %d : tensor<?x100xf32>
}
func.func @bal_stats_grad_e256(%l: tensor<?x256xf32>, %w: tensor<f32>, %g: tensor<256xf32>) -> tensor<?x256xf32> {
  %d = moe.router_stats_grad %l weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<256xf32>) : tensor<?x256xf32> -> tensor<?x256xf32>
  return %d : tensor<?x256xf32>
}
func.func @bal_stats_grad_e2048_bf16(%l: tensor<?x2048xbf16>, %w: tensor<f32>, %g: tensor<2048xf32>) -> tensor<?x2048xf32> {
  %d = moe.router_stats_grad %l weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<2048xf32>) : tensor<?x2048xbf16> -> tensor<?x2048xf32>
  return %d : tensor<?x2048xf32>
}
func.func @bal_loss_e8(%c: tensor<8xf32>, %p: tensor<8xf32>, %w: tensor<f32>) -> tensor<f32> {
  %l = moe.load_balancing_loss %c, %p, %w : tensor<8xf32>, tensor<8xf32>, tensor<f32> -> tensor<f32>
  return %l : tensor<f32>
}
func.func @bal_loss_dyn(%c: tensor<?xf32>, %p: tensor<?xf32>, %w: tensor<f32>) -> tensor<f32> {
  %l = moe.load_balancing_loss %c, %p, %w : tensor<?xf32>, tensor<?xf32>, tensor<f32> -> tensor<f32>
  return %l : tensor<f32>
}
// transformers' load_balancing_loss_func end to end (its attention-mask form).
func.func @bal_switch_e64_bf16_mask(%l: tensor<?x64xbf16>, %m: tensor<?xf32>) -> tensor<f32> {
  %c, %p, %w = moe.router_stats %l token_mask(%m : tensor<?xf32>) k(2) : tensor<?x64xbf16> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
  %loss = moe.load_balancing_loss %c, %p, %w : tensor<64xf32>, tensor<64xf32>, tensor<f32> -> tensor<f32>
  return %loss : tensor<f32>
}
func.func @bal_z_e8(%l: tensor<?x8xf32>) -> tensor<f32> {
  %z = moe.router_z_loss %l : tensor<?x8xf32> -> tensor<f32>
  return %z : tensor<f32>
}
func.func @bal_z_e64_bf16(%l: tensor<?x64xbf16>) -> tensor<f32> {
  %z = moe.router_z_loss %l : tensor<?x64xbf16> -> tensor<f32>
  return %z : tensor<f32>
}
func.func @bal_z_e256(%l: tensor<?x256xf32>) -> tensor<f32> {
  %z = moe.router_z_loss %l : tensor<?x256xf32> -> tensor<f32>
  return %z : tensor<f32>
}
func.func @bal_z_e2048_bf16(%l: tensor<?x2048xbf16>) -> tensor<f32> {
  %z = moe.router_z_loss %l : tensor<?x2048xbf16> -> tensor<f32>
  return %z : tensor<f32>
}
func.func @bal_zgrad_e8(%l: tensor<?x8xf32>, %d: tensor<f32>) -> tensor<?x8xf32> {
  %g = moe.router_z_loss_grad %l dloss(%d : tensor<f32>) : tensor<?x8xf32> -> tensor<?x8xf32>
  return %g : tensor<?x8xf32>
}
func.func @bal_zgrad_e64_bf16(%l: tensor<?x64xbf16>, %d: tensor<f32>) -> tensor<?x64xf32> {
  %g = moe.router_z_loss_grad %l dloss(%d : tensor<f32>) : tensor<?x64xbf16> -> tensor<?x64xf32>
  return %g : tensor<?x64xf32>
}
func.func @bal_zgrad_e100(%l: tensor<?x100xf32>, %d: tensor<f32>) -> tensor<?x100xf32> {
  %g = moe.router_z_loss_grad %l dloss(%d : tensor<f32>) : tensor<?x100xf32> -> tensor<?x100xf32>
  return %g : tensor<?x100xf32>
}
func.func @bal_zgrad_e256(%l: tensor<?x256xf32>, %d: tensor<f32>) -> tensor<?x256xf32> {
  %g = moe.router_z_loss_grad %l dloss(%d : tensor<f32>) : tensor<?x256xf32> -> tensor<?x256xf32>
  return %g : tensor<?x256xf32>
}
func.func @bal_zgrad_e2048_bf16(%l: tensor<?x2048xbf16>, %d: tensor<f32>) -> tensor<?x2048xf32> {
  %g = moe.router_z_loss_grad %l dloss(%d : tensor<f32>) : tensor<?x2048xbf16> -> tensor<?x2048xf32>
  return %g : tensor<?x2048xf32>
}
