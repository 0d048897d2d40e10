"""The routed experts of a sparse-MoE block through ``moe.dispatch_plan`` (the package doc: the plan, grouped
GEMMs or the fused MLP, a deterministic un-permute)."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .. import ops as _ops  # noqa: F401  (registers torch.ops.moe.dispatch_plan)
from .gemm import grouped_mm
from .mlp import expert_mlp

__all__ = ["dispatch_experts"]


# ----------------------------------------------------------------------------------------------------------------
# The whole expert computation
# ----------------------------------------------------------------------------------------------------------------


def dispatch_experts(
    hidden_states: Tensor,
    top_k_index: Tensor,
    top_k_weights: Tensor,
    gate_up_proj: Tensor,
    down_proj: Tensor,
    act: Callable[[Tensor], Tensor],
    *,
    transposed: bool = False,
    gate_up_bias: Optional[Tensor] = None,
    down_bias: Optional[Tensor] = None,
    post_norm: Optional[Callable[[Tensor], Tensor]] = None,
    gate: Optional[tuple[str, float, float]] = None,
) -> Tensor:
    """The routed experts of a sparse-MoE block, through ``moe.dispatch_plan`` (see the module doc).

    Args:
        hidden_states: ``[T, D]``; top_k_index: ``[T, k]`` experts in ``[0, E)``; top_k_weights: ``[T, k]``.
        gate_up_proj: ``[E, 2I, D]`` (``transposed``: ``[E, D, 2I]``), or the up projection alone for ungated
            experts; down_proj: ``[E, D, I]`` (``transposed``: ``[E, I, D]``).
        act: applied to the ``[S, 2I]`` (or ``[S, I]``) projection: the gate (e.g. ``silu(gate) * up``) or the
            activation.
        gate_up_bias, down_bias: ``[E, 2I]``, ``[E, D]`` (optional); post_norm: applied to each expert's output
            row before the routing weight.
        gate: ``(name, alpha, limit)`` when ``act`` is one of the gates :func:`expert_mlp` computes itself
            (:data:`GATES`): then, on CPU without a post-norm, the experts run as :func:`expert_mlp` (one fused loop
            over the experts) instead of grouped GEMMs over all rows; same results up to f32 rounding.

    Returns:
        ``[T, D]`` in the dtype of ``hidden_states``: ``sum_j w[t, j] * expert_{idx[t, j]}(x[t])``.
    """
    if hidden_states.dim() != 2 or top_k_index.dim() != 2 or top_k_weights.shape != top_k_index.shape:
        raise ValueError(f"dispatch_experts: hidden_states must be [T, D] and top_k_index/top_k_weights [T, k], got "
                         f"{list(hidden_states.shape)}, {list(top_k_index.shape)}, {list(top_k_weights.shape)}")
    if top_k_index.shape[0] != hidden_states.shape[0]:
        raise ValueError(f"dispatch_experts: {top_k_index.shape[0]} rows of top_k_index for "
                         f"{hidden_states.shape[0]} tokens")
    T, D = hidden_states.shape
    k = top_k_index.shape[1]
    E = gate_up_proj.shape[0]
    _, offsets, order, inverse = torch.ops.moe.dispatch_plan(top_k_index, E, 1)[:4]
    order = order.long()
    token = torch.div(order, k, rounding_mode="floor")
    if gate is not None and post_norm is None and hidden_states.device.type == "cpu":
        out = expert_mlp(hidden_states.to(gate_up_proj.dtype), token, offsets, top_k_weights.reshape(-1)[order],
                         gate_up_proj.transpose(1, 2) if transposed else gate_up_proj,
                         down_proj.transpose(1, 2) if transposed else down_proj, gate[0],
                         b1=gate_up_bias, b2=down_bias, alpha=gate[1], limit=gate[2])
        return out.to(hidden_states.dtype)
    experts_sorted = top_k_index.reshape(-1)[order]
    x = hidden_states[token].to(gate_up_proj.dtype)
    w1 = gate_up_proj if transposed else gate_up_proj.transpose(1, 2)
    w2 = down_proj if transposed else down_proj.transpose(1, 2)
    h = grouped_mm(x, w1, offsets)
    if gate_up_bias is not None:
        h = h + gate_up_bias[experts_sorted]
    h = grouped_mm(act(h), w2, offsets)
    if down_bias is not None:
        h = h + down_bias[experts_sorted]
    if post_norm is not None:
        h = post_norm(h)
    h = h * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    # Each token's k rows in increasing expert order (eager's index_add_ order), then summed over k.
    pos = inverse.long().view(T, k).sort(dim=1).values
    return h[pos.reshape(-1)].view(T, k, h.shape[-1]).sum(dim=1).to(hidden_states.dtype)
