"""The mixing ops of Mutual-Inform: ``moe.similarity_inform`` (with its training form ``similarity_inform_fwd`` and
its backward) and ``moe.attention_posterior`` (with its backward)."""

from __future__ import annotations

from typing import Literal, Optional, Sequence, get_args

import torch
from torch import Tensor

from ..reference import (
    _attention_posterior_backward_ref,
    _attention_posterior_ref,
    _similarity_inform_backward_ref,
    _similarity_inform_fwd_ref,
    _similarity_inform_ref,
)
from ._autograd import _needs
from ._verified_op import as_f32, as_i32, moe_op
from ._checks import _fail
from .loading import KEY_OPS, _PYTHON_AUTOGRAD, _note_fallback

#: Which heads ``moe.attention_posterior`` mixes with (MoEEnums.td's HeadSelect).
HeadSelect = Literal["min_entropy", "all"]
HEAD_SELECTS: tuple[str, ...] = get_args(HeadSelect)


def _similarity_forward_op(name: str, ref, returns: str, fake_results, doc: str):
    """One of the two forward Similarity-Inform ops: ``similarity_inform`` and its training form
    ``similarity_inform_fwd`` take the same operands (one schema, one op verifier, the same C++ glue), verify
    them as ``similarity_inform`` (the training form's errors name the op it is the form of) and differ only in the
    reference they fall back to and their results. ``returns`` is the result annotation the schema is inferred from;
    ``fake_results(e)`` the results' meta tensors."""

    def op(u: Tensor, e: Tensor, ws: Optional[Tensor] = None, key_mask: Optional[Tensor] = None,
           tau: float = 1.0, causal: bool = False):
        _note_fallback(u)
        return ref(u, e, ws, key_mask, tau, causal)

    def fake(u, e, ws=None, key_mask=None, tau=1.0, causal=False):
        return fake_results(e)

    op.__annotations__["return"] = returns
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return moe_op(name, fake=fake, key="similarity_inform")(op)


similarity_inform = _similarity_forward_op(
    "similarity_inform", _similarity_inform_ref, "Tensor",
    lambda e: e.new_empty(e.shape, dtype=torch.float32),
    """Similarity-Inform mixing (``moe.similarity_inform``, Mutual-Inform eq 5, 8).

    ``p[b,i,:] = Σ_j S[b,i,j] e[b,j,:]`` with ``S[b,i,:] = softmax_j(u_i^T W_s u_j / tau)`` over the tokens of
    sequence ``b`` (``j = i`` included; ``W_s`` = identity when ``ws`` is None).

    Args:
        u: ``[B, N, D]`` MoE inputs. e: ``[B, N, K]`` router probabilities. ws: optional ``[D, D]``.
        key_mask: optional ``[B, N]`` bool, False keys are excluded. tau: > 0, finite. causal: only ``j <= i``.

    Returns:
        ``p`` ``[B, N, K]`` f32; a row with every key excluded gives zeros; NaN propagates to the rows mixing it.
    """)

similarity_inform_fwd = _similarity_forward_op(
    "similarity_inform_fwd", _similarity_inform_fwd_ref, "tuple[Tensor, Tensor]",
    lambda e: (e.new_empty(e.shape, dtype=torch.float32), e.new_empty(e.shape[:2], dtype=torch.float32)),
    """``similarity_inform`` for training (``moe.similarity_inform_fwd``): ``p`` and the row log-sum-exp ``lse``
    (``[B, N]`` f32, -inf for a row without keys) of its softmax, which ``similarity_inform_backward(..., p, lse)``
    reads instead of running the forward again. The autograd of ``similarity_inform`` calls it.""")


def _similarity_inform_backward_fake(grad_p, u, e, ws=None, key_mask=None, tau=1.0, causal=False, p=None, lse=None):
    D = u.shape[2]
    return (
        u.new_empty(u.shape, dtype=torch.float32),
        e.new_empty(e.shape, dtype=torch.float32),
        u.new_empty((D, D) if ws is not None else (0,), dtype=torch.float32),
    )


