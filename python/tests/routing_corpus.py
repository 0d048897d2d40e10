"""Routing programs in many spellings: what raising by meaning must hold (test_raising_corpus.py).

Written by this team from the routers' definitions (../shared/spec, the routers' papers and model cards), each in
independent spellings of the kinds users write: as transformers writes its routers (``hf``), as a serving
engine's PyTorch-native path writes them (``engine``: one function of the gating output, ``view`` / ``size(0)``
sizes, ``zeros_like(...).scatter_`` masks, ``masked_fill(~mask.bool(), -inf)``, ``topk(sorted=False)``, int32
indices), and as a training framework writes them (``train``: ``torch.where`` masks built from ``one_hot`` or
comparisons, ``take_along_dim``, ``log_softmax().exp()`` / ``exp(x - logsumexp)``, in-place renormalisation).
No spelling is copied from anyone's code.

A program takes ``(logits [T, E] f32, bias [E] f32)`` (bias ignored where the router has none) and returns
``(weights [T, k], indices [T, k])``. :data:`CORPUS` lists ``(name, program, E, k, scoring of the expected op)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

NEG = float("-inf")


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    E: int
    k: int
    #: The raised op expected in the compiled graph.
    op: str
    #: Whether the program reads the bias.
    biased: bool = False


# ----------------------------------------------------------------------------------------------------------------
# Group masks, three ways (True = kept)
# ----------------------------------------------------------------------------------------------------------------


def _keep_groups_scatter(choice, G, keep, by):
    n = choice.size(0)
    grouped = choice.view(n, G, -1)
    gs = grouped.topk(2, dim=-1)[0].sum(dim=-1) if by == "top2" else grouped.max(dim=-1).values
    gidx = torch.topk(gs, k=keep, dim=-1, sorted=False)[1]
    gmask = torch.zeros_like(gs)
    gmask.scatter_(1, gidx, 1)
    return gmask.unsqueeze(-1).expand(n, G, choice.size(-1) // G).reshape(n, -1).bool()


def _keep_groups_one_hot(choice, G, keep, by):
    T, E = choice.shape
    grouped = choice.unflatten(-1, (G, E // G))
    gs = grouped.topk(2, dim=-1).values.sum(-1) if by == "top2" else grouped.amax(-1)
    gidx = gs.topk(keep, dim=-1).indices
    kept = F.one_hot(gidx, G).sum(1) > 0
    return kept.repeat_interleave(E // G, dim=-1)


def _keep_groups_index(choice, G, keep, by):
    T, E = choice.shape
    grouped = choice.reshape(T, G, E // G)
    if by == "top2":
        top2 = torch.topk(grouped, 2, dim=2, sorted=True).values
        gs = top2[..., 0] + top2[..., 1]
    else:
        gs = torch.max(grouped, dim=2)[0]
    _, gidx = torch.topk(gs, keep, dim=1)
    kept = torch.zeros(T, G, dtype=torch.bool, device=choice.device).scatter(1, gidx, True)
    return kept[:, :, None].expand(-1, -1, E // G).reshape(T, E)


# ----------------------------------------------------------------------------------------------------------------
# Softmax, top-k, renormalised (Mixtral, Qwen3-MoE, OLMoE with norm_topk_prob)
# ----------------------------------------------------------------------------------------------------------------


def softmax_renorm_hf(x, b, k=8):
    p = F.softmax(x, dim=1, dtype=torch.float)
    w, i = torch.topk(p, k, dim=-1)
    w /= w.sum(dim=-1, keepdim=True)
    return w.to(x.dtype), i


def softmax_renorm_engine(x, b, k=8):
    scores = torch.softmax(x.float(), dim=-1)
    topk_weights, topk_ids = scores.topk(k, dim=-1, sorted=False)
    topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)


def softmax_renorm_train(x, b, k=8):
    probs = x.log_softmax(-1).exp()
    top = probs.topk(k)
    w = top.values / (top.values.sum(-1, keepdim=True) + 1e-20)
    return w, top.indices


def softmax_renorm_topk_first(x, b, k=8):
    v, i = torch.topk(x, k)
    return torch.softmax(v, dim=-1), i


# Softmax, top-k, not renormalised (Qwen2-MoE, OLMoE, DeepSeek-V2-Lite's greedy)
def softmax_plain_hf(x, b, k=4):
    p = F.softmax(x, dim=-1, dtype=torch.float32)
    w, i = torch.topk(p, k, dim=-1)
    return w, i


def softmax_plain_engine(x, b, k=4):
    v, i = torch.topk(x, k, dim=-1, sorted=False)
    w = torch.exp(v - torch.logsumexp(x, dim=-1, keepdim=True))
    return w, i.to(torch.int32)


def softmax_plain_train(x, b, k=4):
    i = torch.argsort(x, dim=-1, descending=True)[:, :k]
    w = torch.gather(torch.softmax(x, -1), 1, i)
    return w, i


def softmax_plain_take(x, b, k=4):
    i = x.topk(k, sorted=False).indices
    w = torch.take_along_dim(F.log_softmax(x, dim=-1), i, dim=-1).exp()
    return w, i


# Top-k of the logits, then a softmax over them (gpt-oss, Mixtral's original)
def topk_softmax_hf(x, b, k=4):
    v, i = torch.topk(x, k, dim=-1)
    return F.softmax(v, dim=1, dtype=v.dtype), i


def topk_softmax_engine(x, b, k=4):
    v, i = x.float().topk(k, dim=-1, sorted=False)
    e = torch.exp(v - v.max(dim=-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True), i.to(torch.int32)


def topk_softmax_train(x, b, k=4):
    top = torch.topk(x, k)
    return (top.values - torch.logsumexp(top.values, -1, keepdim=True)).exp(), top.indices


# ----------------------------------------------------------------------------------------------------------------
# Sigmoid with a correction bias, grouped by the top-2 sum (DeepSeek-V3/R1, Kimi-K2 with groups)
# ----------------------------------------------------------------------------------------------------------------


def dsv3_hf(x, b, G=8, keep=4, k=8, scale=2.5):
    s = x.sigmoid()
    choice = s.view(-1, x.shape[-1]) + b.unsqueeze(0)
    group_scores = choice.view(-1, G, x.shape[-1] // G).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=keep, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, G, x.shape[-1] // G).reshape(-1, x.shape[-1])
    masked = choice.masked_fill(~score_mask.bool(), 0.0 if False else NEG)
    idx = torch.topk(masked, k=k, dim=-1, sorted=False)[1]
    w = s.gather(1, idx)
    w /= w.sum(dim=-1, keepdim=True) + 1e-20
    return w * scale, idx


def dsv3_engine(x, b, G=8, keep=4, k=8, scale=2.5):
    scores = x.sigmoid()
    num_token = scores.size(0)
    scores_for_choice = scores.view(num_token, -1) + b.unsqueeze(0)
    kept = _keep_groups_scatter(scores_for_choice, G, keep, "top2")
    tmp_scores = scores_for_choice.masked_fill(~kept, float("-inf"))
    topk_ids = torch.topk(tmp_scores, k=k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_ids)
    topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    topk_weights = topk_weights * scale
    return topk_weights.to(torch.float32), topk_ids.to(torch.int32)


def dsv3_train(x, b, G=8, keep=4, k=8, scale=2.5):
    scores = torch.sigmoid(x.float())
    choice = scores + b
    kept = _keep_groups_one_hot(choice, G, keep, "top2")
    choice = torch.where(kept, choice, torch.full_like(choice, NEG))
    idx = torch.topk(choice, k, dim=-1).indices
    w = torch.take_along_dim(scores, idx, dim=-1)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * scale
    return w, idx


def dsv3_index(x, b, G=8, keep=4, k=8, scale=2.5):
    scores = torch.sigmoid(x)
    choice = scores + b[None, :]
    kept = _keep_groups_index(choice, G, keep, "top2")
    choice = choice + torch.where(kept, 0.0, NEG)
    _, idx = choice.topk(k, dim=1, sorted=True)
    w = scores.gather(-1, idx)
    return scale * (w / w.sum(-1, keepdim=True)), idx


# Sigmoid + bias, no groups (Kimi-K2, GLM-4.5 style), renormalised and scaled
def sig_bias_hf(x, b, k=8, scale=2.827):
    s = x.sigmoid()
    idx = torch.topk(s + b.unsqueeze(0), k=k, dim=-1, sorted=False)[1]
    w = s.gather(1, idx)
    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * scale, idx


def sig_bias_engine(x, b, k=8, scale=2.827):
    scores = torch.sigmoid(x.float())
    _, topk_ids = torch.topk(scores + b, k=k, dim=-1, sorted=False)
    topk_weights = torch.gather(scores, dim=1, index=topk_ids)
    topk_weights /= topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights * scale, topk_ids.to(torch.int32)


def sig_bias_train(x, b, k=8, scale=2.827):
    scores = torch.sigmoid(x)
    idx = torch.argsort(scores + b, dim=-1, descending=True, stable=True)[..., :k]
    w = torch.take_along_dim(scores, idx, -1)
    return w / w.sum(-1, keepdim=True) * scale, idx


# Sigmoid, no bias, top-k, renormalised (a plain sigmoid router)
def sig_plain_hf(x, b, k=4):
    s = torch.sigmoid(x)
    w, i = torch.topk(s, k, dim=-1)
    return w / w.sum(-1, keepdim=True), i


def sig_plain_engine(x, b, k=4):
    _, i = torch.topk(x, k, dim=-1, sorted=False)
    w = x.sigmoid().gather(1, i)
    return w / w.sum(-1, keepdim=True), i.to(torch.int32)


def sig_plain_train(x, b, k=4):
    s = x.sigmoid()
    i = s.topk(k).indices
    w = s.take_along_dim(i, dim=-1)
    w = w / (w.sum(-1, keepdim=True) + 1e-9)
    return w, i


# ----------------------------------------------------------------------------------------------------------------
# Softmax grouped by the max, no bias (DeepSeek-V2: 160 experts in 8 groups keep 3, top-6, scaled by 16)
# ----------------------------------------------------------------------------------------------------------------


def dsv2_hf(x, b, G=8, keep=3, k=6, scale=16.0):
    scores = x.softmax(dim=-1, dtype=torch.float32)
    n = x.shape[0]
    group_scores = scores.view(n, G, -1).max(dim=-1).values
    group_idx = torch.topk(group_scores, k=keep, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(n, G, x.shape[-1] // G).reshape(n, -1)
    tmp = scores.masked_fill(~score_mask.bool(), 0.0)
    topk_weight, topk_idx = torch.topk(tmp, k=k, dim=-1, sorted=False)
    return topk_weight * scale, topk_idx


def dsv2_engine(x, b, G=8, keep=3, k=6, scale=16.0):
    scores = torch.softmax(x, dim=-1)
    kept = _keep_groups_scatter(scores, G, keep, "max")
    tmp_scores = scores.masked_fill(~kept, float("-inf"))
    topk_weights, topk_ids = torch.topk(tmp_scores, k=k, dim=-1, sorted=False)
    return topk_weights * scale, topk_ids.to(torch.int32)


def dsv2_train(x, b, G=8, keep=3, k=6, scale=16.0):
    probs = F.log_softmax(x, dim=-1).exp()
    kept = _keep_groups_index(probs, G, keep, "max")
    masked = torch.where(kept, probs, torch.zeros_like(probs))
    top = masked.topk(k)
    return top.values * scale, top.indices


# Softmax grouped by the max, renormalised (16 experts in 8 groups keep 2, top-2)
def grouped_softmax_hf(x, b, G=8, keep=2, k=2):
    scores = F.softmax(x, dim=-1, dtype=torch.float32)
    n = scores.shape[0]
    gs = scores.view(n, G, -1).max(dim=-1).values
    gi = torch.topk(gs, k=keep, dim=-1, sorted=False)[1]
    gm = torch.zeros_like(gs)
    gm.scatter_(1, gi, 1)
    sm = gm.unsqueeze(-1).expand(n, G, scores.shape[-1] // G).reshape(n, -1)
    tmp = scores.masked_fill(~sm.bool(), NEG)
    w, i = torch.topk(tmp, k=k, dim=-1, sorted=False)
    return w / w.sum(-1, keepdim=True), i


def grouped_softmax_engine(x, b, G=8, keep=2, k=2):
    scores = torch.softmax(x.float(), dim=-1)
    kept = _keep_groups_scatter(scores, G, keep, "max")
    topk_weights, topk_ids = scores.masked_fill(~kept, NEG).topk(k, sorted=False)
    topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)


def grouped_softmax_train(x, b, G=8, keep=2, k=2):
    scores = x.softmax(-1)
    kept = _keep_groups_one_hot(scores, G, keep, "max")
    i = torch.where(kept, scores, NEG).topk(k).indices
    w = scores.gather(-1, i)
    return w / w.sum(-1, keepdim=True), i


# ----------------------------------------------------------------------------------------------------------------
# A custom elementwise score: sqrt(softplus(x)) with a bias (DeepSeek-V4)
# ----------------------------------------------------------------------------------------------------------------


def sqrtsoftplus_hf(x, b, k=6, scale=1.5):
    s = F.softplus(x).sqrt()
    idx = torch.topk(s + b.unsqueeze(0), k, dim=-1, sorted=False)[1]
    w = s.gather(1, idx)
    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * scale, idx


def sqrtsoftplus_engine(x, b, k=6, scale=1.5):
    scores = torch.sqrt(F.softplus(x.float()))
    _, ids = torch.topk(scores + b, k=k, dim=-1, sorted=False)
    w = scores.gather(1, ids)
    w = w / w.sum(dim=-1, keepdim=True)
    return w * scale, ids.to(torch.int32)


def sqrtsoftplus_train(x, b, k=6, scale=1.5):
    scores = torch.log1p(torch.exp(-x.abs())).add(x.clamp_min(0)).pow(0.5)
    ids = (scores + b).topk(k).indices
    w = torch.take_along_dim(scores, ids, dim=-1)
    return w / w.sum(-1, keepdim=True) * scale, ids


# ----------------------------------------------------------------------------------------------------------------
# Top-k on the (biased) logits, then each chosen logit scored alone (Llama-4's sigmoid; Kolibri)
# ----------------------------------------------------------------------------------------------------------------


def topk_sigmoid_hf(x, b, k=2):
    _, i = torch.topk(x + b.unsqueeze(0), k=k, dim=1)
    return torch.sigmoid(torch.gather(x, 1, i).float()), i


def topk_sigmoid_engine(x, b, k=2):
    _, ids = torch.topk(x + b, k, dim=-1, sorted=False)
    return torch.sigmoid(x.gather(1, ids)), ids.to(torch.int32)


def topk_sigmoid_train(x, b, k=2):
    ids = (x + b).topk(k).indices
    return x.take_along_dim(ids, -1).sigmoid(), ids


def top1_sigmoid_hf(x, b, k=1):
    v, i = torch.topk(x, k, dim=1)
    return torch.sigmoid(v.float()).to(x.dtype), i


def top1_sigmoid_engine(x, b, k=1):
    v, i = x.max(dim=-1, keepdim=True)
    return torch.sigmoid(v), i.to(torch.int32)


def top1_sigmoid_train(x, b, k=1):
    i = x.topk(1, sorted=False).indices
    return torch.gather(x, -1, i).sigmoid(), i


# ----------------------------------------------------------------------------------------------------------------
# More routers
# ----------------------------------------------------------------------------------------------------------------


# Kimi-K2 / DeepSeek-V3 with one group: the group mask code runs, and keeps every expert
def kimi_one_group_hf(x, b):
    return dsv3_hf(x, b, G=1, keep=1, k=8, scale=2.827)


def kimi_one_group_engine(x, b):
    return dsv3_engine(x, b, G=1, keep=1, k=8, scale=2.827)


def kimi_one_group_train(x, b):
    return dsv3_train(x, b, G=1, keep=1, k=8, scale=2.827)


# Softmax scores with a load-balancing bias in the choice only
def softmax_bias_hf(x, b, k=4):
    s = F.softmax(x, dim=-1, dtype=torch.float32)
    idx = torch.topk(s + b.unsqueeze(0), k, dim=-1, sorted=False)[1]
    w = s.gather(1, idx)
    return w / w.sum(-1, keepdim=True), idx


def softmax_bias_engine(x, b, k=4):
    scores = torch.softmax(x.float(), dim=-1)
    _, ids = (scores + b).topk(k, dim=-1, sorted=False)
    w = torch.gather(scores, 1, ids)
    w /= w.sum(dim=-1, keepdim=True)
    return w, ids.to(torch.int32)


def softmax_bias_train(x, b, k=4):
    s = x.log_softmax(-1).exp()
    ids = torch.argsort(s + b, -1, descending=True)[:, :k]
    w = s.take_along_dim(ids, -1)
    return w / (w.sum(-1, keepdim=True) + 1e-20), ids


# Sigmoid + bias, groups by their max (DeepSeek-V3's group rule swapped for V2's)
def sig_group_max_hf(x, b, G=4, keep=2, k=4, scale=1.0):
    s = x.sigmoid()
    choice = s + b.unsqueeze(0)
    n = x.shape[0]
    gs = choice.view(n, G, -1).max(dim=-1).values
    gi = torch.topk(gs, k=keep, dim=-1, sorted=False)[1]
    gm = torch.zeros_like(gs)
    gm.scatter_(1, gi, 1)
    sm = gm.unsqueeze(-1).expand(n, G, x.shape[-1] // G).reshape(n, -1)
    idx = torch.topk(choice.masked_fill(~sm.bool(), NEG), k=k, dim=-1, sorted=False)[1]
    w = s.gather(1, idx)
    return w / w.sum(-1, keepdim=True), idx


def sig_group_max_engine(x, b, G=4, keep=2, k=4):
    scores = torch.sigmoid(x.float())
    choice = scores + b
    kept = _keep_groups_scatter(choice, G, keep, "max")
    ids = choice.masked_fill(~kept, NEG).topk(k, sorted=False).indices
    w = scores.gather(1, ids)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def sig_group_max_train(x, b, G=4, keep=2, k=4):
    scores = x.sigmoid()
    choice = scores + b
    kept = _keep_groups_index(choice, G, keep, "max")
    ids = torch.where(kept, choice, NEG).topk(k).indices
    w = scores.take_along_dim(ids, -1)
    return w / w.sum(-1, keepdim=True), ids


# Sigmoid + bias, scaled, not renormalised (DeepSeek-V3 with norm_topk_prob=False)
def sig_bias_noren_hf(x, b, k=6, scale=2.5):
    s = x.sigmoid()
    idx = torch.topk(s + b.unsqueeze(0), k=k, dim=-1, sorted=False)[1]
    return s.gather(1, idx) * scale, idx


def sig_bias_noren_engine(x, b, k=6, scale=2.5):
    scores = torch.sigmoid(x.float())
    _, ids = torch.topk(scores + b, k=k, dim=-1, sorted=False)
    return torch.gather(scores, 1, ids).mul(scale), ids.to(torch.int32)


def sig_bias_noren_train(x, b, k=6, scale=2.5):
    scores = x.sigmoid()
    ids = (scores + b).topk(k).indices
    return scale * scores.take_along_dim(ids, -1), ids


# Every expert chosen (k = E): the weights are the whole softmax, in descending order
def all_experts_hf(x, b, k=8):
    p = F.softmax(x, dim=1, dtype=torch.float)
    w, i = torch.topk(p, k, dim=-1)
    return w / w.sum(-1, keepdim=True), i


def all_experts_engine(x, b, k=8):
    w, i = torch.softmax(x, -1).sort(dim=-1, descending=True)
    return w[:, :k], i[:, :k].to(torch.int32)


def all_experts_train(x, b, k=8):
    v, i = x.topk(k)
    return v.softmax(-1), i


# Top-1 (Switch): the chosen expert's softmax probability
def switch_hf(x, b):
    probs = torch.softmax(x, dim=-1, dtype=torch.float32)
    w, i = torch.max(probs, dim=-1, keepdim=True)
    return w, i


def switch_engine(x, b):
    w, i = torch.topk(torch.softmax(x.float(), dim=-1), 1, dim=-1)
    return w, i.to(torch.int32)


def switch_train(x, b):
    i = torch.argmax(x, dim=-1, keepdim=True)
    return torch.gather(F.softmax(x, -1), -1, i), i


# Sigmoid + bias, groups by the top-2 sum, 4 of 8 groups... smaller (GLM-4.5's shape without scaling)
def glm_hf(x, b):
    return dsv3_hf(x, b, G=4, keep=2, k=4, scale=1.0)


def glm_engine(x, b):
    return dsv3_engine(x, b, G=4, keep=2, k=4, scale=1.0)


def glm_train(x, b):
    return dsv3_index(x, b, G=4, keep=2, k=4, scale=1.0)


# Softmax, top-k, renormalised with a clamped denominator
def renorm_clamped_hf(x, b, k=4):
    w, i = torch.topk(F.softmax(x, dim=-1, dtype=torch.float32), k, dim=-1)
    return w / w.sum(dim=-1, keepdim=True).clamp(min=1e-20), i


def renorm_clamped_engine(x, b, k=4):
    w, i = torch.softmax(x, -1).topk(k, sorted=False)
    return w / torch.clamp_min(w.sum(-1, keepdim=True), 1e-12), i.to(torch.int32)


def renorm_clamped_train(x, b, k=4):
    p = x.softmax(-1)
    i = p.topk(k).indices
    w = p.gather(-1, i)
    return w / w.sum(-1, keepdim=True).clamp_min(1e-20), i


# A custom score nobody's kernel has: a clamped mix of a tanh and a squared sigmoid (docs/YourRouter.md), biased
def clamped_mix_hf(x, b, k=6, scale=1.7):
    scores = torch.clamp(0.5 * torch.tanh(x) + torch.sigmoid(2.0 * x) ** 2, min=0.05)
    idx = torch.topk(scores + b, k, dim=-1).indices
    w = scores.gather(1, idx)
    return w / w.sum(-1, keepdim=True) * scale, idx


def clamped_mix_engine(x, b, k=6, scale=1.7):
    s = torch.clamp_min(torch.tanh(x.float()).mul(0.5).add(F.sigmoid(x * 2.0).square()), 0.05)
    _, ids = torch.topk(s + b.unsqueeze(0), k=k, dim=-1, sorted=False)
    w = s.gather(1, ids)
    w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * scale, ids.to(torch.int32)


def clamped_mix_train(x, b, k=6, scale=1.7):
    sig = 1.0 / (1.0 + torch.exp(-2.0 * x))
    mix = 0.5 * torch.tanh(x) + sig * sig
    s = torch.where(mix < 0.05, 0.05, mix)
    ids = (s + b).topk(k).indices
    w = torch.take_along_dim(s, ids, -1)
    return scale * w / w.sum(-1, keepdim=True), ids


def _family(name: str, E: int, k: int, op: str, biased: bool = False, **spellings: Callable) -> list[Program]:
    """One router in each of its spellings (keyword: the spelling's name, value: its program), all raised to `op`."""
    return [Program(f"{name}/{spelling}", fn, E, k, op, biased) for spelling, fn in spellings.items()]


def _programs() -> list[Program]:
    return [
        *_family("softmax_renorm", 64, 8, "topk_renorm",
            hf=softmax_renorm_hf, engine=softmax_renorm_engine, train=softmax_renorm_train,
            topk_first=softmax_renorm_topk_first),
        *_family("softmax_plain", 60, 4, "topk_renorm",
            hf=softmax_plain_hf, engine_lse=softmax_plain_engine, train_argsort=softmax_plain_train,
            take_along_dim=softmax_plain_take),
        *_family("topk_softmax", 32, 4, "topk_renorm",
            hf=topk_softmax_hf, engine=topk_softmax_engine, train=topk_softmax_train),
        *_family("dsv3", 64, 8, "route", True,
            hf=dsv3_hf, engine=dsv3_engine, train_one_hot=dsv3_train, index_add_inf=dsv3_index),
        *_family("sig_bias", 48, 8, "route", True, hf=sig_bias_hf, engine=sig_bias_engine, train_argsort=sig_bias_train),
        *_family("sig_plain", 16, 4, "route", hf=sig_plain_hf, engine=sig_plain_engine, train=sig_plain_train),
        *_family("dsv2", 64, 6, "route", hf=dsv2_hf, engine=dsv2_engine, train=dsv2_train),
        # keeping the 2 groups of the highest max always keeps the top-2 experts: the plain top-2 is the same router
        *_family("grouped_softmax", 16, 2, "topk_renorm",
            hf=grouped_softmax_hf, engine=grouped_softmax_engine, train_one_hot=grouped_softmax_train),
        *_family("sqrtsoftplus", 32, 6, "route", True,
            hf=sqrtsoftplus_hf, engine=sqrtsoftplus_engine, train_expanded=sqrtsoftplus_train),
        *_family("topk_sigmoid", 16, 2, "route", True,
            hf=topk_sigmoid_hf, engine=topk_sigmoid_engine, train=topk_sigmoid_train),
        *_family("top1_sigmoid", 16, 1, "route",
            hf=top1_sigmoid_hf, engine_max=top1_sigmoid_engine, train=top1_sigmoid_train),
        *_family("kimi_one_group", 32, 8, "route", True,
            hf=kimi_one_group_hf, engine=kimi_one_group_engine, train_one_hot=kimi_one_group_train),
        *_family("softmax_bias", 24, 4, "route", True,
            hf=softmax_bias_hf, engine=softmax_bias_engine, train_argsort=softmax_bias_train),
        *_family("sig_group_max", 32, 4, "route", True,
            hf=sig_group_max_hf, engine=sig_group_max_engine, train=sig_group_max_train),
        *_family("sig_bias_noren", 40, 6, "route", True,
            hf=sig_bias_noren_hf, engine=sig_bias_noren_engine, train=sig_bias_noren_train),
        *_family("all_experts", 8, 8, "topk_renorm",
            hf=all_experts_hf, engine_sort=all_experts_engine, train=all_experts_train),
        *_family("switch", 16, 1, "topk_renorm", hf_max=switch_hf, engine=switch_engine, train_argmax=switch_train),
        *_family("glm", 32, 4, "route", True, hf=glm_hf, engine=glm_engine, train_add_inf=glm_train),
        *_family("renorm_clamped", 20, 4, "topk_renorm",
            hf=renorm_clamped_hf, engine=renorm_clamped_engine, train=renorm_clamped_train),
        *_family("clamped_mix", 32, 6, "route", True,
            hf=clamped_mix_hf, engine=clamped_mix_engine, train_where=clamped_mix_train),
    ]


CORPUS: list[Program] = _programs()
