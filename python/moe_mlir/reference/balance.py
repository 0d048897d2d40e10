"""Eager references of the load-balancing ops (MoEBalanceOps.td): ``moe.router_stats``, the Switch/GShard loss of
transformers' ``load_balancing_loss_func``, ST-MoE's router z-loss and DeepSeek-V3's sequence-wise balance loss.

Plain torch, device-agnostic, differentiable with respect to the logits / scores, the dialect's rules: logits upcast
to f32, the selection in the order of :func:`moe_mlir.reference._select_desc` (NaN first, then larger values, ties to
the lowest index) on the logits, a softmax over a row of ``-inf`` gives zeros (:func:`moe_mlir.reference.
_masked_softmax`). ``token_mask`` multiplies the tokens' contributions as transformers' attention mask does; the
selection carries no gradient.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _masked_softmax, _select_desc

__all__ = ["router_stats", "load_balancing_loss", "router_z_loss", "sequence_balance_loss"]


def _up(t: Tensor) -> Tensor:
    """f32, or f64 kept (the tests' finite differences evaluate the references in f64)."""
    return t if t.dtype == torch.float64 else t.float()


def router_stats_full(logits: Tensor, top_k: int, token_mask: Optional[Tensor] = None
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """``(counts [E], mean_probs [E], weight_sum [])`` of ``moe.router_stats``, all f32."""
    x = _up(logits)
    T, E = x.shape
    p = _masked_softmax(x)
    sel = _select_desc(x.detach(), top_k)
    one_hot = torch.zeros(T, E, dtype=x.dtype, device=x.device).scatter_(1, sel, 1.0)
    w = torch.ones(T, dtype=x.dtype, device=x.device) if token_mask is None else token_mask.to(x.dtype)
    counts = (one_hot * w[:, None]).sum(0)
    weight_sum = w.sum()
    mean_probs = (p * w[:, None]).sum(0) / weight_sum
    return counts, mean_probs, weight_sum


def router_stats(logits: Tensor, top_k: int, token_mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """``(counts [E], mean_probs [E])`` of ``torch.ops.moe.router_stats``."""
    counts, mean_probs, _ = router_stats_full(logits, top_k, token_mask)
    return counts, mean_probs


def load_balancing_loss(logits: Tensor, top_k: int, token_mask: Optional[Tensor] = None) -> Tensor:
    """``E · Σ_e f_e P_e`` with ``f = counts / W`` (transformers' ``load_balancing_loss_func``, f32)."""
    counts, mean_probs, weight_sum = router_stats_full(logits, top_k, token_mask)
    E = logits.shape[-1]
    return E * (counts / weight_sum * mean_probs).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """``mean_t logsumexp(logits_t)²`` (ST-MoE), f32; NaN for T = 0."""
    lse = torch.logsumexp(_up(logits), dim=-1)
    return (lse * lse).mean()


def sequence_balance_loss(scores: Tensor, indices: Tensor, top_k: int) -> Tensor:
    """DeepSeek-V3's sequence-wise balance loss (α = 1) averaged over the batch: scores [B, S, E], indices
    [B, S, k] (every slot counts, as DeepSeek's scatter_add)."""
    s = scores.float()
    B, S, E = s.shape
    p = (s / s.sum(-1, keepdim=True)).mean(1)
    counts = torch.zeros(B, E, dtype=torch.float32, device=s.device)
    counts.scatter_add_(1, indices.reshape(B, -1).long(),
                        torch.ones(B, indices[0].numel(), dtype=torch.float32, device=s.device))
    f = counts * (E / (top_k * S)) if S > 0 else counts * float("nan")
    return (f * p).sum(1).mean()


# The closed-form backward of the ops (the eager kernels of the torch backward ops; the CPU kernels compute the
# same formulas, MoEBalanceOps.td).


def router_stats_backward(grad_mean_probs: Tensor, logits: Tensor, token_mask: Optional[Tensor],
                          weight_sum: Tensor) -> Tensor:
    """``(w_t / W) · p_te · (g_e − Σ_j p_tj g_j)`` ([T, E] f32)."""
    p = _masked_softmax(logits.float())
    g = grad_mean_probs.float()
    w = torch.ones(p.shape[0], dtype=torch.float32, device=p.device) if token_mask is None else token_mask.float()
    c = (p * g).sum(-1, keepdim=True)
    return (w / weight_sum.float().reshape(()))[:, None] * p * (g - c)


def router_z_loss_backward(grad: Tensor, logits: Tensor) -> Tensor:
    """``grad · (2 / T) · lse_t · softmax(x_t)`` ([T, E] f32)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    return grad.float().reshape(()) * (2.0 / max(x.shape[0], 1)) * lse * torch.exp(x - lse)


def sequence_balance_loss_backward(grad: Tensor, scores: Tensor, indices: Tensor, top_k: int) -> Tensor:
    """``grad / (B·S) · (f_be − Σ_j s'_btj f_bj) / Z_bt`` ([B, S, E] f32)."""
    s = scores.float()
    B, S, E = s.shape
    if B * S == 0:
        return torch.zeros_like(s)
    counts = torch.zeros(B, E, dtype=torch.float32, device=s.device)
    counts.scatter_add_(1, indices.reshape(B, -1).long(),
                        torch.ones(B, indices[0].numel(), dtype=torch.float32, device=s.device))
    f = (counts * (E / (top_k * S)))[:, None, :]
    z = s.sum(-1, keepdim=True)
    c = (s * f).sum(-1, keepdim=True) / z
    return grad.float().reshape(()) / (B * S) * (f - c) / z
