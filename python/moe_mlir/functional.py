"""The Pythonic face of ``torch.ops.moe.*``: ``moe_mlir.route``, ``moe_mlir.topk_renorm``, ``moe_mlir.dispatch_plan``...

Each function calls the torch op of the same name (so ``torch.compile`` and raising see the same graph node, and the
same kernels run) and follows PyTorch's conventions where the torch op's schema cannot:

* tensors are positional, every option is keyword-only (``moe_mlir.route(logits, bias, k=8, scoring="sigmoid")``);
* string options are typed ``Literal[...]`` (the definitions of :mod:`moe_mlir.ops`, which its op verifier's
  enums agree with), and a value outside them is a ``ValueError`` that lists the valid ones;
* a custom score is a Python callable (``scoring=lambda x: torch.sqrt(F.softplus(x))``), never IR text: it is
  traced once into the ``score`` region of ``moe.route`` (:func:`moe_mlir.ops.score_region`), which the kernels
  inline and differentiate;
* results are NamedTuples (:class:`RouteResult`, :class:`DispatchPlan`, ...);
* index results are int64, as ``torch.topk`` returns them (``route`` and ``topk_renorm`` write them so; the other
  ops' kernels write int32, cast once); ``indices_dtype=torch.int32`` returns int32;
* the same name for the same thing: ``k`` (experts per token), ``indices`` (experts chosen), ``num_experts``;
* one error policy, torch's: ``TypeError`` for a dtype or an argument of the wrong type, ``ValueError`` for a shape
  or a value, ``RuntimeError`` for a device (operands on different devices). On a device without kernels (MPS,
  XPU...) the ops run the eager references (:mod:`moe_mlir.reference`) after a one-time ``RuntimeWarning``.

The torch ops' schemas, results and int32 indices are unchanged (compiled graphs hold them).
"""

from __future__ import annotations

import types
from typing import Any, Callable, Literal, NamedTuple, Optional, Union, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from . import ops as _ops
from .ops import _verified_op
from .ops._checks import _check_choice, _check_same_device, _fail
from .ops.capacity import CAPACITY_DROPS, CapacityDrop, capacity_of
from .ops.mixing import HEAD_SELECTS, HeadSelect
from .ops.routing import GROUP_SCORES, ROUTE_ORDERS, ROUTE_SCORINGS, GroupScore, RouteOrder, RouteScoring
from .ops.score_region import scoring_of
from .ops.seed_routers import (ADJ_NORMS, EMPTIES, MEASURES, NORMALIZES, AdjacencyNorm, DispersionMeasure,
                               DispersionNormalize, EmptyCluster)
from .ops.topk import TOPK_MODES, TopkMode
from .reference.routing import CUSTOM_PREFIX

__all__ = [
    "route", "topk_renorm", "dispatch_plan", "apply_capacity", "capacity_of", "bias_update", "load_balancing_loss",
    "router_z_loss", "router_stats", "sequence_balance_loss", "similarity_inform", "similarity_inform_topk",
    "attention_posterior", "attention_posterior_topk", "mad_dispersion", "adjacency_update", "hyper_router",
    "RouteResult", "DispatchPlan", "CapacityResult", "RouterStats", "AttentionPosterior", "AttentionPosteriorTopK",
    "Dispersion", "RouterWeights",
]


# ----------------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------------


class RouteResult(NamedTuple):
    """A top-k routing: ``weights`` ``[..., k]`` f32, the gate weight of each pick; ``indices`` ``[..., k]`` (int64,
    or ``indices_dtype``), the experts picked, by descending choice score (ties to the lowest index, NaN first)."""

    weights: Tensor
    indices: Tensor


