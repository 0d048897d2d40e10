"""The seed routers' ops: ``moe.mad_dispersion`` (ACMoE), ``moe.adjacency_update`` (Symphony), both stop-gradient,
and ``moe.hyper_router`` (HyperRouter) with its backward."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from ..reference import _adjacency_update_ref, _hyper_router_backward_ref, _hyper_router_ref, _mad_dispersion_ref
from ._autograd import _needs
from ._verified_op import as_f32, moe_op, not_in_key
from ._checks import _check_index_range
from .loading import KEY_OPS, _PYTHON_AUTOGRAD, _STOP_GRADIENT, _note_fallback

#: The options of ``moe.mad_dispersion`` and ``moe.adjacency_update`` (MoEEnums.td).
DispersionNormalize = Literal["feature", "expert", "global"]
DispersionMeasure = Literal["mad", "variance"]
EmptyCluster = Literal["identity", "raw"]
AdjacencyNorm = Literal["row", "col", "none"]
NORMALIZES: tuple[str, ...] = get_args(DispersionNormalize)
MEASURES: tuple[str, ...] = get_args(DispersionMeasure)
EMPTIES: tuple[str, ...] = get_args(EmptyCluster)
ADJ_NORMS: tuple[str, ...] = get_args(AdjacencyNorm)


def _mad_dispersion_fake(tokens, assign, num_experts, eps=1e-4, clip=10.0, normalize="feature", measure="mad",
                         empty="identity"):
    return (
        tokens.new_empty((num_experts, tokens.shape[1]), dtype=torch.float32),
        tokens.new_empty((num_experts,), dtype=torch.int32),
    )


@moe_op("mad_dispersion", fake=_mad_dispersion_fake)
def mad_dispersion(
    tokens: Tensor,
    assign: Tensor,
    num_experts: int,
    eps: float = 1e-4,
    clip: float = 10.0,
    normalize: str = "feature",
    measure: str = "mad",
    empty: str = "identity",
) -> tuple[Tensor, Tensor]:
    """ACMoE adaptive-clustering feature weights (``moe.mad_dispersion``, Tight Clusters Def. 1).

    Args:
        tokens: ``[T, D]``. assign: ``[T]`` i32/i64 in ``[0, num_experts)`` (the previous layer's top-1 expert).
        num_experts: E >= 1. eps: > 0. clip: >= 0 (0 disables). normalize: ``"feature"`` | ``"expert"`` |
        ``"global"``. measure: ``"mad"`` | ``"variance"``. empty: ``"identity"`` | ``"raw"``.

    Returns:
        ``(weights [E, D] f32, counts [E] i32)``.

    Raises:
        ValueError: a value of ``assign`` outside ``[0, num_experts)``.
    """
    _check_index_range("mad_dispersion", "assign", assign, num_experts)
    _note_fallback(tokens)
    return _mad_dispersion_ref(tokens, assign, num_experts, eps, clip, normalize, measure, empty)


# ----------------------------------------------------------------------------------------------------------------
# 5. adjacency_update
# ----------------------------------------------------------------------------------------------------------------


def _adjacency_update_fake(a, idx, beta=0.9, norm="row", include_self=True):
    return a.new_empty(a.shape, dtype=torch.float32)


@moe_op("adjacency_update", fake=_adjacency_update_fake)
def adjacency_update(
    a: Tensor, idx: Tensor, beta: float = 0.9, norm: str = "row", include_self: bool = True
) -> Tensor:
    """One moving-average update of Symphony's expert graph (``moe.adjacency_update``, Alg. 1 l.3-9, 15-16).

    Args:
        a: ``[E, E]`` the graph. idx: ``[T, k]`` i32/i64, each token's top-k experts on the base logits.
        beta: in ``[0, 1]``. norm: ``"row"`` | ``"col"`` | ``"none"``. include_self: keep the diagonal of C.

    Returns:
        ``a_next = beta·a + (1-beta)·Norm(C)`` ``[E, E]`` f32, ``C = S^T S`` of the indicators
        ``S[t,j] = 1[j in idx[t]]``; an all-zero row/column of C stays zero.

    Raises:
        ValueError: a value of ``idx`` outside ``[0, E)``.
    """
    _check_index_range("adjacency_update", "idx", idx, a.shape[0])
    _note_fallback(a)
    return _adjacency_update_ref(a, idx, beta, norm, include_self)


# ----------------------------------------------------------------------------------------------------------------
# 6. hyper_router
# ----------------------------------------------------------------------------------------------------------------


def _hyper_router_fake(emb, w1, b1, w2, b2, num_experts):
    d = w2.shape[0] // num_experts - 1
    return (
        emb.new_empty((num_experts, d), dtype=torch.float32),
        emb.new_empty((num_experts,), dtype=torch.float32),
    )


@moe_op("hyper_router", fake=_hyper_router_fake)
def hyper_router(
    emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, num_experts: int
) -> tuple[Tensor, Tensor]:
    """HyperRouter weight generation (``moe.hyper_router``, eq 2, App. C.1).

    ``out = w2 · relu(w1 · emb + b1) + b2`` reshaped row-major to ``[E, D+1]``.

    Args:
        emb: ``[De]``. w1: ``[Dh, De]``. b1: ``[Dh]``. w2: ``[E*(D+1), Dh]``. b2: ``[E*(D+1)]``. num_experts: E.

    Returns:
        ``(w [E, D] f32, b [E] f32)``: the router matrix and the generated bias.
    """
    _note_fallback(emb)
    return _hyper_router_ref(emb, w1, b1, w2, b2, num_experts)


def _without_weight_grads(grads: tuple, weight_grads: bool) -> tuple:
    """d_w1 and d_w2 as empty ``[0]`` tensors unless ``weight_grads``."""
    if weight_grads:
        return tuple(grads)
    return tuple(g.new_empty((0,)) if i in (1, 3) else g for i, g in enumerate(grads))


def _hyper_router_backward_fake(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts, weight_grads=True):
    return _without_weight_grads(tuple(t.new_empty(t.shape, dtype=torch.float32) for t in (emb, w1, b1, w2, b2)),
                                 weight_grads)


# The cotangents are read as f32, whatever autograd hands over.
@moe_op("hyper_router_backward", fake=_hyper_router_backward_fake,
        views={"grad_w": as_f32, "grad_b": as_f32, "weight_grads": not_in_key})
def hyper_router_backward(
    grad_w: Tensor, grad_b: Tensor, emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, num_experts: int,
    weight_grads: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The backward of ``hyper_router`` (``moe.hyper_router_grad``): the gradients of ``(w, b)`` with respect to
    ``emb``, ``w1``, ``b1``, ``w2``, ``b2`` given ``grad_w`` (``[E, D]``) and ``grad_b`` (``[E]``), all f32 in the
    operands' shapes (closed form: :func:`moe_mlir.reference._hyper_router_backward_ref`; the CPU kernel is the
    dialect op's lowering: two matrix-vector products with the transposed weights and two outer products).

    ``weight_grads=False`` (a frozen hypernetwork, HyperRouter's default: 002 §1.10) skips the two outer products:
    ``d_w1`` and ``d_w2`` come back as empty ``[0]`` tensors, and the kernel neither computes nor writes them (the
    size of the hypernetwork), as eager autograd skips the gradients of parameters that do not require them."""
    _note_fallback(emb)
    return _without_weight_grads(_hyper_router_backward_ref(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts),
                                 weight_grads)


def _hyper_router_setup(ctx, inputs, output):
    emb, w1, b1, w2, b2, num_experts = inputs
    ctx.save_for_backward(emb, w1, b1, w2, b2)
    ctx.num_experts = num_experts


def _hyper_router_backward(ctx, grad_w, grad_b):
    operands = ctx.saved_tensors
    n = _needs(ctx, 6)[:5]
    if not any(n) or (grad_w is None and grad_b is None):
        return (None,) * 6
    emb, w2, E = operands[0], operands[3], ctx.num_experts
    if grad_w is None:
        grad_w = emb.new_zeros((E, w2.shape[0] // E - 1), dtype=torch.float32)
    if grad_b is None:
        grad_b = emb.new_zeros((E,), dtype=torch.float32)
    grads = hyper_router_backward(grad_w, grad_b, *operands, E, n[1] or n[3])
    return tuple(g.to(t.dtype) if need else None for g, t, need in zip(grads, operands, n)) + (None,)


_PYTHON_AUTOGRAD.append((hyper_router, _hyper_router_backward, _hyper_router_setup))
_STOP_GRADIENT.extend((mad_dispersion, adjacency_update))

# A whole graph lowers these to their kernel key's op (mlir/lowerings/moe_ops.py).
KEY_OPS["mad_dispersion"] = "mad_dispersion"
KEY_OPS["adjacency_update"] = "adjacency_update"
KEY_OPS["hyper_router"] = "hyper_router"
