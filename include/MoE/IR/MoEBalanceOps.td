//===- MoEBalanceOps.td - Load-balancing statistics and losses -*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// What a training loop needs to keep the experts of a router balanced
// (issue #32): the per-expert statistics of a batch and the auxiliary losses
// built on them, with their backward ops.
//
// Why these ops and not more (or fewer):
// * moe.router_stats is the one fused pass over the logits (softmax in log
//   space, top-k, per-expert sums). Every logits-based balancing loss is a
//   small function of its three results: Switch/GShard/transformers'
//   E · Σ f_i P_i is moe.load_balancing_loss on them (an E-long reduction, so
//   it is its own small op and not an attribute that multiplies the forms of
//   the big one), and other recipes (per-layer or per-group means, DeepSeek's
//   device-level losses) combine the same statistics differently.
// * moe.router_stats_grad is the backward of its one differentiable result
//   (the mean probabilities; the counts are counts): one pass over the logits
//   for every loss built on the statistics, given that loss's gradient to the
//   mean probabilities (for the Switch loss: dloss · E · counts / W).
// * The z-loss and DeepSeek-V3's sequence-wise loss read other quantities
//   (the row log-sum-exp; sigmoid affinities and the selection of a biased
//   router, per sequence), so each is one op with its backward op.
// The statistics are not a result of moe.route/moe.topk_renorm: a router's
// selection may be biased (DeepSeek-V3) while its balancing statistics are
// not, and the routing ops' cached kernels and their importers stay as they
// are; router_stats selects with the same top-k order, so its counts are the
// counts of moe.topk_renorm's indices on the same logits.
//
// Every reduction over tokens is deterministic whatever the thread count: the
// kernels sum fixed-size row blocks in row order and then the blocks' partial
// sums in block order (never per-thread partials).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEBALANCEOPS_TD
#define MOE_IR_MOEBALANCEOPS_TD