class DispatchPlan(NamedTuple):
    """The expert-sorted plan of a ``[T, k]`` routing (vLLM's ``moe_align_block_size``), every field an integer tensor
    (int64, or ``indices_dtype``). An *assignment* is ``n = t·k + j`` (token ``t``'s ``j``-th pick).

    * ``counts`` ``[E]``: the assignments of each expert;
    * ``offsets`` ``[E+1]``: the exclusive prefix sum of ``counts`` (expert ``e``'s rows are
      ``order[offsets[e]:offsets[e+1]]``);
    * ``order`` ``[T·k]``: the assignments stably sorted by expert;
    * ``inverse`` ``[T·k]``: the inverse permutation (``order[inverse[n]] = n``);
    * ``padded_order`` ``[T·k + E·(B−1)]``: ``order`` with each expert's rows padded to a multiple of the block size
      ``B`` (padding entries are ``T·k``);
    * ``block_experts`` ``[⌈(T·k + E·(B−1))/B⌉]``: the expert of each block of ``padded_order``;
    * ``num_padded`` ``[1]``: the used length of ``padded_order``.
    """

    counts: Tensor
    offsets: Tensor
    order: Tensor
    inverse: Tensor
    padded_order: Tensor
    block_experts: Tensor
    num_padded: Tensor


class CapacityResult(NamedTuple):
    """``weights`` ``[T, k]``: the gate weights with the dropped assignments set to 0 (the input's dtype);
    ``dropped`` ``[E]`` int64: the assignments each expert dropped."""

    weights: Tensor
    dropped: Tensor


class RouterStats(NamedTuple):
    """``counts`` ``[E]`` f32: the (token-weighted) picks of each expert; ``mean_probs`` ``[E]`` f32: the mean router
    probability of each expert (differentiable)."""

    counts: Tensor
    mean_probs: Tensor


class AttentionPosterior(NamedTuple):
    """``probs`` ``[B, N, K]`` f32: the mixed router probabilities; ``head`` ``[B]`` (int64, or ``indices_dtype``):
    the head chosen per sequence (``-1`` for ``head_select="all"``)."""

    probs: Tensor
    head: Tensor


class AttentionPosteriorTopK(NamedTuple):
    """:class:`RouteResult`'s ``weights`` and ``indices`` (``[B, N, k]``) of the mixed probabilities, and
    :class:`AttentionPosterior`'s ``head``."""

    weights: Tensor
    indices: Tensor
    head: Tensor


class Dispersion(NamedTuple):
    """``weights`` ``[E, D]`` f32: ACMoE's per-expert feature weights; ``counts`` ``[E]`` int64: the tokens of each
    expert."""

    weights: Tensor
    counts: Tensor


class RouterWeights(NamedTuple):
    """``weight`` ``[E, D]`` f32 and ``bias`` ``[E]`` f32: the router HyperRouter generates."""

    weight: Tensor
    bias: Tensor


# ----------------------------------------------------------------------------------------------------------------
# Checks (the error policy of moe_mlir.ops._checks)
# ----------------------------------------------------------------------------------------------------------------

_INDEX_DTYPES = (torch.int64, torch.int32)


def _tensor(op: str, name: str, t: Any, optional: bool = False) -> None:
    if not (isinstance(t, Tensor) or (optional and t is None)):
        raise TypeError(f"moe.{op}: '{name}' must be a Tensor{' or None' if optional else ''}, got "
                        f"{type(t).__name__}")


def _int(op: str, name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)):
        raise TypeError(f"moe.{op}: '{name}' must be an int, got {type(v).__name__}")


def _float(op: str, name: str, v: Any, optional: bool = False) -> None:
    if optional and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float, torch.SymInt, torch.SymFloat)):
        raise TypeError(f"moe.{op}: '{name}' must be a float{' or None' if optional else ''}, got "
                        f"{type(v).__name__}")


def _bool(op: str, name: str, v: Any) -> None:
    if not isinstance(v, (bool, torch.SymBool)):
        raise TypeError(f"moe.{op}: '{name}' must be a bool, got {type(v).__name__}")


def _operands(op: str, **tensors: Optional[Tensor]) -> None:
    """Each named operand a Tensor (the first ones required, an optional one None or a Tensor: ``name_`` with a
    trailing underscore marks it optional), all on one device."""
    named = {}
    for key, t in tensors.items():
        optional = key.endswith("_")
        name = key.rstrip("_")
        _tensor(op, name, t, optional)
        named[name] = t
    _check_same_device(op, named)


