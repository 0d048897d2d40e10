"""The whole-graph path's use of ``moe-opt`` (verify, lower) and its run-time errors. The tools run through the
compiler driver :mod:`moe_mlir.runtime.driver` (``run_moe_opt``, ``MoEOptError``); where they and the build's
libraries are is :mod:`moe_mlir.runtime.locate`."""

from __future__ import annotations

from typing import Optional, Sequence

from ..runtime.driver import run_moe_opt

__all__ = ["MoERuntimeError", "refuse_gradients", "verify", "lower_to_llvm"]


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
