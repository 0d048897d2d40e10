"""``moe_mlir.compile``: the one entry point over the two compilation paths.

* ``backend="dynamo"`` (the default): ``torch.compile(model, backend="moe")`` (:mod:`moe_mlir.backends.dynamo`):
  Dynamo captures the model (graph breaks, data-dependent expert loops and new token counts included: automatic
  dynamic shapes), the routing idioms of each graph are raised to ``torch.ops.moe.*`` and inductor compiles the
  rest. The model keeps its training mode: this is the training path (AOTAutograd compiles forward and backward;
  the moe ops' registered backward runs in it; docs/Training.md).
* ``backend="auto"|"executor"|"runner"`` or ``target="cuda"``: the whole-graph MLIR path
  (:func:`moe_mlir.backends.whole_graph.compile_whole_graph`: torch.export → MLIR → ``moe-opt`` → executor / mlir-runner, or
  the CUDA split of :mod:`moe_mlir.backends.cuda`): the model in eval mode, static shapes (those of
  ``example_args``), and only models that ``torch.export`` captures whole. Forward-only: with grad mode on, an
  input that requires grad is refused (``RuntimeError`` naming the training path) rather than given a result that
  silently carries no gradient.

On the default path, HF ``transformers`` experts modules (``@use_experts_implementation``: Qwen3-MoE, Mixtral,
OLMoE, DeepSeek-V3, gpt-oss...) whose config selects one of HF's defaults (``"eager"``, ``"grouped_mm"``) run the
dispatch-plan implementation ``"moe"`` of :mod:`moe_mlir.experts` during each call of the compiled model (a
:class:`~moe_mlir.experts.SelectedExperts` wrapping the ``torch.compile``'d model); between calls the model and
its configs are as the user left them.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

__all__ = ["compile", "WHOLE_GRAPH_BACKENDS"]

WHOLE_GRAPH_BACKENDS = ("auto", "executor", "runner")


def compile(
    model: torch.nn.Module,
    example_args: Sequence[Any] = (),
    *,
    backend: str = "dynamo",
    target: str = "cpu",
    dense: str = "inductor",
    dynamic: Optional[bool] = None,
    **whole_graph: Any,
) -> Any:
    """Compiles ``model`` with MoE-MLIR (see the module doc for the two paths).

    Args:
        example_args: the whole-graph path's example inputs (they fix its shapes). The default path compiles on the
            first call, for the shapes it sees (then symbolic ones), like ``torch.compile``.
        backend: ``"dynamo"`` (default) or a whole-graph backend: ``"auto"`` | ``"executor"`` | ``"runner"``.
        target: ``"cpu"`` or ``"cuda"`` (the whole-graph CUDA split; see :mod:`moe_mlir.backends.cuda`).
        dense, dynamic: default path only: who compiles the dense code (``"inductor"`` or ``"eager"``) and
            ``torch.compile``'s ``dynamic``.
        whole_graph: ``params``, ``raise_idioms``, ``func_name``, ``chip``, ``build_dir`` of
            :func:`moe_mlir.backends.whole_graph.compile_whole_graph`.

    Returns:
        The ``torch.compile``'d model (default path), or a :class:`~moe_mlir.backends.cpu.CompiledModel` /
        :class:`~moe_mlir.backends.cuda.CudaCompiledModel`.
    """
    if target not in ("cpu", "cuda"):
        raise ValueError(f"target must be 'cpu' or 'cuda', got {target!r}")
    if backend == "dynamo" and target == "cpu":
        if whole_graph.get("chip") is not None or whole_graph.get("build_dir") is not None:
            raise ValueError("chip= and build_dir= apply to target='cuda' only")
        if whole_graph:
            raise ValueError(f"{sorted(whole_graph)} apply to the whole-graph path only "
                             f"(backend in {WHOLE_GRAPH_BACKENDS} or target='cuda')")
        compiled = torch.compile(model, backend="moe", dynamic=dynamic, options={"dense": dense})
        if isinstance(model, torch.nn.Module):
            from .experts import SelectedExperts, hf_experts_modules

            if hf_experts_modules(model):  # HF experts: the dispatch-plan implementation, for each call
                return SelectedExperts(compiled, model)
        return compiled
    if backend not in ("dynamo",) + WHOLE_GRAPH_BACKENDS:
        raise ValueError(f"backend must be 'dynamo', 'auto', 'executor' or 'runner', got {backend!r}")
    if target == "cuda" and backend == "dynamo":
        backend = "auto"  # the CUDA target is the whole-graph split
    from .backends.whole_graph import compile_whole_graph

    return compile_whole_graph(model, example_args, target=target, backend=backend, **whole_graph)
