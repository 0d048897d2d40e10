// Cases of the static SASS budget (bench/gpu/sass_budget.py, test/GPU/sass-budget.mlir):
// the routing kernels at the shapes of the GPU benchmark (bench/cases.py:gpu_cases()), whose
// kernel times bench/results/gpu-2026-11-24-h100.md holds, plus Kimi-K2's router, the dispatch
// plan and the seed routers' mixing kernels.
//
// A `// sass-budget:` line before a function describes how its selection kernel maps the work,
// for the per-element and per-token figures (the script's docstring says how each is used):
//   kernel=PREFIX           the kernel (name up to its numeric suffix) the line is about
//   elements-per-lane=N     scores a lane holds in registers in each selection round
//   tokens-per-warp=N       tokens one warp selects for (32 / lanes per token)
//   rounds=N                selection rounds per token (k)
//   experts=N               the row length (E or K)
//   loop-trips=N            times the selection loop's body runs per warp; without it, the
//                           rounds less those ptxas peeled off before the loop (counted by
//                           their SHFL/REDUX: right where the rounds' reductions are the
//                           kernel's only ones; route's group rankings are not, so its lines
//                           say 8: no round peeled, read from the SASS)
//   outer-trips=X           times per warp the code of a loop around the selection loop runs
//                           (outside it): a refill that only some warps make (default 1)
//   options=A=x,B=y         moe-lower-to-nvvm options the function is lowered with (a kernel
//                           variant behind an option: its own function, its own budget)
//   tokens=N, bench=NAME    the case's token count and its name in the GPU benchmark
//                           (bench/cases.py), for the calibration against measured times
//   predicts=NAME           a variant not yet run: its time predicted in place of NAME's
// When a kernel's mapping changes (lanes per token, elements per lane), its line changes in the
// same commit.