def MoE_RouterStatsOp : MoE_InferredOp<"router_stats", MoE_PureInferred> {
  let summary = "per-expert selection counts and mean router probabilities of a batch (one fused pass)";
  let description = [{
    The statistics under every load-balancing loss, from the router logits `logits` (`[T, E]`, all the tokens of
    the batch; all layers concatenated when the loss spans layers) in one pass over them. With the optional
    per-token weights `token_mask` (`[T]`, used as a multiplier exactly like the attention mask of transformers'
    `load_balancing_loss_func`; 1 for every token when absent):

    * `p_t = softmax(logits_t)` in f32, in log space: `p_te = exp(x_te − lse_t)`;
    * `sel_t` = the `k` experts of the largest logits of token `t`, in the order of `moe.topk_renorm` (NaN first,
      then larger values, ties to the lowest index), so that `counts` counts exactly the indices that
      `moe.topk_renorm` / `moe.route` (no bias) select on the same logits; softmax being monotone, these are the
      top-k of `p` (Switch/GShard);
    * `counts_e = Σ_t w_t · [e ∈ sel_t]` (f32, `[E]`);
    * `weight_sum = W = Σ_t w_t` (f32, rank 0);
    * `mean_probs_e = P_e = Σ_t w_t · p_te / W` (f32, `[E]`).

    The fraction of tokens routed to expert `e` is `f_e = counts_e / W`; Switch Transformer's (eq 4) and
    transformers' auxiliary loss is `moe.load_balancing_loss`. `W = 0` (no token, or every weight 0) gives
    `mean_probs = NaN` (0/0), as transformers does.

    Edge rules (those of `moe.topk_renorm`): a row holding NaN has NaN probabilities and selects its NaN entries
    first; a row whose every logit is `-inf` has probabilities 0 (never NaN) and selects experts `0 .. k-1`; a
    `+inf` logit gives NaN probabilities (`inf − inf`), as PyTorch. A weight multiplies the row's contributions
    as in PyTorch (`0 · NaN = NaN`). Accumulation is in f32, in fixed row blocks summed in a fixed order:
    bit-identical results for any thread count.

    Attributes: `k` in `[1, E]`.

    ```mlir
    %counts, %probs, %w = moe.router_stats %logits k(2)
        : tensor<?x64xf32> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
    %c2, %p2, %w2 = moe.router_stats %logits token_mask(%m : tensor<?xf32>) k(8)
        : tensor<?x64xbf16> -> tensor<64xf32>, tensor<64xf32>, tensor<f32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$logits,
    Optional<MoE_FloatTensor>:$token_mask,
    I64Attr:$k
  );
  let results = (outs MoE_F32Tensor:$counts, MoE_F32Tensor:$mean_probs, MoE_F32Tensor:$weight_sum);

  let assemblyFormat = [{
    $logits (`token_mask` `(` $token_mask^ `:` type($token_mask) `)`)? `k` `(` $k `)` attr-dict
    `:` type($logits) `->` type($counts) `,` type($mean_probs) `,` type($weight_sum)
  }];
  let hasVerifier = 1;
}

def MoE_RouterStatsGradOp : MoE_InferredOp<"router_stats_grad", MoE_PureInferred> {
  let summary = "the backward of moe.router_stats: to the logits, through the mean probabilities";
  let description = [{
    The vector-Jacobian product of `mean_probs` of `moe.router_stats` (operands `logits` `[T, E]` and
    `token_mask` as the forward op) with its cotangent `dmean_probs` (`g`, `[E]`, f32), given the forward's
    `weight_sum` `W` (rank 0, f32). The counts carry no gradient (a selection), nor does `W`. With
    `p_t = softmax(logits_t)`:

    * `dlogits_te = (w_t / W) · p_te · (g_e − Σ_j p_tj g_j)` (the softmax backward of `P = Σ_t w_t p_t / W`).

    For Switch's loss `L = E · Σ_e (counts_e / W) · P_e`, `g = dL · E · counts / W`. A row whose every logit is
    `-inf` (p = 0) gets 0; NaN propagates. One pass over the logits, rows independent (deterministic).

    ```mlir
    %dx = moe.router_stats_grad %logits weight_sum(%w : tensor<f32>) dmean_probs(%g : tensor<64xf32>)
        : tensor<?x64xf32> -> tensor<?x64xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$logits,
    Optional<MoE_FloatTensor>:$token_mask,
    MoE_F32Tensor:$weight_sum,
    MoE_F32Tensor:$dmean_probs
  );
  let results = (outs MoE_F32Tensor:$dlogits);

  let assemblyFormat = [{
    $logits (`token_mask` `(` $token_mask^ `:` type($token_mask) `)`)?
    `weight_sum` `(` $weight_sum `:` type($weight_sum) `)` `dmean_probs` `(` $dmean_probs `:` type($dmean_probs) `)`
    attr-dict `:` type($logits) `->` type($dlogits)
  }];
  let hasVerifier = 1;
}

def MoE_LoadBalancingLossOp : MoE_InferredOp<"load_balancing_loss", MoE_PureInferred> {
  let summary = "Switch/GShard load-balancing loss from the statistics of moe.router_stats";
  let description = [{
    Switch Transformer's auxiliary loss (Fedus et al. 2021, eq 4; GShard's `l_aux`), as transformers'
    `load_balancing_loss_func` computes it (its attention-mask variant included), from the results of
    `moe.router_stats` (`counts` and `mean_probs` `[E]`, `weight_sum` rank 0, all f32):

    * `loss = E · Σ_e f_e · P_e` with `f_e = counts_e / W`, `P_e = mean_probs_e`.

    Its gradient to `mean_probs` is `dloss · E · counts / W` (the counts are a selection and carry none);
    `moe.router_stats_grad` takes it to the logits. `W = 0` gives NaN, as transformers. The E-long sum is in f32,
    in expert order.

    ```mlir
    %c, %p, %w = moe.router_stats %logits k(2) : tensor<?x8xf32> -> tensor<8xf32>, tensor<8xf32>, tensor<f32>
    %loss = moe.load_balancing_loss %c, %p, %w : tensor<8xf32>, tensor<8xf32>, tensor<f32> -> tensor<f32>
    ```
  }];

  let arguments = (ins MoE_F32Tensor:$counts, MoE_F32Tensor:$mean_probs, MoE_F32Tensor:$weight_sum);
  let results = (outs MoE_F32Tensor:$loss);

  let assemblyFormat = [{
    $counts `,` $mean_probs `,` $weight_sum attr-dict
    `:` type($counts) `,` type($mean_probs) `,` type($weight_sum) `->` type($loss)
  }];
  let hasVerifier = 1;
}

def MoE_RouterZLossOp : MoE_InferredOp<"router_z_loss", MoE_PureInferred> {
  let summary = "the router z-loss of ST-MoE: the mean of logsumexp² of the logits";
  let description = [{
    ST-MoE's router z-loss (Zoph et al. 2022, eq 5) on the router logits `logits` (`[T, E]`):

    * `loss = (1/T) Σ_t lse_t²`, `lse_t = log Σ_e exp(x_te)` (f32, in log space: `m + log Σ exp(x − m)`).

    transformers' `router_z_loss_func` (a sum over `[G, S]` divided by `G · S`) is this op on the logits reshaped
    to `[G · S, E]`. `T = 0` gives NaN (the mean of nothing, as PyTorch). A row of `-inf` has `lse = -inf`
    (loss `+inf`); NaN propagates. Row blocks summed in a fixed order: deterministic for any thread count.

    ```mlir
    %z = moe.router_z_loss %logits : tensor<?x64xf32> -> tensor<f32>
    ```
  }];

  let arguments = (ins MoE_FloatTensor:$logits);
  let results = (outs MoE_F32Tensor:$loss);

  let assemblyFormat = "$logits attr-dict `:` type($logits) `->` type($loss)";
  let hasVerifier = 1;
}

