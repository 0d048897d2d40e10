"""The fused forms (MoEFusedOps.td): a mixing op with the probs-mode top-k gate in its epilogue,
``moe.similarity_inform_topk`` and ``moe.attention_posterior_topk``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..reference import _attention_posterior_topk_ref, _similarity_inform_topk_ref
from ._autograd import _needs
from ._verified_op import moe_op
from .loading import _PYTHON_AUTOGRAD, _note_fallback
from .mixing import (
    _posterior_grads,
    _similarity_grads,
    attention_posterior,
    similarity_inform,
)
from .topk import topk_renorm_backward


def _similarity_inform_topk_fake(u, e, k, ws=None, key_mask=None, tau=1.0, causal=False, renormalize=True):
    shape = (u.shape[0], u.shape[1], k)
    return e.new_empty(shape, dtype=torch.float32), e.new_empty(shape, dtype=torch.int32)


@moe_op("similarity_inform_topk", fake=_similarity_inform_topk_fake)
def similarity_inform_topk(
    u: Tensor,
    e: Tensor,
    k: int,
    ws: Optional[Tensor] = None,
    key_mask: Optional[Tensor] = None,
    tau: float = 1.0,
    causal: bool = False,
    renormalize: bool = True,
) -> tuple[Tensor, Tensor]:
    """``similarity_inform`` followed by the probs-mode ``topk_renorm`` (``moe.similarity_inform_topk``, eq 11).

    Returns:
        ``(weights [B, N, k] f32, indices [B, N, k] i32)``.
    """
    _note_fallback(u)
    return _similarity_inform_topk_ref(u, e, ws, key_mask, k, renormalize, tau, causal)


# ----------------------------------------------------------------------------------------------------------------
# 8. attention_posterior_topk (fused)
# ----------------------------------------------------------------------------------------------------------------


def _attention_posterior_topk_fake(scores, u, v, wo, e, k, sigma=1.0, head_select="min_entropy", head_scale=None,
                                   renormalize=True):
    B, _, N, _ = scores.shape
    shape = (B, N, k)
    return (
        e.new_empty(shape, dtype=torch.float32),
        e.new_empty(shape, dtype=torch.int32),
        e.new_empty((B,), dtype=torch.int32),
    )


@moe_op("attention_posterior_topk", fake=_attention_posterior_topk_fake)
def attention_posterior_topk(
    scores: Tensor,
    u: Tensor,
    v: Tensor,
    wo: Tensor,
    e: Tensor,
    k: int,
    sigma: float = 1.0,
    head_select: str = "min_entropy",
    head_scale: Optional[float] = None,
    renormalize: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """``attention_posterior`` followed by the probs-mode ``topk_renorm`` on its ``p``
    (``moe.attention_posterior_topk``, eq 17).

    Returns:
        ``(weights [B, N, k] f32, indices [B, N, k] i32, head [B] i32)``; ``head`` is ``-1`` for ``"all"``.
    """
    _note_fallback(scores)
    return _attention_posterior_topk_ref(scores, u, v, wo, e, k, renormalize, sigma, head_select, head_scale)


def _similarity_inform_topk_setup(ctx, inputs, output):
    u, e, k, ws, key_mask, tau, causal, renormalize = inputs
    ctx.save_for_backward(u, e, ws, key_mask, output[1])
    ctx.tau, ctx.causal, ctx.renormalize = tau, causal, renormalize


def _similarity_inform_topk_backward(ctx, grad_w, grad_idx):
    u, e, ws, key_mask, idx = ctx.saved_tensors
    n = _needs(ctx, 8)
    none = (None,) * 8
    if grad_w is None or not (n[0] or n[1] or n[3]):
        return none
    # p recomputed by the forward kernel (O(N) memory), then the gate's closed-form backward on the saved choice.
    p = similarity_inform(u, e, ws, key_mask, ctx.tau, ctx.causal)
    grad_p = topk_renorm_backward(grad_w, p, idx, "probs", ctx.renormalize)
    du, de, dws = _similarity_grads(ctx, grad_p, u, e, ws, key_mask, ctx.tau, ctx.causal, (n[0], n[1], n[3]))
    return du, de, None, dws, None, None, None, None


def _attention_posterior_topk_setup(ctx, inputs, output):
    scores, u, v, wo, e, k, sigma, head_select, head_scale, renormalize = inputs
    ctx.save_for_backward(scores, u, v, wo, e, output[1], output[2])
    ctx.sigma, ctx.head_select, ctx.head_scale, ctx.renormalize = sigma, head_select, head_scale, renormalize


def _attention_posterior_topk_backward(ctx, grad_w, grad_idx, grad_head):
    scores, u, v, wo, e, idx, head = ctx.saved_tensors
    n = _needs(ctx, 10)
    if grad_w is None or not any(n[:5]):
        return (None,) * 10
    # p recomputed by the forward kernel (O(N) memory), the gate's closed-form backward on the saved choice, then the
    # posterior's backward at the saved head.
    p, _ = attention_posterior(scores, u, v, wo, e, ctx.sigma, ctx.head_select, ctx.head_scale)
    grad_p = topk_renorm_backward(grad_w, p, idx, "probs", ctx.renormalize)
    return (*_posterior_grads(ctx, grad_p, (scores, u, v, wo, e), head, n[:5]),) + (None,) * 5


_PYTHON_AUTOGRAD.append((similarity_inform_topk, _similarity_inform_topk_backward, _similarity_inform_topk_setup))
_PYTHON_AUTOGRAD.append((attention_posterior_topk, _attention_posterior_topk_backward, _attention_posterior_topk_setup))
