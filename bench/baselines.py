"""PyTorch eager baselines: the straightforward formulations of the papers' reference pseudocode.

Written from ``shared/spec/*.md`` §2 (not from ``moe_mlir.ops``, whose references add NaN/tie/overflow handling the
papers' code does not have and so would make the baseline slower than what a user writes). Each function is what
a model author types: ``torch.topk`` + ``softmax``, ``softmax(U Uᵀ/τ) @ E`` materializing the N×N matrix,
``index_reduce`` cluster statistics, a one-hot ``Sᵀ S``, two GEMVs. The same functions are given to
``torch.compile`` for the compiled baseline.

Deviations from the spec text, all of which make the baseline *faster* (never slower):
* similarity_mix: the "all-masked row -> 0" guard ``(L == -inf).all(-1)`` is only applied when a key mask is
  given (without one no row can be fully masked: j = i is always a valid key).
* Index outputs stay int64 (torch's native index type); ours returns i32 per the dialect contract.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NEG = float("-inf")


# 002 §2 topk_gate(mode="renorm") == 000 §2 topm_softmax: TopK on the logits, softmax over the k winners.
def topk_renorm_logits(scores: torch.Tensor, k: int):
    val, idx = torch.topk(scores, k, dim=-1, largest=True, sorted=True)
    return torch.softmax(val.float(), dim=-1), idx


# 000 §2 topm_renormalize (eq 24/25): the k largest probabilities divided by their sum.
def topk_renorm_probs(p: torch.Tensor, k: int):
    val, idx = p.topk(k, dim=-1)
    den = val.sum(-1, keepdim=True)
    return val / den.clamp_min(torch.finfo(den.dtype).tiny), idx


# 000 §2 similarity_mix (eqs 5, 8, Def. 1): S = softmax(q uᵀ / tau) materialized [B,N,N], p = S E.
def similarity_mix(u, e, tau=1.0, Ws=None, causal=False, key_mask=None):
    uf = u.float()
    q = uf if Ws is None else uf @ Ws.float()
    L = q @ uf.transpose(-1, -2) / tau
    N = u.shape[1]
    if causal:
        L = L.masked_fill(~torch.ones(N, N, dtype=torch.bool, device=u.device).tril(), NEG)
    if key_mask is not None:
        L = L.masked_fill(~key_mask[:, None, :], NEG)
        S = torch.softmax(L, dim=-1).masked_fill((L == NEG).all(-1, keepdim=True), 0.0)
    else:
        S = torch.softmax(L, dim=-1)
    return S @ e.float()


# 000 §2 similarity_inform_smoe minus the router: topm_renormalize(similarity_mix(u, e), M).
def similarity_mix_topk(u, e, k, tau=1.0, causal=False):
    return topk_renorm_probs(similarity_mix(u, e, tau, causal=causal), k)


# 000 §2 head_entropy_select + head_means + attention_posterior_mix (eq 15-17, Lemma 1 in log space).
def head_entropy_select(scores):
    logA = torch.log_softmax(scores.float(), -1)
    ent = -(logA.exp() * logA.masked_fill(torch.isinf(logA), 0.0)).sum(-1)
    ent = ent.mean(-1)
    return ent.argmin(-1), ent


def head_means(v, Wo, h, head_scale=None):
    B, H, Nk, dh = v.shape
    D = Wo.shape[0]
    vs = v[torch.arange(B, device=v.device), h].float()
    Wos = Wo.float().view(D, H, dh).permute(1, 0, 2)[h]
    return (H if head_scale is None else head_scale) * vs @ Wos.transpose(-1, -2)


def attention_posterior_mix(u, scores_h, m, e, sigma=1.0):
    s2 = sigma * sigma
    m = m.float()
    logits = (scores_h.float() + (u.float() @ m.transpose(-1, -2)) / s2
              - 0.5 * (m * m).sum(-1)[:, None, :] / s2)
    Ap = torch.softmax(logits, -1).masked_fill((scores_h == NEG).all(-1, keepdim=True), 0.0)
    return Ap @ e.float()


def attention_posterior(scores, u, v, Wo, e, sigma=1.0):
    B = u.shape[0]
    h, _ = head_entropy_select(scores)
    m = head_means(v, Wo, h)
    p = attention_posterior_mix(u, scores[torch.arange(B, device=scores.device), h], m, e, sigma)
    return p, h


# 003 §2 cluster_stats (index_reduce means, two passes) + ac_weights with the dialect's defaults:
# empty="identity" (clusters with < 2 tokens keep weight 1 and leave the statistics), clip=10 against the mean of
# the valid weights, normalize="feature" (each feature column over the valid experts: 003's masked "cluster" norm).
def mad_dispersion(x, assign, E, eps=1e-4, clip=10.0):
    x = x.float()
    n, d = x.shape
    a = assign.long()
    counts = torch.bincount(a, minlength=E)
    mu = x.new_zeros(E, d).index_reduce(0, a, x, "mean", include_self=False)
    dev = (x - mu[a]).abs()
    disp = x.new_zeros(E, d).index_reduce(0, a, dev, "mean", include_self=False)
    valid = (counts >= 2).unsqueeze(1)
    W = torch.where(valid, 1.0 / (disp + eps), torch.ones_like(disp))
    W = torch.minimum(W, clip * W[valid.expand_as(W)].mean())
    W = W / ((W * valid).sum(0, keepdim=True) / valid.sum().clamp_min(1))
    return torch.where(valid, W, torch.ones_like(W)), counts


# 004 §2 coselect_counts (from the given top-k indices) + adjacency_update(norm="row").
def adjacency_update(A, idx, beta=0.9):
    S = torch.zeros(idx.shape[0], A.shape[0], dtype=torch.float32, device=A.device).scatter_(1, idx.long(), 1.0)
    C = S.t() @ S
    d = C.sum(1, keepdim=True)
    A_hat = torch.where(d > 0, C / d.clamp_min(1e-30), torch.zeros_like(C))
    return beta * A + (1 - beta) * A_hat


# 002 §2 hyper_generate (eq 2): W_r, b_r = (W2 relu(W1 e + b1) + b2).view(E, D+1) split.
def hyper_router(emb, w1, b1, w2, b2, E):
    v = (w2 @ torch.relu(w1 @ emb + b1) + b2).view(E, -1)
    return v[:, :-1], v[:, -1]


# Production routing: HF transformers' DeepseekV3TopkRouter.forward from its logits on (bench/routing.py and the
# GPU benchmark's DeepSeek-V3 router).
def hf_grouped_router(logits, bias, k: int, n_group: int, topk_group: int, scale: float):
    """HF transformers' DeepseekV3TopkRouter.forward from its logits on (transformers 5.x, verbatim maths)."""
    E = logits.shape[-1]
    scores = logits.sigmoid()
    scores_for_choice = scores + bias
    group_scores = scores_for_choice.view(-1, n_group, E // n_group).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, n_group, E // n_group).reshape(-1, E)
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    topk_indices = torch.topk(scores_for_choice, k=k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    return topk_weights * scale, topk_indices
