"""moe_mlir: the PyTorch front end of MoE-MLIR.

* :mod:`moe_mlir.ops` registers ``torch.ops.moe.*`` (the six dialect ops) with eager reference kernels;
* :mod:`moe_mlir.importer` turns a ``torch.nn.Module`` into MLIR text (``func.func @forward``) for ``moe-opt``;
* :mod:`moe_mlir.compiler` drives ``moe-opt`` and executes compiled modules (``moe_mlir.compile``,
  ``torch.compile(backend="moe")``); :mod:`moe_mlir.gpu` is its ``target="cuda"`` (routing on the moe GPU kernels,
  the rest of the graph eager on CUDA);
* :mod:`moe_mlir.metrics` has the routing-stability metrics of Mutual-Inform §4;
* :mod:`moe_mlir.models` has one complete SMoE transformer block per seed router.
"""

from . import ops  # noqa: F401  (registers torch.ops.moe.*)
from . import metrics  # noqa: F401
from .importer import import_model, import_program, MoEImportError  # noqa: F401
from .compiler import compile, CompiledModel, find_moe_opt, run_moe_opt  # noqa: F401

__all__ = [
    "ops",
    "metrics",
    "import_model",
    "MoEImportError",
    "compile",
    "CompiledModel",
    "find_moe_opt",
    "run_moe_opt",
]
