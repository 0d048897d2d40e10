"""The MLIR tools of the whole-graph path: running ``moe-opt`` (verify, lower) and its errors. The tools run through
the compiler driver :mod:`moe_mlir.runtime.driver`; where they and the build's libraries are is
:mod:`moe_mlir.runtime.locate` (both re-exported here)."""

from __future__ import annotations

from typing import Optional, Sequence

from ..runtime.driver import MoEOptError, run_moe_opt
from ..runtime.locate import LLVM_BIN, LLVM_LIB, REPO_ROOT, _build_dirs, find_mlir_runner, find_moe_opt, find_runtime_lib  # noqa: F401

__all__ = ["MoEOptError", "MoERuntimeError", "refuse_gradients", "find_moe_opt", "find_mlir_runner",
           "find_runtime_lib", "run_moe_opt", "verify", "lower_to_llvm", "LLVM_BIN", "LLVM_LIB", "REPO_ROOT"]


class MoERuntimeError(RuntimeError):
    """The compiled code reported a run-time error (e.g. an index operand out of range)."""


def refuse_gradients(args: Sequence[object]) -> None:
    """The whole-graph paths are forward-only (weights folded into the code or detached, no backward): with grad
    mode on, an input that requires grad would get a result that silently carries no gradient, so it is an error."""
    import torch

    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        raise RuntimeError(
            "the whole-graph path (moe_mlir.compile with backend='auto'|'executor'|'runner' or target='cuda', "
            "torch.compile options={'whole_graph': True}) is forward-only: call it under torch.no_grad() or on "
            "inputs that do not require grad; to train, use moe_mlir.compile(model) (the default path) or "
            "torch.compile(model, backend='moe')")


def verify(mlir_text: str, *, moe_opt: Optional[str] = None) -> None:
    """Parses and verifies ``mlir_text`` with moe-opt (raises :class:`MoEOptError`)."""
    run_moe_opt(mlir_text, [], moe_opt=moe_opt)


def lower_to_llvm(mlir_text: str, *, moe_opt: Optional[str] = None) -> str:
    """``moe-opt --canonicalize --moe-lower-to-llvm``: the LLVM-dialect module."""
    return run_moe_opt(mlir_text, ["--canonicalize", "--moe-lower-to-llvm"], moe_opt=moe_opt)
