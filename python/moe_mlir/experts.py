"""Expert dispatch through ``moe.dispatch_plan``: HF transformers' sparse-MoE experts without the per-expert loop.

HF ``transformers`` (5.x) writes the experts of Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, gpt-oss... as an
``Experts`` module decorated with ``@use_experts_implementation``: its forward looks up
``config._experts_implementation`` in ``transformers.integrations.moe.ExpertsInterface`` (``"eager"``, the default,
is the ``one_hot`` / ``where`` / ``index_add_`` loop over the experts hit; it is data-dependent, so Dynamo breaks the
graph at its ``nonzero`` and recompiles per expert). This module adds the implementation ``"moe"``:

1. ``torch.ops.moe.dispatch_plan(top_k_index, E)`` (integer-valued, static output sizes: no graph break) gives the
   per-expert offsets, the ``(token, slot)`` assignments stably sorted by expert and its inverse permutation;
2. the token rows are gathered once in that order, and each projection is **one grouped GEMM**
   (:func:`grouped_mm`: ``torch.ops.moe_mlir.grouped_mm``, an opaque op: on the CPU a loop over the experts that
   have rows, one ``mm`` per contiguous slice; on CUDA one padded batched GEMM (``bmm`` over ``[E, max rows, K]``)
   unless the routing is too skewed for padding, where the loop's 2E launches per layer dominated whole-model
   prefill on an H100 (bench/results/models-2026-11-24-h100.md); ``torch.nn.functional.grouped_mm`` on CUDA in bf16,
   where torch has it) — on this project's CPU the loop measured faster than torch's CPU
   ``torch.nn.functional.grouped_mm`` (one run on the loaded 2-core machine, 2 threads, E=128, D=2048, 2I=1536,
   f32: 1.8 s vs 2.8 s at T=64, 2.3 s vs 3.1 s at T=1024, same results bit for bit);
3. the module's own gate (``_apply_gate``: SiLU(gate)·up, gpt-oss's clamped GLU...) or activation, its biases
   and its post-expert norm, then the routing weights, row-wise, as HF's eager code applies them;
4. a deterministic un-permute: each token's k rows are read back through the inverse order, in increasing expert
   order (the order in which eager's ``index_add_`` accumulates them), and summed: no scatter, no atomics.

Steps 2-4 stream several ``[T*k, D]``-sized intermediates through memory (270 MB each for Qwen3-MoE at T=4096),
which cost more than eager's per-expert loop saves. So on CPU, for the gates it can compute itself (:data:`GATES`:
HF's default SiLU GLU, gpt-oss's clamped GLU; no post-expert norm), the experts run instead as :func:`expert_mlp`
(``torch.ops.moe_mlir.expert_mlp``): one opaque op over the experts with rows, each expert's rows gathered,
projected with BLAS on the weight slices, gated, weighted and summed into the output in eager's order, in scratch
buffers reused across experts, so they stay in cache. On f32/f64 it is the torch extension's kernel
(lib/Runtime/Torch/ExpertOps.cpp: the experts spread over torch's threads, no per-expert torch call: at E = 256 the
Python loop's ~7 calls per expert were most of a whole model's decode); its Python loop (``index_add_`` per
expert) is the reference and the path of other dtypes. Steps 2-4 remain for other gates, a post-expert norm and
CUDA.

Everything is differentiable w.r.t. the hidden states, the expert weights (and biases) and the routing weights
(autograd of the torch ops used; ``grouped_mm`` has a registered backward, an opaque op chosen like its forward);
the plan is integer-valued. Under ``torch.compile`` the whole expert computation is one graph (no data-dependent control flow
in Python).

Which models use it (see the README, "HF experts through the dispatch plan"):

* :func:`register` adds ``"moe"`` to HF's ``ExpertsInterface`` (HF's extension point; idempotent): then
  ``config._experts_implementation = "moe"`` / ``from_pretrained(..., experts_implementation="moe")`` /
  ``model.set_experts_implementation("moe")`` select it, in eager and under any ``torch.compile`` backend;
* :func:`use_moe_experts` selects it for a model within a ``with`` block (and restores the previous choice);
* ``moe_mlir.compile(model)`` selects it for each call of the compiled model only (the user's model object and its
  configs are left as they were between calls; a module whose config names another implementation than HF's
  defaults, :data:`SWITCHED`, keeps it).

Expert parallelism (``_is_expert_parallel``: sentinel indices) is not handled: such modules run HF's eager code.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator, Optional

import torch
from torch import Tensor

from . import ops as _ops  # noqa: F401  (registers torch.ops.moe.dispatch_plan)

__all__ = ["grouped_mm", "hf_grouped_mm_target", "expert_mlp", "GATES", "dispatch_experts", "hf_experts_forward",
           "register", "is_hf_experts", "hf_experts_modules",
           "use_moe_experts", "SelectedExperts", "IMPLEMENTATION"]

#: The name of the HF experts implementation this module registers.
IMPLEMENTATION = "moe"


# ----------------------------------------------------------------------------------------------------------------
# One GEMM per projection over expert-sorted rows
# ----------------------------------------------------------------------------------------------------------------


def _check_grouped(x: Tensor, w: Tensor, offsets: Tensor) -> None:
    if x.dim() != 2 or w.dim() != 3:
        raise ValueError(f"grouped_mm: x must be [S, K] and w [E, K, N], got {list(x.shape)} and {list(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"grouped_mm: x has K = {x.shape[1]} columns but w has K = {w.shape[1]} rows")
    if offsets.dim() != 1 or offsets.shape[0] != w.shape[0] + 1 or offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"grouped_mm: offsets must be an integer [E+1] = [{w.shape[0] + 1}] tensor, got "
                         f"{offsets.dtype} {list(offsets.shape)}")
    if x.dtype != w.dtype:
        raise ValueError(f"grouped_mm: x is {x.dtype} but w is {w.dtype}")


def _spans(o: list[int]) -> Iterator[tuple[int, int, int]]:
    """(expert, start, end) for each expert with rows, from the offsets read to the host once."""
    for e in range(len(o) - 1):
        if o[e + 1] > o[e]:
            yield e, o[e], o[e + 1]


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
    if offs.dim() != 1 or offs.shape[0] != w.shape[0] or offs.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"grouped_mm_ends: offs must be an integer [E] = [{w.shape[0]}] tensor (the ends), got "
                         f"{offs.dtype} {list(offs.shape)}")


def _native_operands(x: Tensor, w: Tensor) -> bool:
    """Operands the extension's grouped GEMM takes: x and w of one dtype that :func:`_native_mlp` takes."""
    return _native_mlp(x) and w.dtype == x.dtype


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


