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
from ._checks import _check_dim, _check_index, _check_index_range, _check_operands, _check_rank, _fail
from .loading import KEY_VALIDATORS, _note_fallback

#: The user-facing load-balancing ops; ``torch.ops.moe.<name>`` exists for each.
BALANCE_OP_NAMES: tuple[str, ...] = ("load_balancing_loss", "router_z_loss", "router_stats", "sequence_balance_loss")

_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_logit_dtype(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _LOGIT_DTYPES:
        raise TypeError(f"moe.{op}: '{name}' must be f32, f16, bf16 or f64, got {t.dtype}")


def _validate_router(op: str, logits: Tensor, top_k: Optional[int], token_mask: Optional[Tensor]) -> None:
    _check_logit_dtype(op, "logits", logits)
    _check_rank(op, "logits", logits, 2, "[T, E]")
    if token_mask is not None:
        if token_mask.is_complex():
            raise TypeError(f"moe.{op}: 'token_mask' must be real, got {token_mask.dtype}")
        _check_rank(op, "token_mask", token_mask, 1, "[T]")
        _check_dim(op, "token_mask", token_mask, 0, logits.shape[0], "the token count T of 'logits'")
    if top_k is not None:
        E = logits.shape[1]
        if not 1 <= top_k <= E:
            _fail(op, f"'top_k' ({top_k}) must be in [1, {E}] (the size of the last dimension of 'logits')")


def _validate_sequence(op: str, scores: Tensor, indices: Tensor, top_k: int) -> None:
    _check_operands(op, (_check_logit_dtype, "scores", scores, 3, "[B, S, E]"),
                    (_check_index, "indices", indices, 3, "[B, S, k]"))
    _check_dim(op, "indices", indices, 0, scores.shape[0], "the batch size B of 'scores'")
    _check_dim(op, "indices", indices, 1, scores.shape[1], "the sequence length S of 'scores'")
    _check_dim(op, "indices", indices, 2, top_k, "'top_k'")
    E = scores.shape[2]
    if not 1 <= top_k <= E:
        _fail(op, f"'top_k' ({top_k}) must be in [1, {E}] (the size of the last dimension of 'scores')")


def _validate_scalar(op: str, name: str, t: Tensor) -> None:
    if t.numel() != 1:
        _fail(op, f"'{name}' must hold one value, got shape {list(t.shape)}")


@torch.library.custom_op("moe::load_balancing_loss", mutates_args=())
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
    _validate_router("load_balancing_loss", logits, top_k, token_mask)
    _note_fallback(logits)
    return _ref.load_balancing_loss(logits, top_k, token_mask).detach()


@load_balancing_loss.register_fake
def _(logits, top_k, token_mask=None):
    _validate_router("load_balancing_loss", logits, top_k, token_mask)
    return logits.new_empty((), dtype=torch.float32)


@torch.library.custom_op("moe::router_z_loss", mutates_args=())
def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's router z-loss: f32 ``mean_t logsumexp(logits_t)²`` of ``logits`` ``[T, E]`` (NaN for T = 0)."""
    _validate_router("router_z_loss", logits, None, None)
    _note_fallback(logits)
    return _ref.router_z_loss(logits).detach()


@router_z_loss.register_fake
def _(logits):
    _validate_router("router_z_loss", logits, None, None)
    return logits.new_empty((), dtype=torch.float32)


@torch.library.custom_op("moe::router_stats", mutates_args=())
def router_stats(logits: Tensor, top_k: int, token_mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Per-expert statistics of a batch: ``(counts [E], mean_probs [E])``, f32.

    ``counts_e = Σ_t w_t [e ∈ top_k(logits_t)]`` (the selection of ``moe.topk_renorm``: ties to the lowest index,
    NaN first), ``mean_probs_e = Σ_t w_t softmax(logits_t)_e / Σ w``. ``mean_probs`` is differentiable w.r.t.
    ``logits``; ``counts`` is not.
    """
    _validate_router("router_stats", logits, top_k, token_mask)
    _note_fallback(logits)
    counts, probs = _ref.router_stats(logits, top_k, token_mask)
    return counts.detach(), probs.detach()


@router_stats.register_fake
def _(logits, top_k, token_mask=None):
    _validate_router("router_stats", logits, top_k, token_mask)
    E = logits.shape[1]
    return logits.new_empty((E,), dtype=torch.float32), logits.new_empty((E,), dtype=torch.float32)


@torch.library.custom_op("moe::sequence_balance_loss", mutates_args=())
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
    _validate_sequence("sequence_balance_loss", scores, indices, top_k)
    _check_index_range("sequence_balance_loss", "indices", indices, scores.shape[2])
    _note_fallback(scores)
    return _ref.sequence_balance_loss(scores, indices, top_k).detach()


@sequence_balance_loss.register_fake
def _(scores, indices, top_k):
    _validate_sequence("sequence_balance_loss", scores, indices, top_k)
    return scores.new_empty((), dtype=torch.float32)


# The training pieces: the statistics with W (the C++ autograd's forward) and the backward ops.


@torch.library.custom_op("moe::router_stats_fwd", mutates_args=())
def router_stats_fwd(logits: Tensor, top_k: int, token_mask: Optional[Tensor] = None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """``(counts [E], mean_probs [E], weight_sum [])`` of ``moe.router_stats`` (what the backward reads), f32."""
    _validate_router("router_stats_fwd", logits, top_k, token_mask)
    _note_fallback(logits)
    return tuple(t.detach() for t in _ref.router_stats_full(logits, top_k, token_mask))


@router_stats_fwd.register_fake
def _(logits, top_k, token_mask=None):
    _validate_router("router_stats_fwd", logits, top_k, token_mask)
    E = logits.shape[1]
    f = torch.float32
    return logits.new_empty((E,), dtype=f), logits.new_empty((E,), dtype=f), logits.new_empty((), dtype=f)


def _validate_stats_backward(grad_mean_probs, logits, token_mask, weight_sum):
    op = "router_stats_backward"
    _validate_router(op, logits, None, token_mask)
    _check_rank(op, "grad_mean_probs", grad_mean_probs, 1, "[E]")
    _check_dim(op, "grad_mean_probs", grad_mean_probs, 0, logits.shape[1], "the expert count E of 'logits'")
    _validate_scalar(op, "weight_sum", weight_sum)


@torch.library.custom_op("moe::router_stats_backward", mutates_args=())
def router_stats_backward(grad_mean_probs: Tensor, logits: Tensor, token_mask: Optional[Tensor],
                          weight_sum: Tensor) -> Tensor:
    """The gradient to ``logits`` ``[T, E]`` (f32) of ``mean_probs`` given its cotangent (``moe.router_stats_grad``)."""
    _validate_stats_backward(grad_mean_probs, logits, token_mask, weight_sum)
    _note_fallback(logits)
    return _ref.router_stats_backward(grad_mean_probs, logits, token_mask, weight_sum)


@router_stats_backward.register_fake
def _(grad_mean_probs, logits, token_mask, weight_sum):
    _validate_stats_backward(grad_mean_probs, logits, token_mask, weight_sum)
    return logits.new_empty(logits.shape, dtype=torch.float32)


@torch.library.custom_op("moe::router_z_loss_backward", mutates_args=())
def router_z_loss_backward(grad: Tensor, logits: Tensor) -> Tensor:
    """The gradient of ``router_z_loss`` to ``logits`` ``[T, E]`` (f32) (``moe.router_z_loss_grad``)."""
    _validate_router("router_z_loss_backward", logits, None, None)
    _validate_scalar("router_z_loss_backward", "grad", grad)
    _note_fallback(logits)
    return _ref.router_z_loss_backward(grad, logits)


@router_z_loss_backward.register_fake
def _(grad, logits):
    _validate_router("router_z_loss_backward", logits, None, None)
    _validate_scalar("router_z_loss_backward", "grad", grad)
    return logits.new_empty(logits.shape, dtype=torch.float32)


@torch.library.custom_op("moe::sequence_balance_loss_backward", mutates_args=())
def sequence_balance_loss_backward(grad: Tensor, scores: Tensor, indices: Tensor, top_k: int) -> Tensor:
    """The gradient of ``sequence_balance_loss`` to ``scores`` ``[B, S, E]`` (f32)."""
    _validate_sequence("sequence_balance_loss_backward", scores, indices, top_k)
    _validate_scalar("sequence_balance_loss_backward", "grad", grad)
    _check_index_range("sequence_balance_loss_backward", "indices", indices, scores.shape[2])
    _note_fallback(scores)
    return _ref.sequence_balance_loss_backward(grad, scores, indices, top_k)


@sequence_balance_loss_backward.register_fake
def _(grad, scores, indices, top_k):
    _validate_sequence("sequence_balance_loss_backward", scores, indices, top_k)
    _validate_scalar("sequence_balance_loss_backward", "grad", grad)
    return scores.new_empty(scores.shape, dtype=torch.float32)


# Autograd without the extension (and on devices the extension does not register, CUDA for now): the reference
# re-run under autograd. The extension's AutogradCPU kernels (BalanceOps.cpp) take CPU calls instead.
_register_recompute_autograd(load_balancing_loss, _ref.load_balancing_loss, (0, 2), (0,))
_register_recompute_autograd(router_z_loss, _ref.router_z_loss, (0,), (0,))
_register_recompute_autograd(router_stats, _ref.router_stats, (0, 2), (1,))
_register_recompute_autograd(sequence_balance_loss, _ref.sequence_balance_loss, (0, 1), (0,))


_BALANCE_VALIDATORS: dict[str, Callable[[dict, dict], None]] = {
    "router_stats_fwd": lambda t, a: _validate_router("router_stats_fwd", t["logits"], int(a["top_k"]),
                                                      t.get("token_mask")),
    "router_stats_backward": lambda t, a: _validate_stats_backward(t["grad_mean_probs"], t["logits"],
                                                                   t.get("token_mask"), t["weight_sum"]),
    "router_z_loss": lambda t, a: _validate_router("router_z_loss", t["logits"], None, None),
    "router_z_loss_backward": lambda t, a: _validate_router("router_z_loss_backward", t["logits"], None, None),
    "sequence_balance_loss": lambda t, a: _validate_sequence("sequence_balance_loss", t["scores"], t["indices"],
                                                             t["indices"].shape[2]),
    "sequence_balance_loss_backward": lambda t, a: _validate_sequence(
        "sequence_balance_loss_backward", t["scores"], t["indices"], t["indices"].shape[2]),
}

KEY_VALIDATORS.update(_BALANCE_VALIDATORS)
