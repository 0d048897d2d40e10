"""Production routing: ``moe.route`` and ``moe.dispatch_plan`` (MoERoutingOps.td).

The gates of DeepSeek-V3/R1, Kimi-K2, GLM-4.5, DeepSeek-V2, Mixtral, Qwen3-MoE, gpt-oss and Llama-4 (one op, its
modes as strings) and the expert-sorted dispatch plan of grouped-GEMM kernels. References (which define the
semantics; ``route``'s backward re-weighs the forward's choice with them): moe_mlir/reference/routing.py. CPU kernels:
lib/Runtime/Torch/RoutingOps.cpp. ``route``'s weights are differentiable w.r.t. the logits (through the scores;
the choice and the selection bias get no gradient); ``dispatch_plan`` is integer-valued.
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

import torch
from torch import Tensor

from ..reference.routing import dispatch_plan as _dispatch_plan_ref
from ..reference.routing import dispatch_plan_sizes as _dispatch_plan_sizes
from ..reference.routing import route as _route_ref
from ..reference.routing import route_weights as _route_weights
from ._autograd import _needs
from ._verified_op import as_f32, as_i32, moe_op, not_in_key
from ._checks import _check_index_range, indices_dtype_check
from .loading import _GRAD_OPS, KEY_OPS, _note_fallback

#: The production routing ops (MoERoutingOps.td); ``torch.ops.moe.<name>`` exists for each.
ROUTING_OP_NAMES: tuple[str, ...] = ("route", "dispatch_plan")
#: The options of ``moe.route`` (MoERoutingAttrs.td's enums; ``tests/test_functional_api.py`` checks each against the
#: op verifier's list): the preset scores (the enum's fourth case, ``custom``, is a region: ``"custom:<region>"``,
#: or a Python callable in :func:`moe_mlir.route`), the order of scoring and choosing, the score of a group.
RouteScoring = Literal["softmax", "sigmoid", "none"]
RouteOrder = Literal["score_then_topk", "topk_then_score"]
GroupScore = Literal["top2_sum", "max"]
ROUTE_SCORINGS: tuple[str, ...] = get_args(RouteScoring)
ROUTE_ORDERS: tuple[str, ...] = get_args(RouteOrder)
GROUP_SCORES: tuple[str, ...] = get_args(GroupScore)


def _route_fake(logits, bias, k, scoring="softmax", order="score_then_topk", n_group=1, topk_group=1,
                group_score="top2_sum", renormalize=False, routed_scaling_factor=1.0, replay=None, indices_dtype=None):
    shape = (logits.shape[0], k)
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=indices_dtype or torch.int32)


# indices_dtype is not in the kernel key's verification (the key's out:indices:i64 names it for the build).
@moe_op("route", fake=_route_fake, views={"indices_dtype": not_in_key}, check=indices_dtype_check("route"))
def route(logits: Tensor, bias: Optional[Tensor], k: int, scoring: str = "softmax", order: str = "score_then_topk",
          n_group: int = 1, topk_group: int = 1, group_score: str = "top2_sum", renormalize: bool = False,
          routed_scaling_factor: float = 1.0, replay: Optional[Tensor] = None,
          indices_dtype: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    """A production MoE gate (``moe.route``).

    Args:
        logits: ``[T, E]`` router logits, f32/f16/bf16.
        bias: ``[E]`` selection bias (DeepSeek-V3's ``e_score_correction_bias``) or None: added to choose, never
            to weigh.
        k: experts per token, ``1 <= k <= E`` (and ``<= topk_group * E / n_group`` with groups).
        scoring: ``"softmax"``, ``"sigmoid"``, ``"none"``, or ``"custom:<score region>"``: an elementwise score
            written as the ``score`` region of moe.route, e.g. from a PyTorch function by
            :func:`moe_mlir.ops.custom_scoring` (DeepSeek-V4's ``sqrtsoftplus``).
        order: ``"score_then_topk"`` (choose on scores + bias, weigh with the scores) or ``"topk_then_score"``
            (choose on logits + bias, score only the k chosen logits: gpt-oss, Llama-4).
        n_group, topk_group, group_score: group-limited selection (the ``topk_group`` best of ``n_group``
            contiguous groups, a group scored by the sum of its top two (``"top2_sum"``) or its max).
        renormalize: divide the k weights by their sum (a zero sum gives zeros).
        routed_scaling_factor: multiplies the weights (> 0).
        replay: ``[T, k]`` expert indices (i32/i64, each in ``[0, E)``, else ValueError) or None: the choice is
            given instead of made (routing replay for RL, hash routing): the result is the weights of these
            experts, as the router would weigh them, and the indices themselves (in their order; the bias and
            the groups play no part).
        indices_dtype: ``torch.int32`` (None: the default) or ``torch.int64`` (as ``torch.topk``): the kernel
            writes them so, no cast after it.

    Returns:
        ``(weights [T, k] f32, indices [T, k] i32 or indices_dtype)`` sorted by descending choice score; ties ->
        lowest index; NaN first.
    """
    if replay is not None:
        _check_index_range("route", "replay", replay, logits.shape[1])
    _note_fallback(logits)
    w, i = _route_ref(logits, bias, k, scoring, order, n_group, topk_group, group_score, renormalize,
                      routed_scaling_factor, replay)
    return w, i.to(indices_dtype or torch.int32)


def _route_backward_fake(grad_w, logits, indices, scoring, renormalize=False, routed_scaling_factor=1.0):
    return logits.new_empty(logits.shape, dtype=torch.float32)


# The torch op takes i64 indices and any float cotangent too: its kernel reads them as i32 and f32.
@moe_op("route_backward", fake=_route_backward_fake, views={"grad_w": as_f32, "indices": as_i32})
def route_backward(grad_w: Tensor, logits: Tensor, indices: Tensor, scoring: str, renormalize: bool = False,
                   routed_scaling_factor: float = 1.0) -> Tensor:
    """The gradient ``[T, E]`` f32 of ``route``'s weights (elementwise scores: ``sigmoid``, ``none``, custom) to the
    logits, given the forward's ``indices`` and the cotangent ``grad_w`` ``[T, k]`` (``moe.route_grad``: one fused
    kernel on CPU and CUDA tensors, the custom score's derivative formed symbolically). Eager fallback (no kernels):
    autograd of the reference."""
    _note_fallback(logits)
    with torch.enable_grad():
        x = logits.detach().float().requires_grad_(True)
        w = _route_weights(x, indices, scoring, "score_then_topk", renormalize, routed_scaling_factor)
        (g,) = torch.autograd.grad(w, x, grad_w.float())
    return g


# Backward: the weights of the forward's own choice (its indices, saved) re-computed from the logits under autograd
# (reference.routing.route_weights); the choice itself (group scores, top-k of the bias-shifted scores: sorts and
# top-ks over [T, E]) has no gradient and is not run again. The bias only chooses: no gradient. An elementwise score
# (sigmoid, none, custom) runs the fused kernel of moe.route_grad instead (CPU and CUDA; route_backward: a custom
# region's symbolic derivative; O(E + k) a row, where autograd of the reference runs the score on [T, E]: sigmoid at
# T = 4096, E = 256, k = 8, 2 threads, the backward alone 3.8 -> 0.50 ms, best of 100 interleaved calls on a loaded
# machine).
def _route_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output[1])
    ctx.weigh = (inputs[3], inputs[4], inputs[8], inputs[9])  # scoring, order, renormalize, routed_scaling_factor


def _route_backward(ctx, grad_w, grad_idx):
    logits, idx = ctx.saved_tensors
    result = [None] * 12
    if grad_w is None or not _needs(ctx, 12)[0]:
        return tuple(result)
    scoring, _, renormalize, scale = ctx.weigh
    if scoring != "softmax":
        result[0] = route_backward(grad_w, logits, idx, scoring, renormalize, scale).to(logits.dtype)
        return tuple(result)
    with torch.enable_grad():
        x = logits.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(_route_weights(x, idx, *ctx.weigh), x, grad_w)
    result[0] = g.to(logits.dtype)
    return tuple(result)


route.register_autograd(_route_backward, setup_context=_route_setup)


def _dispatch_plan_fake(indices, num_experts, block_size=1):
    return tuple(indices.new_empty((n,), dtype=torch.int32)
                 for n in _dispatch_plan_sizes(indices.shape[0], indices.shape[1], num_experts, block_size))


@moe_op("dispatch_plan", fake=_dispatch_plan_fake)
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
    _check_index_range("dispatch_plan", "indices", indices, num_experts)
    _note_fallback(indices)
    return _dispatch_plan_ref(indices, num_experts, block_size)


_GRAD_OPS[route._name] = route

# A whole graph lowers these to their kernel key's op (mlir/lowerings/moe_ops.py).
KEY_OPS["route"] = "route"
KEY_OPS["dispatch_plan"] = "dispatch_plan"
