"""The fused forms (MoEFusedOps.td): a mixing op with the probs-mode top-k gate in its epilogue,
``moe.similarity_inform_topk`` and ``moe.attention_posterior_topk``."""

from __future__ import annotations

import inspect
import typing

import torch
from torch import Tensor

from ..reference import _topk_renorm_ref
from ._autograd import _needs
from ._verified_op import moe_op
from .loading import _PYTHON_AUTOGRAD
from .mixing import (
    _posterior_grads,
    _similarity_grads,
    attention_posterior,
    similarity_inform,
)
from .topk import topk_renorm_backward


def _gated(base, name: str, doc: str):
    """The fused form ``moe.<name>`` of mixing op ``base``, with the probs-mode ``topk_renorm`` in its epilogue
    (MoEFusedOps.td), derived from ``base``'s definition rather than stated again. Its schema is base's with the gate's
    ``k: int`` after base's parameters without a default and ``renormalize: bool = True`` last; its results are the
    gate's ``(weights [..., k] f32, indices [..., k] i32)`` in place of base's first result ``p [..., K]``, then base's
    others; its eager reference and its fake kernel are base's followed by the gate's."""
    base_signature = inspect.signature(base.prototype, eval_str=True)
    params = list(base_signature.parameters.values())
    required = sum(p.default is inspect.Parameter.empty for p in params)
    arg = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params.insert(required, inspect.Parameter("k", arg, annotation=int))
    params.append(inspect.Parameter("renormalize", arg, default=True, annotation=bool))
    returns = base_signature.return_annotation
    results = 1 + (len(typing.get_args(returns)) if typing.get_origin(returns) is tuple else 1)  # p becomes two
    signature = inspect.Signature(params, return_annotation=tuple[(Tensor,) * results])

    def split(args, kwargs):
        """base's arguments by name, ``k``, ``renormalize``."""
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        base_args = dict(bound.arguments)
        return base_args, base_args.pop("k"), base_args.pop("renormalize")

    def tuple_of(out) -> tuple:
        return (out,) if isinstance(out, Tensor) else tuple(out)

    def reference(*args, **kwargs):
        base_args, k, renormalize = split(args, kwargs)
        p, *others = tuple_of(base.prototype(**base_args))
        return (*_topk_renorm_ref(p, k, "probs", renormalize), *others)

    def fake(*args, **kwargs):
        base_args, k, _ = split(args, kwargs)
        p, *others = tuple_of(base.fake(**base_args))
        shape = (*p.shape[:-1], k)
        return (p.new_empty(shape, dtype=torch.float32), p.new_empty(shape, dtype=torch.int32), *others)

    reference.__signature__ = signature
    reference.__name__ = reference.__qualname__ = name
    reference.__doc__ = doc
    return moe_op(name, fake=fake)(reference)


similarity_inform_topk = _gated(similarity_inform, "similarity_inform_topk", """``similarity_inform`` followed by the
    probs-mode ``topk_renorm`` (``moe.similarity_inform_topk``, eq 11):
    ``similarity_inform_topk(u, e, k, ws=None, key_mask=None, tau=1.0, causal=False, renormalize=True)``.

    Returns:
        ``(weights [B, N, k] f32, indices [B, N, k] i32)``.
    """)

attention_posterior_topk = _gated(attention_posterior, "attention_posterior_topk", """``attention_posterior``
    followed by the probs-mode ``topk_renorm`` on its ``p`` (``moe.attention_posterior_topk``, eq 17):
    ``attention_posterior_topk(scores, u, v, wo, e, k, sigma=1.0, head_select="min_entropy", head_scale=None,
    renormalize=True)``.

    Returns:
        ``(weights [B, N, k] f32, indices [B, N, k] i32, head [B] i32)``; ``head`` is ``-1`` for ``"all"``.
    """)


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
