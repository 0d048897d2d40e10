"""``moe.topk_renorm`` and its backward (``moe.topk_renorm_grad``) as ``torch.ops.moe.topk_renorm[_backward]``."""

from __future__ import annotations

from typing import Literal, Optional, get_args

import torch
from torch import Tensor

from ..reference import _topk_renorm_backward_ref, _topk_renorm_ref
from ._autograd import _needs
from ._checks import indices_dtype_check
from ._verified_op import as_f32, as_i32, moe_op, not_in_key
from .loading import KEY_OPS, _PYTHON_AUTOGRAD, _note_fallback

#: What ``moe.topk_renorm``'s scores are (MoEEnums.td's TopkMode).
TopkMode = Literal["logits", "probs"]
TOPK_MODES: tuple[str, ...] = get_args(TopkMode)


def _topk_renorm_fake(scores: Tensor, k: int, mode: str = "logits", renormalize: bool = True,
                      indices_dtype: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    shape = (*scores.shape[:-1], k)
    return scores.new_empty(shape, dtype=torch.float32), scores.new_empty(shape, dtype=indices_dtype or torch.int32)


# indices_dtype is not in the kernel key's verification (the key's out:indices:i64 names it for the build).
@moe_op("topk_renorm", fake=_topk_renorm_fake, views={"indices_dtype": not_in_key},
        check=indices_dtype_check("topk_renorm"))
def topk_renorm(scores: Tensor, k: int, mode: str = "logits", renormalize: bool = True,
                indices_dtype: Optional[torch.dtype] = None) -> tuple[Tensor, Tensor]:
    """Top-k expert selection with gate weights (``moe.topk_renorm``).

    Args:
        scores: ``[..., K]`` router logits (``mode="logits"``) or probabilities (``mode="probs"``), f32/f16/bf16.
        k: experts per row, ``1 <= k <= K``.
        mode: ``"logits"``: weights = softmax over the k selected logits (``renormalize=True``) or the dense
            softmax read at the selected experts (``False``). ``"probs"``: the selected values divided by their
            sum (``True``; a zero sum gives zero weights) or left raw (``False``).
        renormalize: see ``mode``.
        indices_dtype: ``torch.int32`` (None: the default) or ``torch.int64`` (as ``torch.topk``): the kernel
            writes them so, no cast after it.

    Returns:
        ``(weights [..., k] f32, indices [..., k] i32 or indices_dtype)`` sorted by descending score; ties -> lowest
        index; NaN ranks first; a fully ``-inf`` row gives zero weights and indices ``0..k-1``.
    """
    _note_fallback(scores)
    w, i = _topk_renorm_ref(scores, k, mode, renormalize)
    return w, i.to(indices_dtype or torch.int32)


def _topk_renorm_backward_fake(grad_w, scores, indices, mode="logits", renormalize=True):
    return scores.new_empty(scores.shape, dtype=torch.float32)


# The kernel reads the indices as i32 and the cotangent as f32, whatever the caller hands over.
@moe_op("topk_renorm_backward", fake=_topk_renorm_backward_fake, views={"grad_w": as_f32, "indices": as_i32})
def topk_renorm_backward(grad_w: Tensor, scores: Tensor, indices: Tensor, mode: str = "logits",
                         renormalize: bool = True) -> Tensor:
    """The backward of ``topk_renorm`` (``moe.topk_renorm_grad``): the gradient (f32, shaped like ``scores``) of the
    weights with respect to the scores, given the forward's ``indices`` and the weights' cotangent ``grad_w``; through
    the kept values only (closed form: :func:`moe_mlir.reference._topk_renorm_backward_ref`)."""
    _note_fallback(scores)
    return _topk_renorm_backward_ref(grad_w, scores, indices, mode, renormalize)


def topk_renorm_backward_decomposition(grad_w: Tensor, scores: Tensor, indices: Tensor, mode: str = "logits",
                                       renormalize: bool = True) -> Tensor:
    """``topk_renorm_backward`` in aten ops (the reference's closed form, the same formulas as the kernel): what
    inductor compiles in its place inside a backward graph it compiles (``backend="moe"``,
    :mod:`moe_mlir.backends.inductor_options`). An extern call there ends inductor's fusions around it: the
    scatter of the weights' gradient, the dense softmax of the raw logits mode and the add into the router's
    gradient become separate kernels around the call, where inductor's own graph (softmax, topk) fuses them
    into its neighbours. The op itself, called eagerly, keeps its kernel."""
    topk_renorm_backward.check(grad_w, scores, indices, mode, renormalize)
    return _topk_renorm_backward_ref(grad_w, scores, indices, mode, renormalize)


def _topk_renorm_setup(ctx, inputs, output):
    scores, k, mode, renormalize = inputs[:4]
    ctx.save_for_backward(scores, output[1])
    ctx.mode, ctx.renormalize = mode, renormalize


def _topk_renorm_backward(ctx, grad_w, grad_idx):
    scores, idx = ctx.saved_tensors
    if grad_w is None or not _needs(ctx, 5)[0]:
        return None, None, None, None, None
    g = topk_renorm_backward(grad_w, scores, idx, ctx.mode, ctx.renormalize)
    return g.to(scores.dtype), None, None, None, None


_PYTHON_AUTOGRAD.append((topk_renorm, _topk_renorm_backward, _topk_renorm_setup))

# A whole graph lowers these to their kernel key's op (mlir/lowerings/moe_ops.py).
KEY_OPS["topk_renorm"] = "topk_renorm"
