"""Load-balancing statistics and losses (MoEBalanceOps.td, issue #32): ``load_balancing_loss`` (Switch/GShard,
transformers' ``load_balancing_loss_func``), ``router_z_loss`` (ST-MoE), ``router_stats`` (per-expert counts and
mean probabilities) and ``sequence_balance_loss`` (DeepSeek-V3's sequence-wise loss).

References (which define the semantics): :mod:`moe_mlir.reference.balance`. CPU kernels and their C++ autograd:
lib/Runtime/Torch/BalanceOps.cpp (one fused pass over the logits forward, one backward; the forward saves the
statistics the backward reads). The backward ops (``router_stats_backward``, ``router_z_loss_backward``,
``sequence_balance_loss_backward``) and ``router_stats_fwd`` (the statistics and ``W = Σ w``) are ops of their own
so that AOT autograd records them. Gradients flow into ``logits`` / ``scores`` only; ``token_mask`` (any dtype,
a multiplier as transformers' attention mask) and ``indices`` get none. Results are f32; logits may be f32, f16, bf16
or f64 (f64 runs in f32).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ..reference import balance as _ref
from ._autograd import _register_recompute_autograd
from ._verified_op import as_f32, as_f32_scalar, moe_op, not_in_key
from ._checks import _check_index_range, _fail
from .loading import _note_fallback

#: The user-facing load-balancing ops; ``torch.ops.moe.<name>`` exists for each.
BALANCE_OP_NAMES: tuple[str, ...] = ("load_balancing_loss", "router_z_loss", "router_stats", "sequence_balance_loss")

_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_logit_dtype(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _LOGIT_DTYPES:
        raise TypeError(f"moe.{op}: '{name}' must be f32, f16, bf16 or f64, got {t.dtype}")


def _check_one_value(op: str, name: str, t: Tensor) -> None:
    """A scalar cotangent or saved scalar: the torch op takes any shape of one element (read as an f32 scalar)."""
    if t.numel() != 1:
        _fail(op, f"'{name}' must hold one value, got shape {list(t.shape)}")


def _router_check(op: str) -> Callable:
    """The router statistics' and z-loss's own rules: the logits' dtype (the torch ops take f64 too, computed in f32),
    a real mask and one-value scalars; the rest is the key's op's, on the operands as the kernels read them
    (``_ROUTER_VIEWS``)."""

    def check(logits: Tensor, token_mask: Optional[Tensor] = None, weight_sum: Optional[Tensor] = None,
              grad: Optional[Tensor] = None, **_) -> None:
        _check_logit_dtype(op, "logits", logits)
        if token_mask is not None and token_mask.is_complex():
            raise TypeError(f"moe.{op}: 'token_mask' must be real, got {token_mask.dtype}")
        for name, t in (("weight_sum", weight_sum), ("grad", grad)):
            if t is not None:
                _check_one_value(op, name, t)

    return check


_ROUTER_VIEWS = {"logits": as_f32, "token_mask": as_f32}


def _sequence_check(op: str) -> Callable:
    """The sequence-wise loss's own rules: the scores' dtype, ``top_k`` (the last size of the indices, which the key's
    op reads: the key does not take it) and a one-value cotangent."""

    def check(scores: Tensor, indices: Tensor, top_k: int, grad: Optional[Tensor] = None) -> None:
        _check_logit_dtype(op, "scores", scores)
        if indices.dim() == 3 and indices.shape[2] != top_k:
            _fail(op, f"dimension 2 of 'indices' ({indices.shape[2]}) must equal 'top_k' ({top_k})")
        if grad is not None:
            _check_one_value(op, "grad", grad)

    return check


_SEQUENCE_VIEWS = {"scores": as_f32, "top_k": not_in_key}


def _load_balancing_loss_fake(logits, top_k, token_mask=None):
    return logits.new_empty((), dtype=torch.float32)


@moe_op("load_balancing_loss", fake=_load_balancing_loss_fake, key="router_stats_fwd", views=_ROUTER_VIEWS,
        check=_router_check("load_balancing_loss"))
def load_balancing_loss(logits: Tensor, top_k: int, token_mask: Optional[Tensor] = None) -> Tensor:
    """Switch/GShard's auxiliary loss as transformers' ``load_balancing_loss_func`` computes it.

    Args:
        logits: ``[T, E]`` router logits (every layer's, concatenated).
        top_k: experts per token, ``1 <= top_k <= E``.
        token_mask: ``[T]`` token weights (any dtype; transformers' attention mask expanded to the tokens), or None.

    Returns:
        f32 scalar ``E · Σ_e f_e · P_e``, ``f = Σ_t w_t [e ∈ top_k(p_t)] / Σ w``, ``P = Σ_t w_t p_t / Σ w``,
        ``p = softmax(logits)``; NaN when ``Σ w = 0``. Differentiable w.r.t. ``logits`` (through ``P``).
    """
    _note_fallback(logits)
    return _ref.load_balancing_loss(logits, top_k, token_mask).detach()


def _router_z_loss_fake(logits):
    return logits.new_empty((), dtype=torch.float32)


@moe_op("router_z_loss", fake=_router_z_loss_fake, views={"logits": as_f32}, check=_router_check("router_z_loss"))
def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's router z-loss: f32 ``mean_t logsumexp(logits_t)²`` of ``logits`` ``[T, E]`` (NaN for T = 0)."""
    _note_fallback(logits)
    return _ref.router_z_loss(logits).detach()


def _router_stats_fake(logits, top_k, token_mask=None):
    E = logits.shape[1]
    return logits.new_empty((E,), dtype=torch.float32), logits.new_empty((E,), dtype=torch.float32)


@moe_op("router_stats", fake=_router_stats_fake, key="router_stats_fwd", views=_ROUTER_VIEWS,
        check=_router_check("router_stats"))
def router_stats(logits: Tensor, top_k: int, token_mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Per-expert statistics of a batch: ``(counts [E], mean_probs [E])``, f32.

    ``counts_e = Σ_t w_t [e ∈ top_k(logits_t)]`` (the selection of ``moe.topk_renorm``: ties to the lowest index,
    NaN first), ``mean_probs_e = Σ_t w_t softmax(logits_t)_e / Σ w``. ``mean_probs`` is differentiable w.r.t.
    ``logits``; ``counts`` is not.
    """
    _note_fallback(logits)
    counts, probs = _ref.router_stats(logits, top_k, token_mask)
    return counts.detach(), probs.detach()


def _sequence_balance_loss_fake(scores, indices, top_k):
    return scores.new_empty((), dtype=torch.float32)


@moe_op("sequence_balance_loss", fake=_sequence_balance_loss_fake, views=_SEQUENCE_VIEWS,
        check=_sequence_check("sequence_balance_loss"))
def sequence_balance_loss(scores: Tensor, indices: Tensor, top_k: int) -> Tensor:
    """DeepSeek-V3's sequence-wise balance loss (α = 1), averaged over the batch.

    Args:
        scores: ``[B, S, E]`` router affinities (sigmoid of the logits, no bias).
        indices: ``[B, S, top_k]`` the selected experts (i32/i64, in ``[0, E)``, else ValueError).
        top_k: the selections per token (``indices.shape[2]``).

    Returns:
        f32 scalar ``mean_b Σ_e f_be P_be``, ``P_be = mean_t s_bte / Σ_j s_btj``,
        ``f_be = E / (top_k · S) · #slots selecting e``. Differentiable w.r.t. ``scores``.
    """
    _check_index_range("sequence_balance_loss", "indices", indices, scores.shape[2])
    _note_fallback(scores)
    return _ref.sequence_balance_loss(scores, indices, top_k).detach()


# The training pieces: the statistics with W (the C++ autograd's forward) and the backward ops.


def _router_stats_fwd_fake(logits, top_k, token_mask=None):
    E = logits.shape[1]
    f = torch.float32
    return logits.new_empty((E,), dtype=f), logits.new_empty((E,), dtype=f), logits.new_empty((), dtype=f)


@moe_op("router_stats_fwd", fake=_router_stats_fwd_fake, views=_ROUTER_VIEWS,
        check=_router_check("router_stats_fwd"))
def router_stats_fwd(logits: Tensor, top_k: int, token_mask: Optional[Tensor] = None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """``(counts [E], mean_probs [E], weight_sum [])`` of ``moe.router_stats`` (what the backward reads), f32."""
    _note_fallback(logits)
    return tuple(t.detach() for t in _ref.router_stats_full(logits, top_k, token_mask))


def _router_stats_backward_fake(grad_mean_probs, logits, token_mask, weight_sum):
    return logits.new_empty(logits.shape, dtype=torch.float32)


@moe_op("router_stats_backward", fake=_router_stats_backward_fake,
        views={**_ROUTER_VIEWS, "grad_mean_probs": as_f32, "weight_sum": as_f32_scalar},
        check=_router_check("router_stats_backward"))
def router_stats_backward(grad_mean_probs: Tensor, logits: Tensor, token_mask: Optional[Tensor],
                          weight_sum: Tensor) -> Tensor:
    """The gradient to ``logits`` ``[T, E]`` (f32) of ``mean_probs`` given its cotangent (``moe.router_stats_grad``)."""
    _note_fallback(logits)
    return _ref.router_stats_backward(grad_mean_probs, logits, token_mask, weight_sum)


def _router_z_loss_backward_fake(grad, logits):
    return logits.new_empty(logits.shape, dtype=torch.float32)


@moe_op("router_z_loss_backward", fake=_router_z_loss_backward_fake, views={"logits": as_f32, "grad": as_f32_scalar},
        check=_router_check("router_z_loss_backward"))
def router_z_loss_backward(grad: Tensor, logits: Tensor) -> Tensor:
    """The gradient of ``router_z_loss`` to ``logits`` ``[T, E]`` (f32) (``moe.router_z_loss_grad``)."""
    _note_fallback(logits)
    return _ref.router_z_loss_backward(grad, logits)


def _sequence_balance_loss_backward_fake(grad, scores, indices, top_k):
    return scores.new_empty(scores.shape, dtype=torch.float32)


@moe_op("sequence_balance_loss_backward", fake=_sequence_balance_loss_backward_fake,
        views={**_SEQUENCE_VIEWS, "grad": as_f32_scalar}, check=_sequence_check("sequence_balance_loss_backward"))
def sequence_balance_loss_backward(grad: Tensor, scores: Tensor, indices: Tensor, top_k: int) -> Tensor:
    """The gradient of ``sequence_balance_loss`` to ``scores`` ``[B, S, E]`` (f32)."""
    _check_index_range("sequence_balance_loss_backward", "indices", indices, scores.shape[2])
    _note_fallback(scores)
    return _ref.sequence_balance_loss_backward(grad, scores, indices, top_k)


# Autograd without the extension (and on devices the extension does not register, CUDA for now): the reference
# re-run under autograd. The extension's AutogradCPU kernels (BalanceOps.cpp) take CPU calls instead.
_register_recompute_autograd(load_balancing_loss, _ref.load_balancing_loss, (0, 2), (0,))
_register_recompute_autograd(router_z_loss, _ref.router_z_loss, (0,), (0,))
_register_recompute_autograd(router_stats, _ref.router_stats, (0, 2), (1,))
_register_recompute_autograd(sequence_balance_loss, _ref.sequence_balance_loss, (0, 1), (0,))
