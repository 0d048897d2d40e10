//===- MoEGradOps.td - Backward (vector-Jacobian) ops ------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// Not part of the DIALECT.md contract: the backward of the differentiable
// routing ops, one op per forward op, taking the forward operands and the
// cotangent of the forward result and returning the cotangents of the
// float operands. torch.ops.moe.<op>_backward (python/moe_mlir/ops/) calls
// them from the autograd of torch.ops.moe.<op>.
//
// Which ops carry a gradient (DIALECT.md, the paper specs):
// * topk_renorm: to the scores, through the kept (selected) values only; the
//   indices carry none.
// * similarity_inform: to u, e and ws (this file).
// * attention_posterior (+ the fused forms): to scores, u, v, wo, e; none
//   through the chosen head h* or the top-k choice (this file; the fused form
//   chains topk_renorm_grad and attention_posterior_grad).
// * hyper_router: to emb, w1, b1, w2, b2 (frozen hypernetwork weights still
//   pass their gradient to emb, 002 §1.10) (this file).
// * mad_dispersion and adjacency_update carry no gradient: ACMoE's cluster
//   statistics are computed under no_grad (003 §5.10) and Symphony's graph A
//   is a moving average, not a learned parameter (004 §1.2). Gradient flows
//   around them as in the authors' code (through the router logits they
//   reweight or mix), so they have no backward op.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEGRADOPS_TD
#define MOE_IR_MOEGRADOPS_TD

