"""HF transformers' experts modules on :func:`~moe_mlir.experts.dispatch.dispatch_experts`: the ``"moe"`` experts
implementation, its registration and the ways a model selects it (the package doc)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor

from .dispatch import dispatch_experts

__all__ = ["hf_experts_forward", "register", "is_hf_experts", "hf_experts_modules", "use_moe_experts",
           "SelectedExperts", "IMPLEMENTATION"]

#: The name of the HF experts implementation this module registers.
IMPLEMENTATION = "moe"


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


def _known_gate(module: torch.nn.Module) -> Optional[tuple[str, float, float]]:
    """The :data:`GATES` entry computing ``module._apply_gate`` (``(name, alpha, limit)``), or None: HF's default
    gate (concatenated halves) with a SiLU ``act_fn``, or gpt-oss's own clamped GLU, each identified by the function
    object (a subclass overriding ``_apply_gate`` is not recognised and keeps the generic path)."""
    if not module.has_gate or _has_post_norm(module):
        return None
    apply_gate = type(module)._apply_gate
    hf_moe = sys.modules.get("transformers.integrations.moe")
    hf_act = sys.modules.get("transformers.activations")
    silu = (torch.nn.SiLU,) + ((hf_act.SiLUActivation,) if hasattr(hf_act, "SiLUActivation") else ())
    if (hf_moe is not None and apply_gate is getattr(hf_moe, "_default_apply_gate", None)
            and getattr(module, "is_concatenated", True) and type(getattr(module, "act_fn", None)) in silu):
        return ("silu_glu", 1.0, float("inf"))
    gpt_oss = sys.modules.get("transformers.models.gpt_oss.modeling_gpt_oss")
    if (gpt_oss is not None and apply_gate is getattr(getattr(gpt_oss, "GptOssExperts", None), "_apply_gate", None)
            and not getattr(module, "is_concatenated", False)):
        return ("clamped_glu", float(module.alpha), float(module.limit))
    return None


def _has_post_norm(experts: torch.nn.Module) -> bool:
    """Whether HF's experts module applies a norm after each expert (``has_post_expert_norm``: transformers 5.2x;
    older 5.x releases, e.g. 5.17, have no such attribute and no such norm)."""
    return bool(getattr(experts, "has_post_expert_norm", False))


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
                            post_norm=self.post_expert_norm if _has_post_norm(self) else None,
                            gate=_known_gate(self))


def register_implementation(name: str, forward) -> bool:
    """Adds ``forward`` to HF's ``ExpertsInterface`` as ``name`` (idempotent). False when transformers (5.x) is not
    installed."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register(name, forward)
    return True


def register() -> bool:
    """Adds ``"moe"`` to HF's ``ExpertsInterface`` (idempotent). False when transformers (5.x) is not installed."""
    return register_implementation(IMPLEMENTATION, hf_experts_forward)


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