# ----------------------------------------------------------------------------------------------------------------
# The fused per-expert MLP (CPU): each expert's rows gathered, both projections, gate and routing weight applied
# and accumulated while its rows are in cache
# ----------------------------------------------------------------------------------------------------------------

#: The gates :func:`expert_mlp` computes itself: ``"silu_glu"``: ``silu(h[:, :I]) * h[:, I:]`` (HF's default
#: ``_apply_gate`` with a SiLU ``act_fn``: Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3); ``"clamped_glu"``: gpt-oss's
#: interleaved, clamped GLU, ``(clamp(u, -limit, limit) + 1) * g' * sigmoid(alpha * g')`` with
#: ``g' = clamp(g, max=limit)``, ``g = h[:, 0::2]``, ``u = h[:, 1::2]``.
GATES = ("silu_glu", "clamped_glu")


def _check_mlp(x: Tensor, token: Tensor, offsets: Tensor, row_weight: Tensor, w1: Tensor, b1: Optional[Tensor],
               w2: Tensor, b2: Optional[Tensor], gate: str) -> None:
    if gate not in GATES:
        raise ValueError(f"expert_mlp: gate must be one of {GATES}, got {gate!r}")
    if x.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"expert_mlp: x must be [T, D], w1 [E, 2I, D] and w2 [E, N, I], got {list(x.shape)}, "
                         f"{list(w1.shape)}, {list(w2.shape)}")
    E, N1, D = w1.shape
    if D != x.shape[1] or N1 % 2 or w2.shape[0] != E or w2.shape[2] != N1 // 2:
        raise ValueError(f"expert_mlp: w1 {list(w1.shape)} and w2 {list(w2.shape)} do not fit x {list(x.shape)} "
                         f"(w1 [E, 2I, D], w2 [E, N, I])")
    if token.dim() != 1 or row_weight.shape != token.shape:
        raise ValueError(f"expert_mlp: token and row_weight must be [S], got {list(token.shape)} and "
                         f"{list(row_weight.shape)}")
    if offsets.dim() != 1 or offsets.shape[0] != E + 1 or offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"expert_mlp: offsets must be an integer [E+1] = [{E + 1}] tensor, got {offsets.dtype} "
                         f"{list(offsets.shape)}")
    for name, b, n in (("b1", b1, N1), ("b2", b2, w2.shape[1])):
        if b is not None and list(b.shape) != [E, n]:
            raise ValueError(f"expert_mlp: {name} must be [{E}, {n}], got {list(b.shape)}")
    if any(t is not None and t.dtype != x.dtype for t in (w1, w2, b1, b2)):
        raise ValueError(f"expert_mlp: the weights and biases must have the dtype of x ({x.dtype})")


