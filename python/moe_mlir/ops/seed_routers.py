"""The seed routers' ops: ``moe.mad_dispersion`` (ACMoE), ``moe.adjacency_update`` (Symphony), both stop-gradient,
and ``moe.hyper_router`` (HyperRouter) with its backward."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..reference import _adjacency_update_ref, _hyper_router_backward_ref, _hyper_router_ref, _mad_dispersion_ref
from ._autograd import _needs
from ..runtime.verify import KernelView, verify
from ._checks import _check_index_range
from .loading import KEY_OPS, _PYTHON_AUTOGRAD, _STOP_GRADIENT, _note_fallback

NORMALIZES = ("feature", "expert", "global")
MEASURES = ("mad", "variance")
EMPTIES = ("identity", "raw")
ADJ_NORMS = ("row", "col", "none")


def _verify_mad_dispersion(tokens: Tensor, assign: Tensor, num_experts: int, eps: float, clip: float, normalize: str,
                           measure: str, empty: str) -> None:
    verify("mad_dispersion", {"num_experts": num_experts, "eps": eps, "clip": clip, "normalize": normalize,
                              "measure": measure, "empty": empty, "tokens": tokens, "assign": assign})


@torch.library.custom_op("moe::mad_dispersion", mutates_args=())
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
    _verify_mad_dispersion(tokens, assign, num_experts, eps, clip, normalize, measure, empty)
    _check_index_range("mad_dispersion", "assign", assign, num_experts)
    _note_fallback(tokens)
    return _mad_dispersion_ref(tokens, assign, num_experts, eps, clip, normalize, measure, empty)


@mad_dispersion.register_fake
def _(tokens, assign, num_experts, eps=1e-4, clip=10.0, normalize="feature", measure="mad", empty="identity"):
    _verify_mad_dispersion(tokens, assign, num_experts, eps, clip, normalize, measure, empty)
    return (
        tokens.new_empty((num_experts, tokens.shape[1]), dtype=torch.float32),
        tokens.new_empty((num_experts,), dtype=torch.int32),
    )


# ----------------------------------------------------------------------------------------------------------------
# 5. adjacency_update
# ----------------------------------------------------------------------------------------------------------------


def _verify_adjacency_update(a: Tensor, idx: Tensor, beta: float, norm: str, include_self: bool) -> None:
    verify("adjacency_update", {"beta": beta, "norm": norm, "include_self": include_self, "a": a, "idx": idx})


@torch.library.custom_op("moe::adjacency_update", mutates_args=())
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
    _verify_adjacency_update(a, idx, beta, norm, include_self)
    _check_index_range("adjacency_update", "idx", idx, a.shape[0])
    _note_fallback(a)
    return _adjacency_update_ref(a, idx, beta, norm, include_self)


@adjacency_update.register_fake
def _(a, idx, beta=0.9, norm="row", include_self=True):
    _verify_adjacency_update(a, idx, beta, norm, include_self)
    return a.new_empty(a.shape, dtype=torch.float32)


# ----------------------------------------------------------------------------------------------------------------
# 6. hyper_router
# ----------------------------------------------------------------------------------------------------------------


def _verify_hyper_router(emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, num_experts: int) -> None:
    verify("hyper_router", {"num_experts": num_experts, "emb": emb, "w1": w1, "b1": b1, "w2": w2, "b2": b2})


@torch.library.custom_op("moe::hyper_router", mutates_args=())
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
    _verify_hyper_router(emb, w1, b1, w2, b2, num_experts)
    _note_fallback(emb)
    return _hyper_router_ref(emb, w1, b1, w2, b2, num_experts)


@hyper_router.register_fake
def _(emb, w1, b1, w2, b2, num_experts):
    _verify_hyper_router(emb, w1, b1, w2, b2, num_experts)
    d = w2.shape[0] // num_experts - 1
    return (
        emb.new_empty((num_experts, d), dtype=torch.float32),
        emb.new_empty((num_experts,), dtype=torch.float32),
    )


def _verify_hyper_router_backward(grad_w: Tensor, grad_b: Tensor, emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor,
                                  b2: Tensor, num_experts: int) -> None:
    # The cotangents are read as f32, whatever autograd hands over.
    verify("hyper_router_backward", {"num_experts": num_experts, "grad_w": KernelView(torch.float32, grad_w.shape),
                                     "grad_b": KernelView(torch.float32, grad_b.shape), "emb": emb, "w1": w1, "b1": b1,
                                     "w2": w2, "b2": b2})


def _without_weight_grads(grads: tuple, weight_grads: bool) -> tuple:
    """d_w1 and d_w2 as empty ``[0]`` tensors unless ``weight_grads``."""
    if weight_grads:
        return tuple(grads)
    return tuple(g.new_empty((0,)) if i in (1, 3) else g for i, g in enumerate(grads))


@torch.library.custom_op("moe::hyper_router_backward", mutates_args=())
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
    _verify_hyper_router_backward(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts)
    _note_fallback(emb)
    return _without_weight_grads(_hyper_router_backward_ref(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts),
                                 weight_grads)


@hyper_router_backward.register_fake
def _(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts, weight_grads=True):
    _verify_hyper_router_backward(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts)
    return _without_weight_grads(tuple(t.new_empty(t.shape, dtype=torch.float32) for t in (emb, w1, b1, w2, b2)),
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
