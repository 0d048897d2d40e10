"""The whole-graph path's entry points over its two targets: :func:`compile_whole_graph` (``moe_mlir.compile`` with
``backend="auto"|"executor"|"runner"`` or ``target="cuda"``) and :func:`whole_graph_backend`
(``torch.compile(backend="moe", options={"whole_graph": True})``). CPU: :mod:`.cpu`; CUDA: :mod:`.cuda`."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import torch

from .cpu import CompiledModel, compile_cpu
from .cuda import CudaCompiledModel, compile_cuda

__all__ = ["compile_whole_graph", "whole_graph_backend", "backend_target"]


def compile_whole_graph(
    model: torch.nn.Module,
    example_args: Sequence[Any],
    *,
    target: str = "cpu",
    backend: str = "auto",
    params: str = "constant",
    raise_idioms: bool = True,
    func_name: str = "forward",
    chip: Optional[str] = None,
    build_dir: Optional[str] = None,
) -> Union[CompiledModel, CudaCompiledModel]:
    """Compiles ``model`` (eval mode) whole for the shapes of ``example_args`` (``moe_mlir.compile`` with
    ``backend="auto"|"executor"|"runner"`` or ``target="cuda"``).

    Args:
        target: ``"cpu"`` (the whole graph lowered with ``--moe-lower-to-llvm``) or ``"cuda"``: the moe ops
            (routing) run on the moe GPU kernels and the rest of the graph in eager PyTorch CUDA; returns a
            :class:`moe_mlir.backends.cuda.CudaCompiledModel` (see :mod:`moe_mlir.backends.cuda` for the split and why). Compiling
            for CUDA needs the CUDA toolkit but no GPU; calling the result needs CUDA tensors.
        backend: ``"auto"`` | ``"executor"`` | ``"runner"`` (see the module doc); CPU target only.
        params: ``"constant"`` (weights folded into the code) or ``"argument"``; CPU target only (on CUDA the
            weights are always the model's tensors, on the device).
        chip, build_dir: CUDA target only: the ``sm_XY`` to build for (default: the visible device's, else
            ``$MOE_GPU_CHIP`` or sm_90) and where to keep the build (default: a content-addressed cache).

    Raises:
        MoEImportError: an op the importer cannot lower. MoEOptError: the module does not verify or lower (for
        CUDA: a moe op without a GPU kernel for these operands). FileNotFoundError: the requested backend's tools
        are missing (:class:`moe_mlir.backends.cuda.GpuToolchainError` for the GPU build).
    """
    if target == "cuda":
        if backend != "auto":
            raise ValueError(f"backend={backend!r} applies to target='cpu' only")
        if params != "constant":
            raise ValueError("params= applies to target='cpu' only (target='cuda' passes the weights as device "
                             "tensors)")
        return compile_cuda(model, example_args, raise_idioms=raise_idioms, func_name=func_name, chip=chip,
                            build_dir=build_dir)
    if target != "cpu":
        raise ValueError(f"target must be 'cpu' or 'cuda', got {target!r}")
    if chip is not None or build_dir is not None:
        raise ValueError("chip= and build_dir= apply to target='cuda' only")
    return compile_cpu(model, example_args, backend=backend, params=params, raise_idioms=raise_idioms,
                       func_name=func_name)


# ----------------------------------------------------------------------------------------------------------------
# torch.compile(backend="moe")
# ----------------------------------------------------------------------------------------------------------------


def whole_graph_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **options: Any) -> Callable[..., Any]:
    """``torch.compile(backend="moe", options={"whole_graph": True})``: compiles each Dynamo graph with
    :func:`compile_whole_graph` (static shapes: ``dynamic=False``).

    Dynamo calls the result with the graph's inputs and expects the graph's output structure back. The target
    follows the inputs (``options["target"]`` overrides it, see :func:`backend_target`): CUDA inputs take the GPU
    path (routing on the moe kernels, the rest eager on CUDA: results stay on the device); otherwise the CPU
    target, whose results are moved back to the inputs' device.
    """
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor):
            raise NotImplementedError(
                f"input {i} of the graph is a {type(x).__name__}: the whole-graph path needs static shapes "
                "(torch.compile(..., backend='moe', dynamic=False, options={'whole_graph': True})); the default "
                "moe backend handles dynamic shapes"
            )
    options = dict(options)
    options["target"] = backend_target(example_inputs, options.get("target"))
    compiled = compile_whole_graph(gm, example_inputs, **options)
    if options["target"] == "cuda":
        run_cuda = lambda *args: compiled(*args)  # noqa: E731
        run_cuda.compiled = compiled  # type: ignore[attr-defined]
        return run_cuda
    device = example_inputs[0].device if example_inputs else torch.device("cpu")

    def run(*args: torch.Tensor) -> Any:
        out = compiled(*args)
        return torch.utils._pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, out)

    run.compiled = compiled  # type: ignore[attr-defined]
    return run


def backend_target(example_inputs: Sequence[Any], requested: Optional[str] = None) -> str:
    """The target of a ``torch.compile(backend="moe")`` graph: ``requested`` if given, else ``"cuda"`` when any
    tensor input is on a CUDA device, else ``"cpu"``. Inputs on several device types are refused."""
    types = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
    if requested is not None:
        if requested not in ("cpu", "cuda"):
            raise ValueError(f"target must be 'cpu' or 'cuda', got {requested!r}")
        return requested
    if "cuda" in types:
        if types - {"cuda"}:
            raise ValueError(f"the graph's inputs are on several device types ({sorted(types)}): the moe backend "
                             "compiles for one target")
        return "cuda"
    return "cpu"