# The cotangent is read as f32, whatever autograd hands over.
@moe_op("similarity_inform_backward", fake=_similarity_inform_backward_fake, views={"grad_p": as_f32})
def similarity_inform_backward(
    grad_p: Tensor,
    u: Tensor,
    e: Tensor,
    ws: Optional[Tensor] = None,
    key_mask: Optional[Tensor] = None,
    tau: float = 1.0,
    causal: bool = False,
    p: Optional[Tensor] = None,
    lse: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward of ``similarity_inform`` (``moe.similarity_inform_grad``): the gradients of ``p`` with respect to
    ``u``, ``e`` and ``ws`` given ``grad_p`` (``[B, N, K]``), all f32.

    The CPU and CUDA kernels stream the similarity tiles from the forward's log-sum-exp (flash-style, the GPU one
    FlashAttention-2-backward style: a query-major and a key-major pass, no atomics): extra memory O(B·N·(D+K)),
    never N×N. ``p`` and ``lse``, as ``similarity_inform_fwd`` returned them, spare the kernels the forward pass
    that otherwise recomputes them. Without the kernels it runs the reference's closed form.

    Returns:
        ``(du [B, N, D], de [B, N, K], dws)``; ``dws`` is ``[D, D]`` with ``ws``, else an empty ``[0]``.
    """
    _note_fallback(u)
    return _similarity_inform_backward_ref(grad_p, u, e, ws, key_mask, tau, causal)


def _similarity_grads(ctx, grad_p: Tensor, u: Tensor, e: Tensor, ws: Optional[Tensor],
                      key_mask: Optional[Tensor], tau: float, causal: bool, needs: Sequence[bool]):
    """(du, de, dws) cast to the operands' dtypes, None where no gradient is needed (needs: u, e, ws)."""
    du, de, dws = similarity_inform_backward(grad_p, u, e, ws, key_mask, tau, causal)
    return (
        du.to(u.dtype) if needs[0] else None,
        de.to(e.dtype) if needs[1] else None,
        dws.to(ws.dtype) if ws is not None and needs[2] else None,
    )


def _similarity_inform_setup(ctx, inputs, output):
    u, e, ws, key_mask, tau, causal = inputs
    ctx.save_for_backward(u, e, ws, key_mask)
    ctx.tau, ctx.causal = tau, causal


def _similarity_inform_backward(ctx, grad_p):
    u, e, ws, key_mask = ctx.saved_tensors
    n = _needs(ctx, 6)
    if grad_p is None or not (n[0] or n[1] or n[2]):
        return None, None, None, None, None, None
    du, de, dws = _similarity_grads(ctx, grad_p, u, e, ws, key_mask, ctx.tau, ctx.causal, n[:3])
    return du, de, dws, None, None, None


# ----------------------------------------------------------------------------------------------------------------
# 3. attention_posterior
# ----------------------------------------------------------------------------------------------------------------


def _attention_posterior_fake(scores, u, v, wo, e, sigma=1.0, head_select="min_entropy", head_scale=None):
    B, _, N, _ = scores.shape
    return (
        e.new_empty((B, N, e.shape[2]), dtype=torch.float32),
        e.new_empty((B,), dtype=torch.int32),
    )


@moe_op("attention_posterior", fake=_attention_posterior_fake)
def attention_posterior(
    scores: Tensor,
    u: Tensor,
    v: Tensor,
    wo: Tensor,
    e: Tensor,
    sigma: float = 1.0,
    head_select: str = "min_entropy",
    head_scale: Optional[float] = None,
) -> tuple[Tensor, Tensor]:
    """Attention-Inform mixing through the attention posterior (``moe.attention_posterior``, Lemma 1, eq 13-17).

    Args:
        scores: ``[B, H, N, Nk]`` pre-softmax attention logits (``-inf`` = masked). u: ``[B, N, D]``.
        v: ``[B, H, Nk, Dh]`` per-head values. wo: ``[D, H*Dh]`` out-projection (nn.Linear layout).
        e: ``[B, Nk, K]`` router probabilities of the keys. sigma: > 0, finite.
        head_select: ``"min_entropy"`` (eq 15, the head of lowest mean prior entropy) or ``"all"`` (eq 13).
        head_scale: factor of the head means (default H).

    Returns:
        ``(p [B, N, K] f32, head [B] i32)``; ``head`` is ``-1`` for ``"all"``.
    """
    _note_fallback(scores)
    return _attention_posterior_ref(scores, u, v, wo, e, sigma, head_select, head_scale)


