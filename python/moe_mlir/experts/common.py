"""What the experts' modules share: the spans of expert-sorted rows, and whether the torch extension's CPU
kernels serve a call (lib/Runtime/Torch/ExpertOps.cpp)."""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor


def _spans(o: list[int]) -> Iterator[tuple[int, int, int]]:
    """(expert, start, end) for each expert with rows, from the offsets read to the host once."""
    for e in range(len(o) - 1):
        if o[e + 1] > o[e]:
            yield e, o[e], o[e + 1]


#: Tests only: False keeps :func:`expert_mlp` on its Python loop (the reference of the extension's kernel).
NATIVE_MLP = True


def _native_mlp(x: Tensor) -> bool:
    """Whether :func:`expert_mlp` runs the extension's kernel (lib/Runtime/Torch/ExpertOps.cpp: the experts spread
    over torch's threads, BLAS on per-thread scratch, the same sum order): f32/f64 CPU tensors, the extension loaded."""
    if not NATIVE_MLP or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    from ..runtime import extension

    return extension.library_path is not None and hasattr(torch.ops.moe_mlir, "expert_mlp_cpu")


def _native_operands(x: Tensor, w: Tensor) -> bool:
    """Operands the extension's grouped GEMM takes: x and w of one dtype that :func:`_native_mlp` takes."""
    return _native_mlp(x) and w.dtype == x.dtype
