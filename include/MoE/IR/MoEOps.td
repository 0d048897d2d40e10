//===- MoEOps.td - The ops of the moe routing dialect ------*- tablegen -*-===//
//
// Part of the MoE-MLIR project.
//
// Op names, operand order, attribute names and result order follow the contract
// in shared/spec/DIALECT.md; the importer and the tests rely on them, also in
// the generic form.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_IR_MOEOPS_TD
#define MOE_IR_MOEOPS_TD

include "MoE/IR/MoEDialect.td"
include "MoE/IR/MoEAttrs.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

// Ranks and sizes are checked by the C++ verifiers, whose messages name the
// operand (`'u' must have rank 3 ...`); ODS fixes the element types.
def MoE_FloatTensor : RankedTensorOf<[F32, F16, BF16]>;
def MoE_F32Tensor : RankedTensorOf<[F32]>;
def MoE_IndexTensor : RankedTensorOf<[I32, I64]>;
def MoE_I32Tensor : RankedTensorOf<[I32]>;
def MoE_MaskTensor : RankedTensorOf<[I1]>;

// Every op is side-effect free and its result types follow from its operands.
// Shapes may be refined by the written result types (a static size where the
// operands leave it dynamic), hence `WithIsCompatible`.
defvar MoE_PureInferred = [Pure, InferTypeOpAdaptorWithIsCompatible];

// An op whose results are inferred: one compatibility rule for all of them.
class MoE_InferredOp<string mnemonic, list<Trait> traits>
    : MoE_Op<mnemonic, traits> {
  let extraClassDefinition = [{
    bool $cppClass::isCompatibleReturnTypes(::mlir::TypeRange inferred,
                                            ::mlir::TypeRange written) {
      return ::mlir::moe::compatibleResultTypes(inferred, written);
    }
  }];
}

// Ops that read run-time indices (`assign`, `idx`, `indices`, the `head` of
// attention_posterior_grad) report out-of-range values;
// like `arith.divsi`, they have no memory effect but must not be hoisted past the
// control flow that guards them.
defvar MoE_NoEffectInferred = [NoMemoryEffect, ConditionallySpeculatable,
                               InferTypeOpAdaptorWithIsCompatible];

//===----------------------------------------------------------------------===//
// topk_renorm
//===----------------------------------------------------------------------===//

