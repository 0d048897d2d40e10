"""moe_mlir: the PyTorch front end of MoE-MLIR.

Layers (imports go down only; ``tests/test_layering.py`` checks there is no cycle):

* :mod:`moe_mlir.ops` registers ``torch.ops.moe.*`` (the dialect's ops, their fused forms and their backward ops); :mod:`moe_mlir.runtime` loads kernels;
* :mod:`moe_mlir.functional`: the Pythonic form of the ops (``moe_mlir.route(logits, k=8, scoring=...)``: keyword
  options, named results, int64 indices, callables as scores), re-exported here;
* :mod:`moe_mlir.frontend`: export, raising of routing idioms to ``torch.ops.moe.*``, partitioning;
* :mod:`moe_mlir.mlir`: the MLIR printer (a small builder) and the importer (aten → linalg/moe table);
* :mod:`moe_mlir.backends`: ``dynamo`` (``torch.compile(backend="moe")``: raising, then inductor), ``cpu`` (the
  whole-graph path: moe-opt, executor, mlir-runner), ``cuda`` (the whole-graph CUDA split);
* :mod:`moe_mlir.api`: :func:`compile` over both paths;
* :mod:`moe_mlir.metrics` (routing-stability metrics of Mutual-Inform §4), :mod:`moe_mlir.models` (one SMoE block per
  seed router).

Importing the package loads no MLIR/LLVM library: only the whole-graph executor does, when used.
"""

from ._version import __version__  # noqa: F401
from . import ops  # noqa: F401  (registers torch.ops.moe.*)
from . import metrics  # noqa: F401
from . import functional  # noqa: F401
from .functional import (  # noqa: F401  (the Pythonic API of torch.ops.moe.*)
    AttentionPosterior,
    AttentionPosteriorTopK,
    CapacityResult,
    DispatchPlan,
    Dispersion,
    RouteResult,
    RouterStats,
    RouterWeights,
    adjacency_update,
    apply_capacity,
    attention_posterior,
    attention_posterior_topk,
    bias_update,
    capacity_of,
    dispatch_plan,
    hyper_router,
    load_balancing_loss,
    mad_dispersion,
    route,
    router_stats,
    router_z_loss,
    sequence_balance_loss,
    similarity_inform,
    similarity_inform_topk,
    topk_renorm,
)
from .api import compile  # noqa: F401
from .backends.dynamo import register_backend as _register_backend
from .runtime.driver import run_moe_opt  # noqa: F401
from .runtime.locate import find_moe_opt  # noqa: F401
from .mlir.importer import MoEImportError, import_model, import_program  # noqa: F401


def __getattr__(name: str):
    if name == "CompiledModel":  # the whole-graph path's result (kept at the top level for compatibility)
        from .backends.cpu import CompiledModel

        return CompiledModel
    raise AttributeError(f"module 'moe_mlir' has no attribute {name!r}")


def _backend_found_by_entry_point() -> bool:
    """Whether Dynamo will find ``"moe"`` through this package's ``torch_dynamo_backends`` entry point (an installed
    or editable package: pyproject.toml), so that ``import moe_mlir`` need not register it. Registering imports
    ``torch._dynamo``: 2-3 s of every ``import moe_mlir`` (bench/compile.py), and with it torch's import-time log
    lines, for users of ``torch.ops.moe.*`` who never compile."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        eps = distribution("moe_mlir").entry_points
    except (ImportError, PackageNotFoundError):
        return False
    return any(e.group == "torch_dynamo_backends" and e.name == "moe"
               and e.value == "moe_mlir.backends.dynamo:moe_backend" for e in eps)


if "torch._dynamo" in __import__("sys").modules or not _backend_found_by_entry_point():
    _register_backend()

__all__ = [
    "__version__",
    "ops",
    "functional",
    *functional.__all__,
    "metrics",
    "import_model",
    "import_program",
    "MoEImportError",
    "compile",
    "CompiledModel",
    "find_moe_opt",
    "run_moe_opt",
]
