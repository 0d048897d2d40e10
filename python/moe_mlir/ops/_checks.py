"""What the torch ops check beyond their kernel key's op (whose ODS verifier checks every call:
:mod:`moe_mlir.runtime.verify`): the values of index operands, which only the eager references read before they index
with them (the kernels report theirs), and the one wording of an op's errors.

The error policy, that of torch and of the verifier's diagnostics: :class:`TypeError` for a dtype (or a Python
argument of the wrong type), :class:`ValueError` for a shape or a value (an option outside its choices, an index
outside its range), :class:`RuntimeError` for a device (operands on different devices)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch
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


def index_dtype(op: str, dtype: Any) -> Any:
    """The dtype of an op's index results: ``torch.int32`` (None: the default) or ``torch.int64`` (as ``torch.topk``
    gives them); a TypeError for any other (the C++ op's moe_torch::indexDtype says the same)."""
    if dtype is None:
        return torch.int32
    if dtype not in (torch.int32, torch.int64):
        raise TypeError(f"moe.{op}: 'indices_dtype' must be torch.int32 or torch.int64, got {dtype}")
    return dtype


def indices_dtype_check(op: str):
    """The ``check`` of a torch op that takes ``indices_dtype`` (``moe_op``'s, given the arguments by name)."""
    def check(indices_dtype=None, **_) -> None:
        index_dtype(op, indices_dtype)
    return check


def _choices(values: Iterable[str]) -> str:
    """``'a', 'b', 'c'``: the list of valid values as the op verifier words it (KernelKey.h)."""
    return ", ".join(repr(v) for v in values)


def _check_choice(op: str, name: str, value: Any, choices: tuple[str, ...], extra: str = "") -> None:
    """ValueError unless ``value`` is one of ``choices`` (an option's ``Literal`` values); ``extra`` names what else
    the option takes (``" or a callable"``). The wording is the verifier's for the torch ops' enum attributes."""
    if not (isinstance(value, str) and value in choices):
        _fail(op, f"'{name}' must be one of {_choices(choices)}{extra}, got {value!r}")


def _check_same_device(op: str, tensors: dict[str, Optional[Tensor]]) -> None:
    """RuntimeError when the tensor operands (by name; None for an absent optional one) are on different devices."""
    first: Optional[tuple[str, Tensor]] = None
    for name, t in tensors.items():
        if t is None:
            continue
        if first is None:
            first = (name, t)
        elif t.device != first[1].device:
            raise RuntimeError(f"moe.{op}: '{name}' is on {t.device} but '{first[0]}' is on {first[1].device}: "
                               "every tensor operand must be on one device")