def _linear_into(out: Tensor, x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    """``F.linear(x, w, b)`` (the same BLAS call: ``x @ w.T``, ``addmm`` with a bias) written into ``out``."""
    if b is None:
        return torch.mm(x, w.t(), out=out)
    return torch.addmm(b, x, w.t(), out=out)


def _gate_into(out: Tensor, tmp: Tensor, h: Tensor, gate: str, alpha: float, limit: float) -> Tensor:
    """The gate of ``h`` [n, 2I] into ``out`` [n, I] (``tmp``: scratch [n, I]), the operations HF applies."""
    if gate == "silu_glu":
        i = out.shape[1]
        torch.ops.aten.silu.out(h[:, :i], out=out)
        return out.mul_(h[:, i:])
    torch.clamp(h[:, 0::2], max=limit, out=out)  # gpt-oss: gate = clamp(g, max=limit)
    torch.mul(out, alpha, out=tmp)
    torch.sigmoid(tmp, out=tmp)
    out.mul_(tmp)  # glu = gate * sigmoid(gate * alpha)
    torch.clamp(h[:, 1::2], min=-limit, max=limit, out=tmp)
    return out.mul_(tmp.add_(1))  # (up + 1) * glu


def _gate_backward(h: Tensor, grad: Tensor, gate: str, alpha: float, limit: float) -> Tensor:
    """d gate(h) / d h applied to ``grad`` [n, I]: [n, 2I] (clamp's gradient as torch's: 1 inside the open range,
    0 at and beyond the bounds)."""
    dh = torch.empty_like(h)
    if gate == "silu_glu":
        i = grad.shape[1]
        g, u = h[:, :i], h[:, i:]
        s = torch.sigmoid(g)
        dh[:, i:] = grad * torch.nn.functional.silu(g)
        dh[:, :i] = grad * u * s * (1 + g * (1 - s))
        return dh
    g, u = h[:, 0::2], h[:, 1::2]
    gc = g.clamp(max=limit)
    s = torch.sigmoid(gc * alpha)
    dh[:, 1::2] = torch.where((u > -limit) & (u < limit), grad * (gc * s), 0)
    dh[:, 0::2] = torch.where(g < limit, grad * (u.clamp(-limit, limit) + 1) * (s + gc * alpha * s * (1 - s)), 0)
    return dh


#: Tests only: False keeps :func:`expert_mlp` on its Python loop (the reference of the extension's kernel).
NATIVE_MLP = True


def _native_mlp(x: Tensor) -> bool:
    """Whether :func:`expert_mlp` runs the extension's kernel (lib/Runtime/Torch/ExpertOps.cpp: the experts spread
    over torch's threads, BLAS on per-thread scratch, the same sum order): f32/f64 CPU tensors, the extension loaded."""
    if not NATIVE_MLP or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return False
    from .runtime import extension

    return extension.library_path is not None and hasattr(torch.ops.moe_mlir, "expert_mlp_cpu")


@torch.library.custom_op("moe_mlir::expert_mlp", mutates_args=())
def _expert_mlp_op(x: Tensor, token: Tensor, offsets: Tensor, row_weight: Tensor, w1: Tensor, b1: Optional[Tensor],
                   w2: Tensor, b2: Optional[Tensor], gate: str, alpha: float, limit: float) -> Tensor:
    _check_mlp(x, token, offsets, row_weight, w1, b1, w2, b2, gate)
    if token.numel() and int(offsets[-1]) != token.shape[0]:
        raise ValueError(f"expert_mlp: offsets[-1] = {int(offsets[-1])} must equal the number of rows "
                         f"{token.shape[0]}")
    if _native_mlp(x):
        return torch.ops.moe_mlir.expert_mlp_cpu(x, token, offsets, row_weight, w1, b1, w2, b2, gate, alpha, limit)
    out = x.new_zeros((x.shape[0], w2.shape[1]))
    spans = list(_spans(offsets))
    rows = max((b - a for _, a, b in spans), default=0)
    i = w2.shape[2]
    # One set of buffers for all experts (sized for the largest): each expert's rows stay in cache from the
    # gather to the accumulation, and nothing is allocated per expert.
    xb, hb = x.new_empty((rows, x.shape[1])), x.new_empty((rows, w1.shape[1]))
    ab, tb, yb = x.new_empty((rows, i)), x.new_empty((rows, i)), x.new_empty((rows, w2.shape[1]))
    for e, a, b in spans:
        n, tok = b - a, token[a:b]
        xe = torch.index_select(x, 0, tok, out=xb[:n])
        h = _linear_into(hb[:n], xe, w1[e], None if b1 is None else b1[e])
        act = _gate_into(ab[:n], tb[:n], h, gate, alpha, limit)
        y = _linear_into(yb[:n], act, w2[e], None if b2 is None else b2[e])
        # HF's order: the routing weight on the expert's output, then index_add_ in increasing expert order
        # (index_add_ on CPU adds the rows one after the other: deterministic).
        out.index_add_(0, tok, y.mul_(row_weight[a:b, None]))
    return out


@_expert_mlp_op.register_fake
def _(x, token, offsets, row_weight, w1, b1, w2, b2, gate, alpha, limit):
    _check_mlp(x, token, offsets, row_weight, w1, b1, w2, b2, gate)
    return x.new_empty((x.shape[0], w2.shape[1]))


@torch.library.custom_op("moe_mlir::expert_mlp_backward", mutates_args=())
def _expert_mlp_backward_op(grad: Tensor, x: Tensor, token: Tensor, offsets: Tensor, row_weight: Tensor, w1: Tensor,
                            b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor], gate: str, alpha: float,
                            limit: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`expert_mlp` w.r.t. x, row_weight, w1, b1, w2, b2 (each expert's forward recomputed;
    the bias gradients are empty ``[0]`` tensors where there is no bias)."""
    if _native_mlp(x) and int(offsets[-1]) == token.shape[0]:
        return torch.ops.moe_mlir.expert_mlp_backward_cpu(grad, x, token, offsets, row_weight, w1, b1, w2, b2, gate,
                                                          alpha, limit)
    grad_x, grad_rw = torch.zeros_like(x), torch.zeros_like(row_weight)
    grad_w1, grad_w2 = torch.zeros(w1.shape, dtype=w1.dtype), torch.zeros(w2.shape, dtype=w2.dtype)
    grad_b1 = torch.zeros((w1.shape[0], w1.shape[1]) if b1 is not None else (0,), dtype=x.dtype)
    grad_b2 = torch.zeros((w2.shape[0], w2.shape[1]) if b2 is not None else (0,), dtype=x.dtype)
    for e, a, b in _spans(offsets):
        tok = token[a:b]
        xe, ge = x[tok], grad[tok]
        h = torch.nn.functional.linear(xe, w1[e], None if b1 is None else b1[e])
        act = _gate_into(torch.empty(h.shape[0], w2.shape[2], dtype=h.dtype), torch.empty(h.shape[0], w2.shape[2],
                         dtype=h.dtype), h, gate, alpha, limit)
        y = torch.nn.functional.linear(act, w2[e], None if b2 is None else b2[e])
        grad_rw[a:b] = (ge * y).sum(1).to(grad_rw.dtype)
        dy = ge * row_weight[a:b, None].to(ge.dtype)
        torch.mm(dy.t(), act, out=grad_w2[e])
        if b2 is not None:
            grad_b2[e] = dy.sum(0)
        dh = _gate_backward(h, dy @ w2[e], gate, alpha, limit)
        torch.mm(dh.t(), xe, out=grad_w1[e])
        if b1 is not None:
            grad_b1[e] = dh.sum(0)
        grad_x.index_add_(0, tok, dh @ w1[e])
    return grad_x, grad_rw, grad_w1, grad_b1, grad_w2, grad_b2


@_expert_mlp_backward_op.register_fake
def _(grad, x, token, offsets, row_weight, w1, b1, w2, b2, gate, alpha, limit):
    def bias(b, w):
        return x.new_empty((w.shape[0], w.shape[1]) if b is not None else (0,))
    return (torch.empty_like(x), torch.empty_like(row_weight), x.new_empty(w1.shape), bias(b1, w1),
            x.new_empty(w2.shape), bias(b2, w2))


def _expert_mlp_setup(ctx, inputs, output):
    x, token, offsets, row_weight, w1, b1, w2, b2, gate, alpha, limit = inputs
    ctx.save_for_backward(x, token, offsets, row_weight, w1, b1, w2, b2)
    ctx.gate = (gate, alpha, limit)
    ctx.has_bias = (b1 is not None, b2 is not None)


def _expert_mlp_backward(ctx, grad):
    x, token, offsets, row_weight, w1, b1, w2, b2 = ctx.saved_tensors
    gx, grw, gw1, gb1, gw2, gb2 = _expert_mlp_backward_op(grad.contiguous(), x, token, offsets, row_weight, w1, b1,
                                                          w2, b2, *ctx.gate)
    return (gx, None, None, grw, gw1, gb1 if ctx.has_bias[0] else None, gw2, gb2 if ctx.has_bias[1] else None,
            None, None, None)


_expert_mlp_op.register_autograd(_expert_mlp_backward, setup_context=_expert_mlp_setup)


def expert_mlp(x: Tensor, token: Tensor, offsets: Tensor, row_weight: Tensor, w1: Tensor, w2: Tensor, gate: str, *,
               b1: Optional[Tensor] = None, b2: Optional[Tensor] = None, alpha: float = 1.0,
               limit: float = float("inf")) -> Tensor:
    """``out[t] = sum_r row_weight[r] * (gate(x[t] @ w1[e].T + b1[e]) @ w2[e].T + b2[e])`` over the rows ``r`` with
    ``token[r] = t``, ``e`` the expert of row ``r`` (rows ``offsets[e]:offsets[e+1]``), in increasing expert order.

    One opaque op (``torch.ops.moe_mlir.expert_mlp``, CPU, with a registered backward that recomputes each expert's
    forward): per expert, the gather of its rows, both projections (BLAS on the weight slices, no copies), the gate
    (:data:`GATES`) and the routing weight, summed into the output in increasing expert order, all in buffers
    reused across experts — nothing of size rows x features but the weighted outputs goes through memory. f32/f64
    run the extension's kernel (experts over torch's threads), other dtypes the Python loop.

    Args:
        x: ``[T, D]``; token: ``[S]`` the token of each expert-sorted row; offsets: ``[E+1]``; row_weight: ``[S]``;
        w1: ``[E, 2I, D]``, w2: ``[E, N, I]`` (``nn.Linear`` layout, any strides); b1: ``[E, 2I]``, b2: ``[E, N]``.
    """
    return _expert_mlp_op(x, token, offsets, row_weight, w1, b1, w2, b2, gate, float(alpha), float(limit))


# ----------------------------------------------------------------------------------------------------------------
# The whole expert computation
# ----------------------------------------------------------------------------------------------------------------


def dispatch_experts(
    hidden_states: Tensor,
    top_k_index: Tensor,
    top_k_weights: Tensor,
    gate_up_proj: Tensor,
    down_proj: Tensor,
    act: Callable[[Tensor], Tensor],
    *,
    transposed: bool = False,
    gate_up_bias: Optional[Tensor] = None,
    down_bias: Optional[Tensor] = None,
    post_norm: Optional[Callable[[Tensor], Tensor]] = None,
    gate: Optional[tuple[str, float, float]] = None,
) -> Tensor:
    """The routed experts of a sparse-MoE block, through ``moe.dispatch_plan`` (see the module doc).

    Args:
        hidden_states: ``[T, D]``; top_k_index: ``[T, k]`` experts in ``[0, E)``; top_k_weights: ``[T, k]``.
        gate_up_proj: ``[E, 2I, D]`` (``transposed``: ``[E, D, 2I]``), or the up projection alone for ungated
            experts; down_proj: ``[E, D, I]`` (``transposed``: ``[E, I, D]``).
        act: applied to the ``[S, 2I]`` (or ``[S, I]``) projection: the gate (e.g. ``silu(gate) * up``) or the
            activation.
        gate_up_bias, down_bias: ``[E, 2I]``, ``[E, D]`` (optional); post_norm: applied to each expert's output
            row before the routing weight.
        gate: ``(name, alpha, limit)`` when ``act`` is one of the gates :func:`expert_mlp` computes itself
            (:data:`GATES`): then, on CPU without a post-norm, the experts run as :func:`expert_mlp` (one fused loop
            over the experts) instead of grouped GEMMs over all rows; same results up to f32 rounding.

    Returns:
        ``[T, D]`` in the dtype of ``hidden_states``: ``sum_j w[t, j] * expert_{idx[t, j]}(x[t])``.
    """
    if hidden_states.dim() != 2 or top_k_index.dim() != 2 or top_k_weights.shape != top_k_index.shape:
        raise ValueError(f"dispatch_experts: hidden_states must be [T, D] and top_k_index/top_k_weights [T, k], got "
                         f"{list(hidden_states.shape)}, {list(top_k_index.shape)}, {list(top_k_weights.shape)}")
    if top_k_index.shape[0] != hidden_states.shape[0]:
        raise ValueError(f"dispatch_experts: {top_k_index.shape[0]} rows of top_k_index for "
                         f"{hidden_states.shape[0]} tokens")
    T, D = hidden_states.shape
    k = top_k_index.shape[1]
    E = gate_up_proj.shape[0]
    _, offsets, order, inverse = torch.ops.moe.dispatch_plan(top_k_index, E, 1)[:4]
    order = order.long()
    token = torch.div(order, k, rounding_mode="floor")
    if gate is not None and post_norm is None and hidden_states.device.type == "cpu":
        out = expert_mlp(hidden_states.to(gate_up_proj.dtype), token, offsets, top_k_weights.reshape(-1)[order],
                         gate_up_proj.transpose(1, 2) if transposed else gate_up_proj,
                         down_proj.transpose(1, 2) if transposed else down_proj, gate[0],
                         b1=gate_up_bias, b2=down_bias, alpha=gate[1], limit=gate[2])
        return out.to(hidden_states.dtype)
    experts_sorted = top_k_index.reshape(-1)[order]
    x = hidden_states[token].to(gate_up_proj.dtype)
    w1 = gate_up_proj if transposed else gate_up_proj.transpose(1, 2)
    w2 = down_proj if transposed else down_proj.transpose(1, 2)
    h = grouped_mm(x, w1, offsets)
    if gate_up_bias is not None:
        h = h + gate_up_bias[experts_sorted]
    h = grouped_mm(act(h), w2, offsets)
    if down_bias is not None:
        h = h + down_bias[experts_sorted]
    if post_norm is not None:
        h = post_norm(h)
    h = h * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    # Each token's k rows in increasing expert order (eager's index_add_ order), then summed over k.
    pos = inverse.long().view(T, k).sort(dim=1).values
    return h[pos.reshape(-1)].view(T, k, h.shape[-1]).sum(dim=1).to(hidden_states.dtype)


# ----------------------------------------------------------------------------------------------------------------
# HF transformers' experts modules
# ----------------------------------------------------------------------------------------------------------------


def is_hf_experts(module: torch.nn.Module) -> bool:
    """True for a module of a class decorated with HF's ``@use_experts_implementation``."""
    fwd = getattr(type(module), "forward", None)
    return (hasattr(fwd, "__wrapped__") and hasattr(module, "has_gate") and hasattr(module, "is_transposed")
            and hasattr(getattr(module, "config", None), "_experts_implementation"))


