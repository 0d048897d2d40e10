"""The MLIR tools of the whole-graph path: running ``moe-opt`` (verify, lower) and its errors. Where the tools and
the build's libraries are is :mod:`moe_mlir.runtime.locate` (re-exported here)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional, Sequence

from ..runtime.locate import LLVM_BIN, LLVM_LIB, REPO_ROOT, _build_dirs, find_mlir_runner, find_moe_opt, find_runtime_lib  # noqa: F401

__all__ = ["MoEOptError", "MoERuntimeError", "refuse_gradients", "find_moe_opt", "find_mlir_runner",
           "find_runtime_lib", "run_moe_opt", "verify", "lower_to_llvm", "LLVM_BIN", "LLVM_LIB", "REPO_ROOT"]

class MoEOptError(RuntimeError):
    """``moe-opt`` rejected the module (parse, verifier or pass failure); carries its stderr."""


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


def run_moe_opt(mlir_text: str, args: Sequence[str] = (), *, moe_opt: Optional[str] = None,
                timeout: float = 600) -> str:
    """Runs ``moe-opt <args>`` on ``mlir_text`` and returns its stdout.

    Raises:
        FileNotFoundError: no moe-opt. MoEOptError: a non-zero exit (the message holds moe-opt's diagnostics).
    """
    tool = moe_opt or find_moe_opt()
    if tool is None:
        raise FileNotFoundError("moe-opt not found: build it (cmake --build build) or set MOE_OPT")
    proc = subprocess.run([tool, *args, "-"], input=mlir_text, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise MoEOptError(f"moe-opt {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return proc.stdout


def verify(mlir_text: str, *, moe_opt: Optional[str] = None) -> None:
    """Parses and verifies ``mlir_text`` with moe-opt (raises :class:`MoEOptError`)."""
    run_moe_opt(mlir_text, [], moe_opt=moe_opt)


def lower_to_llvm(mlir_text: str, *, moe_opt: Optional[str] = None) -> str:
    """``moe-opt --canonicalize --moe-lower-to-llvm``: the LLVM-dialect module."""
    return run_moe_opt(mlir_text, ["--canonicalize", "--moe-lower-to-llvm"], moe_opt=moe_opt)