def _check_head_range(op: str, head: Optional[Tensor], heads: int) -> None:
    """h* in [0, H) (a data-dependent check: eager kernels only)."""
    if head is None or head.numel() == 0:
        return
    lo, hi = int(head.min()), int(head.max())
    if lo < 0 or hi >= heads:
        _fail(op, f"'head' holds {lo if lo < 0 else hi}, outside [0, {heads}): it indexes no head")


def _attention_posterior_backward_fake(grad_p, scores, u, v, wo, e, head=None, sigma=1.0, head_select="min_entropy",
                                       head_scale=None):
    return tuple(t.new_empty(t.shape, dtype=torch.float32) for t in (scores, u, v, wo, e))


# The torch op takes i64 h* and any float cotangent too: its kernel reads them as i32 and f32.
@moe_op("attention_posterior_backward", fake=_attention_posterior_backward_fake,
        views={"grad_p": as_f32, "head": as_i32})
def attention_posterior_backward(
    grad_p: Tensor,
    scores: Tensor,
    u: Tensor,
    v: Tensor,
    wo: Tensor,
    e: Tensor,
    head: Optional[Tensor] = None,
    sigma: float = 1.0,
    head_select: str = "min_entropy",
    head_scale: Optional[float] = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The backward of ``attention_posterior`` (``moe.attention_posterior_grad``): the gradients of ``p`` with respect
    to ``scores``, ``u``, ``v``, ``wo``, ``e`` given ``grad_p`` (``[B, N, K]``), all f32 in the operands' shapes.

    ``head``: the forward's chosen head (``[B]``) for ``"min_entropy"`` (no gradient flows through it), ``None`` for
    ``"all"``. The CPU kernel recomputes the posterior log-sum-exp and streams the key tiles (flash-style: beyond the
    results, which include ``d_scores`` ``[B, H, N, Nk]``, O(B·(N + H·Nk)·(D + K)) memory). Elsewhere (CUDA for now,
    or without the kernels) it runs the dense closed form :func:`moe_mlir.reference._attention_posterior_backward_ref`.
    """
    _check_head_range("attention_posterior_backward", head, scores.shape[1])
    _note_fallback(scores)
    return _attention_posterior_backward_ref(grad_p, scores, u, v, wo, e, head, sigma, head_select, head_scale)


def _posterior_grads(ctx, grad_p: Tensor, operands: Sequence[Tensor], head: Tensor, needs: Sequence[bool]):
    """(d_scores, d_u, d_v, d_wo, d_e) cast to the operands' dtypes, None where not needed."""
    head = head if ctx.head_select == "min_entropy" else None
    grads = attention_posterior_backward(grad_p, *operands, head, ctx.sigma, ctx.head_select, ctx.head_scale)
    return tuple(g.to(t.dtype) if need else None for g, t, need in zip(grads, operands, needs))


def _attention_posterior_setup(ctx, inputs, output):
    scores, u, v, wo, e, sigma, head_select, head_scale = inputs
    ctx.save_for_backward(scores, u, v, wo, e, output[1])
    ctx.sigma, ctx.head_select, ctx.head_scale = sigma, head_select, head_scale


def _attention_posterior_backward(ctx, grad_p, grad_head):
    *operands, head = ctx.saved_tensors
    n = _needs(ctx, 8)
    if grad_p is None or not any(n[:5]):
        return (None,) * 8
    return (*_posterior_grads(ctx, grad_p, operands, head, n[:5]), None, None, None)


_PYTHON_AUTOGRAD.append((similarity_inform, _similarity_inform_backward, _similarity_inform_setup))
_PYTHON_AUTOGRAD.append((attention_posterior, _attention_posterior_backward, _attention_posterior_setup))

# A whole graph lowers these to their kernel key's op (mlir/lowerings/moe_ops.py).
KEY_OPS["similarity_inform"] = "similarity_inform"
KEY_OPS["attention_posterior"] = "attention_posterior"