def hf_experts_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if is_hf_experts(m)]


def _known_gate(module: torch.nn.Module) -> Optional[tuple[str, float, float]]:
    """The :data:`GATES` entry computing ``module._apply_gate`` (``(name, alpha, limit)``), or None: HF's default
    gate (concatenated halves) with a SiLU ``act_fn``, or gpt-oss's own clamped GLU, each identified by the function
    object (a subclass overriding ``_apply_gate`` is not recognised and keeps the generic path)."""
    if not module.has_gate or _has_post_norm(module):
        return None
    apply_gate = type(module)._apply_gate
    hf_moe = sys.modules.get("transformers.integrations.moe")
    hf_act = sys.modules.get("transformers.activations")
    silu = (torch.nn.SiLU,) + ((hf_act.SiLUActivation,) if hasattr(hf_act, "SiLUActivation") else ())
    if (hf_moe is not None and apply_gate is getattr(hf_moe, "_default_apply_gate", None)
            and getattr(module, "is_concatenated", True) and type(getattr(module, "act_fn", None)) in silu):
        return ("silu_glu", 1.0, float("inf"))
    gpt_oss = sys.modules.get("transformers.models.gpt_oss.modeling_gpt_oss")
    if (gpt_oss is not None and apply_gate is getattr(getattr(gpt_oss, "GptOssExperts", None), "_apply_gate", None)
            and not getattr(module, "is_concatenated", False)):
        return ("clamped_glu", float(module.alpha), float(module.limit))
    return None


