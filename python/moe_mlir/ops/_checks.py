"""The validators' building blocks: the verifier's rules (``include/MoE/IR``), worded as the C++ extension words
them (``lib/Runtime/Torch/TorchKernels.h``), run by the eager kernels, the fake kernels and the kernel cache."""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)
#: The most elements a tensor of the kernels may have (they index with i32; moe::checkKernelLimits).
_I32_MAX = 2**31 - 1


def _fail(op: str, msg: str) -> None:
    raise ValueError(f"moe.{op}: {msg}")


def _check_float(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"moe.{op}: '{name}' must be f32, f16 or bf16, got {t.dtype}")


def _check_index(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"moe.{op}: '{name}' must be i32 or i64, got {t.dtype}")


def _check_rank(op: str, name: str, t: Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        _fail(op, f"'{name}' must have rank {rank} ({layout}), got shape {list(t.shape)}")


def _check_dim(op: str, name: str, t: Tensor, d: int, expected: int, what: str) -> None:
    if t.shape[d] != expected:
        _fail(op, f"dimension {d} of '{name}' ({t.shape[d]}) must equal {what} ({expected})")


def _check_operands(op: str, *operands: tuple[Callable, str, Tensor, int, str]) -> None:
    """``(check, name, tensor, rank, layout)`` per operand: every dtype check (``_check_float``/``_check_index``)
    first, then every rank, in order (the verifier's order)."""
    for check, name, t, _, _ in operands:
        check(op, name, t)
    for _, name, t, rank, layout in operands:
        _check_rank(op, name, t, rank, layout)


def _check_result_elements(op: str, name: str, shape: Sequence) -> None:
    """A result whose size the operands do not bound (a size argument, or sizes of two operands multiplied) holds
    at most 2^31 - 1 elements: checked before anything is allocated, in the words of the C++ extension's
    ``checkResultElements``. A symbolic size (torch.compile's dynamic shapes) is left to the run-time check."""
    n = math.prod(shape)
    if isinstance(n, int) and n > _I32_MAX:
        _fail(op, f"the result '{name}' of shape {list(shape)} would have {n} elements, more than the kernels "
                  f"support: at most {_I32_MAX} per tensor (2^31 - 1: the kernels index with i32)")


def _check_enum(op: str, attr: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        _fail(op, f"'{attr}' must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")


def _check_positive_finite(op: str, attr: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        _fail(op, f"'{attr}' ({value}) must be > 0 and finite")


def _check_index_range(op: str, name: str, t: Tensor, bound: int) -> None:
    """Raises on any value of ``t`` outside ``[0, bound)`` (a data-dependent check: eager kernels only)."""
    if t.numel() == 0:
        return
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= bound:
        bad = lo if lo < 0 else hi
        _fail(op, f"'{name}' holds {bad}, outside [0, {bound}): the value indexes no expert")


# The attribute parsers of the kernel cache's validators (KEY_VALIDATORS: attributes come as strings).


def _f(v: str) -> float:
    return float(v)



def _of(v: str) -> Optional[float]:
    return None if v == "none" else float(v)