def _index_dtype(op: str, dtype: Any) -> torch.dtype:
    if dtype not in _INDEX_DTYPES:
        _fail(op, f"'indices_dtype' must be torch.int64 or torch.int32, got {dtype!r}")
    return dtype


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t if t.dtype == dtype else t.to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# Scores
# ----------------------------------------------------------------------------------------------------------------


def _sqrtsoftplus(x: Tensor) -> Tensor:
    return torch.sqrt(F.softplus(x))


#: The scores this layer names beyond moe.route's presets, each an elementwise function (compiled as a custom
#: score region): DeepSeek-V4's ``sqrtsoftplus`` (``ACT2FN[config.scoring_func]``).
NAMED_SCORES: dict[str, Callable[[Tensor], Tensor]] = {"sqrtsoftplus": _sqrtsoftplus}

#: ``scoring=`` of :func:`route` by name: moe.route's presets and :data:`NAMED_SCORES`.
Scoring = Literal[RouteScoring, "sqrtsoftplus"]
SCORINGS: tuple[str, ...] = get_args(Scoring)
assert SCORINGS == ROUTE_SCORINGS + tuple(NAMED_SCORES), "Scoring lists moe.route's presets, then NAMED_SCORES"


def _scoring(scoring: Union[Scoring, Callable[[Tensor], Tensor]]) -> str:
    """The torch op's ``scoring`` string of :func:`route`'s argument."""
    if callable(scoring):
        return scoring_of(scoring)
    if isinstance(scoring, str) and scoring.startswith(CUSTOM_PREFIX):
        _fail("route", "'scoring' takes a Python callable for a custom score, not IR text (\"custom:<region>\" is "
                       "torch.ops.moe.route's spelling)")
    _check_choice("route", "scoring", scoring, SCORINGS, " or a callable")
    return scoring_of(NAMED_SCORES[scoring]) if scoring in NAMED_SCORES else scoring


# ----------------------------------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------------------------------


def route(logits: Tensor, bias: Optional[Tensor] = None, *, k: int,
          scoring: Union[Scoring, Callable[[Tensor], Tensor]] = "softmax", order: RouteOrder = "score_then_topk",
          n_group: int = 1, topk_group: int = 1, group_score: GroupScore = "top2_sum", renormalize: bool = False,
          routed_scaling_factor: float = 1.0, replay: Optional[Tensor] = None,
          indices_dtype: torch.dtype = torch.int64) -> RouteResult:
    """A production MoE gate (``torch.ops.moe.route``): DeepSeek-V2/V3/V4, Kimi-K2, GLM-4.5, Mixtral, Qwen3-MoE,
    gpt-oss, Llama-4 in one op.

    Args:
        logits: ``[T, E]`` router logits, f32/f16/bf16 (computed in f32).
        bias: ``[E]`` selection bias (DeepSeek-V3's ``e_score_correction_bias``) or None: added to choose, never to
            weigh; no gradient.
        k: experts per token, ``1 <= k <= E`` (and ``k <= topk_group * E / n_group`` with groups).
        scoring: how logits become scores: ``"softmax"`` (over the E experts), ``"sigmoid"``, ``"none"`` (the
            logits), ``"sqrtsoftplus"`` (DeepSeek-V4), or a callable ``f(x) -> Tensor`` applied elementwise, such
            as ``lambda x: torch.sqrt(F.softplus(x))``. The callable is traced once on a 0-d f32 tensor into the
            op's score region (elementwise torch ops: arithmetic, ``exp``, ``log``, ``log1p``, ``sqrt``, ``tanh``,
            ``sigmoid``, ``softplus``, ``silu``, ``relu``, ``clamp``, ``where``, comparisons...) and checked on a
            vector of logits; anything else is a ValueError. The kernels inline it and differentiate it.
        order: ``"score_then_topk"`` (choose on scores + bias, weigh with the scores) or ``"topk_then_score"``
            (choose on logits + bias, score only the k chosen logits: gpt-oss, Llama-4).
        n_group, topk_group: group-limited choice: only the experts of the ``topk_group`` best of ``n_group``
            contiguous groups compete (DeepSeek-V3: 8 and 4).
        group_score: a group's rank: the sum of its top two scores (``"top2_sum"``) or its max (``"max"``).
        renormalize: divide the k weights by their sum (a zero sum gives zeros).
        routed_scaling_factor: multiplies the weights (> 0).
        replay: ``[T, k]`` expert indices (integer, each in ``[0, E)``) or None: the choice is given instead of made
            (routing replay for RL, hash routing): the weights of these experts as the router weighs them, and the
            indices themselves in their order (bias and groups play no part).
        indices_dtype: ``torch.int64`` (default, as ``torch.topk``) or ``torch.int32``; the kernel writes either.

    Returns:
        :class:`RouteResult` ``(weights [T, k] f32, indices [T, k])``, by descending choice score; ties go to the
        lowest index, NaN ranks first. ``weights`` is differentiable w.r.t. ``logits``.

    Raises:
        TypeError: a dtype the op does not take, an argument of the wrong type. ValueError: a shape, ``k`` out of
        range, an option outside its values, a replayed index outside ``[0, E)``. RuntimeError: operands on
        different devices.

    Example::

        w, idx = moe_mlir.route(logits, bias, k=8, scoring="sigmoid", n_group=8, topk_group=4,
                                renormalize=True, routed_scaling_factor=2.5)       # DeepSeek-V3
    """
    _operands("route", logits=logits, bias_=bias, replay_=replay)
    _int("route", "k", k)
    _int("route", "n_group", n_group)
    _int("route", "topk_group", topk_group)
    _check_choice("route", "order", order, ROUTE_ORDERS)
    _check_choice("route", "group_score", group_score, GROUP_SCORES)
    _bool("route", "renormalize", renormalize)
    _float("route", "routed_scaling_factor", routed_scaling_factor)
    dtype = _index_dtype("route", indices_dtype)
    # The kernel writes the indices in `dtype`: no cast after it.
    w, idx = torch.ops.moe.route(logits, bias, k, _scoring(scoring), order, n_group, topk_group, group_score,
                                 renormalize, float(routed_scaling_factor), replay, indices_dtype=dtype)
    return RouteResult(w, idx)


