"""HF transformers' experts modules sharded over a process group: the experts implementation ``"moe_ep"``.

:func:`shard_experts` keeps, in each HF experts module of a model (Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, gpt-oss:
the classes decorated with ``@use_experts_implementation``), only this rank's block of experts (the parameters
``[E, ...]`` sliced to ``[E_local, ...]``, fresh ``nn.Parameter`` s) and selects ``"moe_ep"`` in the config. The
router, attention and the rest stay replicated, as in TorchTitan's and Megatron-core's expert parallelism: each
rank runs the model on its own tokens, and the experts' forward (:func:`hf_ep_experts_forward`) is

1. :func:`~moe_mlir.expert_parallel.dispatch` of the tokens with the router's ids and weights (each token row once
   per rank holding one of its experts);
2. this rank's experts on the received rows, through the same kernels as the single-process ``"moe"``
   implementation (:mod:`moe_mlir.experts`): the fused ``expert_mlp`` loop on CPU for the gates it knows, else
   grouped GEMMs over the expert-sorted rows, the module's own gate, biases and post-expert norm; gate weights
   applied and each received row's experts added in increasing expert order;
3. :func:`~moe_mlir.expert_parallel.combine` back to the tokens.

Every rank must call the model the same number of times (each experts call is a collective), as with any
expert-parallel layer. Gradients of the local experts' parameters are those of this rank's experts over *all* ranks'
tokens (no all-reduce needed for them); the replicated parameters (router, attention...) need the usual
data-parallel gradient all-reduce (e.g. DDP on the same group, or :func:`allreduce_replicated_grads`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .. import experts as _X
from ..experts import hf as _XH
from .dispatch import Dispatched, combine, dispatch, expert_rows, weighted_reduce
from .layout import ExpertLayout

__all__ = ["IMPLEMENTATION", "register", "shard_experts", "hf_ep_experts_forward", "allreduce_replicated_grads",
           "EXPERT_PARAMS"]

#: The name of the HF experts implementation registered here.
IMPLEMENTATION = "moe_ep"

#: The parameters of an HF experts module that have one slice per expert (dimension 0 of size E).
EXPERT_PARAMS = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias", "down_proj_bias")


def register() -> bool:
    """Adds ``"moe_ep"`` to HF's ``ExpertsInterface`` (idempotent). False without transformers 5.x."""
    return _XH.register_implementation(IMPLEMENTATION, hf_ep_experts_forward)


def shard_experts(model: torch.nn.Module, group: Optional["dist.ProcessGroup"] = None,
                  experts_per_rank: Optional[Sequence[int]] = None) -> list[torch.nn.Module]:
    """Keeps only this rank's experts in each HF experts module of ``model`` and selects ``"moe_ep"``.

    Args:
        model: a transformers model or block, the same (same weights) on every rank of ``group``.
        group: the expert-parallel group (None: the default group).
        experts_per_rank: the block sizes (default: even, :meth:`ExpertLayout.even`).

    Returns:
        The sharded modules (each has ``ep_layout``, ``ep_group`` and ``ep_rank``).
    """
    if not register():
        raise RuntimeError("expert_parallel.shard_experts needs transformers 5.x (its ExpertsInterface)")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    modules = _X.hf_experts_modules(model)
    if not modules:
        raise ValueError(f"expert_parallel.shard_experts: {type(model).__name__} has no HF experts module")
    for m in modules:
        if getattr(m, "ep_layout", None) is not None:
            raise ValueError("expert_parallel.shard_experts: the experts are already sharded")
        layout = ExpertLayout.make(m.num_experts, world, experts_per_rank)
        if layout.world_size != world:
            raise ValueError(f"expert_parallel.shard_experts: experts_per_rank {list(layout.experts_per_rank)} "
                             f"has {layout.world_size} entries for a group of {world} ranks")
        mine = layout.local_experts(rank)
        for name in EXPERT_PARAMS:
            p = getattr(m, name, None)
            if isinstance(p, torch.nn.Parameter) and p.dim() >= 1 and p.shape[0] == layout.num_experts:
                setattr(m, name, torch.nn.Parameter(p.detach()[mine.start:mine.stop].clone(),
                                                    requires_grad=p.requires_grad))
        m.ep_layout, m.ep_group, m.ep_rank = layout, group, rank
        m.config._experts_implementation = IMPLEMENTATION
    return modules


