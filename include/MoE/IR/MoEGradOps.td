//===- MoEGradOps.td - Backward (vector-Jacobian) ops ------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// Not part of the DIALECT.md contract: the backward of the differentiable
// routing ops, one op per forward op, taking the forward operands and the
// cotangent of the forward result and returning the cotangents of the
// float operands. torch.ops.moe.<op>_backward (python/moe_mlir/ops.py) calls
// them from the autograd of torch.ops.moe.<op>.
//
// Which ops carry a gradient (DIALECT.md, the paper specs):
// * topk_renorm: to the scores, through the kept (selected) values only; the
//   indices carry none.
// * similarity_inform: to u, e and ws (this file).
// * attention_posterior (+ the fused forms): to scores, u, v, wo, e; none
//   through the chosen head h* or the top-k choice.
// * hyper_router: to emb, w1, b1, w2, b2 (frozen hypernetwork weights still
//   pass their gradient to emb, 002 §1.10).
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

    Memory (flash-style): nothing `N × N` is built. The lowering recomputes `lse` and `p` with the forward's
    streaming kernel (O(B·N) extra memory: the log-sum-exp is recomputed, not saved by the forward, so the
    forward op and its torch op stay unchanged), then streams the `S` tiles twice from `lse`: once
    query-major (`dq`), once key-major (`de` and the key part of `du`), so every sum has one writer and a fixed
    order (deterministic, independent of the thread count).

    ```mlir
    %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : tensor<2x128x16xf32>) tau(5.000000e-01) causal(true)
        : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>
    %du2, %de2, %dws = moe.similarity_inform_grad %u, %e ws(%ws : tensor<64x64xf32>) dp(%dp : tensor<2x128x16xf32>)
        : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x64xf32>, tensor<2x128x16xf32>, tensor<64x64xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$u,
    MoE_FloatTensor:$e,
    Optional<MoE_FloatTensor>:$ws,
    Optional<MoE_MaskTensor>:$key_mask,
    MoE_F32Tensor:$dp,
    DefaultValuedAttr<F32Attr, "1.0">:$tau,
    DefaultValuedAttr<BoolAttr, "false">:$causal
  );
  let results = (outs MoE_F32Tensor:$du, MoE_F32Tensor:$de, Optional<MoE_F32Tensor>:$dws);

  let assemblyFormat = [{
    $u `,` $e (`ws` `(` $ws^ `:` type($ws) `)`)? (`key_mask` `(` $key_mask^ `:` type($key_mask) `)`)?
    `dp` `(` $dp `:` type($dp) `)` (`tau` `(` $tau^ `)`)? (`causal` `(` $causal^ `)`)? attr-dict
    `:` type($u) `,` type($e) `->` type($du) `,` type($de) (`,` type($dws)^)?
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

#endif // MOE_IR_MOEGRADOPS_TD
