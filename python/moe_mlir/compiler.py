"""Compatibility module: the whole-graph path moved to :mod:`moe_mlir.backends.cpu` (tools:
:mod:`moe_mlir.backends.tools`), ``compile`` to :mod:`moe_mlir.api` and the ``torch.compile`` backend to
:mod:`moe_mlir.backends.dynamo`."""

from .api import compile  # noqa: F401
from .backends.cpu import CompiledModel, ExecutorLibrary, compile_cpu, run_with_mlir_runner, runner_module  # noqa: F401
from .backends.whole_graph import backend_target, compile_whole_graph, whole_graph_backend  # noqa: F401
from .backends.dynamo import moe_backend  # noqa: F401
from .backends.tools import (LLVM_BIN, LLVM_LIB, REPO_ROOT, MoEOptError, MoERuntimeError, find_mlir_runner,  # noqa: F401
                             find_moe_opt, find_runtime_lib, lower_to_llvm, run_moe_opt, verify)