def MoE_SimilarityInformGradOp : MoE_InferredOp<"similarity_inform_grad",
    !listconcat(MoE_PureInferred, [AttrSizedOperandSegments])> {
  let summary = "the backward of moe.similarity_inform (flash-style, O(N) memory)";
  let description = [{
    The vector-Jacobian product of `moe.similarity_inform` (operands `u`, `e`, `ws`, `key_mask` and attributes
    `tau`, `causal` exactly as the forward op) with the cotangent `dp` (`[B, N, K]`, f32) of its result `p`.
    With `q_i = u_i W_s` (`W_s = ws`, or the identity), `x_ij = <q_i, u_j> / tau` over the keys `j` the forward
    mixes (key_mask, causal `j ≤ i`), `S = softmax_j(x)` and `p_i = Σ_j S_ij e_j`:

    * `lse_i = log Σ_j exp(x_ij)` (the log-sum-exp of the forward softmax), so `S_ij = exp(x_ij − lse_i)`;
    * `dS_ij = <dp_i, e_j>`, `δ_i = Σ_j S_ij dS_ij = <dp_i, p_i>`;
    * `dX_ij = S_ij (dS_ij − δ_i) / tau` (the softmax backward, 1/tau folded in);
    * results: `de_j = Σ_i S_ij dp_i`; `dq_i = Σ_j dX_ij u_j`; `du_j = Σ_i dX_ij q_i + dq_j W_s^T`
      (`u` is both the key and, through `q`, the query); `dws = Σ_{b,i} u_i^T dq_i` (`[D, D]`), a result only
      when `ws` is present.

    Excluded keys (masked, `j > i` under `causal`) get `S = 0` and no gradient; a row whose every key is excluded
    (p = 0) passes no gradient. Gradients are f32 whatever the operand types (the caller casts).
    Non-finite values: the result is NaN wherever a non-finite `u`, `e` or `dp` enters a sum (the forward's
    `p` is not finite there either).

    Saved statistics: `saved(p, lse)` passes the forward's result `p` (f32) and row log-sum-exp `lse` (`[B, N]`,
    f32, `-inf` for a row without keys), as `moe.similarity_inform_fwd` returns them for training. Without them
    the lowering recomputes both with the forward's streaming kernel: one forward pass more (a quarter of the
    work at D = 64, K = 16), the same bits when the saved values came from the same kernel.

    Memory (flash-style): nothing `N × N` is built (O(B·N) extra memory for `lse`, when recomputed). The lowering
    streams the `S` tiles twice from `lse`: once query-major (`dq`), once key-major (`de` and the key part of
    `du`), so every sum has one writer and a fixed order (deterministic, independent of the thread count).

    ```mlir
    %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x128x16xf32>) tau(5.000000e-01) causal(true)
        : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>
    %du2, %de2, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<64x64xf32>) dp(%dp : tensor<2x128x16xf32>)
        : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>, tensor<64x64xf32>
    %du3, %de3 = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x128x16xf32>)
        saved(%p, %lse : tensor<2x128x16xf32>, tensor<2x128xf32>) causal(true)
        : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$u,
    MoE_FloatTensor:$e,
    Optional<MoE_FloatTensor>:$ws,
    Optional<MoE_MaskTensor>:$key_mask,
    MoE_F32Tensor:$dp,
    Optional<MoE_F32Tensor>:$p,
    Optional<MoE_F32Tensor>:$lse,
    DefaultValuedAttr<F32Attr, "1.0">:$tau,
    DefaultValuedAttr<BoolAttr, "false">:$causal
  );
  let results = (outs MoE_F32Tensor:$du, MoE_F32Tensor:$de, Optional<MoE_F32Tensor>:$dws);

  let assemblyFormat = [{
    $u `,` $e (`ws` `(` $ws^ `:` type($ws) `)`)? (`key_mask` `(` $key_mask^ `:` type($key_mask) `)`)?
    `dp` `(` $dp `:` type($dp) `)` (`saved` `(` $p^ `,` $lse `:` type($p) `,` type($lse) `)`)?
    (`tau` `(` $tau^ `)`)? (`causal` `(` $causal^ `)`)? attr-dict
    `:` type($u) `,` type($e) `->` type($du) `,` type($de) (`,` type($dws)^)?
  }];
  let hasVerifier = 1;
}

def MoE_SimilarityInformFwdOp : MoE_InferredOp<"similarity_inform_fwd",
    !listconcat(MoE_PureInferred, [AttrSizedOperandSegments])> {
  let summary = "moe.similarity_inform for training: p and the row log-sum-exp its backward reads";
  let description = [{
    `moe.similarity_inform` (same operands, attributes and result `p`, in f32) that also returns the log-sum-exp
    of each row's softmax, `lse[b,i] = log Σ_j exp(x_ij)` over the keys the row mixes (`x` and the key rules as in
    `moe.similarity_inform_grad`), `-inf` for a row without keys. The training forward: the backward
    (`moe.similarity_inform_grad ... saved(p, lse)`) then rebuilds `S_ij = exp(x_ij − lse_i)` tile by tile instead
    of running the forward again, as FlashAttention-2 saves its log-sum-exp. `lse` is `[B, N]`: O(N) memory.

    ```mlir
    %p, %lse = moe.similarity_inform_fwd %u, %e tau(5.000000e-01) causal(true)
        : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>, tensor<2x128xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$u,
    MoE_FloatTensor:$e,
    Optional<MoE_FloatTensor>:$ws,
    Optional<MoE_MaskTensor>:$key_mask,
    DefaultValuedAttr<F32Attr, "1.0">:$tau,
    DefaultValuedAttr<BoolAttr, "false">:$causal
  );
  let results = (outs MoE_F32Tensor:$p, MoE_F32Tensor:$lse);

  let assemblyFormat = [{
    $u `,` $e (`ws` `(` $ws^ `:` type($ws) `)`)? (`key_mask` `(` $key_mask^ `:` type($key_mask) `)`)?
    (`tau` `(` $tau^ `)`)? (`causal` `(` $causal^ `)`)? attr-dict
    `:` type($u) `,` type($e) `->` type($p) `,` type($lse)
  }];
  let hasVerifier = 1;
}

