"""Expert dispatch through ``moe.dispatch_plan``: HF transformers' sparse-MoE experts without the per-expert loop.

HF ``transformers`` (5.x) writes the experts of Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, gpt-oss... as an
``Experts`` module decorated with ``@use_experts_implementation``: its forward looks up
``config._experts_implementation`` in ``transformers.integrations.moe.ExpertsInterface`` (``"eager"``, the default,
is the ``one_hot`` / ``where`` / ``index_add_`` loop over the experts hit; it is data-dependent, so Dynamo breaks the
graph at its ``nonzero`` and recompiles per expert). This module adds the implementation ``"moe"``:

1. ``torch.ops.moe.dispatch_plan(top_k_index, E)`` (integer-valued, static output sizes: no graph break) gives the
   per-expert offsets, the ``(token, slot)`` assignments stably sorted by expert and its inverse permutation;
2. the token rows are gathered once in that order, and each projection is **one grouped GEMM**
   (:func:`grouped_mm`: ``torch.ops.moe_mlir.grouped_mm``, an opaque op looping over the experts that have rows,
   one ``mm`` per contiguous slice; ``torch.nn.functional.grouped_mm`` on CUDA in bf16, where torch has it — that
   branch has not run on a GPU yet) — on this project's CPU the loop measured faster than torch's CPU
   ``torch.nn.functional.grouped_mm`` (one run on the loaded 2-core machine, 2 threads, E=128, D=2048, 2I=1536,
   f32: 1.8 s vs 2.8 s at T=64, 2.3 s vs 3.1 s at T=1024, same results bit for bit);
3. the module's own gate (``_apply_gate``: SiLU(gate)·up, gpt-oss's clamped GLU...) or activation, its biases
   and its post-expert norm, then the routing weights, row-wise, as HF's eager code applies them;
4. a deterministic un-permute: each token's k rows are read back through the inverse order, in increasing expert
   order (the order in which eager's ``index_add_`` accumulates them), and summed: no scatter, no atomics.

Everything is differentiable w.r.t. the hidden states, the expert weights (and biases) and the routing weights
(autograd of the torch ops used; ``grouped_mm`` has a registered backward, also an opaque loop); the plan is
integer-valued. Under ``torch.compile`` the whole expert computation is one graph (no data-dependent control flow
in Python).

Which models use it (see the README, "HF experts through the dispatch plan"):

* :func:`register` adds ``"moe"`` to HF's ``ExpertsInterface`` (HF's extension point; idempotent): then
  ``config._experts_implementation = "moe"`` / ``from_pretrained(..., experts_implementation="moe")`` /
  ``model.set_experts_implementation("moe")`` select it, in eager and under any ``torch.compile`` backend;
* :func:`use_moe_experts` selects it for a model within a ``with`` block (and restores the previous choice);
* ``moe_mlir.compile(model)`` selects it for each call of the compiled model only (the user's model object and its
  configs are left as they were between calls; a module whose config names another implementation than HF's
  defaults, :data:`SWITCHED`, keeps it).

Expert parallelism (``_is_expert_parallel``: sentinel indices) is not handled: such modules run HF's eager code.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor

from . import ops as _ops  # noqa: F401  (registers torch.ops.moe.dispatch_plan)

__all__ = ["grouped_mm", "dispatch_experts", "hf_experts_forward", "register", "is_hf_experts", "hf_experts_modules",
           "use_moe_experts", "SelectedExperts", "IMPLEMENTATION"]

#: The name of the HF experts implementation this module registers.
IMPLEMENTATION = "moe"


# ----------------------------------------------------------------------------------------------------------------
# One GEMM per projection over expert-sorted rows
# ----------------------------------------------------------------------------------------------------------------


def _check_grouped(x: Tensor, w: Tensor, offsets: Tensor) -> None:
    if x.dim() != 2 or w.dim() != 3:
        raise ValueError(f"grouped_mm: x must be [S, K] and w [E, K, N], got {list(x.shape)} and {list(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"grouped_mm: x has K = {x.shape[1]} columns but w has K = {w.shape[1]} rows")
    if offsets.dim() != 1 or offsets.shape[0] != w.shape[0] + 1 or offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"grouped_mm: offsets must be an integer [E+1] = [{w.shape[0] + 1}] tensor, got "
                         f"{offsets.dtype} {list(offsets.shape)}")
    if x.dtype != w.dtype:
        raise ValueError(f"grouped_mm: x is {x.dtype} but w is {w.dtype}")


def _spans(offsets: Tensor) -> Iterator[tuple[int, int, int]]:
    """(expert, start, end) for each expert with rows (one host read of the offsets)."""
    o = offsets.tolist()
    for e in range(len(o) - 1):
        if o[e + 1] > o[e]:
            yield e, o[e], o[e + 1]


@torch.library.custom_op("moe_mlir::grouped_mm", mutates_args=())
def _grouped_mm_op(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    _check_grouped(x, w, offsets)
    out = x.new_empty((x.shape[0], w.shape[2]))
    if out.numel() and int(offsets[-1]) != x.shape[0]:
        raise ValueError(f"grouped_mm: offsets[-1] = {int(offsets[-1])} must equal the number of rows {x.shape[0]}")
    for e, a, b in _spans(offsets):
        torch.mm(x[a:b], w[e], out=out[a:b])
    return out


@_grouped_mm_op.register_fake
def _(x, w, offsets):
    _check_grouped(x, w, offsets)
    return x.new_empty((x.shape[0], w.shape[2]))


@torch.library.custom_op("moe_mlir::grouped_mm_backward", mutates_args=())
def _grouped_mm_backward_op(grad: Tensor, x: Tensor, w: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    grad_x = torch.zeros_like(x)
    grad_w = torch.zeros_like(w)
    for e, a, b in _spans(offsets):
        torch.mm(grad[a:b], w[e].t(), out=grad_x[a:b])
        torch.mm(x[a:b].t(), grad[a:b], out=grad_w[e])
    return grad_x, grad_w


@_grouped_mm_backward_op.register_fake
def _(grad, x, w, offsets):
    return torch.empty_like(x), torch.empty_like(w)


def _grouped_mm_setup(ctx, inputs, output):
    x, w, offsets = inputs
    ctx.save_for_backward(x, w, offsets)


def _grouped_mm_backward(ctx, grad):
    x, w, offsets = ctx.saved_tensors
    grad_x, grad_w = _grouped_mm_backward_op(grad.contiguous(), x, w, offsets)
    return grad_x, grad_w, None


_grouped_mm_op.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


def grouped_mm(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    """``out[offsets[e]:offsets[e+1]] = x[offsets[e]:offsets[e+1]] @ w[e]`` for every expert ``e``.

    Args:
        x: ``[S, K]`` rows sorted by expert; w: ``[E, K, N]`` (any strides: pass ``W.transpose(1, 2)`` for
        ``nn.Linear``-layout ``[E, N, K]`` weights); offsets: ``[E+1]`` integer, ``offsets[0] = 0``,
        ``offsets[E] = S``.
    """
    if (x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch.nn.functional, "grouped_mm")
            and torch.cuda.get_device_capability(x.device) >= (8, 0)):
        return torch.nn.functional.grouped_mm(x, w, offs=offsets[1:].to(torch.int32))
    return _grouped_mm_op(x, w, offsets)


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
    experts_sorted = top_k_index.reshape(-1)[order]
    x = hidden_states[torch.div(order, k, rounding_mode="floor")].to(gate_up_proj.dtype)
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


# ----------------------------------------------------------------------------------------------------------------
# HF transformers' experts modules
# ----------------------------------------------------------------------------------------------------------------


def is_hf_experts(module: torch.nn.Module) -> bool:
    """True for a module of a class decorated with HF's ``@use_experts_implementation``."""
    fwd = getattr(type(module), "forward", None)
    return (hasattr(fwd, "__wrapped__") and hasattr(module, "has_gate") and hasattr(module, "is_transposed")
            and hasattr(getattr(module, "config", None), "_experts_implementation"))


