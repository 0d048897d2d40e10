"""Memref descriptors and dtype names for calling compiled MLIR code from Python (ctypes).

A function lowered with ``llvm.emit_c_interface`` (``_mlir_ciface_<name>``) takes each ranked memref argument as a
pointer to ``{T *allocated, T *aligned, int64 offset, int64 sizes[R], int64 strides[R]}`` and, when it returns
memrefs, a pointer to a struct of those descriptors as its first argument. This module builds those structs over
torch tensors (no copy) and reads returned ones back.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Sequence

import torch

__all__ = [
    "MLIR_ELEM",
    "DTYPE_OF_ELEM",
    "mlir_elem",
    "memref_struct",
    "result_descriptors",
    "describe",
    "descriptor_shape",
    "tensor_type",
    "memref_type",
    "pointers",
]

#: torch dtype -> MLIR element type: the package's one dtype table (the importer prints with it, the runtime
#: marshals with it). Signless integers: torch-mlir's ``si64`` is ``i64`` once lowered.
MLIR_ELEM: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.bool: "i1",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
}
#: MLIR element type -> torch dtype.
DTYPE_OF_ELEM: dict[str, torch.dtype] = {v: k for k, v in MLIR_ELEM.items()}


def mlir_elem(dtype: torch.dtype) -> str:
    try:
        return MLIR_ELEM[dtype]
    except KeyError:
        raise TypeError(f"no MLIR element type for {dtype}") from None


@functools.lru_cache(maxsize=None)
def memref_struct(rank: int) -> type[ctypes.Structure]:
    """The ctypes struct of a rank-``rank`` memref descriptor (element type erased to ``void *``)."""
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRef{rank}D", (ctypes.Structure,), {"_fields_": fields})


@functools.lru_cache(maxsize=None)
def _results_struct(ranks: tuple[int, ...]) -> type[ctypes.Structure]:
    fields = [(f"r{i}", memref_struct(r)) for i, r in enumerate(ranks)]
    return type("Results", (ctypes.Structure,), {"_fields_": fields})


def result_descriptors(ranks: Sequence[int]) -> tuple[ctypes.Structure, list[ctypes.Structure]]:
    """The result out-parameter of a ``_mlir_ciface_`` function returning memrefs of ``ranks`` (one descriptor, or a
    struct of them; passed by pointer as the first argument), and the descriptors in it, in order (views into it:
    they read what the call wrote)."""
    if len(ranks) == 1:
        res = memref_struct(ranks[0])()
        return res, [res]
    res = _results_struct(tuple(ranks))()
    return res, [getattr(res, f"r{i}") for i in range(len(ranks))]


def describe(t: torch.Tensor, shape: Sequence[int] | None = None) -> ctypes.Structure:
    """A descriptor over ``t``'s storage (no copy), viewed with ``shape`` (default ``t.shape``).

    The tensor must stay alive while the descriptor is used. Strided tensors are described as they are; code
    compiled for identity layouts (the moe kernels) needs contiguous ones.
    """
    shape = tuple(t.shape) if shape is None else tuple(shape)
    d = memref_struct(len(shape))()
    ptr = t.data_ptr()
    d.allocated = d.aligned = ptr
    d.offset = 0
    if shape:
        if shape == tuple(t.shape):
            strides = t.stride()
        else:
            if not t.is_contiguous():
                raise ValueError("a reshaped descriptor needs a contiguous tensor")
            strides, acc = [], 1
            for n in reversed(shape):
                strides.append(acc)
                acc *= max(n, 1)
            strides = tuple(reversed(strides))
        d.sizes[:] = shape
        d.strides[:] = strides
    return d


def descriptor_shape(d: ctypes.Structure) -> tuple[int, ...]:
    return tuple(d.sizes) if hasattr(d, "sizes") else ()


def pointers(descs: Sequence[ctypes.Structure]) -> list[ctypes.c_void_p]:
    """``ctypes.byref``-style pointers to ``descs`` for a ``_mlir_ciface_`` call."""
    return [ctypes.c_void_p(ctypes.addressof(d)) for d in descs]


def _dims(shape: Sequence[object]) -> str:
    return "x".join("?" if d is None or d == "?" else str(d) for d in shape)


def tensor_type(shape: Sequence[object], elem: str) -> str:
    """``tensor<2x?x16xf32>`` (None or ``"?"`` is a dynamic dimension)."""
    dims = _dims(shape)
    return f"tensor<{dims}x{elem}>" if dims else f"tensor<{elem}>"


def memref_type(shape: Sequence[object], elem: str) -> str:
    dims = _dims(shape)
    return f"memref<{dims}x{elem}>" if dims else f"memref<{elem}>"
