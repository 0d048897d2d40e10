//===- MoEFusedOps.td - Mixing fused with its top-k gate ---*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// Not part of the DIALECT.md contract: the fusion pass (moe-fuse-routing)
// produces these ops from a mixing op followed by its top-k gate, so that one
// kernel computes the mixed probabilities and selects the experts in its
// epilogue, without writing the [B, N, K] probabilities to memory.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEFUSEDOPS_TD
#define MOE_IR_MOEFUSEDOPS_TD

def MoE_SimilarityInformTopkOp : MoE_InferredOp<"similarity_inform_topk",
    !listconcat(MoE_PureInferred, [AttrSizedOperandSegments])> {
  let summary = "Similarity-Inform mixing with the top-k gate in its epilogue (eq 11)";
  let description = [{
    `moe.similarity_inform` followed by `moe.topk_renorm mode(probs)`, as one op: the Similarity-Inform SMoE gate of
    Mutual-Inform eq 11, `TopM_Renormalize(Σ_j S[i,j] e_j)`. Operands and the attributes `tau`, `causal` are those of
    `moe.similarity_inform`; `k` and `renormalize` those of `moe.topk_renorm`. Results: the gate weights and expert
    indices, `[B, N, k]`. Every rule of the two ops holds unchanged (ties, NaN, masked rows, zero sums).

    Produced by `moe-fuse-routing`; the portable lowering splits it back into the two ops, the GPU lowering emits one
    kernel whose epilogue selects the experts from the K-wide accumulator held in registers.

    ```mlir
    %w, %idx = moe.similarity_inform_topk %u, %e k(2) causal(true)
        : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x2xf32>, tensor<2x128x2xi32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$u,
    MoE_FloatTensor:$e,
    Optional<MoE_FloatTensor>:$ws,
    Optional<MoE_MaskTensor>:$key_mask,
    DefaultValuedAttr<F32Attr, "1.0">:$tau,
    DefaultValuedAttr<BoolAttr, "false">:$causal,
    I64Attr:$k,
    DefaultValuedAttr<BoolAttr, "true">:$renormalize
  );
  let results = (outs MoE_F32Tensor:$weights, MoE_I32Tensor:$indices);

  let assemblyFormat = [{
    $u `,` $e (`ws` `(` $ws^ `:` type($ws) `)`)? (`key_mask` `(` $key_mask^ `:` type($key_mask) `)`)?
    `k` `(` $k `)` (`renormalize` `(` $renormalize^ `)`)? (`tau` `(` $tau^ `)`)? (`causal` `(` $causal^ `)`)?
    attr-dict `:` type($u) `,` type($e) `->` type($weights) `,` type($indices)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

def MoE_AttentionPosteriorTopkOp : MoE_InferredOp<"attention_posterior_topk", MoE_PureInferred> {
  let summary = "Attention-Inform mixing with the top-k gate in its epilogue (eq 17)";
  let description = [{
    `moe.attention_posterior` followed by `moe.topk_renorm mode(probs)` on its `p`, as one op: the Attention-Inform
    SMoE gate of Mutual-Inform eq 17, `TopM_Renormalize(Σ_j A'_{h*}[i,j] ē_j)`. Operands and the attributes `sigma`,
    `head_select`, `head_scale` are those of `moe.attention_posterior`; `k` and `renormalize` those of
    `moe.topk_renorm`. Results: the gate weights and expert indices, `[B, N, k]`, and the selected head `[B]`
    (−1 for `head_select = all`). Every rule of the two ops holds unchanged.

    ```mlir
    %w, %idx, %head = moe.attention_posterior_topk %scores, %u, %v, %wo, %e k(2)
        : tensor<2x8x128x128xf32>, tensor<2x128x512xf32>, tensor<2x8x128x64xf32>, tensor<512x512xf32>,
          tensor<2x128x16xf32> -> tensor<2x128x2xf32>, tensor<2x128x2xi32>, tensor<2xi32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$scores,
    MoE_FloatTensor:$u,
    MoE_FloatTensor:$v,
    MoE_FloatTensor:$wo,
    MoE_FloatTensor:$e,
    DefaultValuedAttr<F32Attr, "1.0">:$sigma,
    DefaultValuedAttr<MoE_HeadSelectAttr, "::mlir::moe::HeadSelect::min_entropy">:$head_select,
    OptionalAttr<F32Attr>:$head_scale,
    I64Attr:$k,
    DefaultValuedAttr<BoolAttr, "true">:$renormalize
  );
  let results = (outs MoE_F32Tensor:$weights, MoE_I32Tensor:$indices, MoE_I32Tensor:$head);

  let assemblyFormat = [{
    $scores `,` $u `,` $v `,` $wo `,` $e `k` `(` $k `)` (`renormalize` `(` $renormalize^ `)`)?
    (`sigma` `(` $sigma^ `)`)? (`head_select` `(` custom<EnumKeyword>($head_select)^ `)`)?
    (`head_scale` `(` $head_scale^ `)`)? attr-dict
    `:` type($scores) `,` type($u) `,` type($v) `,` type($wo) `,` type($e)
    `->` type($weights) `,` type($indices) `,` type($head)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

#endif // MOE_IR_MOEFUSEDOPS_TD