def MoE_RouterZLossGradOp : MoE_InferredOp<"router_z_loss_grad", MoE_PureInferred> {
  let summary = "the backward of moe.router_z_loss";
  let description = [{
    The gradient of `moe.router_z_loss` to its logits (`[T, E]`) given the cotangent `dloss` (rank 0, f32):

    * `dlogits_te = dloss · (2 / T) · lse_t · softmax(x_t)_e`.

    A row of `-inf` gives NaN (`-inf · 0`, as PyTorch's autograd of logsumexp). One pass, rows independent.

    ```mlir
    %dx = moe.router_z_loss_grad %logits dloss(%d : tensor<f32>) : tensor<?x64xf32> -> tensor<?x64xf32>
    ```
  }];

  let arguments = (ins MoE_FloatTensor:$logits, MoE_F32Tensor:$dloss);
  let results = (outs MoE_F32Tensor:$dlogits);

  let assemblyFormat = [{
    $logits `dloss` `(` $dloss `:` type($dloss) `)` attr-dict `:` type($logits) `->` type($dlogits)
  }];
  let hasVerifier = 1;
}

def MoE_SequenceBalanceLossOp : MoE_InferredOp<"sequence_balance_loss", MoE_PureInferred> {
  let summary = "DeepSeek-V3's sequence-wise balance loss, averaged over the sequences of a batch";
  let description = [{
    DeepSeek-V3's complementary sequence-wise balance loss (DeepSeek-V3 technical report, eq 17–20, without its
    coefficient α) for every sequence `b` of `scores` (`[B, S, E]`: the router's affinities `s`, e.g. the
    sigmoid of the logits, without the balancing bias) and `indices` (`[B, S, k]`, i32 or i64: the experts the
    router selected, with its bias), averaged over the batch:

    * `s'_t = s_t / Σ_e s_te` (eq 19);  `P_be = (1/S) Σ_t s'_bte` (eq 20);
    * `f_be = E / (k · S) · Σ_t Σ_j [indices_btj = e]` (eq 18: a selection counts once per slot, as DeepSeek's
      `scatter_add`);
    * `loss = (1/B) Σ_b Σ_e f_be · P_be` (eq 17, α = 1).

    The gradient flows to `scores` only (`moe.sequence_balance_loss_grad`). `B = 0` or `S = 0` gives NaN (0/0, as
    PyTorch's means); a row whose affinities sum to 0 gives NaN; NaN propagates. An index outside `[0, E)` counts
    for no expert (`torch.ops.moe.sequence_balance_loss` rejects it before the kernel runs). Sums in f32 over the rows of a sequence in order, then the sequences
    in order: deterministic for any thread count.

    ```mlir
    %l = moe.sequence_balance_loss %s, %idx : tensor<?x?x256xf32>, tensor<?x?x8xi64> -> tensor<f32>
    ```
  }];

  let arguments = (ins MoE_FloatTensor:$scores, MoE_IndexTensor:$indices);
  let results = (outs MoE_F32Tensor:$loss);

  let assemblyFormat = [{
    $scores `,` $indices attr-dict `:` type($scores) `,` type($indices) `->` type($loss)
  }];
  let hasVerifier = 1;
}

def MoE_SequenceBalanceLossGradOp : MoE_InferredOp<"sequence_balance_loss_grad", MoE_PureInferred> {
  let summary = "the backward of moe.sequence_balance_loss: to the scores";
  let description = [{
    The gradient of `moe.sequence_balance_loss` (operands `scores`, `indices` as the forward op) to `scores`,
    given the cotangent `dloss` (rank 0, f32). With `f_be` and `s'` as in the forward op and `Z_bt = Σ_e s_bte`:

    * `dscores_bte = dloss / (B · S) · (f_be − Σ_j s'_btj f_bj) / Z_bt`.

    The selection carries no gradient; an index outside `[0, E)` counts for no expert, as in the forward op.

    ```mlir
    %ds = moe.sequence_balance_loss_grad %s, %idx dloss(%d : tensor<f32>)
        : tensor<?x?x256xf32>, tensor<?x?x8xi64> -> tensor<?x?x256xf32>
    ```
  }];

  let arguments = (ins MoE_FloatTensor:$scores, MoE_IndexTensor:$indices, MoE_F32Tensor:$dloss);
  let results = (outs MoE_F32Tensor:$dscores);

  let assemblyFormat = [{
    $scores `,` $indices `dloss` `(` $dloss `:` type($dloss) `)` attr-dict
    `:` type($scores) `,` type($indices) `->` type($dscores)
  }];
  let hasVerifier = 1;
}

#endif // MOE_IR_MOEBALANCEOPS_TD