def hf_experts_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if is_hf_experts(m)]


def hf_experts_forward(self: torch.nn.Module, hidden_states: Tensor, top_k_index: Tensor,
                       top_k_weights: Tensor) -> Tensor:
    """HF's experts implementation ``"moe"`` (the signature of ``ExpertsInterface`` functions)."""
    if getattr(self, "_is_expert_parallel", False):  # sentinel indices: HF's own loop
        return type(self).forward.__wrapped__(self, hidden_states, top_k_index, top_k_weights)
    if self.has_gate:
        w1 = self.gate_up_proj
        b1 = self.gate_up_proj_bias if self.has_bias else None
        act = self._apply_gate
    else:
        w1 = self.up_proj
        b1 = self.up_proj_bias if self.has_bias else None
        act = self.act_fn
    return dispatch_experts(hidden_states, top_k_index, top_k_weights, w1, self.down_proj, act,
                            transposed=self.is_transposed, gate_up_bias=b1,
                            down_bias=self.down_proj_bias if self.has_bias else None,
                            post_norm=self.post_expert_norm if self.has_post_expert_norm else None)


def register() -> bool:
    """Adds ``"moe"`` to HF's ``ExpertsInterface`` (idempotent). False when transformers (5.x) is not installed."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register(IMPLEMENTATION, hf_experts_forward)
    return True


#: The implementations switched to ``"moe"``: HF's defaults (unset on a standalone module, ``"eager"``, and
#: ``"grouped_mm"``, which ``PreTrainedModel`` picks when nothing was requested). Others (``"batched_mm"``, a
#: kernel from the hub...) are a user's choice and are kept.
SWITCHED = (None, "eager", "grouped_mm")


def _default(impl: Any) -> bool:
    return impl in SWITCHED


def _switch(modules: list[torch.nn.Module]) -> dict[int, tuple[Any, Any]]:
    saved: dict[int, tuple[Any, Any]] = {}
    for m in modules:
        cfg = m.config
        if id(cfg) not in saved and _default(cfg._experts_implementation):
            saved[id(cfg)] = (cfg, cfg._experts_implementation)
    for cfg, _ in saved.values():
        cfg._experts_implementation = IMPLEMENTATION
    return saved


def _restore(saved: dict[int, tuple[Any, Any]]) -> None:
    for cfg, old in saved.values():
        cfg._experts_implementation = old


@contextlib.contextmanager
def use_moe_experts(model: torch.nn.Module) -> Iterator[list[torch.nn.Module]]:
    """Within the block, the HF experts modules of ``model`` whose config selects one of HF's defaults
    (:data:`SWITCHED`) run :func:`hf_experts_forward`; their configs are restored on exit. Yields the modules switched."""
    modules = hf_experts_modules(model)
    if modules:
        register()
    saved = _switch(modules)
    try:
        yield [m for m in modules if id(m.config) in saved]
    finally:
        _restore(saved)


class SelectedExperts:
    """A compiled model whose HF experts modules run :func:`hf_experts_forward` during each call (what
    ``moe_mlir.compile`` returns for a model with HF experts). Attributes are the compiled model's.

    The switch is the experts' ``config._experts_implementation``, set for the call and restored after it: another
    thread running the *eager* model during a call would run the ``"moe"`` implementation too (same results up to
    f32 rounding)."""

    def __init__(self, compiled: Callable[..., Any], model: torch.nn.Module) -> None:
        register()
        self.__dict__["_compiled"] = compiled
        self.__dict__["_experts_modules"] = hf_experts_modules(model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        saved = _switch(self._experts_modules)
        try:
            return self._compiled(*args, **kwargs)
        finally:
            _restore(saved)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_compiled"], name)
