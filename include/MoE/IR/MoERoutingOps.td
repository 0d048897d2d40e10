//===- MoERoutingOps.td - Production routers and dispatch plans -*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// moe.route: one op for the gates of today's production MoE models (DeepSeek-V3,
// Kimi-K2, GLM-4.5, Qwen3-MoE, Mixtral, gpt-oss, Llama-4), which differ in the
// scoring function, an optional selection bias, group-limited selection, the
// order of scoring and top-k, renormalization and a routed scaling factor.
// moe.dispatch_plan: the expert-sorted token order that serving kernels build
// from the top-k indices (vLLM's moe_align_block_size), with an optional expert
// capacity (GShard/Switch token dropping).
// moe.bias_update: DeepSeek-V3's auxiliary-loss-free balancing step on the
// selection bias that moe.route reads.
//
// Not part of the DIALECT.md contract of the seed ops; moe.topk_renorm is left
// unchanged (moe.route with scoring(softmax) and no bias selects the same
// experts up to ties created by rounding).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEROUTINGOPS_TD
#define MOE_IR_MOEROUTINGOPS_TD

def MoE_RouteOp : MoE_InferredOp<"route", !listconcat(MoE_PureInferred,
    [IsolatedFromAbove, AttrSizedOperandSegments])> {
  let summary = "production MoE router: scoring, selection bias, group-limited top-k, renormalization, scaling";
  let description = [{
    Routes every token (row of `logits`, `[T, E]`) to `k` of `E` experts and returns the gate weights
    (`[T, k]`, f32) and expert indices (`[T, k]`, i32), sorted by descending selection score. One op covers the
    routers of today's production models; the modes are typed attributes, so a router imports as one op.

    With `x = logits[t, :]` and the optional selection bias `b` (`bias`, `[E]`, 0 when absent):

    1. **Scoring** (`scoring`): `σ(x) = softmax(x)` over the `E` experts, `sigmoid(x)` elementwise, `x` itself
       (`none`, for callers that score before the op), or `custom`: the elementwise function `f` of the `score`
       region, `σ(x)_e = f(x_e)` (see *Custom scores* below).
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

    **Custom scores** (`scoring(custom)`, issue #48 item 2). The `score` region holds one block with one `f32`
    argument, the logit `x_e`, and ends in `moe.yield` of the `f32` score `f(x_e)`; everything in it is scalar
    `f32` (an `i1` for a comparison) and elementwise, so every lowering inlines the body where it computes a
    sigmoid today (on vectors on the CPU, per lane on the GPU). Accepted ops: `arith.constant` (f32), `addf`,
    `subf`, `mulf`, `divf`, `negf`, `maximumf`, `minimumf`, `cmpf`, `select`; `math.exp`, `exp2`, `log`,
    `log1p`, `sqrt`, `rsqrt`, `tanh`, `absf`, `powf`, `erf`, and the step functions `math.floor`, `ceil`,
    `round`, which have no useful derivative (`moe.route_grad` rejects them). The region is isolated from above
    (constants live inside it). `sigmoid` is the preset `f(x) = 1 / (1 + exp(-x))`, `none` the identity;
    softmax is not elementwise and stays its own mode. `f` replaces the scoring of either order (with
    `topk_then_score`, `f` of each selected logit); the bias, groups, renormalization and scaling are unchanged.
    NaN, `±inf` and zero sums follow from `f`'s IEEE arithmetic (DeepSeek-V4's `sqrt(softplus(x))`: `-inf`
    scores 0, `+inf` scores `+inf`). A region appears if and only if `scoring(custom)`.

    ```mlir
    // DeepSeek-V4 (sqrtsoftplus): f(x) = sqrt(log1p(exp(-|x|)) + max(x, 0))
    %w, %idx = moe.route %logits bias(%b : tensor<256xf32>) k(8) scoring(custom) renormalize(true)
        score {
        ^bb0(%x: f32):
          %zero = arith.constant 0.000000e+00 : f32
          %a = math.absf %x : f32
          %n = arith.negf %a : f32
          %e = math.exp %n : f32
          %l = math.log1p %e : f32
          %m = arith.maximumf %x, %zero : f32
          %sp = arith.addf %l, %m : f32
          %s = math.sqrt %sp : f32
          moe.yield %s : f32
        } : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>
    ```

    **Replay** (`replay`, `[T, k]` i32 or i64, issue #48 item 5): the choice is given, not made. The op returns
    `indices = replay` and the weights of step 5 for those experts: `w_j = s[replay_j]` (`score_then_topk`; softmax
    still over all `E` logits of the row) or the scored given logits (`topk_then_score`), then renormalized and
    scaled. Steps 2-4 are skipped, so the bias, the groups and `sorted`-ness play no part; the attributes stay those
    of the router whose choice is replayed. This is routing replay for reinforcement learning (the weights and, by
    `moe.route_grad` or the reference's autograd, their gradients for a routing recorded by an inference engine:
    FlashInfer's `routing_replay_out`, Megatron's router replay) and hash routing (DeepSeek-V4's
    `DeepseekV4HashRouter`: `replay = tid2eid[input_ids]`). The given row is taken as it is: its order is kept and
    a repeated expert is weighed twice. An index outside `[0, E)` is a run-time error (the index check of
    `moe.dispatch_plan`), never a read out of bounds. With softmax scores and `renormalize = true` the softmax's
    normaliser cancels: `w_j = exp(x_j - m) / Σ_l exp(x_l - m)`, `m` the row's max, so a kernel needs of the row
    only `m` (the CPU kernel: a pass of maxima, and `k` exponentials a token, not `E`). The weights keep the row's
    rules, which a softmax over the `k` given logits alone (`order(topk_then_score)`) would not: a NaN or `+inf`
    logit anywhere in the row makes them NaN, and given experts whose scores underflow in the row's softmax weigh 0.

    ```mlir
    // DeepSeek-V4's hash layers: sqrtsoftplus scores of the table's experts, renormalized
    %w, %idx = moe.route %logits replay(%table_ids : tensor<?x6xi64>) k(6) scoring(custom) renormalize(true)
        routed_scaling_factor(1.500000e+00) score { ... } : tensor<?x256xf32> -> tensor<?x6xf32>, tensor<?x6xi32>
    ```

    Edge rules (those of `moe.topk_renorm`): a `-inf` logit gets softmax/sigmoid score 0; a row whose every logit is
    `-inf` has softmax scores 0 (never NaN); a NaN logit makes the row's softmax scores NaN (sigmoid: that expert's
    score only), ranks first and propagates to the weights it enters. Indices are always in `[0, E)`: `i32`, or
    `i64` where the result type says so (as `torch.topk` returns them; the inferred type is `i32`). Scores, sums and
    the softmax accumulate in f32 whatever the element type of `logits`; `bias` is read as f32.

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
    with groups needs `E/n_group` ≥ 2; `routed_scaling_factor` finite and > 0; `replay` has rank 2, `k` columns and
    the rows of `logits`.

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
    Optional<MoE_IndexTensor>:$replay,
    I64Attr:$k,
    DefaultValuedAttr<MoE_RouteScoringAttr, "::mlir::moe::RouteScoring::softmax">:$scoring,
    DefaultValuedAttr<MoE_RouteOrderAttr, "::mlir::moe::RouteOrder::score_then_topk">:$order,
    DefaultValuedAttr<I64Attr, "1">:$n_group,
    DefaultValuedAttr<I64Attr, "1">:$topk_group,
    DefaultValuedAttr<MoE_GroupScoreAttr, "::mlir::moe::GroupScore::top2_sum">:$group_score,
    DefaultValuedAttr<BoolAttr, "false">:$renormalize,
    DefaultValuedAttr<F32Attr, "1.0">:$routed_scaling_factor
  );
  let results = (outs MoE_F32Tensor:$weights, MoE_IndexTensor:$indices);
  let regions = (region MaxSizedRegion<1>:$score);

  let assemblyFormat = [{
    $logits (`bias` `(` $bias^ `:` type($bias) `)`)? (`replay` `(` $replay^ `:` type($replay) `)`)?
    `k` `(` $k `)` (`scoring` `(` custom<EnumKeyword>($scoring)^ `)`)? (`order` `(` custom<EnumKeyword>($order)^ `)`)?
    (`n_group` `(` $n_group^ `)`)? (`topk_group` `(` $topk_group^ `)`)?
    (`group_score` `(` custom<EnumKeyword>($group_score)^ `)`)?
    (`renormalize` `(` $renormalize^ `)`)? (`routed_scaling_factor` `(` $routed_scaling_factor^ `)`)?
    (`score` $score^)? attr-dict
    `:` type($logits) `->` type($weights) `,` type($indices)
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
}

def MoE_YieldOp : MoE_Op<"yield", [Pure, Terminator,
    ParentOneOf<["RouteOp", "RouteGradOp"]>]> {
  let summary = "the score of a moe.route / moe.route_grad score region";
  let description = [{
    Ends the `score` region of `moe.route` and `moe.route_grad` with the score of the block's logit.

    ```mlir
    moe.yield %s : f32
    ```
  }];
  let arguments = (ins F32:$value);
  let assemblyFormat = "$value attr-dict `:` type($value)";
}

def MoE_RouteGradOp : MoE_InferredOp<"route_grad", !listconcat(MoE_NoEffectInferred, [IsolatedFromAbove])> {
  let summary = "the backward of moe.route with an elementwise score: to the logits, through the selected scores";
  let description = [{
    The vector-Jacobian product of the weights of `moe.route` with an elementwise score (`scoring` `sigmoid`,
    `none` or `custom` with the forward's `score` region `f`; softmax is not elementwise and is rejected) with
    their cotangent `dw` (`[T, k]`, f32), given the forward's `logits` (`[T, E]`) and selection `indices`
    (`[T, k]`, i32, in `[0, E)`). The choice (bias, groups, top-k, `order`) carries no gradient. With
    `x_l = logits[t, idx_l]`, `s_l = f(x_l)`, `S = Σ_l s_l`, the scale `a` (`routed_scaling_factor`):

    * `renormalize = false` (`w_l = a s_l`): `dlogits[t, idx_l] = a · dw_l · f'(x_l)`;
    * `renormalize = true` (`w_l = a s_l / S`, zero weights when `S = 0`):
      `dlogits[t, idx_l] = a · (dw_l − c / S) / S · f'(x_l)` with `c = Σ_m dw_m s_m`, and 0 when `S = 0`;

    0 elsewhere. `f'` is the region's derivative, formed symbolically from its ops (forward mode over the block;
    `select` passes the derivative of the chosen operand, `maximumf`/`minimumf` that of the larger/smaller one and
    half of each at a tie, `absf` gives `sign(x)` with `sign(0) = 0`, `sqrt` at 0 gives `+inf`, as PyTorch's
    autograd formulas). One departure from autograd: a product- or quotient-rule term with an exact zero factor
    is 0 even when the other factor is infinite, so `1 / (1 + exp(-x))` has derivative 0 at `x = -inf`, as
    `torch.sigmoid`, where autograd of that expression gives NaN. Step functions (`math.floor`, `ceil`, `round`) are rejected: their
    derivative is zero almost everywhere, which would silently stop training. Both orders of the forward give
    the same weights as a function of the selected logits, so the op has no `order`. A repeated index
    accumulates. Out-of-range indices are read clamped and never written.

    ```mlir
    %dx = moe.route_grad %logits, %idx dw(%dw : tensor<?x8xf32>) scoring(sigmoid) renormalize(true)
        routed_scaling_factor(2.500000e+00) : tensor<?x256xf32>, tensor<?x8xi32> -> tensor<?x256xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$logits,
    MoE_I32Tensor:$indices,
    MoE_F32Tensor:$dw,
    DefaultValuedAttr<MoE_RouteScoringAttr, "::mlir::moe::RouteScoring::sigmoid">:$scoring,
    DefaultValuedAttr<BoolAttr, "false">:$renormalize,
    DefaultValuedAttr<F32Attr, "1.0">:$routed_scaling_factor
  );
  let results = (outs MoE_F32Tensor:$dlogits);
  let regions = (region MaxSizedRegion<1>:$score);

  let assemblyFormat = [{
    $logits `,` $indices `dw` `(` $dw `:` type($dw) `)`
    (`scoring` `(` custom<EnumKeyword>($scoring)^ `)`)?
    (`renormalize` `(` $renormalize^ `)`)? (`routed_scaling_factor` `(` $routed_scaling_factor^ `)`)?
    (`score` $score^)? attr-dict
    `:` type($logits) `,` type($indices) `->` type($dlogits)
  }];
  let hasVerifier = 1;
  let hasRegionVerifier = 1;

  let extraClassDeclaration = [{
    ::mlir::Speculation::Speculatability getSpeculatability() {
      return ::mlir::Speculation::NotSpeculatable;
    }
  }];
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

    **Expert capacity** (`capacity` C, absent by default: no limit; GShard's and Switch Transformer's token
    dropping). Every expert keeps at most `C` of the in-range assignments routed to it; the others are *dropped*.
    The assignments claim places in one priority order, and an assignment is kept when fewer than `C` assignments
    to its expert come before it:

    * `drop(position)` (default): slot-major, then token order: the key of assignment `(t, j)` is `(j, t)`, so every
      token's first choice comes before any second choice (GShard, Switch Transformer's `cumsum` over tokens, per
      choice);
    * `drop(probability)`: by gate weight, largest first, ties (and equal weights such as `-0.0` and `0.0`) in the
      position order (V-MoE's batch-prioritized routing, with the weight of each assignment as its priority).
      The weights come from the operand `weights` (`[T, k]`, f32, f16 or bf16, read as f32), which only this mode
      reads and requires; a NaN weight ranks first (the dialect's top-k order).

    With a capacity, every result above describes the **kept assignments only**: it is the plan of `indices` with
    the dropped assignments left out, exactly like out-of-range ones (`counts[e] = min(C, demand[e])`, where
    `demand[e]` counts the in-range assignments to `e`; `order` keeps the increasing-`n` order within an expert,
    not the priority order; a dropped assignment's `inverse` entry is `-1`, so a combine that gathers gate weights
    through the plan gives it weight 0; the entries of `order` past `offsets[E]` are `-1`). One more result,
    `dropped` (`[E]`, i32), reports `demand[e] - counts[e]` per expert. The kept gate weights are
    `weights[n]` where `inverse[n] ≥ 0` and 0 elsewhere. `C ≥ T·k` keeps everything; `C = 0` drops every
    in-range assignment. Switch Transformer's capacity is `C = ⌈capacity_factor · T · k / E⌉`.

    Attributes: `num_experts` ≥ 1; `block_size` ≥ 1 (default 1: no padding); `capacity` ≥ 0 (optional);
    `drop` needs `capacity`.

    ```mlir
    %counts, %offsets, %order, %inverse, %padded, %blocks, %num = moe.dispatch_plan %idx num_experts(256)
        block_size(64)
        : tensor<4x8xi32> -> tensor<256xi32>, tensor<257xi32>, tensor<32xi32>, tensor<32xi32>, tensor<16160xi32>,
          tensor<253xi32>, tensor<1xi32>
    // Switch Transformer, capacity factor 1.25 at T = 1024, k = 1, E = 64: C = 20, drop by position.
    %c, %o, %ord, %inv, %p, %b, %np, %dropped = moe.dispatch_plan %i1 num_experts(64) capacity(20)
        : tensor<1024x1xi32> -> tensor<64xi32>, tensor<65xi32>, tensor<1024xi32>, tensor<1024xi32>,
          tensor<1024xi32>, tensor<1024xi32>, tensor<1xi32>, tensor<64xi32>
    // V-MoE's batch-prioritized routing: the largest gate weights keep their place.
    %c2, %o2, %ord2, %inv2, %p2, %b2, %np2, %dropped2 = moe.dispatch_plan %i2 num_experts(8) capacity(3)
        drop(probability) weights(%w2 : tensor<?x2xf32>)
        : tensor<?x2xi32> -> tensor<8xi32>, tensor<9xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>,
          tensor<?xi32>, tensor<1xi32>, tensor<8xi32>
    ```
  }];

  let arguments = (ins
    MoE_IndexTensor:$indices,
    Optional<MoE_FloatTensor>:$weights,
    I64Attr:$num_experts,
    DefaultValuedAttr<I64Attr, "1">:$block_size,
    OptionalAttr<I64Attr>:$capacity,
    DefaultValuedAttr<MoE_CapacityDropAttr, "::mlir::moe::CapacityDrop::position">:$drop
  );
  let results = (outs MoE_I32Tensor:$counts, MoE_I32Tensor:$offsets, MoE_I32Tensor:$order,
                      MoE_I32Tensor:$inverse, MoE_I32Tensor:$padded_order, MoE_I32Tensor:$block_experts,
                      MoE_I32Tensor:$num_padded, Optional<MoE_I32Tensor>:$dropped);

  let assemblyFormat = [{
    $indices `num_experts` `(` $num_experts `)` (`block_size` `(` $block_size^ `)`)?
    (`capacity` `(` $capacity^ `)`)? (`drop` `(` custom<EnumKeyword>($drop)^ `)`)?
    (`weights` `(` $weights^ `:` type($weights) `)`)? attr-dict
    `:` type($indices) `->` type($counts) `,` type($offsets) `,` type($order) `,` type($inverse) `,`
    type($padded_order) `,` type($block_experts) `,` type($num_padded) (`,` type($dropped)^)?
  }];
  let hasVerifier = 1;

  let extraClassDeclaration = [{
    ::mlir::Speculation::Speculatability getSpeculatability() {
      return ::mlir::Speculation::NotSpeculatable;
    }
    /// The rules of the capacity option (`capacity`, `drop`, `weights`).
    ::llvm::LogicalResult verifyCapacity();
  }];
}

// Expert loads: exact counts (i32, i64) or weighted ones (f32).
def MoE_CountTensor : RankedTensorOf<[I32, I64, F32]>;

def MoE_BiasUpdateOp : MoE_InferredOp<"bias_update", MoE_PureInferred> {
  let summary = "DeepSeek-V3's auxiliary-loss-free bias update: b_e + u · sign(mean(counts) − counts_e)";
  let description = [{
    One balancing step of DeepSeek-V3's auxiliary-loss-free load balancing (DeepSeek-V3 technical report,
    §2.1.2): after each training step, the selection bias `b` of every expert (`bias`, `[E]`, the `bias` operand of
    `moe.route`) moves by the bias update speed `u` (`rate`) towards balance, down for an overloaded expert and up
    for an underloaded one:

        new_bias[e] = b[e] + u · sign(mean(counts) − counts[e]),   mean(counts) = Σ_e' counts[e'] / E

    with `sign(0) = 0`. `counts` (`[E]`) are the expert loads of the step: the `counts` result of
    `moe.dispatch_plan` (i32), or token counts as floats (weighted counts of a masked batch). The op is out of
    place: it returns the new bias (f32) and the training loop stores it, after its optimizer step (the bias has no
    gradient).

    Exactness: the sign is that of `Σ_e' counts[e'] − E · counts[e]`, computed in f64, which is exact for integer
    counts (so an expert exactly at the mean never moves, and none moves by rounding); `u · sign` is exact and the
    sum is one f32 addition, so the result is bit-for-bit `b + u * torch.sign(counts.mean() - counts)` in f32
    whenever that mean is not rounded across a count. A NaN count gives a NaN difference, whose sign is 0, as
    `torch.sign`'s (`(0 < d) − (d < 0)`): a NaN mean leaves the whole bias unchanged, as in that PyTorch expression.
    `bias` is read as f32.

    Verifier rules: `bias` and `counts` have rank 1 and the same size; `rate` is finite and ≥ 0 (DeepSeek-V3 uses
    0.001, then 0 for the last 500B tokens).

    ```mlir
    %new = moe.bias_update %b, %counts rate(1.000000e-03) : tensor<256xf32>, tensor<256xi32> -> tensor<256xf32>
    ```
  }];

  let arguments = (ins MoE_FloatTensor:$bias, MoE_CountTensor:$counts, F32Attr:$rate);
  let results = (outs MoE_F32Tensor:$new_bias);

  let assemblyFormat = [{
    $bias `,` $counts `rate` `(` $rate `)` attr-dict `:` type($bias) `,` type($counts) `->` type($new_bias)
  }];
  let hasVerifier = 1;
}

#endif // MOE_IR_MOEROUTINGOPS_TD
