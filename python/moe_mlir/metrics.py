"""Routing-stability metrics of Mutual-Inform SMoE (000_mutual_inform.md §4).

* :func:`routing_fluctuation_rate`: the fraction of tokens whose *set* of selected experts differs between two
  checkpoints (epoch 59 and 60 in the paper), ``FR = (1/T) Σ_t 1[set(idx_a[t]) != set(idx_b[t])]``. Sets are
  unordered: swapping the order of the same two experts is not a switch.
* :func:`entropy_ratio`: ``ER = mean_t ℋ(p_t; model) / mean_t ℋ(ē_t; baseline)`` with ``ℋ(p) = -Σ_k p_k log p_k``
  (natural log; the base cancels) and ``0 log 0 = 0``, on the dense (pre-top-M) distributions.

Both take any leading shape (``[B, N, M]`` is flattened to ``T = B·N`` tokens) and an optional token mask (True =
counted) so that padded tokens stay out of the statistics (§5). Results are 0-d f32 tensors.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["routing_fluctuation_rate", "entropy_ratio", "routing_entropy"]


def _flatten_tokens(x: Tensor, name: str) -> Tensor:
    if x.dim() < 1:
        raise ValueError(f"'{name}' must have rank >= 1 ([..., M]), got a scalar")
    return x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x.reshape(-1, 1)


def _flatten_mask(mask: Optional[Tensor], tokens: int, name: str) -> Optional[Tensor]:
    if mask is None:
        return None
    m = mask.reshape(-1).bool()
    if m.numel() != tokens:
        raise ValueError(f"'{name}' has {m.numel()} entries but there are {tokens} tokens")
    return m


def routing_fluctuation_rate(idx_before: Tensor, idx_after: Tensor, token_mask: Optional[Tensor] = None) -> Tensor:
    """Fraction of tokens that switch one or more of their experts between two checkpoints.

    Args:
        idx_before: ``[..., M]`` expert indices of the same tokens at the earlier checkpoint (any integer dtype).
        idx_after: ``[..., M]`` expert indices at the later checkpoint; same shape.
        token_mask: optional ``[...]`` bool, True for the tokens to count.

    Returns:
        0-d f32 tensor in ``[0, 1]`` (0 when no token is counted).
    """
    if idx_before.shape != idx_after.shape:
        raise ValueError(
            f"'idx_before' {list(idx_before.shape)} and 'idx_after' {list(idx_after.shape)} must have the same shape"
        )
    a = _flatten_tokens(idx_before, "idx_before").sort(-1).values
    b = _flatten_tokens(idx_after, "idx_after").to(a.device).sort(-1).values
    switched = (a != b).any(-1).float()
    m = _flatten_mask(token_mask, a.shape[0], "token_mask")
    if m is not None:
        switched = switched[m.to(switched.device)]
    if switched.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=a.device)
    return switched.mean()


def routing_entropy(p: Tensor) -> Tensor:
    """Per-token entropy ``-Σ_k p_k log p_k`` (``0 log 0 = 0``) of ``p`` ``[..., K]`` in f32: ``[...]``."""
    pf = p.float()
    return -torch.special.xlogy(pf, pf).sum(-1)


def entropy_ratio(p_model: Tensor, e_baseline: Tensor, token_mask: Optional[Tensor] = None) -> Tensor:
    """Ratio of the mean routing entropy of a model to that of the baseline SMoE on the same tokens.

    Args:
        p_model: ``[..., K]`` the dense routing distribution of the model (``p_t`` for Mutual-Inform).
        e_baseline: ``[..., K]`` the dense softmax router probabilities ``ē_t`` of the baseline SMoE.
        token_mask: optional ``[...]`` bool, True for the tokens to count.

    Returns:
        0-d f32 tensor ``mean_t ℋ(p_model) / mean_t ℋ(e_baseline)`` (inf/NaN when the baseline entropy is 0, as the
        definition implies).
    """
    if p_model.shape[-1] != e_baseline.shape[-1]:
        raise ValueError(
            f"'p_model' has {p_model.shape[-1]} experts but 'e_baseline' has {e_baseline.shape[-1]}"
        )
    hm = routing_entropy(_flatten_tokens(p_model, "p_model"))
    hb = routing_entropy(_flatten_tokens(e_baseline, "e_baseline")).to(hm.device)
    m = _flatten_mask(token_mask, hm.shape[0], "token_mask")
    if m is not None:
        if hb.shape[0] != hm.shape[0]:
            raise ValueError("a token mask needs the same tokens in 'p_model' and 'e_baseline'")
        m = m.to(hm.device)
        hm, hb = hm[m], hb[m]
    return hm.mean() / hb.mean()
