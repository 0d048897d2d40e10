"""Grouped GEMMs over expert-sorted rows: ``moe_mlir::grouped_mm`` (one GEMM per projection of the dispatch
plan's rows) and ``moe_mlir::grouped_mm_ends`` (transformers' grouped GEMM fallback, raised by
:mod:`moe_mlir.frontend.hf_rewrites`, on the extension's kernel), each with its backward."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from .common import _native_operands, _spans

__all__ = ["grouped_mm", "hf_grouped_mm_target"]


# ----------------------------------------------------------------------------------------------------------------
# One GEMM per projection over expert-sorted rows
# ----------------------------------------------------------------------------------------------------------------


def _check_grouped(x: Tensor, w: Tensor, offsets: Tensor) -> None:
    if x.dim() != 2 or w.dim() != 3:
        raise ValueError(f"grouped_mm: x must be [S, K] and w [E, K, N], got {list(x.shape)} and {list(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"grouped_mm: x has K = {x.shape[1]} columns but w has K = {w.shape[1]} rows")
    if offsets.dim() != 1 or offsets.shape[0] != w.shape[0] + 1:
        raise ValueError(f"grouped_mm: offsets must be [E+1] = [{w.shape[0] + 1}], got {list(offsets.shape)}")
    # The dtypes: TypeError (the torch ops' policy, moe_mlir/ops/_checks.py).
    if offsets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"grouped_mm: offsets must be int32 or int64, got {offsets.dtype}")
    if x.dtype != w.dtype:
        raise TypeError(f"grouped_mm: x is {x.dtype} but w is {w.dtype}")


#: The padded path (:func:`_grouped_mm_padded`) computes ``E * C`` rows (``C``: the most rows of one expert) where
#: the loop computes ``S``; it is taken while ``E * C <= _PAD_MAX_WASTE * S``. That bounds, against the loop, both its
#: GEMM work and padded buffers (``<= 4x`` the rows) and its weight reads: every expert with rows has at most ``C``
#: of them, so at least ``S / C >= E / 4`` experts have rows, and the bmm's reading all ``E`` weight matrices is
#: ``<= 4x`` the loop's. No additive constant: at small ``S`` (decode: ``S = T*k`` rows over ``E = 64..256``
#: experts) a constant would admit reading every expert's weights for a handful of rows, which is what decode
#: costs. Balanced routing has ``C`` a small multiple of ``S / E`` (H100 prefill shapes: ``S = 4096``, ``E = 64`` or
#: 256), inside the bound; skewed routing (one expert holding most rows) is not, and keeps the loop. The factor 4
#: is a judgement, not a GPU measurement.
_PAD_MAX_WASTE = 4

#: Tests only: ``"padded"`` / ``"loop"`` forces that path of ``moe_mlir::grouped_mm`` and its backward on any
#: device (within the padded path's preconditions); None: :func:`_grouped_mm_path`'s rule.
_FORCE_PATH: Optional[str] = None


def _regular(o: list[int]) -> bool:
    """Offsets of at least one expert, from 0, that do not decrease (the layouts the padded path and the extension's
    kernel express; other offsets keep the Python loop's own semantics)."""
    return len(o) > 1 and o[0] == 0 and all(b >= a for a, b in zip(o, o[1:]))


def _grouped_mm_path(device: torch.device, o: list[int]) -> str:
    """``"padded"`` or ``"loop"`` for rows on ``device`` with host offsets ``o``: the padded batched GEMM on CUDA
    (O(1) kernel launches instead of the loop's one ``mm`` per expert with rows, the launches dominating at
    prefill sizes) while :data:`_PAD_MAX_WASTE` bounds its waste; the loop elsewhere (slower padded on this
    project's CPU, see :func:`_grouped_mm_padded`) and for offsets the padded layout cannot express
    (``o[0] != 0``, decreasing: the loop's semantics, whatever they are, are kept)."""
    if not _regular(o):
        return "loop"
    if _FORCE_PATH is not None:
        return _FORCE_PATH
    counts = [b - a for a, b in zip(o, o[1:])]
    rows = o[-1]
    return "padded" if device.type == "cuda" and len(counts) * max(counts) <= _PAD_MAX_WASTE * rows else "loop"


def _pad_slots(offsets: Tensor, rows: int, cap: int) -> Tensor:
    """For each sorted row ``r`` its slot ``expert_r * cap + (r - offsets[expert_r])`` in an ``[E * cap]`` padded
    layout (no host read: ``repeat_interleave`` is told its output size)."""
    offs = offsets.long()
    E = offs.shape[0] - 1
    expert = torch.repeat_interleave(torch.arange(E, device=offs.device), offs[1:] - offs[:-1], output_size=rows)
    return expert * cap + (torch.arange(rows, device=offs.device) - offs[expert])


def _pad(t: Tensor, slots: Tensor, E: int, cap: int) -> Tensor:
    """``t``'s rows placed at ``slots`` of a zero ``[E, cap, t.shape[1]]`` buffer."""
    return t.new_zeros((E * cap, t.shape[1])).index_copy_(0, slots, t).view(E, cap, t.shape[1])


def _like(ref: Tensor, t: Tensor) -> Tensor:
    """``t`` with ``ref``'s strides (the fake implementations promise ``empty_like`` layouts)."""
    return t if t.stride() == ref.stride() else torch.empty_like(ref).copy_(t)


def _cap(offsets: Tensor, o: Optional[list[int]]) -> int:
    if o is None:
        o = offsets.tolist()
    return max((b - a for a, b in zip(o, o[1:])), default=0)


def _grouped_mm_padded(x: Tensor, w: Tensor, offsets: Tensor, o: Optional[list[int]] = None) -> Tensor:
    """``moe_mlir::grouped_mm`` as one batched GEMM: the sorted rows scattered into a zero ``[E, C, K]`` buffer
    (``C``: the most rows of one expert; experts with fewer, or none, get zero rows), one ``bmm`` with ``w``, the
    real rows gathered back: a fixed number of kernels whatever ``E`` (the slots, the zero fill and scatter, one
    ``bmm``, the gather; plus the one host read of the offsets the caller made, ``o``).
    Needs ``offsets[0] = 0``, non-decreasing offsets and ``offsets[-1] = S`` (checked by the op). Equal to the loop
    up to f32 summation order (bmm and mm may block differently). On this project's CPU (S = 4096, E = 64,
    K = N = 256, f32, random top-8 routing, C = 82; the shared 2-core machine, min of 9 runs) it was slower: 1
    thread 15.2 vs 11.3 ms forward, 39 vs 23 ms backward (2 threads: 20.5 vs 21.2 and 81 vs 55 ms, noisy), so the
    CPU keeps the loop. Its speed on a GPU is not measured yet."""
    E, N = w.shape[0], w.shape[2]
    S = x.shape[0]
    cap = _cap(offsets, o)
    if S == 0 or cap == 0:
        return x.new_zeros((S, N))
    slots = _pad_slots(offsets, S, cap)
    return torch.bmm(_pad(x, slots, E, cap), w).view(E * cap, N).index_select(0, slots)


def _grouped_mm_padded_backward(grad: Tensor, x: Tensor, w: Tensor, offsets: Tensor,
                                o: Optional[list[int]] = None) -> tuple[Tensor, Tensor]:
    """The padded path's backward: ``grad_x = bmm(grad_pad, w^T)`` gathered back, ``grad_w = bmm(x_pad^T,
    grad_pad)`` (zero for experts without rows: their padded rows are zero), 2 GEMMs whatever ``E``."""
    E, K = w.shape[0], w.shape[1]
    S = x.shape[0]
    cap = _cap(offsets, o)
    if S == 0 or cap == 0:
        return torch.zeros_like(x), torch.zeros_like(w)
    slots = _pad_slots(offsets, S, cap)
    grad_pad = _pad(grad, slots, E, cap)
    grad_x = torch.bmm(grad_pad, w.transpose(1, 2)).view(E * cap, K).index_select(0, slots)
    grad_w = torch.bmm(_pad(x, slots, E, cap).transpose(1, 2), grad_pad)
    return _like(x, grad_x), _like(w, grad_w)


def _native_gemm(x: Tensor, w: Tensor, o: list[int]) -> bool:
    """Whether the CPU loop of ``moe_mlir::grouped_mm`` runs as the extension's kernel (grouped_mm_cpu in
    lib/Runtime/Torch/ExpertOps.cpp: the experts' GEMMs spread over torch's threads): f32/f64 CPU operands and
    offsets from 0 that do not decrease (other offsets keep the loop's own semantics)."""
    return _native_operands(x, w) and _regular(o)


@torch.library.custom_op("moe_mlir::grouped_mm", mutates_args=())
def _grouped_mm_op(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    _check_grouped(x, w, offsets)
    out = x.new_empty((x.shape[0], w.shape[2]))
    if not out.numel():
        return out
    o = offsets.tolist()  # the one host read: the check, the path and the loop's spans
    if o[-1] != x.shape[0]:
        raise ValueError(f"grouped_mm: offsets[-1] = {o[-1]} must equal the number of rows {x.shape[0]}")
    if _native_gemm(x, w, o) and _grouped_mm_path(x.device, o) == "loop":
        return torch.ops.moe_mlir.grouped_mm_cpu(x, w, offsets)
    return _grouped_rows(x, w, offsets, o, out)


def _grouped_rows(x: Tensor, w: Tensor, offsets: Tensor, o: list[int], out: Tensor) -> Tensor:
    """``out[o[e]:o[e+1]] = x[o[e]:o[e+1]] @ w[e]`` in torch ops, on the path :func:`_grouped_mm_path` picks (the
    padded batched GEMM, or one ``mm`` per expert with rows into ``out``); ``o`` is ``offsets`` read on the host."""
    if _grouped_mm_path(x.device, o) == "padded":
        return _grouped_mm_padded(x, w, offsets, o)
    for e, a, b in _spans(o):
        torch.mm(x[a:b], w[e], out=out[a:b])
    return out


@_grouped_mm_op.register_fake
def _(x, w, offsets):
    _check_grouped(x, w, offsets)
    return x.new_empty((x.shape[0], w.shape[2]))


@torch.library.custom_op("moe_mlir::grouped_mm_backward", mutates_args=())
def _grouped_mm_backward_op(grad: Tensor, x: Tensor, w: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    o = offsets.tolist()
    if _native_gemm(x, w, o) and _grouped_mm_path(x.device, o) == "loop":
        grad_x, grad_w = torch.ops.moe_mlir.grouped_mm_backward_cpu(grad, x, w, offsets, grad_w_like_w=True)
        return grad_x, _like(w, grad_w)
    return _grouped_rows_backward(grad, x, w, offsets, o)


def _grouped_rows_backward(grad: Tensor, x: Tensor, w: Tensor, offsets: Tensor,
                           o: list[int]) -> tuple[Tensor, Tensor]:
    """:func:`_grouped_rows`' backward (grad_x and grad_w in x's and w's strides), on the same path."""
    if x.shape[0] and o[-1] == x.shape[0] and _grouped_mm_path(x.device, o) == "padded":
        return _grouped_mm_padded_backward(grad, x, w, offsets, o)
    grad_x = torch.zeros_like(x)
    grad_w = torch.zeros_like(w)
    for e, a, b in _spans(o):
        torch.mm(grad[a:b], w[e].t(), out=grad_x[a:b])
        torch.mm(x[a:b].t(), grad[a:b], out=grad_w[e])
    return grad_x, grad_w


@_grouped_mm_backward_op.register_fake
def _(grad, x, w, offsets):
    return torch.empty_like(x), torch.empty_like(w)


def _grouped_mm_setup(ctx, inputs, output):
    x, w, offsets = inputs
    ctx.save_for_backward(x, w, offsets)


def _grouped_mm_backward(ctx, grad):
    x, w, offsets = ctx.saved_tensors
    grad_x, grad_w = _grouped_mm_backward_op(grad.contiguous(), x, w, offsets)
    return grad_x, grad_w, None


_grouped_mm_op.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


def grouped_mm(x: Tensor, w: Tensor, offsets: Tensor) -> Tensor:
    """``out[offsets[e]:offsets[e+1]] = x[offsets[e]:offsets[e+1]] @ w[e]`` for every expert ``e``.

    Args:
        x: ``[S, K]`` rows sorted by expert; w: ``[E, K, N]`` (any strides: pass ``W.transpose(1, 2)`` for
        ``nn.Linear``-layout ``[E, N, K]`` weights); offsets: ``[E+1]`` integer, ``offsets[0] = 0``,
        ``offsets[E] = S``.
    """
    if (x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch.nn.functional, "grouped_mm")
            and torch.cuda.get_device_capability(x.device) >= (8, 0)):
        return torch.nn.functional.grouped_mm(x, w, offs=offsets[1:].to(torch.int32))
    return _grouped_mm_op(x, w, offsets)


# ----------------------------------------------------------------------------------------------------------------
# transformers' grouped GEMM (its fallback under torch.compile) on the extension's kernel or grouped_mm's paths
# ----------------------------------------------------------------------------------------------------------------


def _check_ends(x: Tensor, w: Tensor, offs: Tensor, transposed: bool) -> None:
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[2 if transposed else 1]:
        raise ValueError(f"grouped_mm_ends: x must be [S, K] and w [E, K, N] ([E, N, K] with transposed), got "
                         f"{list(x.shape)} and {list(w.shape)}")
    if offs.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"grouped_mm_ends: offs (the ends) must be int32 or int64, got {offs.dtype}")
    if offs.dim() != 1 or offs.shape[0] != w.shape[0]:
        raise ValueError(f"grouped_mm_ends: offs must be [E] = [{w.shape[0]}] (the ends), got {list(offs.shape)}")


def _ends_offsets(offs: Tensor, rows: int) -> tuple[Tensor, list[int]]:
    """The ``[E+1]`` offsets ``[0, *offs]`` of :func:`_grouped_rows` and their host copy (the one host read, as in
    transformers' loop), checked: ends that decrease or pass the rows raise ValueError."""
    offsets = torch.cat([offs.new_zeros(1), offs]).long()
    o = offsets.tolist()
    if not _regular(o) or o[-1] > rows:
        raise ValueError(f"grouped_mm_ends: the ends must not decrease and stay within the {rows} rows, got {o[1:]}")
    return offsets, o


def _ends_in_torch(x: Tensor, w: Tensor, offs: Tensor, transposed: bool) -> Tensor:
    """grouped_mm_ends in torch ops (CUDA, dtypes the kernel does not take): the rows up to the last end on
    :func:`_grouped_rows`' path, zeros after them."""
    wk = w.transpose(1, 2) if transposed else w
    offsets, o = _ends_offsets(offs, x.shape[0])
    out = x.new_zeros((x.shape[0], wk.shape[2]))
    if o[-1]:
        out[:o[-1]] = _grouped_rows(x[:o[-1]], wk, offsets, o, out[:o[-1]])
    return out


def _ends_in_torch_backward(grad: Tensor, x: Tensor, w: Tensor, offs: Tensor,
                            transposed: bool) -> tuple[Tensor, Tensor]:
    """:func:`_ends_in_torch`'s gradients, both contiguous (grad_w in w's own layout: ``[E, N, K]`` with
    ``transposed``); the rows past the last end get zeros."""
    wk = w.transpose(1, 2) if transposed else w
    offsets, o = _ends_offsets(offs, x.shape[0])
    grad_x = torch.zeros_like(x, memory_format=torch.contiguous_format)
    grad_w = torch.zeros_like(wk)
    if o[-1]:
        grad_x[:o[-1]], grad_w = _grouped_rows_backward(grad[:o[-1]], x[:o[-1]], wk, offsets, o)
    return grad_x, (grad_w.transpose(1, 2) if transposed else grad_w).contiguous()


@torch.library.custom_op("moe_mlir::grouped_mm_ends", mutates_args=())
def _grouped_mm_ends_op(x: Tensor, w: Tensor, offs: Tensor, transposed: bool = False) -> Tensor:
    """transformers' ``transformers::grouped_mm_fallback`` (``out[start:end] = x[start:end] @ w[e]`` with ``end =
    offs[e]`` and ``start`` the previous end, 0 first; rows past the last end are zeros): the extension's kernel on
    f32/f64 CPU tensors, otherwise :func:`moe_mlir::grouped_mm <grouped_mm>`'s path choice on the rows up to the
    last end (on CUDA at prefill sizes the padded batched GEMM: a few kernels instead of one ``mm`` per expert;
    else one ``mm`` per expert with rows, transformers' loop). ``transposed``: ``w`` is ``[E, N, K]`` (an ``nn.Linear``
    weight, the product is with ``w[e]ᵀ``; its gradient comes in its own layout: no transposing copy when autograd
    accumulates it into the parameter).

    With the extension loaded, CPU calls never reach this body or the Python autograd below: the extension
    registers the op's CPU and AutogradCPU kernels in C++ (lib/Runtime/Torch/GroupedMmEnds.cpp, the same checks
    and results), since a decode step calls the op twice per MoE layer and this wrapper cost ~13 us of a ~17 us
    call. This body serves other devices and a torch without the extension (backend "moe" puts the op on f32/f64
    CPU tensors only: on CUDA it serves a direct caller)."""
    _check_ends(x, w, offs, transposed)
    if _native_operands(x, w):
        return torch.ops.moe_mlir.grouped_mm_cpu(x, w, offs, transposed)
    return _ends_in_torch(x, w, offs, transposed)


@_grouped_mm_ends_op.register_fake
def _(x, w, offs, transposed=False):
    _check_ends(x, w, offs, transposed)
    return x.new_empty((x.shape[0], w.shape[1] if transposed else w.shape[2]))


@torch.library.custom_op("moe_mlir::grouped_mm_ends_backward", mutates_args=())
def _grouped_mm_ends_backward_op(grad: Tensor, x: Tensor, w: Tensor, offs: Tensor,
                                 transposed: bool = False) -> tuple[Tensor, Tensor]:
    # Both gradients contiguous, whatever the layout w arrives in: in a compiled backward graph a w that is a view
    # can arrive with other strides than its fake had, so a layout following w's would not be the fake's.
    if _native_operands(x, w):
        grad_x, grad_w = torch.ops.moe_mlir.grouped_mm_backward_cpu(grad, x, w, offs, transposed=transposed)
        return grad_x.contiguous(), grad_w.contiguous()
    return _ends_in_torch_backward(grad, x, w, offs, transposed)


@_grouped_mm_ends_backward_op.register_fake
def _(grad, x, w, offs, transposed=False):
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(w.shape)


def _grouped_mm_ends_setup(ctx, inputs, output):
    x, w, offs, transposed = inputs
    ctx.save_for_backward(x, w, offs)
    ctx.transposed = transposed


def _grouped_mm_ends_backward(ctx, grad):
    x, w, offs = ctx.saved_tensors
    grad_x, grad_w = _grouped_mm_ends_backward_op(grad.contiguous(), x, w, offs, ctx.transposed)
    return grad_x, grad_w, None, None


_grouped_mm_ends_op.register_autograd(_grouped_mm_ends_backward, setup_context=_grouped_mm_ends_setup)


def hf_grouped_mm_target() -> Optional[Any]:
    """``torch.ops.transformers.grouped_mm_fallback.default`` where transformers registered it (the op its
    ``grouped_mm`` experts call on CPU and for non-bf16 weights under torch.compile), else None."""
    try:
        return torch.ops.transformers.grouped_mm_fallback.default
    except (AttributeError, RuntimeError):
        return None
