"""Eager references of the production routing ops ``moe.route``, ``moe.dispatch_plan`` (and its capacity option) and
``moe.bias_update`` (MoERoutingOps.td).

Plain torch, device-agnostic, the dialect's rules (those of :mod:`moe_mlir.reference`): logits upcast to f32, ties to
the lowest index and NaN first in every top-k (:func:`moe_mlir.reference._select_desc`), a softmax over a row of
``-inf`` gives zeros, a zero renormalization sum gives zero weights. ``route``'s weights are differentiable with
respect to the logits (through the scores, never through the choice); the bias only chooses, so it gets no
gradient. ``dispatch_plan`` is integer-valued (no gradient) and assumes indices in range (the op checks).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _masked_softmax, _select_desc
from .score_region import eval_score_region

#: ``scoring="custom:<region body>"``: the score is the region's elementwise function (score_region.py).
CUSTOM_PREFIX = "custom:"

__all__ = ["route", "route_weights", "dispatch_plan", "dispatch_plan_sizes"]


def _score(x: Tensor, scoring: str) -> Tensor:
    if scoring == "softmax":
        return _masked_softmax(x)
    if scoring == "sigmoid":
        return torch.sigmoid(x)
    if scoring.startswith(CUSTOM_PREFIX):
        return eval_score_region(scoring[len(CUSTOM_PREFIX):], x)
    return x


def _first_where(order: Tensor, keep: Tensor, k: int) -> Tensor:
    """The first ``k`` entries of each row of ``order`` whose ``keep`` (gathered through ``order``) is true, in
    order (a stable partition)."""
    kept = torch.gather(keep, -1, order).to(torch.uint8)
    first = torch.sort(kept, dim=-1, descending=True, stable=True).indices
    return torch.gather(order, -1, first)[..., :k]


def route(
    logits: Tensor, bias: Optional[Tensor], k: int, scoring: str = "softmax", order: str = "score_then_topk",
    n_group: int = 1, topk_group: int = 1, group_score: str = "top2_sum", renormalize: bool = False,
    routed_scaling_factor: float = 1.0, replay: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """``(weights [T, k] f32, indices [T, k] i32)`` of ``moe.route`` (see the op description); with ``replay``
    (``[T, k]`` indices in ``[0, E)``) the choice is given: its weights, and the indices themselves."""
    x = logits.float()
    T, E = x.shape
    score_first = order == "score_then_topk"
    s = _score(x, scoring) if score_first else x
    if replay is not None:
        idx = replay.long()
        return _weigh(s, idx, scoring, score_first, renormalize, routed_scaling_factor), idx.to(torch.int32)
    c = s.detach()
    if bias is not None:
        c = c + bias.detach().float()
    if n_group > 1:
        size = E // n_group
        cg = c.reshape(T, n_group, size)
        top = torch.gather(cg, -1, _select_desc(cg, 2 if group_score == "top2_sum" else 1))
        gscore = top.sum(-1) if group_score == "top2_sum" else top[..., 0]
        kept_groups = _select_desc(gscore, topk_group)
        kept = torch.zeros(T, n_group, dtype=torch.bool, device=x.device)
        kept.scatter_(1, kept_groups, True)
        keep = kept.repeat_interleave(size, dim=1)
        idx = _first_where(_select_desc(c, E), keep, k)
    else:
        idx = _select_desc(c, k)
    return _weigh(s, idx, scoring, score_first, renormalize, routed_scaling_factor), idx.to(torch.int32)


def _weigh(s: Tensor, idx: Tensor, scoring: str, score_first: bool, renormalize: bool,
           routed_scaling_factor: float) -> Tensor:
    """The weights of the chosen experts ``idx`` (i64) from ``s`` (the scores, or the logits when the order scores
    after choosing)."""
    w = torch.gather(s, -1, idx)
    if not score_first:
        w = _score(w, scoring)
    if renormalize:
        den = w.sum(-1, keepdim=True)
        zero = den == 0
        w = torch.where(zero, torch.zeros_like(w), w / torch.where(zero, torch.ones_like(den), den))
    if routed_scaling_factor != 1.0:
        w = w * torch.tensor(routed_scaling_factor, dtype=torch.float32)
    return w


def route_weights(logits: Tensor, indices: Tensor, scoring: str = "softmax", order: str = "score_then_topk",
                  renormalize: bool = False, routed_scaling_factor: float = 1.0) -> Tensor:
    """The weights [T, k] f32 ``route`` gives the experts ``indices`` [T, k] (its own choice): differentiable with
    respect to the logits. ``route``'s backward differentiates this with the forward's indices instead of choosing
    again (the choice, group scores and top-k of the bias-shifted scores, has no gradient)."""
    x = logits.float()
    score_first = order == "score_then_topk"
    s = _score(x, scoring) if score_first else x
    return _weigh(s, indices.long(), scoring, score_first, renormalize, routed_scaling_factor)


def dispatch_plan_sizes(T, k, num_experts: int, block_size: int):
    """Sizes of the seven results (SymInt-friendly): counts, offsets, order, inverse, padded_order,
    block_experts, num_padded."""
    n = T * k
    padded = n + num_experts * (block_size - 1)
    return num_experts, num_experts + 1, n, n, padded, (padded + block_size - 1) // block_size, 1


def dispatch_plan(indices: Tensor, num_experts: int, block_size: int = 1) -> tuple[Tensor, ...]:
    """The seven i32 results of ``moe.dispatch_plan`` for indices in ``[0, num_experts)``."""
    dev = indices.device
    flat = indices.reshape(-1).long()
    n = flat.numel()
    E, B = num_experts, block_size
    counts = torch.bincount(flat, minlength=E)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), torch.cumsum(counts, 0)])
    order = torch.sort(flat, stable=True).indices
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(n, device=dev)
    padded_counts = (counts + B - 1) // B * B
    padded_offsets = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), torch.cumsum(padded_counts, 0)])
    padded_len = n + E * (B - 1)
    padded = torch.full((padded_len,), n, dtype=torch.long, device=dev)
    expert_of_sorted = flat[order]
    pos = padded_offsets[expert_of_sorted] + torch.arange(n, device=dev) - offsets[expert_of_sorted]
    padded[pos] = order
    num_blocks = (padded_len + B - 1) // B
    blocks = torch.full((num_blocks,), -1, dtype=torch.long, device=dev)
    num_padded = int(padded_offsets[E])
    used = num_padded // B
    if used:
        starts = torch.arange(used, device=dev) * B
        blocks[:used] = torch.searchsorted(padded_offsets[1:], starts, right=True)
    i32 = torch.int32
    return (counts.to(i32), offsets.to(i32), order.to(i32), inverse.to(i32), padded.to(i32), blocks.to(i32),
            torch.tensor([num_padded], dtype=i32, device=dev))


def capacity_keep(indices: Tensor, weights: Optional[Tensor], num_experts: int, capacity: int,
                  drop: str = "position") -> Tensor:
    """Which assignments of ``indices`` ``[T, k]`` keep their place under an expert capacity (``moe.dispatch_plan``'s
    capacity option): a bool ``[T, k]``. The assignments claim places in the priority order (``drop="position"``:
    slot-major, then token; ``"probability"``: weight descending, NaN first, equal weights (``-0.0 = 0.0``) in the
    position order); an expert keeps the first ``capacity`` assignments routed to it."""
    T, k = indices.shape
    dev = indices.device
    flat = indices.t().reshape(-1).long()  # the position order: (slot j, token t)
    n = flat.numel()
    if drop == "probability":
        w = weights.detach().float().t().reshape(-1)
        # torch.sort puts NaN first when descending and keeps -0.0 and 0.0 in their order (stable).
        order = torch.sort(w, descending=True, stable=True).indices
    else:
        order = torch.arange(n, device=dev)
    experts = flat[order]
    by_expert = torch.sort(experts, stable=True).indices  # each expert's assignments in the priority order
    counts = torch.bincount(experts, minlength=num_experts)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty(n, dtype=torch.long, device=dev)
    rank[by_expert] = torch.arange(n, device=dev) - starts[experts[by_expert]]
    keep = torch.empty(n, dtype=torch.bool, device=dev)
    keep[order] = rank < capacity
    return keep.reshape(k, T).t()


def apply_capacity(indices: Tensor, weights: Tensor, num_experts: int, capacity: int,
                   drop: str = "position") -> tuple[Tensor, Tensor]:
    """``(kept_weights, dropped)``: ``weights`` with the dropped assignments set to 0 (differentiable w.r.t.
    ``weights``: the gradient is masked the same way) and the i64 ``[E]`` per-expert count of dropped
    assignments."""
    keep = capacity_keep(indices, weights, num_experts, capacity, drop)
    kept = torch.where(keep, weights, torch.zeros((), dtype=weights.dtype, device=weights.device))
    dropped = torch.bincount(indices[~keep].reshape(-1).long(), minlength=num_experts)
    return kept, dropped


def bias_update(bias: Tensor, counts: Tensor, rate: float) -> Tensor:
    """``moe.bias_update``: ``bias + rate · sign(mean(counts) − counts)`` in f32, the sign taken exactly as that of
    ``Σ counts − E · counts_e`` in f64 (``torch.sign``: 0 for NaN)."""
    c = counts.double()
    d = c.sum() - c.numel() * c
    return bias.float() + rate * torch.sign(d).float()