def topk_renorm(scores: Tensor, *, k: int, mode: TopkMode = "logits", renormalize: bool = True,
                indices_dtype: torch.dtype = torch.int64) -> RouteResult:
    """Top-k expert selection with gate weights (``torch.ops.moe.topk_renorm``).

    Args:
        scores: ``[..., E]`` router logits (``mode="logits"``) or probabilities (``mode="probs"``), f32/f16/bf16.
        k: experts per row, ``1 <= k <= E``.
        mode: ``"logits"``: the weights are the softmax over the k picked logits (``renormalize=True``, Mixtral) or
            the softmax over all E read at the picks (``False``). ``"probs"``: the picked values divided by their
            sum (``True``; a zero sum gives zeros) or as they are (``False``).
        renormalize: see ``mode``.
        indices_dtype: ``torch.int64`` (default, as ``torch.topk``) or ``torch.int32``; the kernel writes either.

    Returns:
        :class:`RouteResult` ``(weights [..., k] f32, indices [..., k])`` by descending score; ties go to the lowest
        index, NaN ranks first; a row of ``-inf`` gives zero weights and indices ``0..k-1``. ``weights`` is
        differentiable w.r.t. ``scores``.
    """
    _operands("topk_renorm", scores=scores)
    _int("topk_renorm", "k", k)
    _check_choice("topk_renorm", "mode", mode, TOPK_MODES)
    _bool("topk_renorm", "renormalize", renormalize)
    dtype = _index_dtype("topk_renorm", indices_dtype)
    w, idx = torch.ops.moe.topk_renorm(scores, k, mode, renormalize, indices_dtype=dtype)
    return RouteResult(w, idx)