def _has_post_norm(experts: torch.nn.Module) -> bool:
    """Whether HF's experts module applies a norm after each expert (``has_post_expert_norm``: transformers 5.2x;
    older 5.x releases, e.g. 5.17, have no such attribute and no such norm)."""
    return bool(getattr(experts, "has_post_expert_norm", False))


def hf_experts_forward(self: torch.nn.Module, hidden_states: Tensor, top_k_index: Tensor,
                       top_k_weights: Tensor) -> Tensor:
    """HF's experts implementation ``"moe"`` (the signature of ``ExpertsInterface`` functions)."""
    if getattr(self, "_is_expert_parallel", False):  # sentinel indices: HF's own loop
        return type(self).forward.__wrapped__(self, hidden_states, top_k_index, top_k_weights)
    if self.has_gate:
        w1 = self.gate_up_proj
        b1 = self.gate_up_proj_bias if self.has_bias else None
        act = self._apply_gate
    else:
        w1 = self.up_proj
        b1 = self.up_proj_bias if self.has_bias else None
        act = self.act_fn
    return dispatch_experts(hidden_states, top_k_index, top_k_weights, w1, self.down_proj, act,
                            transposed=self.is_transposed, gate_up_bias=b1,
                            down_bias=self.down_proj_bias if self.has_bias else None,
                            post_norm=self.post_expert_norm if _has_post_norm(self) else None,
                            gate=_known_gate(self))