// sass-budget: kernel=topk_renorm_warp elements-per-lane=2 tokens-per-warp=1 rounds=8 experts=64 tokens=65536 bench=topk_logits_T65536_K64_k8 options=topk-rounds=redux
func.func @topk_logits_K64(%s: tensor<65536x64xf32>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<65536x64xf32> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=4 tokens-per-warp=1 rounds=8 experts=128 tokens=65536 bench=topk_logits_T65536_K128_k8 options=topk-rounds=redux
func.func @topk_logits_K128(%s: tensor<65536x128xf32>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<65536x128xf32> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=8 tokens-per-warp=1 rounds=8 experts=256 tokens=65536 bench=topk_logits_T65536_K256_k8 options=topk-rounds=redux
func.func @topk_logits_K256(%s: tensor<65536x256xf32>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<65536x256xf32> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=2 tokens-per-warp=1 rounds=8 experts=64 options=topk-rounds=redux
func.func @topk_probs_K64(%s: tensor<65536x64xf32>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) mode(probs) : tensor<65536x64xf32> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=4 tokens-per-warp=1 rounds=8 experts=128 tokens=65536 bench=topk_probs_T65536_K128_k8 options=topk-rounds=redux
func.func @topk_probs_K128(%s: tensor<65536x128xf32>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) mode(probs) : tensor<65536x128xf32> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=8 tokens-per-warp=1 rounds=8 experts=256 options=topk-rounds=redux
func.func @topk_probs_K256(%s: tensor<65536x256xf32>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) mode(probs) : tensor<65536x256xf32> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// topk-rounds=list (moe-lower-to-nvvm's choice on sm_80 and later, within list-redux): the same top-k, mapped by
// TopkRenorm.cpp's listMappingOf (4 lanes a token for K = 64, 8 for 128 and 256; 16 or 32 scores a
// lane). loop-trips=8: every round runs in the loop. outer-trips: the refills a warp makes, outside
// the rounds' loop (test/GPU/unit/test_topk_list_model.py on Gaussian rows, k = 8: 3.7-4.3% of
// tokens; per warp at most 0.29 / 0.15 / 0.17 at K = 64 / 128 / 256). The 4-byte-load fallback for
// misaligned rows counts as executed: the per-token figures are from above by ~n / tokens-per-warp.
// sass-budget: kernel=topk_renorm_warp elements-per-lane=16 tokens-per-warp=8 rounds=8 loop-trips=8 outer-trips=0.29 experts=64 tokens=65536 predicts=topk_logits_T65536_K64_k8 options=topk-rounds=list
func.func @topk_list_logits_K64(%s: tensor<65536x64xf32>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<65536x64xf32> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=16 tokens-per-warp=4 rounds=8 loop-trips=8 outer-trips=0.15 experts=128 tokens=65536 predicts=topk_logits_T65536_K128_k8 options=topk-rounds=list
func.func @topk_list_logits_K128(%s: tensor<65536x128xf32>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<65536x128xf32> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=32 tokens-per-warp=4 rounds=8 loop-trips=8 outer-trips=0.17 experts=256 tokens=65536 predicts=topk_logits_T65536_K256_k8 options=topk-rounds=list
func.func @topk_list_logits_K256(%s: tensor<65536x256xf32>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<65536x256xf32> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=16 tokens-per-warp=8 rounds=8 loop-trips=8 outer-trips=0.29 experts=64 options=topk-rounds=list
func.func @topk_list_logits_K64_bf16(%s: tensor<65536x64xbf16>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<65536x64xbf16> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=16 tokens-per-warp=4 rounds=8 loop-trips=8 outer-trips=0.15 experts=128 options=topk-rounds=list
func.func @topk_list_logits_K128_bf16(%s: tensor<65536x128xbf16>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<65536x128xbf16> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// sass-budget: kernel=topk_renorm_warp elements-per-lane=32 tokens-per-warp=4 rounds=8 loop-trips=8 outer-trips=0.17 experts=256 options=topk-rounds=list
func.func @topk_list_logits_K256_bf16(%s: tensor<65536x256xbf16>) -> (tensor<65536x8xf32>, tensor<65536x8xi32>) {
  %w, %i = moe.topk_renorm %s k(8) : tensor<65536x256xbf16> -> tensor<65536x8xf32>, tensor<65536x8xi32>
  return %w, %i : tensor<65536x8xf32>, tensor<65536x8xi32>
}
// DeepSeek-V3: E = 256, 8 groups of 32, the best 4 groups, k = 8 (bench: route_deepseek_v3_T8192).
// sass-budget: kernel=route_warp elements-per-lane=8 tokens-per-warp=1 rounds=8 loop-trips=8 experts=256 tokens=8192 bench=route_deepseek_v3_T8192 options=route-map=warp
func.func @route_deepseek_v3(%x: tensor<8192x256xf32>, %b: tensor<256xf32>) -> (tensor<8192x8xf32>, tensor<8192x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<8192x256xf32> -> tensor<8192x8xf32>, tensor<8192x8xi32>
  return %w, %i : tensor<8192x8xf32>, tensor<8192x8xi32>
}
// Kimi-K2: E = 384, one group, k = 8.
// sass-budget: kernel=route_warp elements-per-lane=12 tokens-per-warp=1 rounds=8 loop-trips=8 experts=384 tokens=8192 options=route-map=warp
func.func @route_kimi_k2(%x: tensor<8192x384xf32>, %b: tensor<384xf32>) -> (tensor<8192x8xf32>, tensor<8192x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<384xf32>) k(8) scoring(sigmoid) renormalize(true) routed_scaling_factor(2.827000e+00) : tensor<8192x384xf32> -> tensor<8192x8xf32>, tensor<8192x8xi32>
  return %w, %i : tensor<8192x8xf32>, tensor<8192x8xi32>
}
// route-map=lanes (the default): the route kernel mapped by RouteLanes.cpp's
// routeLanesMapOf (lanes a token sized by E, a contiguous run of experts a lane, groups ranked by shuffles,
// emitListTopk's lists). elements-per-lane: the run (P); loop-trips=8: every round in the loop. outer-trips:
// the refills a warp makes (test/GPU/unit/test_route_lanes_model.py, Gaussian logits: DeepSeek-V3 with sigmoid +
// a bias in [0, 0.1) 0.02 a warp, E = 160 k = 8 0.16, E = 384 0.01, E = 288 k = 32 2.4, E = 2048 0). The 4-byte
// load fallback for misaligned rows counts as executed, as for topk-rounds=list.
// sass-budget: kernel=route_lanes elements-per-lane=32 tokens-per-warp=4 rounds=8 loop-trips=8 outer-trips=0.02 experts=256 tokens=8192 predicts=route_deepseek_v3_T8192 options=route-map=lanes
func.func @route_lanes_deepseek_v3(%x: tensor<8192x256xf32>, %b: tensor<256xf32>) -> (tensor<8192x8xf32>, tensor<8192x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<8192x256xf32> -> tensor<8192x8xf32>, tensor<8192x8xi32>
  return %w, %i : tensor<8192x8xf32>, tensor<8192x8xi32>
}
// Kimi-K2: 16 lanes of 24 experts.
// sass-budget: kernel=route_lanes elements-per-lane=24 tokens-per-warp=2 rounds=8 loop-trips=8 outer-trips=0.01 experts=384 tokens=8192 options=route-map=lanes
func.func @route_lanes_kimi_k2(%x: tensor<8192x384xf32>, %b: tensor<384xf32>) -> (tensor<8192x8xf32>, tensor<8192x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<384xf32>) k(8) scoring(sigmoid) renormalize(true) routed_scaling_factor(2.827000e+00) : tensor<8192x384xf32> -> tensor<8192x8xf32>, tensor<8192x8xi32>
  return %w, %i : tensor<8192x8xf32>, tensor<8192x8xi32>
}
// GLM-4.5: E = 160 (not a power of two), 8 lanes of 20 experts.
// sass-budget: kernel=route_lanes elements-per-lane=20 tokens-per-warp=4 rounds=8 loop-trips=8 outer-trips=0.16 experts=160 tokens=8192 options=route-map=lanes
func.func @route_lanes_glm_e160(%x: tensor<8192x160xf32>, %b: tensor<160xf32>) -> (tensor<8192x8xf32>, tensor<8192x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<160xf32>) k(8) scoring(sigmoid) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<8192x160xf32> -> tensor<8192x8xf32>, tensor<8192x8xi32>
  return %w, %i : tensor<8192x8xf32>, tensor<8192x8xi32>
}
// E = 288, k = 32: 8 lanes of 36 experts, four picks a lane.
// sass-budget: kernel=route_lanes elements-per-lane=36 tokens-per-warp=4 rounds=32 loop-trips=32 outer-trips=2.4 experts=288 tokens=8192 options=route-map=lanes
func.func @route_lanes_e288_k32(%x: tensor<8192x288xf32>) -> (tensor<8192x32xf32>, tensor<8192x32xi32>) {
  %w, %i = moe.route %x k(32) renormalize(true) : tensor<8192x288xf32> -> tensor<8192x32xf32>, tensor<8192x32xi32>
  return %w, %i : tensor<8192x32xf32>, tensor<8192x32xi32>
}
// E = 2048 (past the warp kernel's 1024): a warp of 64 experts a lane, redux rounds.
// sass-budget: kernel=route_lanes elements-per-lane=64 tokens-per-warp=1 rounds=8 loop-trips=8 outer-trips=0 experts=2048 tokens=8192 options=route-map=lanes
func.func @route_lanes_e2048(%x: tensor<8192x2048xf32>) -> (tensor<8192x8xf32>, tensor<8192x8xi32>) {
  %w, %i = moe.route %x k(8) renormalize(true) : tensor<8192x2048xf32> -> tensor<8192x8xf32>, tensor<8192x8xi32>
  return %w, %i : tensor<8192x8xf32>, tensor<8192x8xi32>
}
// Issue #48 item 4's shapes without caps (route-map=lanes): 32 groups of 64 (a group a lane), E = 4096 with
// k = 64 (32 lanes of 128, 64-thread blocks: routeLanesBlockSize), 64 groups of 64 (two a lane, bf16), E = 3000
// (96 a lane). outer-trips: the model's refills a token (Gaussian logits; sigmoid + bias where the case has them).
// sass-budget: kernel=route_lanes elements-per-lane=64 tokens-per-warp=1 rounds=8 loop-trips=8 outer-trips=0 experts=2048 tokens=8192 options=route-map=lanes
func.func @route_lanes_e2048_g32(%x: tensor<8192x2048xf32>, %b: tensor<2048xf32>) -> (tensor<8192x8xf32>, tensor<8192x8xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<2048xf32>) k(8) scoring(sigmoid) n_group(32) topk_group(4) renormalize(true) : tensor<8192x2048xf32> -> tensor<8192x8xf32>, tensor<8192x8xi32>
  return %w, %i : tensor<8192x8xf32>, tensor<8192x8xi32>
}
// sass-budget: kernel=route_lanes elements-per-lane=128 tokens-per-warp=1 rounds=64 loop-trips=64 outer-trips=1.2 experts=4096 tokens=8192 options=route-map=lanes
func.func @route_lanes_e4096_k64(%x: tensor<8192x4096xf32>) -> (tensor<8192x64xf32>, tensor<8192x64xi32>) {
  %w, %i = moe.route %x k(64) renormalize(true) : tensor<8192x4096xf32> -> tensor<8192x64xf32>, tensor<8192x64xi32>
  return %w, %i : tensor<8192x64xf32>, tensor<8192x64xi32>
}
// sass-budget: kernel=route_lanes elements-per-lane=128 tokens-per-warp=1 rounds=16 loop-trips=16 outer-trips=0 experts=4096 tokens=8192 options=route-map=lanes
func.func @route_lanes_e4096_g64(%x: tensor<8192x4096xbf16>, %b: tensor<4096xf32>) -> (tensor<8192x16xf32>, tensor<8192x16xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<4096xf32>) k(16) scoring(sigmoid) n_group(64) topk_group(8) renormalize(true) : tensor<8192x4096xbf16> -> tensor<8192x16xf32>, tensor<8192x16xi32>
  return %w, %i : tensor<8192x16xf32>, tensor<8192x16xi32>
}
// sass-budget: kernel=route_lanes elements-per-lane=96 tokens-per-warp=1 rounds=64 loop-trips=64 outer-trips=1.4 experts=3000 tokens=8192 options=route-map=lanes
func.func @route_lanes_e3000_k64(%x: tensor<8192x3000xf32>) -> (tensor<8192x64xf32>, tensor<8192x64xi32>) {
  %w, %i = moe.route %x k(64) scoring(sigmoid) renormalize(true) : tensor<8192x3000xf32> -> tensor<8192x64xf32>, tensor<8192x64xi32>
  return %w, %i : tensor<8192x64xf32>, tensor<8192x64xi32>
}
// DeepSeek-V3's route and the plan of its picks as one chain (route-map=lanes; Route.cpp lowers both in one
// host code: the four kernels launched back to back).
// sass-budget: kernel=route_lanes elements-per-lane=32 tokens-per-warp=4 rounds=8 loop-trips=8 outer-trips=0.02 experts=256 tokens=8192 options=route-map=lanes
func.func @route_plan_deepseek_v3(%x: tensor<8192x256xf32>, %b: tensor<256xf32>) -> (tensor<8192x8xf32>, tensor<256xi32>, tensor<257xi32>, tensor<65536xi32>, tensor<65536xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>) {
  %w, %i = moe.route %x bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.500000e+00) : tensor<8192x256xf32> -> tensor<8192x8xf32>, tensor<8192x8xi32>
  %c, %o, %ord, %inv, %p, %pb, %n = moe.dispatch_plan %i num_experts(256) block_size(64) : tensor<8192x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<65536xi32>, tensor<65536xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  return %w, %c, %o, %ord, %inv, %p, %pb, %n : tensor<8192x8xf32>, tensor<256xi32>, tensor<257xi32>, tensor<65536xi32>, tensor<65536xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}
// The dispatch plan of DeepSeek-V3's picks (8192 tokens x 8).
func.func @dispatch_plan(%idx: tensor<8192x8xi32>) -> (tensor<256xi32>, tensor<257xi32>, tensor<65536xi32>, tensor<65536xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>) {
  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %idx num_experts(256) block_size(64) : tensor<8192x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<65536xi32>, tensor<65536xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
  return %c, %o, %ord, %inv, %p, %b, %n : tensor<256xi32>, tensor<257xi32>, tensor<65536xi32>, tensor<65536xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>
}
// The seed routers' mixing kernels (bench: sim_B1_N16384_D64_K16, its bf16 form on tensor cores,
// attn_B16_H4_N1024_Nk1024_D256_Dh64_K16).
func.func @similarity_inform(%u: tensor<1x16384x64xf32>, %e: tensor<1x16384x16xf32>) -> tensor<1x16384x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) : tensor<1x16384x64xf32>, tensor<1x16384x16xf32> -> tensor<1x16384x16xf32>
  return %p : tensor<1x16384x16xf32>
}
// The f32 operands of the same shape on tensor cores by 3xTF32 (flash-mma-tf32, off by default):
// 4 warps of 16 rows, 64-key tiles (32 scores a thread a tile), three HMMA.1688 a product.
// sass-budget: kernel=similarity_inform_tf32 scores-per-tile=32 options=flash-mma-tf32=true
func.func @similarity_inform_f32_tf32(%u: tensor<1x16384x64xf32>, %e: tensor<1x16384x16xf32>) -> tensor<1x16384x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) : tensor<1x16384x64xf32>, tensor<1x16384x16xf32> -> tensor<1x16384x16xf32>
  return %p : tensor<1x16384x16xf32>
}
// The tensor-core kernel's key loop per score (issue #47 item 2: at most 6 instructions a score), the
// issue's two shapes: B = 1, N = 16384, D = 64, K = 16 (64-key tiles: a thread computes 32 scores a tile,
// 64 with two row tiles a warp) in the default kernel (two row tiles a warp, the keys split: 128 blocks of
// 128 rows at B = 1, N = 16384, under 264, take 3 splits; the lazy rescale's hot loop holds no row max,
// shuffle or rescale, the exact step, in the loop around it, runs for a tile where a row max grew past the
// margin: the sass budget reports its instructions beside the key loop's; three cp.async stages in dynamic
// shared memory), the same without the split (what a grid of 264 blocks or more runs), and the kernel of one
// row tile a warp (64 rows a block, two cp.async stages); causal B = 4, N = 4096, D = 256, K = 64 (one row
// tile there, 32-key tiles: 32 scores a tile; the whole tiles not peeled past 128 features: the peeled copy
// spilled at this static shape).
// sass-budget: kernel=similarity_inform_mma scores-per-tile=64
func.func @similarity_inform_bf16_rows128_split_lazy3(%u: tensor<1x16384x64xbf16>, %e: tensor<1x16384x16xbf16>) -> tensor<1x16384x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) : tensor<1x16384x64xbf16>, tensor<1x16384x16xbf16> -> tensor<1x16384x16xf32>
  return %p : tensor<1x16384x16xf32>
}
// sass-budget: kernel=similarity_inform_mma scores-per-tile=64 options=flash-mma-key-splits=1
func.func @similarity_inform_bf16_rows128_lazy3(%u: tensor<1x16384x64xbf16>, %e: tensor<1x16384x16xbf16>) -> tensor<1x16384x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) : tensor<1x16384x64xbf16>, tensor<1x16384x16xbf16> -> tensor<1x16384x16xf32>
  return %p : tensor<1x16384x16xf32>
}
// sass-budget: kernel=similarity_inform_mma scores-per-tile=32 options=flash-mma-block-rows=64,flash-mma-key-splits=1
func.func @similarity_inform_bf16_rows64(%u: tensor<1x16384x64xbf16>, %e: tensor<1x16384x16xbf16>) -> tensor<1x16384x16xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) : tensor<1x16384x64xbf16>, tensor<1x16384x16xbf16> -> tensor<1x16384x16xf32>
  return %p : tensor<1x16384x16xf32>
}
// The fused top-k (similarity_inform_topk, k = 2; bench: its bf16 case at B = 1, N = 16384): the same key loop
// with the selection in the epilogue, on the 128-row kernel with split keys (the defaults; the split pair's
// top-k combine takes a quad of lanes a row) and on the 64-row kernel (the fused top-k's only form before).
// sass-budget: kernel=similarity_inform_topk_mma scores-per-tile=64
func.func @similarity_inform_topk_bf16(%u: tensor<1x16384x64xbf16>, %e: tensor<1x16384x16xbf16>) -> (tensor<1x16384x2xf32>, tensor<1x16384x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) tau(1.000000e+00) : tensor<1x16384x64xbf16>, tensor<1x16384x16xbf16> -> tensor<1x16384x2xf32>, tensor<1x16384x2xi32>
  return %w, %i : tensor<1x16384x2xf32>, tensor<1x16384x2xi32>
}
// sass-budget: kernel=similarity_inform_topk_mma scores-per-tile=32 options=flash-mma-block-rows=64,flash-mma-key-splits=1
func.func @similarity_inform_topk_bf16_rows64(%u: tensor<1x16384x64xbf16>, %e: tensor<1x16384x16xbf16>) -> (tensor<1x16384x2xf32>, tensor<1x16384x2xi32>) {
  %w, %i = moe.similarity_inform_topk %u, %e k(2) tau(1.000000e+00) : tensor<1x16384x64xbf16>, tensor<1x16384x16xbf16> -> tensor<1x16384x2xf32>, tensor<1x16384x2xi32>
  return %w, %i : tensor<1x16384x2xf32>, tensor<1x16384x2xi32>
}
// flash-mma-grad (issue #47 item 3): similarity_inform_grad's tensor-core passes at the benchmark's shape, saved
// statistics. A trip of either pass's column loop computes 32 scores a thread (its warp's 16 rows x 64 columns over
// 32 lanes), each with S and <dp, e> on mma.sync, its weight, its logit cotangent and their products (dX U, and by
// key P dp): the backward's ~2.5x the forward's work a score. The key-major pass's dp tile is rounded element by
// element in a loop nested in the trip, not counted (its instructions beside the figure).
// sass-budget: kernel=similarity_inform_grad_dq_mma scores-per-tile=32 options=flash-mma-grad=true
func.func @similarity_inform_grad_bf16_dq(%u: tensor<1x16384x64xbf16>, %e: tensor<1x16384x16xbf16>, %dp: tensor<1x16384x16xf32>, %p: tensor<1x16384x16xf32>, %lse: tensor<1x16384xf32>) -> (tensor<1x16384x64xf32>, tensor<1x16384x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x16384x16xf32>) saved(%p, %lse : tensor<1x16384x16xf32>, tensor<1x16384xf32>) tau(1.000000e+00) : tensor<1x16384x64xbf16>, tensor<1x16384x16xbf16> -> tensor<1x16384x64xf32>, tensor<1x16384x16xf32>
  return %du, %de : tensor<1x16384x64xf32>, tensor<1x16384x16xf32>
}
// sass-budget: kernel=similarity_inform_grad_dk_mma scores-per-tile=32 options=flash-mma-grad=true
func.func @similarity_inform_grad_bf16_dk(%u: tensor<1x16384x64xbf16>, %e: tensor<1x16384x16xbf16>, %dp: tensor<1x16384x16xf32>, %p: tensor<1x16384x16xf32>, %lse: tensor<1x16384xf32>) -> (tensor<1x16384x64xf32>, tensor<1x16384x16xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<1x16384x16xf32>) saved(%p, %lse : tensor<1x16384x16xf32>, tensor<1x16384xf32>) tau(1.000000e+00) : tensor<1x16384x64xbf16>, tensor<1x16384x16xbf16> -> tensor<1x16384x64xf32>, tensor<1x16384x16xf32>
  return %du, %de : tensor<1x16384x64xf32>, tensor<1x16384x16xf32>
}
// Past 128 features, at the causal D = 256, K = 64 shape: each pass's feature split (two blocks, 128 of dq's or du's
// features each, the logits in full), 16-column tiles, 8 scores a thread a trip (16 rows x 16 columns over 32 lanes).
// sass-budget: kernel=similarity_inform_grad_dq_mma scores-per-tile=8 options=flash-mma-grad=true
func.func @similarity_inform_grad_bf16_causal_d256_dq(%u: tensor<4x4096x256xbf16>, %e: tensor<4x4096x64xbf16>, %dp: tensor<4x4096x64xf32>, %p: tensor<4x4096x64xf32>, %lse: tensor<4x4096xf32>) -> (tensor<4x4096x256xf32>, tensor<4x4096x64xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<4x4096x64xf32>) saved(%p, %lse : tensor<4x4096x64xf32>, tensor<4x4096xf32>) tau(1.000000e+00) causal(true) : tensor<4x4096x256xbf16>, tensor<4x4096x64xbf16> -> tensor<4x4096x256xf32>, tensor<4x4096x64xf32>
  return %du, %de : tensor<4x4096x256xf32>, tensor<4x4096x64xf32>
}
// sass-budget: kernel=similarity_inform_grad_dk_mma scores-per-tile=8 options=flash-mma-grad=true
func.func @similarity_inform_grad_bf16_causal_d256_dk(%u: tensor<4x4096x256xbf16>, %e: tensor<4x4096x64xbf16>, %dp: tensor<4x4096x64xf32>, %p: tensor<4x4096x64xf32>, %lse: tensor<4x4096xf32>) -> (tensor<4x4096x256xf32>, tensor<4x4096x64xf32>) {
  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<4x4096x64xf32>) saved(%p, %lse : tensor<4x4096x64xf32>, tensor<4x4096xf32>) tau(1.000000e+00) causal(true) : tensor<4x4096x256xbf16>, tensor<4x4096x64xbf16> -> tensor<4x4096x256xf32>, tensor<4x4096x64xf32>
  return %du, %de : tensor<4x4096x256xf32>, tensor<4x4096x64xf32>
}
// sass-budget: kernel=similarity_inform_mma scores-per-tile=32
func.func @similarity_inform_bf16_causal_d256(%u: tensor<4x4096x256xbf16>, %e: tensor<4x4096x64xbf16>) -> tensor<4x4096x64xf32> {
  %p = moe.similarity_inform %u, %e tau(1.000000e+00) causal(true) : tensor<4x4096x256xbf16>, tensor<4x4096x64xbf16> -> tensor<4x4096x64xf32>
  return %p : tensor<4x4096x64xf32>
}
func.func @attention_posterior(%s: tensor<16x4x1024x1024xf32>, %u: tensor<16x1024x256xf32>, %v: tensor<16x4x1024x64xf32>, %wo: tensor<256x256xf32>, %e: tensor<16x1024x16xf32>) -> (tensor<16x1024x16xf32>, tensor<16xi32>) {
  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma(2.000000e+00) : tensor<16x4x1024x1024xf32>, tensor<16x1024x256xf32>, tensor<16x4x1024x64xf32>, tensor<256x256xf32>, tensor<16x1024x16xf32> -> tensor<16x1024x16xf32>, tensor<16xi32>
  return %p, %h : tensor<16x1024x16xf32>, tensor<16xi32>
}
