"""Torch custom ops for the ``moe`` dialect: ``torch.ops.moe.<name>`` for the six ops and the two fused forms.

Every op is registered with :func:`torch.library.custom_op` as ``moe::<name>`` so that ``torch.export`` and FX keep
it as one opaque node (``torch.ops.moe.<name>``), which the importer maps to the dialect op of the same name. The
operand order, attribute names and defaults are those of ``shared/spec/DIALECT.md`` and ``include/MoE/IR/MoEOps.td``;
enum attributes are plain strings (``mode="probs"``). The fused forms (``similarity_inform_topk``,
``attention_posterior_topk``, MoEFusedOps.td) take the mixing op's operands, then ``k``, then its attributes, then
``renormalize``.

Kernels: on CPU tensors the ops run the compiled moe kernels through the C++ extension ``libmoe_torch.so``
(``lib/Runtime/Torch``; the token-like dimensions are dynamic, kernels are cached in memory and on disk by
:mod:`moe_mlir.runtime.cache`). Elsewhere (CUDA for now), or when the extension or the compiler is unavailable (a
one-time warning says why), they run the eager references of :mod:`moe_mlir.reference`, which define the semantics:

* f16/bf16 inputs upcast, everything accumulated in f32;
* ties in any top-k/argmin break to the lowest index, NaN ranks above every number in a top-k;
* masked (``-inf``) logits get no probability and a fully masked row yields zeros, never NaN;
* index operands out of range raise :class:`ValueError`.

Validation mirrors the verifier (same rules, messages naming the operand and the rule) and runs in the fake kernels
too, so ``torch.export`` rejects a bad call at trace time; the C++ kernels run the same validators (through the
kernel cache) for what their cache key does not already pin down.

Autograd: ``topk_renorm``, ``similarity_inform``, ``attention_posterior``, ``hyper_router`` and the fused forms are
differentiable (gradients through the selected values only, none through indices or the head choice).
``mad_dispersion`` and ``adjacency_update`` are stop-gradient (003 §5.10, 004 §1.2). The backward of

* ``similarity_inform``: ``torch.ops.moe.similarity_inform_backward`` (the dialect's ``moe.similarity_inform_grad``:
  a flash-style kernel, O(N) memory, on the CPU and on CUDA; the autograd's forward is
  ``torch.ops.moe.similarity_inform_fwd``, which returns ``p`` and ``lse`` for the backward to read (called
  directly, without them, the backward recomputes them); the eager fallback is the reference's closed form);
* ``topk_renorm``: ``torch.ops.moe.topk_renorm_backward`` (``moe.topk_renorm_grad``: the closed form of
  :func:`moe_mlir.reference._topk_renorm_backward_ref` on the saved indices, O(rows·K), no recompute; CPU and
  CUDA kernels);
* ``similarity_inform_topk``: both of the above; the autograd's forward is ``similarity_inform_fwd`` then
  ``topk_renorm`` (the fused kernel's bits; ``p`` and ``lse`` saved, O(N) memory);
* ``hyper_router``: ``torch.ops.moe.hyper_router_backward`` (``moe.hyper_router_grad``: the closed form of
  :func:`moe_mlir.reference._hyper_router_backward_ref`; every operand's gradient, so a frozen hypernetwork still
  passes gradient to ``emb``);
* ``attention_posterior``: ``torch.ops.moe.attention_posterior_backward`` (``moe.attention_posterior_grad``: at the
  forward's chosen head, the posterior log-sum-exp recomputed, the key tiles streamed; beyond ``d_scores`` itself,
  O(N) memory; the eager fallback is the dense closed form
  :func:`moe_mlir.reference._attention_posterior_backward_ref`);
* ``attention_posterior_topk``: ``p`` recomputed by the forward kernel, then ``topk_renorm_backward`` and
  ``attention_posterior_backward`` (as ``similarity_inform_topk``).

The autograd of these six ops is C++ (``lib/Runtime/Torch/Autograd.cpp``, at AutogradCPU/AutogradCUDA: no Python per
call); the Python ``setup_context``/``backward`` pairs below (``_PYTHON_AUTOGRAD``) are registered only when the
extension does not load, so that an op has one autograd either way. No backward is differentiable again: double
backward raises ``moe.<op>: double backward is not supported`` (C++) or PyTorch's "no autograd formula" error
(Python fallback).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from .reference import (
    _IN_BACKWARD,
    _adjacency_update_ref,
    _attention_posterior_backward_ref,
    _attention_posterior_ref,
    _attention_posterior_topk_ref,
    _hyper_router_backward_ref,
    _hyper_router_ref,
    _mad_dispersion_ref,
    _similarity_inform_backward_ref,
    _similarity_inform_fwd_ref,
    _similarity_inform_ref,
    _similarity_inform_topk_ref,
    _topk_renorm_backward_ref,
    _topk_renorm_ref,
)

#: The dialect ops, in DIALECT.md order; ``torch.ops.moe.<name>`` exists for each.
OP_NAMES: tuple[str, ...] = (
    "topk_renorm",
    "similarity_inform",
    "attention_posterior",
    "mad_dispersion",
    "adjacency_update",
    "hyper_router",
)

#: The fused forms (MoEFusedOps.td): a mixing op with the probs-mode top-k gate in its epilogue.
FUSED_OP_NAMES: tuple[str, ...] = ("similarity_inform_topk", "attention_posterior_topk")

__all__ = [
    *OP_NAMES,
    *FUSED_OP_NAMES,
    "similarity_inform_fwd",
    "similarity_inform_backward",
    "topk_renorm_backward",
    "hyper_router_backward",
    "attention_posterior_backward",
    "OP_NAMES",
    "FUSED_OP_NAMES",
    "kernels_available",
]

TOPK_MODES = ("logits", "probs")
HEAD_SELECTS = ("min_entropy", "all")
NORMALIZES = ("feature", "expert", "global")
MEASURES = ("mad", "variance")
EMPTIES = ("identity", "raw")
ADJ_NORMS = ("row", "col", "none")

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)
_NEG_INF = float("-inf")
#: The most elements a tensor of the kernels may have (they index with i32; moe::checkKernelLimits).
_I32_MAX = 2**31 - 1


# ----------------------------------------------------------------------------------------------------------------
# Validation (the verifier's rules; also run by the fake kernels)
# ----------------------------------------------------------------------------------------------------------------


def _fail(op: str, msg: str) -> None:
    raise ValueError(f"moe.{op}: {msg}")


def _check_float(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"moe.{op}: '{name}' must be f32, f16 or bf16, got {t.dtype}")


def _check_index(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"moe.{op}: '{name}' must be i32 or i64, got {t.dtype}")


def _check_rank(op: str, name: str, t: Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        _fail(op, f"'{name}' must have rank {rank} ({layout}), got shape {list(t.shape)}")


def _check_dim(op: str, name: str, t: Tensor, d: int, expected: int, what: str) -> None:
    if t.shape[d] != expected:
        _fail(op, f"dimension {d} of '{name}' ({t.shape[d]}) must equal {what} ({expected})")


def _check_operands(op: str, *operands: tuple[Callable, str, Tensor, int, str]) -> None:
    """``(check, name, tensor, rank, layout)`` per operand: every dtype check (``_check_float``/``_check_index``)
    first, then every rank, in order (the verifier's order)."""
    for check, name, t, _, _ in operands:
        check(op, name, t)
    for _, name, t, rank, layout in operands:
        _check_rank(op, name, t, rank, layout)


def _check_result_elements(op: str, name: str, shape: Sequence) -> None:
    """A result whose size the operands do not bound (a size argument, or sizes of two operands multiplied) holds
    at most 2^31 - 1 elements: checked before anything is allocated, in the words of the C++ extension's
    ``checkResultElements``. A symbolic size (torch.compile's dynamic shapes) is left to the run-time check."""
    n = math.prod(shape)
    if isinstance(n, int) and n > _I32_MAX:
        _fail(op, f"the result '{name}' of shape {list(shape)} would have {n} elements, more than the kernels "
                  f"support: at most {_I32_MAX} per tensor (2^31 - 1: the kernels index with i32)")


def _check_enum(op: str, attr: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        _fail(op, f"'{attr}' must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")


def _check_positive_finite(op: str, attr: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        _fail(op, f"'{attr}' ({value}) must be > 0 and finite")


def _note_fallback(t: Tensor) -> None:
    """Called by the eager kernels: on a CPU tensor they run only when the compiled kernels are unavailable."""
    global _FALLBACK_WARNED
    if t.device.type == "cpu" and not _FALLBACK_WARNED:
        _FALLBACK_WARNED = True
        warnings.warn(f"moe: the compiled CPU kernels are unavailable ({_KERNELS_UNAVAILABLE or 'not loaded'}); "
                      "torch.ops.moe.* run the eager references", RuntimeWarning, stacklevel=3)


_FALLBACK_WARNED = False
_KERNELS_UNAVAILABLE: Optional[str] = None


def _check_index_range(op: str, name: str, t: Tensor, bound: int) -> None:
    """Raises on any value of ``t`` outside ``[0, bound)`` (a data-dependent check: eager kernels only)."""
    if t.numel() == 0:
        return
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= bound:
        bad = lo if lo < 0 else hi
        _fail(op, f"'{name}' holds {bad}, outside [0, {bound}): the value indexes no expert")


# ----------------------------------------------------------------------------------------------------------------
# Autograd: recompute the reference under autograd (the kernels are cheap next to the experts)
# ----------------------------------------------------------------------------------------------------------------


def _register_recompute_autograd(op, ref: Callable, tensor_args: "int | Sequence[int]",
                                 float_outputs: Sequence[int]) -> None:
    """Registers a backward that re-runs ``ref`` (same arguments as the op) with grad enabled and returns the input
    gradients.

    ``tensor_args``: the positions of the (optional) tensor operands, or their number when they lead; the rest are
    attributes. ``float_outputs``: the outputs that carry gradients (index outputs do not).
    """
    positions = tuple(range(tensor_args)) if isinstance(tensor_args, int) else tuple(tensor_args)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*[inputs[p] if isinstance(inputs[p], Tensor) else None for p in positions])
        ctx.inputs = [None if p in positions else v for p, v in enumerate(inputs)]
        ctx.present = [isinstance(inputs[p], Tensor) for p in positions]

    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        args = list(ctx.inputs)
        leaves = []
        for p, t, present in zip(positions, saved, ctx.present):
            if present and t.is_floating_point():
                t = t.detach().requires_grad_(True)
            args[p] = t
            leaves.append(t)
        token = _IN_BACKWARD.set(True)
        try:
            with torch.enable_grad():
                outs = ref(*args)
                outs = outs if isinstance(outs, tuple) else (outs,)
                want = [(i, t) for i, t in enumerate(leaves) if isinstance(t, Tensor) and t.requires_grad]
                pairs = [(outs[o], grads[o]) for o in float_outputs if grads[o] is not None]
                result: list[Optional[Tensor]] = [None] * len(args)
                if want and pairs:
                    gs = torch.autograd.grad(
                        [p[0] for p in pairs], [t for _, t in want], [p[1] for p in pairs], allow_unused=True
                    )
                    for (i, t), g in zip(want, gs):
                        result[positions[i]] = None if g is None else g.to(t.dtype)
        finally:
            _IN_BACKWARD.reset(token)
        return tuple(result)

    op.register_autograd(backward, setup_context=setup_context)


# ----------------------------------------------------------------------------------------------------------------
# 1. topk_renorm
# ----------------------------------------------------------------------------------------------------------------


def _validate_topk_renorm(scores: Tensor, k: int, mode: str) -> None:
    _check_float("topk_renorm", "scores", scores)
    if scores.dim() < 1:
        _fail("topk_renorm", "'scores' must have rank >= 1 ([..., K])")
    K = scores.shape[-1]
    if not 1 <= k <= K:
        _fail("topk_renorm", f"'k' ({k}) must be in [1, {K}] (the size of the last dimension of 'scores')")
    _check_enum("topk_renorm", "mode", mode, TOPK_MODES)


@torch.library.custom_op("moe::topk_renorm", mutates_args=())
def topk_renorm(scores: Tensor, k: int, mode: str = "logits", renormalize: bool = True) -> tuple[Tensor, Tensor]:
    """Top-k expert selection with gate weights (``moe.topk_renorm``).

    Args:
        scores: ``[..., K]`` router logits (``mode="logits"``) or probabilities (``mode="probs"``), f32/f16/bf16.
        k: experts per row, ``1 <= k <= K``.
        mode: ``"logits"``: weights = softmax over the k selected logits (``renormalize=True``) or the dense
            softmax read at the selected experts (``False``). ``"probs"``: the selected values divided by their
            sum (``True``; a zero sum gives zero weights) or left raw (``False``).
        renormalize: see ``mode``.

    Returns:
        ``(weights [..., k] f32, indices [..., k] i32)`` sorted by descending score; ties -> lowest index; NaN ranks
        first; a fully ``-inf`` row gives zero weights and indices ``0..k-1``.
    """
    _validate_topk_renorm(scores, k, mode)
    _note_fallback(scores)
    return _topk_renorm_ref(scores, k, mode, renormalize)


@topk_renorm.register_fake
def _(scores: Tensor, k: int, mode: str = "logits", renormalize: bool = True) -> tuple[Tensor, Tensor]:
    _validate_topk_renorm(scores, k, mode)
    shape = (*scores.shape[:-1], k)
    return scores.new_empty(shape, dtype=torch.float32), scores.new_empty(shape, dtype=torch.int32)


def _needs(ctx, n: int) -> tuple[bool, ...]:
    """``ctx.needs_input_grad`` for the op's ``n`` arguments (it covers the arguments the caller passed, not the
    defaults)."""
    given = tuple(ctx.needs_input_grad)
    return given + (False,) * (n - len(given))


def _validate_topk_renorm_backward(grad_w: Tensor, scores: Tensor, indices: Tensor, mode: str) -> None:
    op = "topk_renorm_backward"
    _check_float(op, "scores", scores)
    if scores.dim() < 1:
        _fail(op, "'scores' must have rank >= 1 ([..., K])")
    _check_float(op, "grad_w", grad_w)
    _check_index(op, "indices", indices)
    _check_rank(op, "indices", indices, scores.dim(), "[..., k], as the weights")
    _check_rank(op, "grad_w", grad_w, scores.dim(), "[..., k], as the weights")
    for d in range(scores.dim() - 1):
        _check_dim(op, "indices", indices, d, scores.shape[d], "the same dimension of 'scores'")
        _check_dim(op, "grad_w", grad_w, d, scores.shape[d], "the same dimension of 'scores'")
    _check_dim(op, "grad_w", grad_w, grad_w.dim() - 1, indices.shape[-1], "the last dimension of 'indices' (k)")
    k, K = indices.shape[-1], scores.shape[-1]
    if not 1 <= k <= K:
        _fail(op, f"the last dimension of 'indices' (k = {k}) must be in [1, {K}] (K, the experts of 'scores')")
    _check_enum(op, "mode", mode, TOPK_MODES)


@torch.library.custom_op("moe::topk_renorm_backward", mutates_args=())
def topk_renorm_backward(grad_w: Tensor, scores: Tensor, indices: Tensor, mode: str = "logits",
                         renormalize: bool = True) -> Tensor:
    """The backward of ``topk_renorm`` (``moe.topk_renorm_grad``): the gradient (f32, shaped like ``scores``) of the
    weights with respect to the scores, given the forward's ``indices`` and the weights' cotangent ``grad_w``; through
    the kept values only (closed form: :func:`moe_mlir.reference._topk_renorm_backward_ref`)."""
    _validate_topk_renorm_backward(grad_w, scores, indices, mode)
    _note_fallback(scores)
    return _topk_renorm_backward_ref(grad_w, scores, indices, mode, renormalize)


@topk_renorm_backward.register_fake
def _(grad_w, scores, indices, mode="logits", renormalize=True):
    _validate_topk_renorm_backward(grad_w, scores, indices, mode)
    return scores.new_empty(scores.shape, dtype=torch.float32)


def _topk_renorm_setup(ctx, inputs, output):
    scores, k, mode, renormalize = inputs
    ctx.save_for_backward(scores, output[1])
    ctx.mode, ctx.renormalize = mode, renormalize


def _topk_renorm_backward(ctx, grad_w, grad_idx):
    scores, idx = ctx.saved_tensors
    if grad_w is None or not _needs(ctx, 4)[0]:
        return None, None, None, None
    g = topk_renorm_backward(grad_w, scores, idx, ctx.mode, ctx.renormalize)
    return g.to(scores.dtype), None, None, None




# ----------------------------------------------------------------------------------------------------------------
# 2. similarity_inform
# ----------------------------------------------------------------------------------------------------------------


def _validate_similarity_inform(
    u: Tensor, e: Tensor, ws: Optional[Tensor], key_mask: Optional[Tensor], tau: float,
    op: str = "similarity_inform",
) -> None:
    _check_operands(op, (_check_float, "u", u, 3, "[B, N, D]"), (_check_float, "e", e, 3, "[B, N, K]"))
    _check_dim(op, "e", e, 0, u.shape[0], "dimension 0 of 'u' (B)")
    _check_dim(op, "e", e, 1, u.shape[1], "dimension 1 of 'u' (N)")
    if ws is not None:
        _check_float(op, "ws", ws)
        _check_rank(op, "ws", ws, 2, "[D, D]")
        _check_dim(op, "ws", ws, 0, u.shape[2], "dimension 2 of 'u' (D)")
        _check_dim(op, "ws", ws, 1, u.shape[2], "dimension 2 of 'u' (D)")
    if key_mask is not None:
        if key_mask.dtype != torch.bool:
            raise TypeError(f"moe.{op}: 'key_mask' must be bool (i1), got {key_mask.dtype}")
        _check_rank(op, "key_mask", key_mask, 2, "[B, N]")
        _check_dim(op, "key_mask", key_mask, 0, u.shape[0], "dimension 0 of 'u' (B)")
        _check_dim(op, "key_mask", key_mask, 1, u.shape[1], "dimension 1 of 'u' (N)")
    _check_positive_finite(op, "tau", tau)


@torch.library.custom_op("moe::similarity_inform", mutates_args=())
def similarity_inform(
    u: Tensor,
    e: Tensor,
    ws: Optional[Tensor] = None,
    key_mask: Optional[Tensor] = None,
    tau: float = 1.0,
    causal: bool = False,
) -> Tensor:
    """Similarity-Inform mixing (``moe.similarity_inform``, Mutual-Inform eq 5, 8).

    ``p[b,i,:] = Σ_j S[b,i,j] e[b,j,:]`` with ``S[b,i,:] = softmax_j(u_i^T W_s u_j / tau)`` over the tokens of
    sequence ``b`` (``j = i`` included; ``W_s`` = identity when ``ws`` is None).

    Args:
        u: ``[B, N, D]`` MoE inputs. e: ``[B, N, K]`` router probabilities. ws: optional ``[D, D]``.
        key_mask: optional ``[B, N]`` bool, False keys are excluded. tau: > 0, finite. causal: only ``j <= i``.

    Returns:
        ``p`` ``[B, N, K]`` f32; a row with every key excluded gives zeros; NaN propagates to the rows mixing it.
    """
    _validate_similarity_inform(u, e, ws, key_mask, tau)
    _note_fallback(u)
    return _similarity_inform_ref(u, e, ws, key_mask, tau, causal)


@similarity_inform.register_fake
def _(u, e, ws=None, key_mask=None, tau=1.0, causal=False):
    _validate_similarity_inform(u, e, ws, key_mask, tau)
    return e.new_empty(e.shape, dtype=torch.float32)


@torch.library.custom_op("moe::similarity_inform_fwd", mutates_args=())
def similarity_inform_fwd(
    u: Tensor,
    e: Tensor,
    ws: Optional[Tensor] = None,
    key_mask: Optional[Tensor] = None,
    tau: float = 1.0,
    causal: bool = False,
) -> tuple[Tensor, Tensor]:
    """``similarity_inform`` for training (``moe.similarity_inform_fwd``): ``p`` and the row log-sum-exp ``lse``
    (``[B, N]`` f32, -inf for a row without keys) of its softmax, which ``similarity_inform_backward(..., p, lse)``
    reads instead of running the forward again. The autograd of ``similarity_inform`` calls it."""
    _validate_similarity_inform(u, e, ws, key_mask, tau)  # errors name similarity_inform, whose training form it is
    _note_fallback(u)
    return _similarity_inform_fwd_ref(u, e, ws, key_mask, tau, causal)


@similarity_inform_fwd.register_fake
def _(u, e, ws=None, key_mask=None, tau=1.0, causal=False):
    _validate_similarity_inform(u, e, ws, key_mask, tau)
    return e.new_empty(e.shape, dtype=torch.float32), e.new_empty(e.shape[:2], dtype=torch.float32)


def _validate_similarity_inform_backward(
    grad_p: Tensor, u: Tensor, e: Tensor, ws: Optional[Tensor], key_mask: Optional[Tensor], tau: float,
    p: Optional[Tensor] = None, lse: Optional[Tensor] = None,
) -> None:
    op = "similarity_inform_backward"
    _validate_similarity_inform(u, e, ws, key_mask, tau, op=op)
    _check_operands(op, (_check_float, "grad_p", grad_p, 3, "[B, N, K], the shape of p"))
    for d in range(3):
        _check_dim(op, "grad_p", grad_p, d, e.shape[d], "the same dimension of 'e'")
    if (p is None) != (lse is None):
        _fail(op, "the saved forward statistics come as a pair: pass both 'p' and 'lse' or neither")
    if p is not None:
        for name, t, rank, dims in (("p", p, 3, "[B, N, K], the forward's result"),
                                    ("lse", lse, 2, "[B, N], the forward's row log-sum-exp")):
            if t.dtype != torch.float32:
                raise TypeError(f"moe.{op}: '{name}' must be float32 (as similarity_inform_fwd returns it), "
                                f"got {t.dtype}")
            _check_rank(op, name, t, rank, dims)
            for d in range(rank):
                _check_dim(op, name, t, d, e.shape[d], "the same dimension of 'e'")


@torch.library.custom_op("moe::similarity_inform_backward", mutates_args=())
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
    _validate_similarity_inform_backward(grad_p, u, e, ws, key_mask, tau, p, lse)
    _note_fallback(u)
    return _similarity_inform_backward_ref(grad_p, u, e, ws, key_mask, tau, causal)


@similarity_inform_backward.register_fake
def _(grad_p, u, e, ws=None, key_mask=None, tau=1.0, causal=False, p=None, lse=None):
    _validate_similarity_inform_backward(grad_p, u, e, ws, key_mask, tau, p, lse)
    D = u.shape[2]
    return (
        u.new_empty(u.shape, dtype=torch.float32),
        e.new_empty(e.shape, dtype=torch.float32),
        u.new_empty((D, D) if ws is not None else (0,), dtype=torch.float32),
    )


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


def _validate_attention_posterior(
    scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, sigma: float, head_select: str,
    head_scale: Optional[float], op: str = "attention_posterior",
) -> None:
    _check_operands(op, (_check_float, "scores", scores, 4, "[B, H, N, Nk]"), (_check_float, "u", u, 3, "[B, N, D]"),
                    (_check_float, "v", v, 4, "[B, H, Nk, Dh]"), (_check_float, "wo", wo, 2, "[D, H*Dh]"),
                    (_check_float, "e", e, 3, "[B, Nk, K]"))
    B, H, N, Nk = scores.shape
    _check_dim(op, "u", u, 0, B, "dimension 0 of 'scores' (B)")
    _check_dim(op, "u", u, 1, N, "dimension 2 of 'scores' (N)")
    _check_dim(op, "v", v, 0, B, "dimension 0 of 'scores' (B)")
    _check_dim(op, "v", v, 1, H, "dimension 1 of 'scores' (H)")
    _check_dim(op, "v", v, 2, Nk, "dimension 3 of 'scores' (Nk)")
    _check_dim(op, "wo", wo, 0, u.shape[2], "dimension 2 of 'u' (D)")
    _check_dim(op, "wo", wo, 1, H * v.shape[3], "H * Dh")
    _check_dim(op, "e", e, 0, B, "dimension 0 of 'scores' (B)")
    _check_dim(op, "e", e, 1, Nk, "dimension 3 of 'scores' (Nk)")
    _check_positive_finite(op, "sigma", sigma)
    _check_enum(op, "head_select", head_select, HEAD_SELECTS)
    if head_scale is not None and not math.isfinite(head_scale):
        _fail(op, f"'head_scale' ({head_scale}) must be finite")
    if op == "attention_posterior":  # p [B, N, K]: N from the scores, K from e
        _check_result_elements(op, "p", (B, N, e.shape[2]))


@torch.library.custom_op("moe::attention_posterior", mutates_args=())
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
    _validate_attention_posterior(scores, u, v, wo, e, sigma, head_select, head_scale)
    _note_fallback(scores)
    return _attention_posterior_ref(scores, u, v, wo, e, sigma, head_select, head_scale)


@attention_posterior.register_fake
def _(scores, u, v, wo, e, sigma=1.0, head_select="min_entropy", head_scale=None):
    _validate_attention_posterior(scores, u, v, wo, e, sigma, head_select, head_scale)
    B, _, N, _ = scores.shape
    return (
        e.new_empty((B, N, e.shape[2]), dtype=torch.float32),
        e.new_empty((B,), dtype=torch.int32),
    )


def _validate_attention_posterior_backward(
    grad_p: Tensor, scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, head: Optional[Tensor],
    sigma: float, head_select: str, head_scale: Optional[float],
) -> None:
    op = "attention_posterior_backward"
    _validate_attention_posterior(scores, u, v, wo, e, sigma, head_select, head_scale, op=op)
    _check_operands(op, (_check_float, "grad_p", grad_p, 3, "[B, N, K], the shape of p"))
    B, _, N, _ = scores.shape
    for d, (size, what) in enumerate(((B, "B"), (N, "N"), (e.shape[2], "K"))):
        _check_dim(op, "grad_p", grad_p, d, size, what)
    if head_select == "min_entropy":
        if head is None:
            _fail(op, "head_select = min_entropy needs 'head' (the forward's chosen head h*, [B])")
        _check_index(op, "head", head)
        _check_rank(op, "head", head, 1, "[B], the forward's chosen head")
        _check_dim(op, "head", head, 0, B, "dimension 0 of 'scores' (B)")
    elif head is not None:
        _fail(op, "'head' must be None for head_select = all (the gradient mixes every head)")


def _check_head_range(op: str, head: Optional[Tensor], heads: int) -> None:
    """h* in [0, H) (a data-dependent check: eager kernels only)."""
    if head is None or head.numel() == 0:
        return
    lo, hi = int(head.min()), int(head.max())
    if lo < 0 or hi >= heads:
        _fail(op, f"'head' holds {lo if lo < 0 else hi}, outside [0, {heads}): it indexes no head")


@torch.library.custom_op("moe::attention_posterior_backward", mutates_args=())
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
    _validate_attention_posterior_backward(grad_p, scores, u, v, wo, e, head, sigma, head_select, head_scale)
    _check_head_range("attention_posterior_backward", head, scores.shape[1])
    _note_fallback(scores)
    return _attention_posterior_backward_ref(grad_p, scores, u, v, wo, e, head, sigma, head_select, head_scale)


@attention_posterior_backward.register_fake
def _(grad_p, scores, u, v, wo, e, head=None, sigma=1.0, head_select="min_entropy", head_scale=None):
    _validate_attention_posterior_backward(grad_p, scores, u, v, wo, e, head, sigma, head_select, head_scale)
    return tuple(t.new_empty(t.shape, dtype=torch.float32) for t in (scores, u, v, wo, e))


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




# ----------------------------------------------------------------------------------------------------------------
# 4. mad_dispersion
# ----------------------------------------------------------------------------------------------------------------


def _validate_mad_dispersion(
    tokens: Tensor, assign: Tensor, num_experts: int, eps: float, clip: float, normalize: str, measure: str,
    empty: str,
) -> None:
    op = "mad_dispersion"
    _check_operands(op, (_check_float, "tokens", tokens, 2, "[T, D]"), (_check_index, "assign", assign, 1, "[T]"))
    _check_dim(op, "assign", assign, 0, tokens.shape[0], "dimension 0 of 'tokens' (T)")
    if num_experts < 1:
        _fail(op, f"'num_experts' ({num_experts}) must be >= 1")
    _check_result_elements(op, "counts", (num_experts,))
    _check_result_elements(op, "weights", (num_experts, tokens.shape[1]))
    _check_positive_finite(op, "eps", eps)
    if not (math.isfinite(clip) and clip >= 0):
        _fail(op, f"'clip' ({clip}) must be >= 0 and finite (0 disables clipping)")
    _check_enum(op, "normalize", normalize, NORMALIZES)
    _check_enum(op, "measure", measure, MEASURES)
    _check_enum(op, "empty", empty, EMPTIES)


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
    _validate_mad_dispersion(tokens, assign, num_experts, eps, clip, normalize, measure, empty)
    _check_index_range("mad_dispersion", "assign", assign, num_experts)
    _note_fallback(tokens)
    return _mad_dispersion_ref(tokens, assign, num_experts, eps, clip, normalize, measure, empty)


@mad_dispersion.register_fake
def _(tokens, assign, num_experts, eps=1e-4, clip=10.0, normalize="feature", measure="mad", empty="identity"):
    _validate_mad_dispersion(tokens, assign, num_experts, eps, clip, normalize, measure, empty)
    return (
        tokens.new_empty((num_experts, tokens.shape[1]), dtype=torch.float32),
        tokens.new_empty((num_experts,), dtype=torch.int32),
    )


# ----------------------------------------------------------------------------------------------------------------
# 5. adjacency_update
# ----------------------------------------------------------------------------------------------------------------


def _validate_adjacency_update(a: Tensor, idx: Tensor, beta: float, norm: str) -> None:
    op = "adjacency_update"
    _check_operands(op, (_check_float, "a", a, 2, "[E, E]"), (_check_index, "idx", idx, 2, "[T, k]"))
    _check_dim(op, "a", a, 1, a.shape[0], "dimension 0 of 'a' (E; the graph is square)")
    if not (0.0 <= beta <= 1.0):
        _fail(op, f"'beta' ({beta}) must be in [0, 1]")
    _check_enum(op, "norm", norm, ADJ_NORMS)


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
    _validate_adjacency_update(a, idx, beta, norm)
    _check_index_range("adjacency_update", "idx", idx, a.shape[0])
    _note_fallback(a)
    return _adjacency_update_ref(a, idx, beta, norm, include_self)


@adjacency_update.register_fake
def _(a, idx, beta=0.9, norm="row", include_self=True):
    _validate_adjacency_update(a, idx, beta, norm)
    return a.new_empty(a.shape, dtype=torch.float32)


# ----------------------------------------------------------------------------------------------------------------
# 6. hyper_router
# ----------------------------------------------------------------------------------------------------------------


def _validate_hyper_router(emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, num_experts: int,
                           op: str = "hyper_router") -> None:
    _check_operands(op, (_check_float, "emb", emb, 1, "[De]"), (_check_float, "w1", w1, 2, "[Dh, De]"),
                    (_check_float, "b1", b1, 1, "[Dh]"), (_check_float, "w2", w2, 2, "[E*(D+1), Dh]"),
                    (_check_float, "b2", b2, 1, "[E*(D+1)]"))
    if num_experts < 1:
        _fail(op, f"'num_experts' ({num_experts}) must be >= 1")
    _check_dim(op, "w1", w1, 1, emb.shape[0], "dimension 0 of 'emb' (De)")
    _check_dim(op, "b1", b1, 0, w1.shape[0], "dimension 0 of 'w1' (Dh)")
    _check_dim(op, "w2", w2, 1, w1.shape[0], "dimension 0 of 'w1' (Dh)")
    _check_dim(op, "b2", b2, 0, w2.shape[0], "dimension 0 of 'w2' (E*(D+1))")
    rows = w2.shape[0]
    if rows % num_experts != 0 or rows // num_experts < 1:
        _fail(op, f"dimension 0 of 'w2' ({rows}) must be num_experts * (D+1) = {num_experts} * (D+1) with D >= 0")


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
    _validate_hyper_router(emb, w1, b1, w2, b2, num_experts)
    _note_fallback(emb)
    return _hyper_router_ref(emb, w1, b1, w2, b2, num_experts)


@hyper_router.register_fake
def _(emb, w1, b1, w2, b2, num_experts):
    _validate_hyper_router(emb, w1, b1, w2, b2, num_experts)
    d = w2.shape[0] // num_experts - 1
    return (
        emb.new_empty((num_experts, d), dtype=torch.float32),
        emb.new_empty((num_experts,), dtype=torch.float32),
    )


def _validate_hyper_router_backward(grad_w: Tensor, grad_b: Tensor, emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor,
                                    b2: Tensor, num_experts: int) -> None:
    op = "hyper_router_backward"
    _validate_hyper_router(emb, w1, b1, w2, b2, num_experts, op=op)
    _check_operands(op, (_check_float, "grad_w", grad_w, 2, "[E, D], the shape of w"),
                    (_check_float, "grad_b", grad_b, 1, "[E], the shape of b"))
    d = w2.shape[0] // num_experts - 1
    _check_dim(op, "grad_w", grad_w, 0, num_experts, "num_experts (E)")
    _check_dim(op, "grad_w", grad_w, 1, d, "D = dimension 0 of 'w2' / E - 1")
    _check_dim(op, "grad_b", grad_b, 0, num_experts, "num_experts (E)")


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
    _validate_hyper_router_backward(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts)
    _note_fallback(emb)
    return _without_weight_grads(_hyper_router_backward_ref(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts),
                                 weight_grads)


@hyper_router_backward.register_fake
def _(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts, weight_grads=True):
    _validate_hyper_router_backward(grad_w, grad_b, emb, w1, b1, w2, b2, num_experts)
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




# ----------------------------------------------------------------------------------------------------------------
# 7. similarity_inform_topk (fused)
# ----------------------------------------------------------------------------------------------------------------


def _check_k_of_e(op: str, k: int, e: Tensor) -> None:
    """The fused forms' gate: ``1 <= k <= K`` (the experts of ``e``)."""
    K = e.shape[2]
    if not 1 <= k <= K:
        _fail(op, f"'k' ({k}) must be in [1, {K}] (dimension 2 of 'e', K)")


def _validate_similarity_inform_topk(
    u: Tensor, e: Tensor, k: int, ws: Optional[Tensor], key_mask: Optional[Tensor], tau: float
) -> None:
    _validate_similarity_inform(u, e, ws, key_mask, tau, op="similarity_inform_topk")
    _check_k_of_e("similarity_inform_topk", k, e)


@torch.library.custom_op("moe::similarity_inform_topk", mutates_args=())
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
    _validate_similarity_inform_topk(u, e, k, ws, key_mask, tau)
    _note_fallback(u)
    return _similarity_inform_topk_ref(u, e, ws, key_mask, k, renormalize, tau, causal)


@similarity_inform_topk.register_fake
def _(u, e, k, ws=None, key_mask=None, tau=1.0, causal=False, renormalize=True):
    _validate_similarity_inform_topk(u, e, k, ws, key_mask, tau)
    shape = (u.shape[0], u.shape[1], k)
    return e.new_empty(shape, dtype=torch.float32), e.new_empty(shape, dtype=torch.int32)


# ----------------------------------------------------------------------------------------------------------------
# 8. attention_posterior_topk (fused)
# ----------------------------------------------------------------------------------------------------------------


def _validate_attention_posterior_topk(
    scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, k: int, sigma: float, head_select: str,
    head_scale: Optional[float],
) -> None:
    _validate_attention_posterior(scores, u, v, wo, e, sigma, head_select, head_scale, op="attention_posterior_topk")
    _check_k_of_e("attention_posterior_topk", k, e)
    # [B, N, k]: N from the scores, k <= K from e.
    _check_result_elements("attention_posterior_topk", "weights", (scores.shape[0], scores.shape[2], k))


@torch.library.custom_op("moe::attention_posterior_topk", mutates_args=())
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
    _validate_attention_posterior_topk(scores, u, v, wo, e, k, sigma, head_select, head_scale)
    _note_fallback(scores)
    return _attention_posterior_topk_ref(scores, u, v, wo, e, k, renormalize, sigma, head_select, head_scale)


@attention_posterior_topk.register_fake
def _(scores, u, v, wo, e, k, sigma=1.0, head_select="min_entropy", head_scale=None, renormalize=True):
    _validate_attention_posterior_topk(scores, u, v, wo, e, k, sigma, head_select, head_scale)
    B, _, N, _ = scores.shape
    shape = (B, N, k)
    return (
        e.new_empty(shape, dtype=torch.float32),
        e.new_empty(shape, dtype=torch.int32),
        e.new_empty((B,), dtype=torch.int32),
    )


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




# ----------------------------------------------------------------------------------------------------------------
# Production routing: moe.route and moe.dispatch_plan (MoERoutingOps.td)
# ----------------------------------------------------------------------------------------------------------------
#
# The gates of DeepSeek-V3/R1, Kimi-K2, GLM-4.5, DeepSeek-V2, Mixtral, Qwen3-MoE, gpt-oss and Llama-4 (one op, its
# modes as strings) and the expert-sorted dispatch plan of grouped-GEMM kernels. References (which define the
# semantics and are what the backward recomputes): moe_mlir/reference_routing.py. CPU kernels:
# lib/Runtime/Torch/RoutingOps.cpp. ``route``'s weights are differentiable w.r.t. the logits (through the scores;
# the choice and the selection bias get no gradient); ``dispatch_plan`` is integer-valued.

from .reference_routing import dispatch_plan as _dispatch_plan_ref  # noqa: E402
from .reference_routing import dispatch_plan_sizes as _dispatch_plan_sizes  # noqa: E402
from .reference_routing import route as _route_ref  # noqa: E402

__all__ += ["route", "dispatch_plan", "ROUTING_OP_NAMES"]

#: The production routing ops (MoERoutingOps.td); ``torch.ops.moe.<name>`` exists for each.
ROUTING_OP_NAMES: tuple[str, ...] = ("route", "dispatch_plan")
ROUTE_SCORINGS = ("softmax", "sigmoid", "none")
ROUTE_ORDERS = ("score_then_topk", "topk_then_score")
GROUP_SCORES = ("top2_sum", "max")


def _validate_route(logits: Tensor, bias: Optional[Tensor], k: int, scoring: str, order: str, n_group: int,
                    topk_group: int, group_score: str, routed_scaling_factor: float) -> None:
    op = "route"
    _check_float(op, "logits", logits)
    if logits.dim() != 2:
        _fail(op, f"'logits' must have rank 2 ([T, E]), got shape {list(logits.shape)}")
    E = logits.shape[1]
    if bias is not None:
        _check_float(op, "bias", bias)
        if bias.dim() != 1:
            _fail(op, f"'bias' must have rank 1 ([E]), got shape {list(bias.shape)}")
        if bias.shape[0] != E:
            _fail(op, f"dimension 0 of 'bias' (E = {bias.shape[0]}) must equal dimension 1 of 'logits' (E = {E})")
    if not 1 <= k <= E:
        _fail(op, f"'k' ({k}) must be in [1, {E}] (the size of the last dimension of 'logits')")
    _check_enum(op, "scoring", scoring, ROUTE_SCORINGS)
    _check_enum(op, "order", order, ROUTE_ORDERS)
    _check_enum(op, "group_score", group_score, GROUP_SCORES)
    if n_group < 1:
        _fail(op, f"'n_group' ({n_group}) must be >= 1")
    if E % n_group:
        _fail(op, f"'n_group' ({n_group}) must divide the number of experts E = {E}")
    if not 1 <= topk_group <= n_group:
        _fail(op, f"'topk_group' ({topk_group}) must be in [1, n_group = {n_group}]")
    if n_group > 1:
        size = E // n_group
        if k > topk_group * size:
            _fail(op, f"'k' ({k}) must be <= topk_group * E / n_group = {topk_group} * {size} = {topk_group * size} "
                      "(the experts of the kept groups)")
        if group_score == "top2_sum" and size < 2:
            _fail(op, f"'group_score' top2_sum needs groups of at least 2 experts, but E / n_group = {size}")
    if not (math.isfinite(routed_scaling_factor) and routed_scaling_factor > 0):
        _fail(op, f"'routed_scaling_factor' ({routed_scaling_factor}) must be finite and > 0")


@torch.library.custom_op("moe::route", mutates_args=())
def route(logits: Tensor, bias: Optional[Tensor], k: int, scoring: str = "softmax", order: str = "score_then_topk",
          n_group: int = 1, topk_group: int = 1, group_score: str = "top2_sum", renormalize: bool = False,
          routed_scaling_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """A production MoE gate (``moe.route``).

    Args:
        logits: ``[T, E]`` router logits, f32/f16/bf16.
        bias: ``[E]`` selection bias (DeepSeek-V3's ``e_score_correction_bias``) or None: added to choose, never
            to weigh.
        k: experts per token, ``1 <= k <= E`` (and ``<= topk_group * E / n_group`` with groups).
        scoring: ``"softmax"``, ``"sigmoid"`` or ``"none"``.
        order: ``"score_then_topk"`` (choose on scores + bias, weigh with the scores) or ``"topk_then_score"``
            (choose on logits + bias, score only the k chosen logits: gpt-oss, Llama-4).
        n_group, topk_group, group_score: group-limited selection (the ``topk_group`` best of ``n_group``
            contiguous groups, a group scored by the sum of its top two (``"top2_sum"``) or its max).
        renormalize: divide the k weights by their sum (a zero sum gives zeros).
        routed_scaling_factor: multiplies the weights (> 0).

    Returns:
        ``(weights [T, k] f32, indices [T, k] i32)`` sorted by descending choice score; ties -> lowest index; NaN
        first.
    """
    _validate_route(logits, bias, k, scoring, order, n_group, topk_group, group_score, routed_scaling_factor)
    _note_fallback(logits)
    return _route_ref(logits, bias, k, scoring, order, n_group, topk_group, group_score, renormalize,
                      routed_scaling_factor)


@route.register_fake
def _(logits, bias, k, scoring="softmax", order="score_then_topk", n_group=1, topk_group=1, group_score="top2_sum",
      renormalize=False, routed_scaling_factor=1.0):
    _validate_route(logits, bias, k, scoring, order, n_group, topk_group, group_score, routed_scaling_factor)
    shape = (logits.shape[0], k)
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int32)


# Recompute backward: the reference re-run under autograd; gradients flow to the logits through the scores (the
# bias is detached inside the reference: it only chooses).
_register_recompute_autograd(route, _route_ref, (0, 1), (0,))


def _validate_dispatch_plan(indices: Tensor, num_experts: int, block_size: int) -> None:
    op = "dispatch_plan"
    _check_index(op, "indices", indices)
    if indices.dim() != 2:
        _fail(op, f"'indices' must have rank 2 ([T, k]), got shape {list(indices.shape)}")
    if num_experts < 1:
        _fail(op, f"'num_experts' ({num_experts}) must be >= 1")
    if block_size < 1:
        _fail(op, f"'block_size' ({block_size}) must be >= 1")
    padded = _dispatch_plan_sizes(indices.shape[0], indices.shape[1], num_experts, block_size)[4]
    if isinstance(padded, int) and padded > _I32_MAX:
        _fail(op, f"the padded plan (T*k + num_experts*(block_size-1) = {padded}) must fit in i32")
    _check_result_elements(op, "offsets", (num_experts + 1,))


@torch.library.custom_op("moe::dispatch_plan", mutates_args=())
def dispatch_plan(indices: Tensor, num_experts: int, block_size: int = 1
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The expert-sorted dispatch plan of a top-k routing (``moe.dispatch_plan``, vLLM's moe_align_block_size).

    Args:
        indices: ``[T, k]`` expert indices (i32/i64), each in ``[0, num_experts)`` (else ValueError).
        num_experts: E >= 1.
        block_size: B >= 1 (1: no padding).

    Returns:
        i32 ``(counts [E], offsets [E+1], order [T·k], inverse [T·k], padded_order [T·k + E·(B−1)],
        block_experts [⌈(T·k + E·(B−1))/B⌉], num_padded [1])``; ``order`` lists the assignments ``n = t·k + j``
        stably sorted by expert, ``inverse`` is its inverse permutation.
    """
    _validate_dispatch_plan(indices, num_experts, block_size)
    _check_index_range("dispatch_plan", "indices", indices, num_experts)
    _note_fallback(indices)
    return _dispatch_plan_ref(indices, num_experts, block_size)


@dispatch_plan.register_fake
def _(indices, num_experts, block_size=1):
    _validate_dispatch_plan(indices, num_experts, block_size)
    return tuple(indices.new_empty((n,), dtype=torch.int32)
                 for n in _dispatch_plan_sizes(indices.shape[0], indices.shape[1], num_experts, block_size))


_ROUTING_VALIDATORS: dict[str, Callable[[dict, dict], None]] = {
    "route": lambda t, a: _validate_route(
        t["logits"], t.get("bias"), int(a["k"]), a["scoring"], a["order"], int(a["n_group"]), int(a["topk_group"]),
        a["group_score"], float(a["routed_scaling_factor"])),
    "dispatch_plan": lambda t, a: _validate_dispatch_plan(t["indices"], int(a["num_experts"]),
                                                          int(a["block_size"])),
}


# ----------------------------------------------------------------------------------------------------------------
# The compiled kernels (lib/Runtime/Torch + moe_mlir.runtime)
# ----------------------------------------------------------------------------------------------------------------


def _f(v: str) -> float:
    return float(v)


def _b(v: str) -> bool:
    return v == "1"


def _of(v: str) -> Optional[float]:
    return None if v == "none" else float(v)


#: Per op: validate(inputs by name (meta tensors of the call's shapes), attributes as strings). The kernel cache
#: calls these on a cache-key miss, so that a call the key does not pin down yet gets the Python messages.
KEY_VALIDATORS: dict[str, Callable[[dict, dict], None]] = {
    "topk_renorm": lambda t, a: _validate_topk_renorm(t["scores"], int(a["k"]), a["mode"]),
    "similarity_inform": lambda t, a: _validate_similarity_inform(
        t["u"], t["e"], t.get("ws"), t.get("key_mask"), _f(a["tau"])),
    "similarity_inform_topk": lambda t, a: _validate_similarity_inform_topk(
        t["u"], t["e"], int(a["k"]), t.get("ws"), t.get("key_mask"), _f(a["tau"])),
    "attention_posterior": lambda t, a: _validate_attention_posterior(
        t["scores"], t["u"], t["v"], t["wo"], t["e"], _f(a["sigma"]), a["head_select"], _of(a["head_scale"])),
    "attention_posterior_topk": lambda t, a: _validate_attention_posterior_topk(
        t["scores"], t["u"], t["v"], t["wo"], t["e"], int(a["k"]), _f(a["sigma"]), a["head_select"],
        _of(a["head_scale"])),
    "mad_dispersion": lambda t, a: _validate_mad_dispersion(
        t["tokens"], t["assign"], int(a["num_experts"]), _f(a["eps"]), _f(a["clip"]), a["normalize"], a["measure"],
        a["empty"]),
    "adjacency_update": lambda t, a: _validate_adjacency_update(t["a"], t["idx"], _f(a["beta"]), a["norm"]),
    "topk_renorm_backward": lambda t, a: _validate_topk_renorm_backward(
        t["grad_w"], t["scores"], t["indices"], a["mode"]),
    # The training form of similarity_inform (its autograd's forward): errors name the op the user called.
    "similarity_inform_fwd": lambda t, a: _validate_similarity_inform(
        t["u"], t["e"], t.get("ws"), t.get("key_mask"), _f(a["tau"])),
    "similarity_inform_backward": lambda t, a: _validate_similarity_inform_backward(
        t["grad_p"], t["u"], t["e"], t.get("ws"), t.get("key_mask"), _f(a["tau"]), t.get("p"), t.get("lse")),
    "hyper_router": lambda t, a: _validate_hyper_router(
        t["emb"], t["w1"], t["b1"], t["w2"], t["b2"], int(a["num_experts"])),
    "hyper_router_backward": lambda t, a: _validate_hyper_router_backward(
        t["grad_w"], t["grad_b"], t["emb"], t["w1"], t["b1"], t["w2"], t["b2"], int(a["num_experts"])),
    "attention_posterior_backward": lambda t, a: _validate_attention_posterior_backward(
        t["grad_p"], t["scores"], t["u"], t["v"], t["wo"], t["e"], t.get("head"), _f(a["sigma"]), a["head_select"],
        _of(a["head_scale"])),
}


def kernels_available() -> bool:
    """True when ``torch.ops.moe.*`` run the compiled kernels on CPU tensors (else the eager references)."""
    return _KERNELS_UNAVAILABLE is None and _EXTENSION_LOADED


#: The Python autograd of the differentiable dialect ops, (op, backward, setup_context). The extension registers their
#: autograd in C++ (lib/Runtime/Torch/Autograd.cpp: no Python per call, the same semantics); these are registered
#: only when it does not load, so that an op has one autograd either way.
_PYTHON_AUTOGRAD = (
    (topk_renorm, _topk_renorm_backward, _topk_renorm_setup),
    (similarity_inform, _similarity_inform_backward, _similarity_inform_setup),
    (similarity_inform_topk, _similarity_inform_topk_backward, _similarity_inform_topk_setup),
    (attention_posterior, _attention_posterior_backward, _attention_posterior_setup),
    (attention_posterior_topk, _attention_posterior_topk_backward, _attention_posterior_topk_setup),
    (hyper_router, _hyper_router_backward, _hyper_router_setup),
)


def _stop_gradient_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(*(output if isinstance(output, tuple) else (output,)))


def _stop_gradient_backward(ctx, *grads):
    raise AssertionError("unreachable: the outputs of a stop-gradient op are non-differentiable")


#: The stop-gradient ops (003 §5.10, 004 §1.2): without the extension (whose AutogradCPU kernel runs them below
#: autograd) their outputs are marked non-differentiable here, so they never require grad either way.
_STOP_GRADIENT = (mad_dispersion, adjacency_update)
_GRAD_OPS = {route._name: route}
_AUTOGRAD_IMPLS: dict[str, Callable] = {}
KEY_VALIDATORS.update(_ROUTING_VALIDATORS)


def _autograd_call(name: str, keyset, args: tuple):
    """The extension's path for a CPU call of ``route`` with an input that requires grad: the custom op's own autograd
    (the recompute backward registered above), whose forward redispatches to the CPU kernel."""
    impl = _AUTOGRAD_IMPLS.get(name)
    if impl is None:
        from torch._library.autograd import make_autograd_impl

        op = _GRAD_OPS[name]
        impl = _AUTOGRAD_IMPLS[name] = make_autograd_impl(op._opoverload, op)
    return impl(keyset, *args)


def _load_kernels() -> None:
    global _KERNELS_UNAVAILABLE, _EXTENSION_LOADED
    from .runtime import extension

    reason = extension.load(KEY_VALIDATORS, _autograd_call)
    _EXTENSION_LOADED = reason is None
    _KERNELS_UNAVAILABLE = reason
    if not _EXTENSION_LOADED:
        for op, backward, setup in _PYTHON_AUTOGRAD:
            op.register_autograd(backward, setup_context=setup)
        for op in _STOP_GRADIENT:
            op.register_autograd(_stop_gradient_backward, setup_context=_stop_gradient_setup)


_EXTENSION_LOADED = False
_load_kernels()

