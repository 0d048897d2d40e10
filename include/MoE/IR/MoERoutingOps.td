//===- MoERoutingOps.td - Production routers and dispatch plans -*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// moe.route: one op for the gates of today's production MoE models (DeepSeek-V3,
// Kimi-K2, GLM-4.5, Qwen3-MoE, Mixtral, gpt-oss, Llama-4), which differ in the
// scoring function, an optional selection bias, group-limited selection, the
// order of scoring and top-k, renormalization and a routed scaling factor.
// moe.dispatch_plan: the expert-sorted token order that serving kernels build
// from the top-k indices (vLLM's moe_align_block_size).
//
// Not part of the DIALECT.md contract of the seed ops; moe.topk_renorm is left
// unchanged (moe.route with scoring(softmax) and no bias selects the same
// experts up to ties created by rounding).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEROUTINGOPS_TD
#define MOE_IR_MOEROUTINGOPS_TD

def MoE_RouteOp : MoE_InferredOp<"route", MoE_PureInferred> {
  let summary = "production MoE router: scoring, selection bias, group-limited top-k, renormalization, scaling";
  let description = [{
    Routes every token (row of `logits`, `[T, E]`) to `k` of `E` experts and returns the gate weights
    (`[T, k]`, f32) and expert indices (`[T, k]`, i32), sorted by descending selection score. One op covers the
    routers of today's production models; the modes are typed attributes, so a router imports as one op.

    With `x = logits[t, :]` and the optional selection bias `b` (`bias`, `[E]`, 0 when absent):

    1. **Scoring** (`scoring`): `σ(x) = softmax(x)` over the `E` experts, `sigmoid(x)` elementwise, or `x` itself
       (`none`, for callers that score before the op).
    2. **Choice scores** (`order`):
       * `score_then_topk` (default): `s = σ(x)` and the experts are chosen on `c = s + b`;
       * `topk_then_score`: the experts are chosen on the raw logits `c = x + b`, and only the `k` selected logits
         are scored: softmax over the `k` (gpt-oss: `softmax(topk(x))`), sigmoid of each (Llama-4 with `k = 1`),
         or kept.
       The bias only chooses: it never enters the weights (DeepSeek-V3's `e_score_correction_bias`, the
       auxiliary-loss-free load balancing).
    3. **Groups** (`n_group` G, `topk_group`; default 1 and 1 = no groups): the `E` experts form `G` contiguous
       groups of `E/G`. A group's score is the sum of its two largest choice scores (`group_score(top2_sum)`,
       default: DeepSeek-V3, SGLang's `biased_grouped_topk`) or its largest one (`group_score(max)`: DeepSeek-V2 and
       vLLM's `grouped_topk` without a bias). The `topk_group` best groups are kept (ties to the lowest group);
       experts of the other groups are never selected (they rank after every expert of a kept group, `-inf` and
       NaN ones included, as with the `-inf` fill of HF's `DeepseekV3TopkRouter` and vLLM; older HF releases filled
       0.0, which differs only when fewer than `k` kept choice scores are positive).
    4. **Top-k** on `c` among the kept experts: descending, ties to the lowest index, NaN first (as in
       `moe.topk_renorm` and `torch.topk`).
    5. **Weights**: `w_j = s[idx_j]` (`score_then_topk`) or the scored selected logits (`topk_then_score`); with
       `renormalize = true` (default false) `w_j /= Σ_l w_l` (a zero sum gives zero weights, never NaN); then
       `w_j *= routed_scaling_factor` (default 1).

    Edge rules (those of `moe.topk_renorm`): a `-inf` logit gets softmax/sigmoid score 0; a row whose every logit is
    `-inf` has softmax scores 0 (never NaN); a NaN logit makes the row's softmax scores NaN (sigmoid: that expert's
    score only), ranks first and propagates to the weights it enters. Indices are always in `[0, E)`. Scores,
    sums and the softmax accumulate in f32 whatever the element type of `logits`; `bias` is read as f32.

    Models (attribute values not shown are the defaults):

    | model | attributes |
    |-------|------------|
    | DeepSeek-V3 / R1 (E = 256) | `k(8) scoring(sigmoid) bias n_group(8) topk_group(4) renormalize(true) routed_scaling_factor(2.5)` |
    | Kimi-K2 (E = 384) | `k(8) scoring(sigmoid) bias renormalize(true) routed_scaling_factor(2.827)` |
    | GLM-4.5 (E = 160) | `k(8) scoring(sigmoid) bias renormalize(true) routed_scaling_factor(2.5)` |
    | DeepSeek-V2 (E = 160) | `k(6) n_group(8) topk_group(3) group_score(max) routed_scaling_factor(16.0)` |
    | Mixtral, Qwen3-MoE | `k(2)` / `k(8)`, `renormalize(true)` (Qwen3: `norm_topk_prob`) |
    | gpt-oss | `k(4) order(topk_then_score)` |
    | Llama-4 | `k(1) scoring(sigmoid) order(topk_then_score)` |

    Verifier rules: `logits` has rank 2 and `bias` rank 1 with `E` entries; `k` in `[1, E]`; `n_group` ≥ 1 divides
    `E`; `topk_group` in `[1, n_group]`; `k` ≤ `topk_group · E/n_group` (the kept experts); `group_score(top2_sum)`
    with groups needs `E/n_group` ≥ 2; `routed_scaling_factor` finite and > 0.

    ```mlir
    // DeepSeek-V3
    %w, %idx = moe.route %logits bias(%b : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) topk_group(4)
        renormalize(true) routed_scaling_factor(2.500000e+00)
        : tensor<?x256xbf16> -> tensor<?x8xf32>, tensor<?x8xi32>
    // gpt-oss
    %w2, %idx2 = moe.route %l k(4) order(topk_then_score) : tensor<?x128xf32> -> tensor<?x4xf32>, tensor<?x4xi32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$logits,
    Optional<MoE_FloatTensor>:$bias,
    I64Attr:$k,
    DefaultValuedAttr<MoE_RouteScoringAttr, "::mlir::moe::RouteScoring::softmax">:$scoring,
    DefaultValuedAttr<MoE_RouteOrderAttr, "::mlir::moe::RouteOrder::score_then_topk">:$order,
    DefaultValuedAttr<I64Attr, "1">:$n_group,
    DefaultValuedAttr<I64Attr, "1">:$topk_group,
    DefaultValuedAttr<MoE_GroupScoreAttr, "::mlir::moe::GroupScore::top2_sum">:$group_score,
    DefaultValuedAttr<BoolAttr, "false">:$renormalize,
    DefaultValuedAttr<F32Attr, "1.0">:$routed_scaling_factor
  );
  let results = (outs MoE_F32Tensor:$weights, MoE_I32Tensor:$indices);

  let assemblyFormat = [{
    $logits (`bias` `(` $bias^ `:` type($bias) `)`)? `k` `(` $k `)`
    (`scoring` `(` custom<EnumKeyword>($scoring)^ `)`)? (`order` `(` custom<EnumKeyword>($order)^ `)`)?
    (`n_group` `(` $n_group^ `)`)? (`topk_group` `(` $topk_group^ `)`)?
    (`group_score` `(` custom<EnumKeyword>($group_score)^ `)`)?
    (`renormalize` `(` $renormalize^ `)`)? (`routed_scaling_factor` `(` $routed_scaling_factor^ `)`)? attr-dict
    `:` type($logits) `->` type($weights) `,` type($indices)
  }];
  let hasVerifier = 1;
}

def MoE_DispatchPlanOp : MoE_InferredOp<"dispatch_plan", MoE_NoEffectInferred> {
  let summary = "expert-sorted dispatch plan of a top-k routing (vLLM's moe_align_block_size)";
  let description = [{
    Builds, from the top-k expert indices `indices` (`[T, k]`, i32 or i64, each in `[0, E)` with
    `E = num_experts`), the plan that grouped-GEMM expert kernels consume. The `N = T·k` assignments are numbered
    `n = t·k + j` (token `t`, slot `j`). Results (all i32):

    * `counts` `[E]`: `counts[e] = #{n : indices[n] = e}`;
    * `offsets` `[E+1]`: the exclusive prefix sum, `offsets[0] = 0`, `offsets[E] = N`;
    * `order` `[N]`: the assignments sorted **stably** by expert: `order[offsets[e] + r]` is the `r`-th assignment
      (in increasing `n`) routed to `e`;
    * `inverse` `[N]`: its inverse permutation, `inverse[order[p]] = p` (where assignment `n` sits in the sorted
      order, i.e. its row in the expert-sorted activations);
    * `padded_order` `[N + E·(B−1)]` with `B = block_size`: the layout of vLLM's `moe_align_block_size`
      (`sorted_token_ids`): expert `e`'s assignments start at `padded_offsets[e] = Σ_{e'<e} ⌈counts[e']/B⌉·B`,
      in the order of `order`; the padding entries hold `N`;
    * `block_experts` `[⌈(N + E·(B−1))/B⌉]`: the expert of every `B`-row block of `padded_order` (vLLM's
      `expert_ids`), `-1` for the blocks past the last used one;
    * `num_padded` `[1]`: the number of used entries of `padded_order`, `Σ_e ⌈counts[e]/B⌉·B`
      (`num_tokens_post_padded`).

    The plan is a pure function of `indices` (counting sort, no atomics), so it is deterministic. A value of
    `indices` outside `[0, E)` is a run-time error: it is reported to the caller (the execution API returns it;
    under `mlir-runner` it is printed), the assignment is left out of every result (its `order`/`inverse` entries
    are `-1`), and nothing is written out of bounds.

    Attributes: `num_experts` ≥ 1; `block_size` ≥ 1 (default 1: no padding).

    ```mlir
    %counts, %offsets, %order, %inverse, %padded, %blocks, %num = moe.dispatch_plan %idx num_experts(256)
        block_size(64)
        : tensor<4x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<32xi32>, tensor<32xi32>, tensor<16160xi32>,
          tensor<253xi32>, tensor<1xi32>
    ```
  }];

  let arguments = (ins
    MoE_IndexTensor:$indices,
    I64Attr:$num_experts,
    DefaultValuedAttr<I64Attr, "1">:$block_size
  );
  let results = (outs MoE_I32Tensor:$counts, MoE_I32Tensor:$offsets, MoE_I32Tensor:$order,
                      MoE_I32Tensor:$inverse, MoE_I32Tensor:$padded_order, MoE_I32Tensor:$block_experts,
                      MoE_I32Tensor:$num_padded);

  let assemblyFormat = [{
    $indices `num_experts` `(` $num_experts `)` (`block_size` `(` $block_size^ `)`)? attr-dict
    `:` type($indices) `->` type($counts) `,` type($offsets) `,` type($order) `,` type($inverse) `,`
    type($padded_order) `,` type($block_experts) `,` type($num_padded)
  }];
  let hasVerifier = 1;

  let extraClassDeclaration = [{
    ::mlir::Speculation::Speculatability getSpeculatability() {
      return ::mlir::Speculation::NotSpeculatable;
    }
  }];
}

#endif // MOE_IR_MOEROUTINGOPS_TD
