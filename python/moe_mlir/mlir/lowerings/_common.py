"""Helpers shared by the lowering modules of :mod:`moe_mlir.mlir.lowerings`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

import torch

from ...runtime.abi import DTYPE_OF_ELEM
from ..builder import Value, mlir_elem

if TYPE_CHECKING:  # pragma: no cover
    from ..importer import FxImporter

Scalar = Union[bool, int, float]


def _norm_dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _dims(dim: Any, rank: int) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(rank))
    if isinstance(dim, int):
        return [_norm_dim(dim, rank)]
    return sorted({_norm_dim(d, rank) for d in dim})


def _compute_elem(imp: FxImporter, *operands: Any) -> str:
    """The promoted element type of ``operands`` (torch.result_type on the fake values)."""
    vals = []
    for o in operands:
        if isinstance(o, Value):
            vals.append(torch.empty((), dtype=_dtype(o.type.elem)))
        elif o is not None:
            vals.append(o)
    if not vals:
        raise NotImplementedError("no operands")
    dt = vals[0] if isinstance(vals[0], torch.Tensor) else torch.tensor(vals[0])
    for v in vals[1:]:
        dt = torch.empty((), dtype=torch.result_type(dt, v))
    return mlir_elem(dt.dtype)


def _dtype(elem: str) -> torch.dtype:
    return DTYPE_OF_ELEM[elem]