def register_implementation(name: str, forward) -> bool:
    """Adds ``forward`` to HF's ``ExpertsInterface`` as ``name`` (idempotent). False when transformers (5.x) is not
    installed."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return False
    ExpertsInterface.register(name, forward)
    return True


def register() -> bool:
    """Adds ``"moe"`` to HF's ``ExpertsInterface`` (idempotent). False when transformers (5.x) is not installed."""
    return register_implementation(IMPLEMENTATION, hf_experts_forward)


#: The implementations switched to ``"moe"``: HF's defaults (unset on a standalone module, ``"eager"``, and
#: ``"grouped_mm"``, which ``PreTrainedModel`` picks when nothing was requested). Others (``"batched_mm"``, a
#: kernel from the hub...) are a user's choice and are kept.
SWITCHED = (None, "eager", "grouped_mm")


def _default(impl: Any) -> bool:
    return impl in SWITCHED


def _switch(modules: list[torch.nn.Module]) -> dict[int, tuple[Any, Any]]:
    saved: dict[int, tuple[Any, Any]] = {}
    for m in modules:
        cfg = m.config
        if id(cfg) not in saved and _default(cfg._experts_implementation):
            saved[id(cfg)] = (cfg, cfg._experts_implementation)
    for cfg, _ in saved.values():
        cfg._experts_implementation = IMPLEMENTATION
    return saved