def dispatch_plan(indices: Tensor, *, num_experts: int, block_size: int = 1,
                  indices_dtype: torch.dtype = torch.int64) -> DispatchPlan:
    """The expert-sorted dispatch plan of a top-k routing (``torch.ops.moe.dispatch_plan``): what a grouped GEMM
    over the experts reads.

    Args:
        indices: ``[T, k]`` the experts of each token (int32/int64, each in ``[0, num_experts)``).
        num_experts: E >= 1.
        block_size: B >= 1, the row block of a blocked GEMM kernel (1: no padding).
        indices_dtype: the dtype of every field, ``torch.int64`` (default) or ``torch.int32`` (no cast).

    Returns:
        :class:`DispatchPlan` ``(counts, offsets, order, inverse, padded_order, block_experts, num_padded)``.
    """
    _operands("dispatch_plan", indices=indices)
    _int("dispatch_plan", "num_experts", num_experts)
    _int("dispatch_plan", "block_size", block_size)
    dtype = _index_dtype("dispatch_plan", indices_dtype)
    return DispatchPlan(*(_as(t, dtype) for t in torch.ops.moe.dispatch_plan(indices, num_experts, block_size)))


def apply_capacity(indices: Tensor, weights: Tensor, *, num_experts: int, capacity: int,
                   drop: CapacityDrop = "position") -> CapacityResult:
    """Expert capacity with token dropping (``torch.ops.moe.apply_capacity``: GShard, Switch Transformer, V-MoE).

    Args:
        indices: ``[T, k]`` the experts of each token (integer, each in ``[0, num_experts)``).
        weights: ``[T, k]`` gate weights (f32/f16/bf16).
        num_experts: E >= 1.
        capacity: C >= 0, the most assignments an expert keeps (:func:`capacity_of` for a capacity factor).
        drop: which assignments an expert keeps first: ``"position"`` (every token's first pick in token order,
            then the second picks...: GShard, Switch) or ``"probability"`` (largest weight first: V-MoE's
            batch-prioritized routing).

    Returns:
        :class:`CapacityResult` ``(weights [T, k], dropped [E] int64)``; ``weights`` is differentiable (the dropped
        assignments pass no gradient).
    """
    _operands("apply_capacity", indices=indices, weights=weights)
    _int("apply_capacity", "num_experts", num_experts)
    _int("apply_capacity", "capacity", capacity)
    _check_choice("apply_capacity", "drop", drop, CAPACITY_DROPS)
    return CapacityResult(*torch.ops.moe.apply_capacity(indices, weights, num_experts, capacity, drop))


def bias_update(bias: Tensor, counts: Tensor, *, rate: float) -> Tensor:
    """DeepSeek-V3's auxiliary-loss-free balancing step, out of place: f32 ``[E]``
    ``bias + rate · sign(mean(counts) − counts)`` (``torch.ops.moe.bias_update``; no gradient).

    Args:
        bias: ``[E]`` the selection bias of :func:`route`. counts: ``[E]`` the expert loads of the step (the
            ``counts`` of :func:`dispatch_plan` or of :func:`router_stats`). rate: the update speed u >= 0
            (DeepSeek-V3: 0.001).
    """
    _operands("bias_update", bias=bias, counts=counts)
    _float("bias_update", "rate", rate)
    return torch.ops.moe.bias_update(bias, counts, float(rate))


# ----------------------------------------------------------------------------------------------------------------
# Load balancing
# ----------------------------------------------------------------------------------------------------------------


