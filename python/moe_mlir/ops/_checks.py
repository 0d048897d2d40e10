"""What the torch ops check beyond their kernel key's op (whose ODS verifier checks every call:
:mod:`moe_mlir.runtime.verify`): the values of index operands, which only the eager references read before they index
with them (the kernels report theirs), and the one wording of an op's error."""

from __future__ import annotations

from torch import Tensor


def _fail(op: str, msg: str) -> None:
    raise ValueError(f"moe.{op}: {msg}")


def _check_index_range(op: str, name: str, t: Tensor, bound: int) -> None:
    """Raises on any value of ``t`` outside ``[0, bound)`` (a data-dependent check: eager kernels only)."""
    if t.numel() == 0:
        return
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= bound:
        bad = lo if lo < 0 else hi
        _fail(op, f"'{name}' holds {bad}, outside [0, {bound}): the value indexes no expert")
