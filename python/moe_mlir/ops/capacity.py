"""Expert capacity and auxiliary-loss-free bias balancing: ``apply_capacity`` (``moe.dispatch_plan``'s capacity
option) and ``bias_update`` (``moe.bias_update``), MoERoutingOps.td.

* ``apply_capacity``: GShard/Switch Transformer token dropping. Each expert keeps at most ``capacity`` of the
  ``[T, k]`` assignments routed to it, claimed in the position order (``drop="position"``: every token's first
  choice in token order, then the second choices...) or by gate weight (``drop="probability"``: V-MoE's
  batch-prioritized routing, the weight of each assignment as its priority, ties in the position order). Dropped
  assignments get weight 0 and are counted per expert. Differentiable w.r.t. ``weights`` (the same mask on the
  gradient). :func:`capacity_of` is Switch Transformer's capacity for a capacity factor.
* ``bias_update``: DeepSeek-V3's balancing step ``b + u · sign(mean(counts) − counts)``, out of place, applied by the
  training loop after its optimizer step (no gradient).

References (the semantics; the eager fallback and what ``apply_capacity``'s backward recomputes):
moe_mlir/reference/routing.py. CPU kernels: lib/Runtime/Torch/CapacityOps.cpp.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import Tensor

from ..reference.routing import apply_capacity as _apply_capacity_ref
from ..reference.routing import bias_update as _bias_update_ref
from ._autograd import _register_recompute_autograd, _stop_gradient_backward, _stop_gradient_setup
from ._verified_op import moe_op
from ._checks import _check_index_range, _fail
from .loading import _GRAD_OPS, KEY_OPS, _note_fallback

#: The capacity and bias-balancing ops; ``torch.ops.moe.<name>`` exists for each.
CAPACITY_OP_NAMES: tuple[str, ...] = ("apply_capacity", "bias_update")
#: Which assignments ``moe.apply_capacity`` drops first (MoERoutingAttrs.td's CapacityDrop).
CapacityDrop = Literal["position", "probability"]
CAPACITY_DROPS: tuple[str, ...] = get_args(CapacityDrop)


def capacity_of(tokens: int, top_k: int, num_experts: int, factor: float) -> int:
    """Switch Transformer's expert capacity ``⌈factor · tokens · top_k / num_experts⌉`` (GShard's with ``top_k = 2``):
    the ``capacity`` of :func:`apply_capacity` for a capacity factor (1.0: exactly the balanced load; Switch trains
    with 1.25, evaluates with 2.0). Computed in exact rational arithmetic on the float ``factor``, so that a load
    that divides evenly is not rounded up by floating-point error."""
    if tokens < 0:
        raise ValueError(f"capacity_of: 'tokens' ({tokens}) must be >= 0")
    if top_k < 1:
        raise ValueError(f"capacity_of: 'top_k' ({top_k}) must be >= 1")
    if num_experts < 1:
        raise ValueError(f"capacity_of: 'num_experts' ({num_experts}) must be >= 1")
    if not (math.isfinite(factor) and factor >= 0):
        raise ValueError(f"capacity_of: 'factor' ({factor}) must be finite and >= 0")
    from fractions import Fraction

    return math.ceil(Fraction(factor) * tokens * top_k / num_experts)


def _check_weights_shape(indices: Tensor, weights: Tensor, num_experts: int, capacity: int, drop: str) -> None:
    """The dialect op reads the weights only to drop by probability; the torch op masks them either way: its own
    rule (lib/Runtime/Torch/CapacityOps.cpp words it the same)."""
    op = "apply_capacity"
    if weights.dim() != 2:
        _fail(op, f"'weights' must have rank 2 ([T, k]), got shape {list(weights.shape)}")
    for d, what in enumerate(("T", "k")):
        if weights.shape[d] != indices.shape[d]:
            _fail(op, f"dimension {d} of 'weights' ({weights.shape[d]}) must equal dimension {d} of 'indices' ({what}) "
                      f"({indices.shape[d]})")


def _apply_capacity_fake(indices, weights, num_experts, capacity, drop="position"):
    return torch.empty_like(weights), indices.new_empty((num_experts,), dtype=torch.int64)


@moe_op("apply_capacity", fake=_apply_capacity_fake, check=_check_weights_shape)
def apply_capacity(indices: Tensor, weights: Tensor, num_experts: int, capacity: int, drop: str = "position"
                   ) -> tuple[Tensor, Tensor]:
    """Expert capacity with token dropping (``moe.dispatch_plan``'s capacity option).

    Args:
        indices: ``[T, k]`` expert indices (i32/i64), each in ``[0, num_experts)`` (else ValueError).
        weights: ``[T, k]`` gate weights (f32/f16/bf16).
        num_experts: E >= 1.
        capacity: C >= 0, the most assignments an expert keeps (:func:`capacity_of` for a capacity factor).
        drop: ``"position"`` (slot-major then token order: GShard, Switch Transformer) or ``"probability"`` (by
            weight, largest first, NaN first, ties in the position order: V-MoE's batch-prioritized routing).

    Returns:
        ``(kept_weights [T, k]`` in the dtype of ``weights``, the dropped assignments set to 0;
        ``dropped [E]`` i64, the dropped assignments per expert``)``.
    """
    _check_index_range("apply_capacity", "indices", indices, num_experts)
    _note_fallback(indices)
    return _apply_capacity_ref(indices, weights, num_experts, capacity, drop)


# Recompute backward: the reference's mask re-run under autograd (kept weights pass their gradient, dropped ones 0).
_register_recompute_autograd(apply_capacity, _apply_capacity_ref, (1,), (0,))
_GRAD_OPS[apply_capacity._name] = apply_capacity  # the extension's AutogradCPU kernel calls back into it


def _bias_update_fake(bias, counts, rate):
    return bias.new_empty(bias.shape, dtype=torch.float32)


@moe_op("bias_update", fake=_bias_update_fake)
def bias_update(bias: Tensor, counts: Tensor, rate: float) -> Tensor:
    """DeepSeek-V3's auxiliary-loss-free balancing step (``moe.bias_update``), out of place.

    Args:
        bias: ``[E]`` selection bias (``moe.route``'s ``bias``), f32/f16/bf16.
        counts: ``[E]`` expert loads of the step (i32/i64: ``dispatch_plan``'s counts; f32: ``router_stats``'
            counts).
        rate: the bias update speed u >= 0 (DeepSeek-V3: 0.001), rounded to f32.

    Returns:
        f32 ``[E]``: ``bias + rate · sign(mean(counts) − counts)`` (``sign(0) = 0``; the sign is exact for integer
        counts; a NaN count leaves the bias unchanged, as ``torch.sign(nan) = 0``). Assign it to the bias after
        the optimizer step.
    """
    _note_fallback(bias)
    return _bias_update_ref(bias, counts, rate)


# No gradient: the bias only chooses experts, and the training loop assigns the result.
bias_update.register_autograd(_stop_gradient_backward, setup_context=_stop_gradient_setup)


# A whole graph lowers these to their kernel key's op (mlir/lowerings/moe_ops.py).
KEY_OPS["bias_update"] = "bias_update"