def _restore(saved: dict[int, tuple[Any, Any]]) -> None:
    for cfg, old in saved.values():
        cfg._experts_implementation = old


@contextlib.contextmanager
def use_moe_experts(model: torch.nn.Module) -> Iterator[list[torch.nn.Module]]:
    """Within the block, the HF experts modules of ``model`` whose config selects one of HF's defaults
    (:data:`SWITCHED`) run :func:`hf_experts_forward`; their configs are restored on exit. Yields the modules switched."""
    modules = hf_experts_modules(model)
    if modules:
        register()
    saved = _switch(modules)
    try:
        yield [m for m in modules if id(m.config) in saved]
    finally:
        _restore(saved)


class SelectedExperts:
    """A compiled model whose HF experts modules run :func:`hf_experts_forward` during each call (what
    ``moe_mlir.compile`` returns for a model with HF experts). Attributes are the compiled model's.

    The switch is the experts' ``config._experts_implementation``, set for the call and restored after it: another
    thread running the *eager* model during a call would run the ``"moe"`` implementation too (same results up to
    f32 rounding)."""

    def __init__(self, compiled: Callable[..., Any], model: torch.nn.Module) -> None:
        register()
        self.__dict__["_compiled"] = compiled
        self.__dict__["_experts_modules"] = hf_experts_modules(model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        saved = _switch(self._experts_modules)
        try:
            return self._compiled(*args, **kwargs)
        finally:
            _restore(saved)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_compiled"], name)