def load_balancing_loss(logits: Tensor, token_mask: Optional[Tensor] = None, *, k: int) -> Tensor:
    """Switch/GShard's auxiliary loss as transformers' ``load_balancing_loss_func`` computes it
    (``torch.ops.moe.load_balancing_loss``).

    Args:
        logits: ``[T, E]`` router logits (every layer's, concatenated), f32/f16/bf16/f64 (computed in f32).
        token_mask: ``[T]`` token weights (any real dtype: transformers' attention mask over the tokens) or None.
        k: experts per token, ``1 <= k <= E``.

    Returns:
        f32 scalar ``E · Σ_e f_e · P_e`` (``f_e``: the share of picks of expert e, ``P_e``: its mean probability);
        NaN when no token counts. Differentiable w.r.t. ``logits``.
    """
    _operands("load_balancing_loss", logits=logits, token_mask_=token_mask)
    _int("load_balancing_loss", "k", k)
    return torch.ops.moe.load_balancing_loss(logits, k, token_mask)


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's router z-loss: f32 scalar ``mean_t logsumexp(logits_t)²`` of ``logits`` ``[T, E]``
    (``torch.ops.moe.router_z_loss``; NaN for T = 0). Differentiable w.r.t. ``logits``."""
    _operands("router_z_loss", logits=logits)
    return torch.ops.moe.router_z_loss(logits)


def router_stats(logits: Tensor, token_mask: Optional[Tensor] = None, *, k: int) -> RouterStats:
    """Per-expert statistics of a batch (``torch.ops.moe.router_stats``).

    Args:
        logits: ``[T, E]`` router logits. token_mask: ``[T]`` token weights or None. k: experts per token.

    Returns:
        :class:`RouterStats` ``(counts [E], mean_probs [E])``, f32: ``counts_e = Σ_t w_t [e ∈ top_k(logits_t)]``
        (the choice of :func:`topk_renorm`), ``mean_probs_e = Σ_t w_t softmax(logits_t)_e / Σ w``
        (differentiable).
    """
    _operands("router_stats", logits=logits, token_mask_=token_mask)
    _int("router_stats", "k", k)
    return RouterStats(*torch.ops.moe.router_stats(logits, k, token_mask))


def sequence_balance_loss(scores: Tensor, indices: Tensor) -> Tensor:
    """DeepSeek-V3's sequence-wise balance loss (α = 1), averaged over the batch
    (``torch.ops.moe.sequence_balance_loss``).

    Args:
        scores: ``[B, S, E]`` router affinities (sigmoid of the logits, no bias).
        indices: ``[B, S, k]`` the experts picked (integer, each in ``[0, E)``); ``k`` is its last size.

    Returns:
        f32 scalar ``mean_b Σ_e f_be P_be``; differentiable w.r.t. ``scores``.
    """
    _operands("sequence_balance_loss", scores=scores, indices=indices)
    return torch.ops.moe.sequence_balance_loss(scores, indices, indices.shape[-1] if indices.dim() else 0)


# ----------------------------------------------------------------------------------------------------------------
# The seed routers' ops (Mutual-Inform, ACMoE, Symphony, HyperRouter)
# ----------------------------------------------------------------------------------------------------------------


def similarity_inform(u: Tensor, e: Tensor, ws: Optional[Tensor] = None, key_mask: Optional[Tensor] = None, *,
                      tau: float = 1.0, causal: bool = False) -> Tensor:
    """Similarity-Inform mixing (``torch.ops.moe.similarity_inform``, Mutual-Inform eq 5, 8):
    ``p[b,i] = Σ_j softmax_j(u_i^T W_s u_j / tau) e[b,j]`` over the tokens of sequence ``b``.

    Args:
        u: ``[B, N, D]`` the MoE inputs. e: ``[B, N, K]`` router probabilities. ws: ``[D, D]`` or None (identity).
        key_mask: ``[B, N]`` bool or None: False keys are left out. tau: > 0. causal: only ``j <= i``.

    Returns:
        ``p`` ``[B, N, K]`` f32 (a row without keys gives zeros); differentiable w.r.t. ``u``, ``e``, ``ws``.
    """
    _operands("similarity_inform", u=u, e=e, ws_=ws, key_mask_=key_mask)
    _float("similarity_inform", "tau", tau)
    _bool("similarity_inform", "causal", causal)
    return torch.ops.moe.similarity_inform(u, e, ws, key_mask, float(tau), causal)


def similarity_inform_topk(u: Tensor, e: Tensor, ws: Optional[Tensor] = None, key_mask: Optional[Tensor] = None, *,
                           k: int, tau: float = 1.0, causal: bool = False, renormalize: bool = True,
                           indices_dtype: torch.dtype = torch.int64) -> RouteResult:
    """:func:`similarity_inform` then :func:`topk_renorm` with ``mode="probs"`` in one op
    (``torch.ops.moe.similarity_inform_topk``, Mutual-Inform eq 11): the arguments of both.

    Returns:
        :class:`RouteResult` ``(weights [B, N, k] f32, indices [B, N, k])``.
    """
    _operands("similarity_inform_topk", u=u, e=e, ws_=ws, key_mask_=key_mask)
    _int("similarity_inform_topk", "k", k)
    _float("similarity_inform_topk", "tau", tau)
    _bool("similarity_inform_topk", "causal", causal)
    _bool("similarity_inform_topk", "renormalize", renormalize)
    dtype = _index_dtype("similarity_inform_topk", indices_dtype)
    w, idx = torch.ops.moe.similarity_inform_topk(u, e, k, ws, key_mask, float(tau), causal, renormalize)
    return RouteResult(w, _as(idx, dtype))


def _posterior_options(op: str, sigma: Any, head_select: Any, head_scale: Any, indices_dtype: Any) -> torch.dtype:
    _float(op, "sigma", sigma)
    _check_choice(op, "head_select", head_select, HEAD_SELECTS)
    _float(op, "head_scale", head_scale, optional=True)
    return _index_dtype(op, indices_dtype)


def attention_posterior(scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, *, sigma: float = 1.0,
                        head_select: HeadSelect = "min_entropy", head_scale: Optional[float] = None,
                        indices_dtype: torch.dtype = torch.int64) -> AttentionPosterior:
    """Attention-Inform mixing through the attention posterior (``torch.ops.moe.attention_posterior``,
    Mutual-Inform Lemma 1, eq 13-17).

    Args:
        scores: ``[B, H, N, Nk]`` pre-softmax attention logits (``-inf``: masked). u: ``[B, N, D]``.
        v: ``[B, H, Nk, Dh]`` per-head values. wo: ``[D, H·Dh]`` the out-projection (``nn.Linear`` layout).
        e: ``[B, Nk, K]`` router probabilities of the keys. sigma: > 0.
        head_select: ``"min_entropy"`` (eq 15: the head of lowest mean prior entropy) or ``"all"`` (eq 13).
        head_scale: the factor of the head means (None: H).
        indices_dtype: the dtype of ``head``, ``torch.int64`` (default) or ``torch.int32``.

    Returns:
        :class:`AttentionPosterior` ``(probs [B, N, K] f32, head [B])``; ``probs`` is differentiable.
    """
    _operands("attention_posterior", scores=scores, u=u, v=v, wo=wo, e=e)
    dtype = _posterior_options("attention_posterior", sigma, head_select, head_scale, indices_dtype)
    p, head = torch.ops.moe.attention_posterior(scores, u, v, wo, e, float(sigma), head_select,
                                                None if head_scale is None else float(head_scale))
    return AttentionPosterior(p, _as(head, dtype))


def attention_posterior_topk(scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, *, k: int,
                             sigma: float = 1.0, head_select: HeadSelect = "min_entropy",
                             head_scale: Optional[float] = None, renormalize: bool = True,
                             indices_dtype: torch.dtype = torch.int64) -> AttentionPosteriorTopK:
    """:func:`attention_posterior` then :func:`topk_renorm` with ``mode="probs"`` in one op
    (``torch.ops.moe.attention_posterior_topk``, eq 17): the arguments of both.

    Returns:
        :class:`AttentionPosteriorTopK` ``(weights [B, N, k] f32, indices [B, N, k], head [B])``.
    """
    _operands("attention_posterior_topk", scores=scores, u=u, v=v, wo=wo, e=e)
    _int("attention_posterior_topk", "k", k)
    dtype = _posterior_options("attention_posterior_topk", sigma, head_select, head_scale, indices_dtype)
    _bool("attention_posterior_topk", "renormalize", renormalize)
    w, idx, head = torch.ops.moe.attention_posterior_topk(scores, u, v, wo, e, k, float(sigma), head_select,
                                                          None if head_scale is None else float(head_scale),
                                                          renormalize)
    return AttentionPosteriorTopK(w, _as(idx, dtype), _as(head, dtype))


def mad_dispersion(tokens: Tensor, indices: Tensor, *, num_experts: int, eps: float = 1e-4, clip: float = 10.0,
                   normalize: DispersionNormalize = "feature", measure: DispersionMeasure = "mad",
                   empty: EmptyCluster = "identity") -> Dispersion:
    """ACMoE's adaptive-clustering feature weights (``torch.ops.moe.mad_dispersion``, Tight Clusters Def. 1).

    Args:
        tokens: ``[T, D]``. indices: ``[T]`` each token's expert (the previous layer's top-1; integer, in
            ``[0, num_experts)``). num_experts: E >= 1. eps: > 0. clip: >= 0 (0: no clipping).
        normalize: ``"feature"``, ``"expert"`` or ``"global"``. measure: ``"mad"`` or ``"variance"``.
        empty: an expert without tokens gets ``"identity"`` weights (ones) or ``"raw"`` ones.

    Returns:
        :class:`Dispersion` ``(weights [E, D] f32, counts [E] int64)``; no gradient (stop-gradient, as the paper).
    """
    op = "mad_dispersion"
    _operands(op, tokens=tokens, indices=indices)
    _int(op, "num_experts", num_experts)
    _float(op, "eps", eps)
    _float(op, "clip", clip)
    _check_choice(op, "normalize", normalize, NORMALIZES)
    _check_choice(op, "measure", measure, MEASURES)
    _check_choice(op, "empty", empty, EMPTIES)
    weights, counts = torch.ops.moe.mad_dispersion(tokens, indices, num_experts, float(eps), float(clip), normalize,
                                                   measure, empty)
    return Dispersion(weights, counts.to(torch.int64))


def adjacency_update(a: Tensor, indices: Tensor, *, beta: float = 0.9, norm: AdjacencyNorm = "row",
                     include_self: bool = True) -> Tensor:
    """One moving-average update of Symphony's expert graph (``torch.ops.moe.adjacency_update``, Alg. 1):
    ``beta·a + (1-beta)·Norm(C)``, ``C = SᵀS`` of the indicators ``S[t, j] = 1[j ∈ indices[t]]``.

    Args:
        a: ``[E, E]`` the graph. indices: ``[T, k]`` each token's top-k experts (integer, in ``[0, E)``).
        beta: in ``[0, 1]``. norm: ``"row"``, ``"col"`` or ``"none"``. include_self: keep C's diagonal.

    Returns:
        ``[E, E]`` f32; no gradient (stop-gradient, as the paper).
    """
    _operands("adjacency_update", a=a, indices=indices)
    _float("adjacency_update", "beta", beta)
    _check_choice("adjacency_update", "norm", norm, ADJ_NORMS)
    _bool("adjacency_update", "include_self", include_self)
    return torch.ops.moe.adjacency_update(a, indices, float(beta), norm, include_self)


def hyper_router(emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, *, num_experts: int) -> RouterWeights:
    """HyperRouter's router generation (``torch.ops.moe.hyper_router``, eq 2): ``w2 · relu(w1 · emb + b1) + b2``
    read row-major as ``[E, D+1]``.

    Args:
        emb: ``[De]``. w1: ``[Dh, De]``. b1: ``[Dh]``. w2: ``[E·(D+1), Dh]``. b2: ``[E·(D+1)]``. num_experts: E.

    Returns:
        :class:`RouterWeights` ``(weight [E, D] f32, bias [E] f32)``, differentiable w.r.t. every operand.
    """
    _operands("hyper_router", emb=emb, w1=w1, b1=b1, w2=w2, b2=b2)
    _int("hyper_router", "num_experts", num_experts)
    return RouterWeights(*torch.ops.moe.hyper_router(emb, w1, b1, w2, b2, num_experts))


# help(torch.ops.moe.<op>) names the Pythonic form of the op.
for _name in __all__:
    if isinstance(globals()[_name], types.FunctionType) and _name != "capacity_of":
        _doc = getattr(torch.ops.moe, _name).__doc__ or ""
        if f"moe_mlir.{_name}(" not in _doc:
            _verified_op.document(_name, f"{_doc}\n\nThe Pythonic form (keyword options, named results, int64 "
                                         f"indices): moe_mlir.{_name}(...).", getattr(_ops, _name))
del _name, _doc