def MoE_TopkRenormGradOp : MoE_InferredOp<"topk_renorm_grad", MoE_PureInferred> {
  let summary = "the backward of moe.topk_renorm: to the scores, through the kept values";
  let description = [{
    The vector-Jacobian product of the weights of `moe.topk_renorm` (operand `scores` `[..., K]` and attributes
    `mode`, `renormalize` as the forward op) with their cotangent `dw` (`[..., k]`, f32), given the forward's
    selection `indices` (`[..., k]`, i32, in `[0, K)`): the selection itself carries no gradient. With
    `sel_l = scores[idx_l]`, the forward weights `w` and `c = Σ_l dw_l w_l`:

    * `logits`, `renormalize = true` (`w = softmax(sel)`): `dscores[idx_l] = w_l (dw_l − c)`, 0 elsewhere;
    * `logits`, `renormalize = false` (`w = softmax(scores)[idx]`, the normalizer sees every logit):
      `dscores[j] = s_j (G_j − c)` with `s = softmax(scores)` and `G` = `dw` scattered to the selected experts;
    * `probs`, `renormalize = true` (`w = sel / Σ sel`): `dscores[idx_l] = (dw_l − c) / Σ sel`, 0 when the sum
      is 0 (the forward's zero weights are constant there);
    * `probs`, `renormalize = false` (`w = sel`): `dscores[idx_l] = dw_l`.

    A fully masked row (every logit `-inf`: zero weights) gets zero gradient. The result is f32 of the shape of
    `scores`. The weights are recomputed from `scores` with the forward's formula (MoE/Kernels/TopK.h), O(K) per
    row; nothing is saved by the forward besides its outputs.

    ```mlir
    %ds = moe.topk_renorm_grad %logits, %idx dw(%dw : tensor<4x128x2xf32>)
        : tensor<4x128x16xf32>, tensor<4x128x2xi32> -> tensor<4x128x16xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$scores,
    MoE_I32Tensor:$indices,
    MoE_F32Tensor:$dw,
    DefaultValuedAttr<MoE_TopkModeAttr, "::mlir::moe::TopkMode::logits">:$mode,
    DefaultValuedAttr<BoolAttr, "true">:$renormalize
  );
  let results = (outs MoE_F32Tensor:$dscores);

  let assemblyFormat = [{
    $scores `,` $indices `dw` `(` $dw `:` type($dw) `)` (`mode` `(` custom<EnumKeyword>($mode)^ `)`)?
    (`renormalize` `(` $renormalize^ `)`)? attr-dict `:` type($scores) `,` type($indices) `->` type($dscores)
  }];
  let hasVerifier = 1;
}

def MoE_HyperRouterGradOp : MoE_InferredOp<"hyper_router_grad", MoE_PureInferred> {
  let summary = "the backward of moe.hyper_router: to emb and the hypernetwork";
  let description = [{
    The vector-Jacobian product of `moe.hyper_router` (operands `emb` `[De]`, `w1` `[Dh, De]`, `b1` `[Dh]`,
    `w2` `[E·(D+1), Dh]`, `b2` `[E·(D+1)]` and `num_experts` exactly as the forward op) with the cotangents
    `dw` (`[E, D]`, f32) of the generated router matrix `w` and `db` (`[E]`, f32) of the generated bias `b`.
    With `a = w1 · emb + b1`, `h = relu(a)` and `out = w2 · h + b2` (the forward, recomputed: nothing is saved):

    * `dout = [dw | db]` reshaped row-major to `[E·(D+1)]` (the cotangent of `out`, the forward's split undone);
    * `d_b2 = dout`, `d_w2 = dout ⊗ h` (`d_w2[r, c] = dout[r] · h[c]`);
    * `dh = w2^T · dout`, `da = dh ⊙ 1[h > 0]` (the ReLU derivative, 0 at `a = 0` as in PyTorch; a NaN `a` passes
      `dh` through, also as PyTorch's `threshold_backward`);
    * `d_b1 = da`, `d_w1 = da ⊗ emb`, `d_emb = w1^T · da`.

    Every gradient is computed whether or not its operand is trained: a frozen hypernetwork (buffers, 002 §1.10)
    still passes its gradient to `emb` through `d_emb`, and a caller that does not use `d_w1`/`d_w2` lets the
    lowering's outer products be removed as dead code. Results are f32 in the shapes of their operands whatever
    the operand types (the caller casts). Sums (the two matrix-vector products with the transposes) accumulate in
    f32; the lowering is two `linalg.vecmat`, two outer products and elementwise generics (no `N`: the op has no
    token dimension, so it is small next to the router's matmul).

    ```mlir
    %demb, %dw1, %db1, %dw2, %db2 = moe.hyper_router_grad %emb, %w1, %b1, %w2, %b2
        dw(%dw : tensor<16x256xf32>) db(%db : tensor<16xf32>) num_experts(16)
        : tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<4112x256xf32>, tensor<4112xf32>
        -> tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<4112x256xf32>, tensor<4112xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$emb,
    MoE_FloatTensor:$w1,
    MoE_FloatTensor:$b1,
    MoE_FloatTensor:$w2,
    MoE_FloatTensor:$b2,
    MoE_F32Tensor:$dw,
    MoE_F32Tensor:$db,
    I64Attr:$num_experts
  );
  let results = (outs MoE_F32Tensor:$d_emb, MoE_F32Tensor:$d_w1, MoE_F32Tensor:$d_b1, MoE_F32Tensor:$d_w2,
                      MoE_F32Tensor:$d_b2);

  let assemblyFormat = [{
    $emb `,` $w1 `,` $b1 `,` $w2 `,` $b2 `dw` `(` $dw `:` type($dw) `)` `db` `(` $db `:` type($db) `)`
    `num_experts` `(` $num_experts `)` attr-dict
    `:` type($emb) `,` type($w1) `,` type($b1) `,` type($w2) `,` type($b2)
    `->` type($d_emb) `,` type($d_w1) `,` type($d_b1) `,` type($d_w2) `,` type($d_b2)
  }];
  let hasVerifier = 1;
}

def MoE_AttentionPosteriorGradOp : MoE_InferredOp<"attention_posterior_grad", MoE_NoEffectInferred> {
  let summary = "the backward of moe.attention_posterior (recomputes the posterior log-sum-exp)";
  let description = [{
    The vector-Jacobian product of the mixed probabilities `p` of `moe.attention_posterior` (operands `scores`,
    `u`, `v`, `wo`, `e` and attributes `sigma`, `head_select`, `head_scale` exactly as the forward op) with their
    cotangent `dp` (`[B, N, K]`, f32). Results: `d_scores` `[B, H, N, Nk]`, `d_u` `[B, N, D]`, `d_v`
    `[B, H, Nk, Dh]`, `d_wo` `[D, H·Dh]`, `d_e` `[B, Nk, K]`, all f32. Nothing flows through the chosen head `h*`
    or the entropies that chose it: `head` (`[B]` i32, the forward's second result) is an operand, required for
    `head_select = min_entropy` and absent for `all`.

    Derivation. Per batch element and head `h`, with `c = head_scale` (default `H`), `W_h = wo[:, h·Dh:(h+1)·Dh]`
    (`[D, Dh]`) and `m_hj = c · W_h v_hj` (`[D]`, the head means):

    * logits `z_hij = t_hij + (<u_i, m_hj> − ‖m_hj‖²/2) / sigma²`, `-inf` where `scores_hij = -inf`, with
      `t = scores` for `min_entropy` and `t_hij = scores_hij − lse_j(scores_hi:)` (the log prior) for `all`;
    * weights `G_hij`: for `min_entropy` `G = softmax_j(z_{h*})` on `h = h*` and 0 on the other heads; for `all`
      `G_hij = H'_hi · A'_hij = exp(z_hij − L_i)` with `L_i = logsumexp_{h,j} z_hij` (the head posterior times the
      per-head posterior is one softmax over the pairs `(h, j)`), so `p_i = Σ_{h,j} G_hij e_j` in both modes;
    * softmax backward: `g_ij = <dp_i, e_j>`, `δ_i = Σ_{h,j} G_hij g_ij = <dp_i, p_i>`,
      `dz_hij = G_hij (g_ij − δ_i)`;
    * `d_e_j = Σ_{h,i} G_hij dp_i`; `d_u_i = Σ_{h,j} dz_hij m_hj / sigma²`;
    * `dm_hj = (Σ_i dz_hij u_i − (Σ_i dz_hij) m_hj) / sigma²`, then through `m = c W_h v`:
      `d_v_hj = c · W_h^T dm_hj` and `d_wo[:, h·Dh:(h+1)·Dh] = c · Σ_{b,j} dm_hj ⊗ v_hj` (summed over the batch:
      `wo` is shared);
    * `d_scores_hij = dz_hij` for `min_entropy` (0 outside `h*`); for `all` the log prior adds
      `− softmax_j(scores_hi:)_j · Σ_j' dz_hij'`.

    Masked keys (`scores = -inf`) and rows without a key get `G = 0` and no gradient. A non-finite `e` entry gets
    no gradient and enters `g` as 0 (as autograd of the reference formulation, which keeps it out of the matmul);
    a NaN in `dp` or in the float operands propagates. Gradients are f32 whatever the operand types (the caller
    casts).

    Forward statistics: the posterior log-sum-exp (per row, and per head for `all`) is recomputed, as
    `moe.similarity_inform_grad` does (one pass over the keys like the forward's; the forward op and its torch op
    stay unchanged), but `h*` is an operand: recomputing it would read every head's `scores` for the row
    entropies (`H·N·Nk`) while the backward otherwise reads one head, and taking the forward's own choice makes
    the backward differentiate exactly the head the forward used, whichever kernel produced it. The `head` values
    must be in `[0, H)`: every lowering checks them at run time (no host synchronization) and reports a value
    outside through the run-time index errors (`moeReportIndexError`, include/MoE/Runtime/ErrorReporting.h); that
    batch element is skipped (all its gradients are 0, and it adds nothing to `d_wo`). Hence with `head` the op,
    free of memory effects, is not speculatable (like `mad_dispersion`).

    Memory: `d_scores` is itself `[B, H, N, Nk]` (the cotangent of `scores`). The fast CPU kernel (`min_entropy`)
    writes `dz` into it from flash-style tiles recomputed from the log-sum-exp and otherwise needs
    O(B·(N + Nk)·(D + K)): nothing else `N × Nk`. The portable lowering (every target, both modes) computes with
    `[B, H, N, Nk]` temporaries, the size of `d_scores`.

    ```mlir
    %ds, %du, %dv, %dwo, %de = moe.attention_posterior_grad %scores, %u, %v, %wo, %e head(%head : tensor<2xi32>)
        dp(%dp : tensor<2x128x16xf32>) sigma(2.000000e+00)
        : tensor<2x8x128x128xf32>, tensor<2x128x512xf32>, tensor<2x8x128x64xf32>, tensor<512x512xf32>,
          tensor<2x128x16xf32>
        -> tensor<2x8x128x128xf32>, tensor<2x128x512xf32>, tensor<2x8x128x64xf32>, tensor<512x512xf32>,
           tensor<2x128x16xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$scores,
    MoE_FloatTensor:$u,
    MoE_FloatTensor:$v,
    MoE_FloatTensor:$wo,
    MoE_FloatTensor:$e,
    Optional<MoE_I32Tensor>:$head,
    MoE_F32Tensor:$dp,
    DefaultValuedAttr<F32Attr, "1.0">:$sigma,
    DefaultValuedAttr<MoE_HeadSelectAttr, "::mlir::moe::HeadSelect::min_entropy">:$head_select,
    OptionalAttr<F32Attr>:$head_scale
  );
  let results = (outs MoE_F32Tensor:$d_scores, MoE_F32Tensor:$d_u, MoE_F32Tensor:$d_v, MoE_F32Tensor:$d_wo,
                      MoE_F32Tensor:$d_e);

  let assemblyFormat = [{
    $scores `,` $u `,` $v `,` $wo `,` $e (`head` `(` $head^ `:` type($head) `)`)? `dp` `(` $dp `:` type($dp) `)`
    (`sigma` `(` $sigma^ `)`)? (`head_select` `(` custom<EnumKeyword>($head_select)^ `)`)?
    (`head_scale` `(` $head_scale^ `)`)? attr-dict
    `:` type($scores) `,` type($u) `,` type($v) `,` type($wo) `,` type($e)
    `->` type($d_scores) `,` type($d_u) `,` type($d_v) `,` type($d_wo) `,` type($d_e)
  }];
  let hasVerifier = 1;

  let extraClassDeclaration = [{
    /// The factor of the head means: `head_scale` when set, else H (std::nullopt when H is dynamic).
    std::optional<double> getEffectiveHeadScale();
    /// An h* outside [0, H) is a run-time error: with a `head`, not hoisted past the control flow that guards it
    /// (as the ops that read run-time indices); `all` reads no index.
    ::mlir::Speculation::Speculatability getSpeculatability() {
      return getHead() ? ::mlir::Speculation::NotSpeculatable : ::mlir::Speculation::Speculatable;
    }
  }];
}

#endif // MOE_IR_MOEGRADOPS_TD