def MoE_TopkRenormOp : MoE_InferredOp<"topk_renorm", MoE_PureInferred> {
  let summary = "top-k expert selection with renormalized gate weights";
  let description = [{
    Selects, independently for every row of `scores` (shape `[..., K]`, any leading shape), the `k` largest
    entries and returns their gate weights and expert indices, both of shape `[..., k]`, sorted by descending
    score. It is the gate of all four seed routers.

    * `mode = logits` (default): `scores` are router logits `r`. With `renormalize = true` (default) the weights
      are the softmax over the `k` selected logits, `w = softmax(TopK(r))`, which equals
      softmax → top-k → renormalize exactly (Mutual-Inform App. A.3, eq 24/25; the gate of HyperRouter eq 2 as
      released, and of ACMoE eq 1). With `renormalize = false` the weights are the dense softmax over all `K`
      logits read at the selected experts, `w_j = softmax(r)_{idx_j}` (HyperRouter eq 1/2 read literally).
    * `mode = probs`: `scores` are probabilities `p` (the mixed `p` of Similarity-/Attention-Inform, Symphony's
      `G`). With `renormalize = true` the weights are `p_{idx_j} / Σ_l p_{idx_l}` (TopM_Renormalize, eq 11/17);
      a zero sum yields zero weights. With `renormalize = false` they are the selected values unchanged
      (Symphony eq 8, `combine = raw`).

    Selection order and edge rules:
    * Ties break to the lowest index: among equal scores, the smaller expert index comes first.
    * NaN ranks above every number (as in `torch.topk`), so a row holding NaN selects it first and its weights are
      NaN (logits mode, or probs mode with renormalization; raw probs keep NaN only where selected). Indices are
      always in `[0, K)`.
    * `-inf` logits (masked experts) get weight 0; a row whose every logit is `-inf` yields zero weights (never
      NaN) and the indices `0, 1, ..., k-1`. A `+inf` logit yields NaN weights (`inf - inf`), as in PyTorch.
    * Accumulation is in f32 whatever the element type of `scores`.

    The indices are `i32` or, written so in the result type, `i64` (as `torch.topk` returns them: a consumer that
    wants int64 then needs no cast of its own); the inferred type is `i32`.

    Attributes: `k` in `[1, K]`; `mode` (`logits` | `probs`); `renormalize` (bool).

    Example (two of sixteen experts for every token of a `[4, 128]` batch):

    ```mlir
    %w, %idx = moe.topk_renorm %logits k(2)
        : tensor<4x128x16xf32> -> tensor<4x128x2xf32>, tensor<4x128x2xi32>
    %w2, %idx2 = moe.topk_renorm %p k(1) mode(probs) renormalize(false)
        : tensor<?x16xbf16> -> tensor<?x1xf32>, tensor<?x1xi32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$scores,
    I64Attr:$k,
    DefaultValuedAttr<MoE_TopkModeAttr, "::mlir::moe::TopkMode::logits">:$mode,
    DefaultValuedAttr<BoolAttr, "true">:$renormalize
  );
  let results = (outs MoE_F32Tensor:$weights, MoE_IndexTensor:$indices);

  let assemblyFormat = [{
    $scores `k` `(` $k `)` (`mode` `(` custom<EnumKeyword>($mode)^ `)`)? (`renormalize` `(` $renormalize^ `)`)? attr-dict
    `:` type($scores) `->` type($weights) `,` type($indices)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// similarity_inform
//===----------------------------------------------------------------------===//

def MoE_SimilarityInformOp : MoE_InferredOp<"similarity_inform",
    !listconcat(MoE_PureInferred, [AttrSizedOperandSegments])> {
  let summary = "Similarity-Inform mixing of router probabilities over the tokens of a sequence";
  let description = [{
    Mixes the dense router probabilities `e` (`[B, N, K]`) of the tokens of each sequence through their
    similarity (Mutual-Inform §3.1, Def. 1):

    * eq 5: `S[b,i,j] = softmax_j(u_i^T W_s u_j / tau)` over the tokens `j` of the same sequence `b`, `j = i`
      included; `W_s` is `ws` (`[D, D]`) or the identity when `ws` is absent (all the paper's experiments);
    * eq 8: `p[b,i,:] = Σ_j S[b,i,j] · e[b,j,:]`.

    Eq 11 (Similarity-Inform SMoE) follows with `moe.topk_renorm mode(probs)` on `p`.

    `causal = true` lets token `i` mix only `j ≤ i` (decoder LMs: otherwise the gate sees future tokens).
    `key_mask` (`[B, N]`, i1) excludes the keys where it is false. Masked keys get `S = 0`; a row whose every key is
    masked yields `p = 0`, never NaN. NaN in `u` or `e` propagates to every row that mixes it.

    The lowering never materializes `S` (`N × N`): it streams key tiles with an online softmax whose value width
    is `K`, in f32 (logits reach `‖u‖²/tau ≈ D` for LayerNorm'd inputs).

    Attributes: `tau` > 0 and finite (default 1.0); `causal` (default false).

    ```mlir
    %p = moe.similarity_inform %u, %e tau(5.000000e-01) causal(true)
        : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
    %q = moe.similarity_inform %u, %e ws(%ws : tensor<64x64xf32>) key_mask(%m : tensor<2x128xi1>)
        : tensor<2x128x64xf32>, tensor<2x128x16xf32> -> tensor<2x128x16xf32>
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
  let results = (outs MoE_F32Tensor:$p);

  let assemblyFormat = [{
    $u `,` $e (`ws` `(` $ws^ `:` type($ws) `)`)? (`key_mask` `(` $key_mask^ `:` type($key_mask) `)`)?
    (`tau` `(` $tau^ `)`)? (`causal` `(` $causal^ `)`)? attr-dict
    `:` type($u) `,` type($e) `->` type($p)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

//===----------------------------------------------------------------------===//
// attention_posterior
//===----------------------------------------------------------------------===//

def MoE_AttentionPosteriorOp : MoE_InferredOp<"attention_posterior", MoE_PureInferred> {
  let summary = "Attention-Inform mixing through the attention posterior of the lowest-entropy head";
  let description = [{
    Mixes the router probabilities `e` of the keys (`[B, Nk, K]`) through the *posterior* of the attention
    (Mutual-Inform §3.2, Lemma 1). Operands: `scores` `[B, H, N, Nk]` are the pre-softmax attention logits of
    every head (`-inf` = masked); `u` `[B, N, D]` the MoE input (`ū = MHA(X)`); `v` `[B, H, Nk, Dh]` the per-head
    values; `wo` `[D, H·Dh]` the attention out-projection in `nn.Linear` layout.

    * Head means (eq 1): `m[b,h,j,:] = head_scale · v[b,h,j,:] · wo[:, h·Dh:(h+1)·Dh]^T`; `head_scale` defaults to
      `H`, which makes `ū_i = (1/H) Σ_h Σ_j A_h[i,j] m_{h,j}` exact.
    * Posterior (Lemma 1, in log space because the Gaussian density `(2π)^{-D/2}` underflows f32):
      `A'_h[i,:] = softmax_j(scores[b,h,i,j] + <u_i, m_{h,j}>/sigma² − ‖m_{h,j}‖²/(2 sigma²))`.
    * `head_select = min_entropy` (eq 15–17): `h* = argmin_h mean_i ℋ(softmax_j scores[b,h,i,:])`, the head whose
      prior attention rows have the lowest mean entropy (`0 · log 0 = 0`); then `p[b,i,:] = Σ_j A'_{h*}[i,j] e[b,j,:]`
      and the result `head[b] = h*`. Rows whose every key is masked are left out of the mean (a head with no valid
      row has mean 0). Ties break to the lowest head; a NaN mean entropy counts as the minimum (as in
      `torch.argmin`), so NaN propagates instead of being skipped.
    * `head_select = all` (eq 13/14): `p[b,i,:] = Σ_h H'[i,h] Σ_j A'_h[i,j] e[b,j,:]` with the head posterior
      `H'[i,:] = softmax_h(logsumexp_j(log_softmax(scores[b,h,i,:])_j + <u_i,m_{h,j}>/sigma² − ‖m_{h,j}‖²/(2 sigma²)))`;
      `head` is then −1.

    Eq 17 (Attention-Inform SMoE) follows with `moe.topk_renorm mode(probs)` on `p`. A query row whose every key is
    masked yields `p = 0`. All of it accumulates in f32; the lowering never stores the `N × Nk` posterior.

    Attributes: `sigma` > 0 and finite (default 1.0); `head_select` (`min_entropy` | `all`); `head_scale`
    (optional, finite; default `H`).

    ```mlir
    %p, %head = moe.attention_posterior %scores, %u, %v, %wo, %e sigma(2.000000e+00)
        : tensor<2x8x128x128xf32>, tensor<2x128x512xf32>, tensor<2x8x128x64xf32>, tensor<512x512xf32>,
          tensor<2x128x16xf32> -> tensor<2x128x16xf32>, tensor<2xi32>
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
    OptionalAttr<F32Attr>:$head_scale
  );
  let results = (outs MoE_F32Tensor:$p, MoE_I32Tensor:$head);

  let assemblyFormat = [{
    $scores `,` $u `,` $v `,` $wo `,` $e (`sigma` `(` $sigma^ `)`)? (`head_select` `(` custom<EnumKeyword>($head_select)^ `)`)?
    (`head_scale` `(` $head_scale^ `)`)? attr-dict
    `:` type($scores) `,` type($u) `,` type($v) `,` type($wo) `,` type($e) `->` type($p) `,` type($head)
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;

  let extraClassDeclaration = [{
    /// The factor of the head means: `head_scale` when set, else the number of heads H.
    /// Returns std::nullopt when H is dynamic and `head_scale` is unset.
    std::optional<double> getEffectiveHeadScale();
  }];
}

//===----------------------------------------------------------------------===//
// mad_dispersion
//===----------------------------------------------------------------------===//

def MoE_MadDispersionOp : MoE_InferredOp<"mad_dispersion", MoE_NoEffectInferred> {
  let summary = "ACMoE adaptive-clustering feature weights from per-cluster dispersion";
  let description = [{
    Computes the diagonal AC transformations `M_k = diag(W[k,:])` of ACMoE (Tight Clusters Def. 1 and
    "Implementation details") from the tokens `tokens` (`[T, D]`) and their cluster `assign` (`[T]`, the previous
    layer's top-1 expert, in `[0, num_experts)`). Results: `weights` `[E, D]` (f32) and `counts` `[E]` (i32), the
    number of tokens of every cluster, with `E = num_experts`.

    * Cluster mean `μ[k,q] = mean_{t ∈ C_k} x[t,q]`.
    * `measure = mad` (default): `s[k,q] = mean_{t ∈ C_k} |x[t,q] − μ[k,q]|` (the cluster mean is subtracted:
      reading A of Def. 1, the authors' code); `measure = variance`: `s[k,q] = mean_{t ∈ C_k} (x[t,q] − μ[k,q])²`
      (the population variance of the ablation).
    * `W = 1 / (s + eps)`; if `clip > 0`, `W = min(W, clip · mean(W))` with the mean over all entries; then `W` is
      rescaled to mean 1: `normalize = feature` (default) divides each feature column by its mean over experts
      (the authors' language-model code), `expert` each expert row by its mean over features (eq 21), `global` all
      of `W` by one scalar mean.
    * `empty = identity` (default): clusters with fewer than 2 tokens get `W = 1` everywhere (`M_k = I`, Remark 1)
      and are left out of the clip and normalization statistics. `empty = raw` reproduces the authors' code: an
      empty cluster has `μ = s = 0`, so `W = 1/eps`, and enters every statistic (this shrinks every other weight).
    * A value of `assign` outside `[0, E)` is a run-time error: the token is left out (never written out of
      bounds) and the error is reported to the caller (the execution API returns it; under `mlir-runner` it is
      printed). NaN in `tokens` propagates to its cluster and, through the statistics, to `W`.
    * Sums are f32, in a fixed order, so the result is deterministic.

    Attributes: `num_experts` ≥ 1; `eps` > 0 (default 1e-4); `clip` ≥ 0 (default 10, 0 disables);
    `normalize`, `measure`, `empty` as above.

    The AC router logits (eq 8) `logits[t,k] = Σ_q x[t,q] · W[assign[t],q] · emb[k,q]` are a gather and a
    `linalg.matmul` on the result.

    ```mlir
    %w, %counts = moe.mad_dispersion %x, %assign num_experts(16) normalize(expert) empty(raw)
        : tensor<4096x352xf32>, tensor<4096xi32> -> tensor<16x352xf32>, tensor<16xi32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$tokens,
    MoE_IndexTensor:$assign,
    I64Attr:$num_experts,
    DefaultValuedAttr<F32Attr, "1.0e-4">:$eps,
    DefaultValuedAttr<F32Attr, "10.0">:$clip,
    DefaultValuedAttr<MoE_DispersionNormalizeAttr,
                      "::mlir::moe::DispersionNormalize::feature">:$normalize,
    DefaultValuedAttr<MoE_DispersionMeasureAttr, "::mlir::moe::DispersionMeasure::mad">:$measure,
    DefaultValuedAttr<MoE_EmptyClusterAttr, "::mlir::moe::EmptyCluster::identity">:$empty
  );
  let results = (outs MoE_F32Tensor:$weights, MoE_I32Tensor:$counts);

  let assemblyFormat = [{
    $tokens `,` $assign `num_experts` `(` $num_experts `)` (`eps` `(` $eps^ `)`)? (`clip` `(` $clip^ `)`)?
    (`normalize` `(` custom<EnumKeyword>($normalize)^ `)`)? (`measure` `(` custom<EnumKeyword>($measure)^ `)`)? (`empty` `(` custom<EnumKeyword>($empty)^ `)`)? attr-dict
    `:` type($tokens) `,` type($assign) `->` type($weights) `,` type($counts)
  }];
  let hasVerifier = 1;

  let extraClassDeclaration = [{
    ::mlir::Speculation::Speculatability getSpeculatability() {
      return ::mlir::Speculation::NotSpeculatable;
    }
  }];
}

//===----------------------------------------------------------------------===//
// adjacency_update
//===----------------------------------------------------------------------===//

def MoE_AdjacencyUpdateOp : MoE_InferredOp<"adjacency_update", MoE_NoEffectInferred> {
  let summary = "SymphonySMoE moving-average update of the expert co-selection graph";
  let description = [{
    One training-step update of Symphony's expert graph `a` (`[E, E]`) from `idx` (`[T, k]`), each token's top-k
    experts on the *base* router logits (Symphony Alg. 1 lines 3–9, 15–16; eq 6–7):

    * `S[t,j] = 1[j ∈ idx[t,:]]` (an indicator: a repeated index counts once), `C = S^T S`, the integer
      co-selection counts (exact, so the result is deterministic); `include_self = false` zeroes the diagonal of
      `C`;
    * `norm = row` (default, Alg. 1 `RowNorm`) divides each row of `C` by its sum, `col` each column (eq 7's `1/π_k`),
      `none` keeps the counts; an all-zero row or column stays zero (an expert no token chose);
    * `a_next = beta · a + (1 − beta) · Norm(C)`.

    The Symphony gate itself is `G = softmax(logits) · a^T` (a `linalg.matmul`) followed by
    `moe.topk_renorm mode(probs) renormalize(false)`.

    A value of `idx` outside `[0, E)` is a run-time error: the entry is left out (never written out of bounds)
    and the error is reported to the caller. With `beta = 1` the op folds to `a` (the graph is frozen).

    Attributes: `beta` in `[0, 1]` (default 0.9); `norm` (`row` | `col` | `none`); `include_self` (default true).

    ```mlir
    %a1 = moe.adjacency_update %a0, %idx beta(9.900000e-01) norm(col)
        : tensor<16x16xf32>, tensor<8192x2xi32> -> tensor<16x16xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$a,
    MoE_IndexTensor:$idx,
    DefaultValuedAttr<F32Attr, "0.9">:$beta,
    DefaultValuedAttr<MoE_AdjacencyNormAttr, "::mlir::moe::AdjacencyNorm::row">:$norm,
    DefaultValuedAttr<BoolAttr, "true">:$include_self
  );
  let results = (outs MoE_F32Tensor:$a_next);

  let assemblyFormat = [{
    $a `,` $idx (`beta` `(` $beta^ `)`)? (`norm` `(` custom<EnumKeyword>($norm)^ `)`)? (`include_self` `(` $include_self^ `)`)?
    attr-dict `:` type($a) `,` type($idx) `->` type($a_next)
  }];
  let hasVerifier = 1;
  let hasFolder = 1;

  let extraClassDeclaration = [{
    ::mlir::Speculation::Speculatability getSpeculatability() {
      return ::mlir::Speculation::NotSpeculatable;
    }
  }];
}

//===----------------------------------------------------------------------===//
// hyper_router
//===----------------------------------------------------------------------===//

def MoE_HyperRouterOp : MoE_InferredOp<"hyper_router", MoE_PureInferred> {
  let summary = "HyperRouter: router weights generated by a frozen hypernetwork";
  let description = [{
    Generates the router of a HyperRouter layer (HyperRouter §3.2 eq 2, App. C.1) from the layer's trainable
    embedding `emb` (`[De]`) with the frozen two-layer hypernetwork `w1` `[Dh, De]`, `b1` `[Dh]`, `w2`
    `[E·(D+1), Dh]`, `b2` `[E·(D+1)]`:

    * `out = w2 · relu(w1 · emb + b1) + b2`, reshaped row-major to `[E, D+1]`;
    * `w = out[:, :D]` (`[E, D]`, the router matrix `W_r`) and `b = out[:, D]` (`[E]`, the generated bias).

    The router logits are then `x · w^T + b`, gated by `moe.topk_renorm`. Accumulation is in f32.

    When every operand is a constant (inference), the op folds to two constants: the router is generated once
    and stored (App. C.4). A training graph passes `emb` as an argument, so nothing folds there.

    Attributes: `num_experts` (E) ≥ 1; the verifier checks that `w2` has `E·(D+1)` rows.

    ```mlir
    %w, %b = moe.hyper_router %emb, %w1, %b1, %w2, %b2 num_experts(16)
        : tensor<256xf32>, tensor<256x256xf32>, tensor<256xf32>, tensor<4112x256xf32>, tensor<4112xf32>
        -> tensor<16x256xf32>, tensor<16xf32>
    ```
  }];

  let arguments = (ins
    MoE_FloatTensor:$emb,
    MoE_FloatTensor:$w1,
    MoE_FloatTensor:$b1,
    MoE_FloatTensor:$w2,
    MoE_FloatTensor:$b2,
    I64Attr:$num_experts
  );
  let results = (outs MoE_F32Tensor:$w, MoE_F32Tensor:$b);

  let assemblyFormat = [{
    $emb `,` $w1 `,` $b1 `,` $w2 `,` $b2 `num_experts` `(` $num_experts `)` attr-dict
    `:` type($emb) `,` type($w1) `,` type($b1) `,` type($w2) `,` type($b2) `->` type($w) `,` type($b)
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Fused ops (produced by moe-fuse-routing)
//===----------------------------------------------------------------------===//

include "MoE/IR/MoEFusedOps.td"
include "MoE/IR/MoERoutingOps.td"
include "MoE/IR/MoEBalanceOps.td"
include "MoE/IR/MoEGradOps.td"
include "MoE/IR/MoEKernelOp.td"

#endif // MOE_IR_MOEOPS_TD