def _local_experts(m: torch.nn.Module, d: Dispatched) -> Tensor:
    """``[R, D]``: for each received row, this rank's experts' outputs times the gate weights, added in increasing
    expert order."""
    local = d.handle.local
    if m.has_gate:
        w1, b1, act = m.gate_up_proj, (m.gate_up_proj_bias if m.has_bias else None), m._apply_gate
    else:
        w1, b1, act = m.up_proj, (m.up_proj_bias if m.has_bias else None), m.act_fn
    w2, b2 = m.down_proj, (m.down_proj_bias if m.has_bias else None)
    x = d.x.to(w1.dtype)
    if w1.shape[0] == 0:  # a rank owning no experts receives no rows; stays in the graph so that its backward
        return d.x * 0 + 0 * d.weights.sum()  # runs the exchange's collectives like every other rank's
    gate = _XH._known_gate(m)
    post_norm = m.post_expert_norm if getattr(m, "has_post_expert_norm", False) else None  # absent before transformers 5.2x
    if gate is not None and post_norm is None and x.device.type == "cpu":
        row_weight = d.weights.reshape(-1)[local.slot]
        out = _X.expert_mlp(x, local.row, local.offsets, row_weight,
                            w1.transpose(1, 2) if m.is_transposed else w1,
                            w2.transpose(1, 2) if m.is_transposed else w2, gate[0],
                            b1=b1, b2=b2, alpha=gate[1], limit=gate[2])
        return out.to(d.x.dtype)
    rows = expert_rows(Dispatched(x, d.ids, d.weights, d.handle))
    h = _X.grouped_mm(rows, w1 if m.is_transposed else w1.transpose(1, 2), local.offsets)
    if b1 is not None:
        h = h + b1[local.expert]
    h = _X.grouped_mm(act(h), w2 if m.is_transposed else w2.transpose(1, 2), local.offsets)
    if b2 is not None:
        h = h + b2[local.expert]
    if post_norm is not None:
        h = post_norm(h)
    return weighted_reduce(h, d).to(d.x.dtype)


def hf_ep_experts_forward(self: torch.nn.Module, hidden_states: Tensor, top_k_index: Tensor,
                          top_k_weights: Tensor) -> Tensor:
    """HF's experts implementation ``"moe_ep"`` (the signature of ``ExpertsInterface`` functions)."""
    layout = getattr(self, "ep_layout", None)
    if layout is None:
        raise RuntimeError(f"experts implementation '{IMPLEMENTATION}' on a {type(self).__name__} that "
                           "expert_parallel.shard_experts did not shard")
    d = dispatch(hidden_states, top_k_index, top_k_weights, layout, self.ep_group)
    return combine(_local_experts(self, d), d.handle)


def allreduce_replicated_grads(model: torch.nn.Module, group: Optional["dist.ProcessGroup"] = None) -> None:
    """Sums the gradients of the parameters every rank holds a copy of (all but the sharded experts') over
    ``group``, for a training loop without DDP. The sharded experts' gradients are already complete."""
    sharded = {id(p) for m in _X.hf_experts_modules(model) if getattr(m, "ep_layout", None) is not None
               for name in EXPERT_PARAMS if isinstance(p := getattr(m, name, None), torch.nn.Parameter)}
    for p in model.parameters():
        if id(p) in sharded or not p.requires_grad:
            continue
        # A parameter unused on this rank still joins the sum (with zeros): every rank must issue the same
        # collectives in the same order, or they pair the wrong tensors (or hang).
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=group)
