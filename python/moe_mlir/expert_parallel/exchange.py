"""The moves of expert parallelism, each with its adjoint as backward.

* :func:`expand` (``out[n] = src[index[n]]``) and :func:`reduce` (``out[m] = Σ_c src[gather[m, c]]``, the columns
  added one after the other, left to right; a past-the-end position adds nothing; on CPU one ``index_add_`` pass,
  which adds in the same order) are adjoint when ``index`` and
  ``gather`` describe the same map: the backward of one is the other. The sums are a fixed sequence of row
  additions (on CUDA gathers, no atomics), so they give the same bits on every run.
* :func:`all_to_all` rows: ``torch.distributed.all_to_all_single`` on the given group; its backward is the
  all-to-all with the splits swapped.

Dispatch is ``all_to_all ∘ expand`` and combine ``reduce ∘ all_to_all``: the backward of dispatch is a combine and
the backward of combine a dispatch.

A collective that fails (a rank died: gloo reports the closed connection; or the group's timeout passed) is
re-raised as :class:`ExpertParallelError` naming the step, the group size and the original error.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["ExpertParallelError", "expand", "reduce", "all_to_all", "dispatch_exchange", "exchange_counts"]


class ExpertParallelError(RuntimeError):
    """A collective of expert parallelism failed on this rank (a peer died, or the group's timeout passed)."""


def _collective(what: str, group: Optional["dist.ProcessGroup"], fn, *args) -> None:
    try:
        fn(*args)
    except ExpertParallelError:
        raise
    except (RuntimeError, ValueError, OSError) as e:  # gloo/NCCL errors surface as RuntimeError (DistBackendError)
        world = dist.get_world_size(group)
        raise ExpertParallelError(
            f"expert_parallel: the {what} all-to-all over {world} ranks failed on rank {dist.get_rank(group)} "
            f"(a rank exited or stopped answering within the process group's timeout): {e}") from e


class _Expand(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src: Tensor, index: Tensor, gather: Tensor) -> Tensor:
        ctx.save_for_backward(index, gather)
        return src.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        index, gather = ctx.saved_tensors
        return _Reduce.apply(grad, gather, index), None, None


def _reduce_by_gathers(src: Tensor, gather: Tensor) -> Tensor:
    """``Σ_c src[gather[:, c]]`` column after column (past-the-end: a zero row): no atomics (CUDA)."""
    padded = torch.cat([src, src.new_zeros((1, *src.shape[1:]))])
    out = padded.index_select(0, gather[:, 0])
    for c in range(1, gather.shape[1]):
        out += padded.index_select(0, gather[:, c])
    return out


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src: Tensor, gather: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(index, gather)
        if gather.shape[1] == 0:
            return src.new_zeros((gather.shape[0], *src.shape[1:]))
        if src.device.type == "cpu":
            # One pass: CPU index_add_ adds the source rows in their order (deterministic), which is the order of
            # ``gather``'s columns (positions sorted per row), and 0 + a == a: the same bits as the gathers.
            return src.new_zeros((gather.shape[0], *src.shape[1:])).index_add_(0, index, src)
        return _reduce_by_gathers(src, gather)

    @staticmethod
    def backward(ctx, grad: Tensor):
        index, gather = ctx.saved_tensors
        return _Expand.apply(grad.contiguous(), index, gather), None, None


def expand(src: Tensor, index: Tensor, gather: Tensor) -> Tensor:
    """``src[index]`` whose backward is :func:`reduce` over ``gather`` (``gather`` lists, per row of ``src``, the
    positions ``n`` with ``index[n]`` equal to that row, past-the-end where there are fewer)."""
    return _Expand.apply(src, index, gather)


def reduce(src: Tensor, gather: Tensor, index: Tensor) -> Tensor:
    """``out[m] = src[gather[m, 0]] + src[gather[m, 1]] + ...`` (positions ``>= len(src)`` add nothing), whose
    backward is :func:`expand` with ``index`` (the row ``m`` of each position)."""
    return _Reduce.apply(src, gather, index)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, send: list[int], recv: list[int], group, what: str) -> Tensor:
        ctx.splits, ctx.group, ctx.what = (send, recv), group, what
        out = x.new_empty((sum(recv), *x.shape[1:]))
        _collective(what, group, dist.all_to_all_single, out, x.contiguous(), recv, send, group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        send, recv = ctx.splits
        return _AllToAll.apply(grad, recv, send, ctx.group, ctx.what + " (backward)"), None, None, None, None


class _DispatchExchange(torch.autograd.Function):
    """The rows and their gate weights + local ids in one autograd node, so that the backward's two all-to-alls run
    in one fixed order on every rank (two separate nodes could be scheduled in different orders by the autograd
    engines of different ranks, and the collectives would then pair up wrongly)."""

    @staticmethod
    def forward(ctx, rows: Tensor, weights: Tensor, ids: Tensor, send: list[int], recv: list[int], group):
        ctx.splits, ctx.group, ctx.k = (send, recv), group, weights.shape[1]
        out = rows.new_empty((sum(recv), *rows.shape[1:]))
        _collective("dispatch", group, dist.all_to_all_single, out, rows.contiguous(), recv, send, group)
        meta = torch.cat([weights, ids.view(torch.float32)], 1)  # ids travel as their f32 bit patterns
        recv_meta = meta.new_empty((sum(recv), meta.shape[1]))
        _collective("dispatch (gate weights)", group, dist.all_to_all_single, recv_meta, meta, recv, send, group)
        recv_ids = recv_meta[:, ctx.k:].contiguous().view(torch.int32)
        ctx.mark_non_differentiable(recv_ids)
        return out, recv_meta[:, : ctx.k].contiguous(), recv_ids

    @staticmethod
    def backward(ctx, grad_rows: Tensor, grad_weights: Tensor, _grad_ids):
        send, recv = ctx.splits
        g_rows = grad_rows.new_empty((sum(send), *grad_rows.shape[1:]))
        _collective("dispatch (backward)", ctx.group, dist.all_to_all_single, g_rows, grad_rows.contiguous(), send,
                    recv, ctx.group)
        g_w = grad_weights.new_empty((sum(send), ctx.k))
        _collective("dispatch (backward, gate weights)", ctx.group, dist.all_to_all_single, g_w,
                    grad_weights.contiguous(), send, recv, ctx.group)
        return g_rows, g_w, None, None, None, None


def dispatch_exchange(rows: Tensor, weights: Tensor, ids: Tensor, send: list[int], recv: list[int], group
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """Sends ``rows`` ``[S, D]``, their gate weights ``[S, k]`` (f32) and local ids ``[S, k]`` (i32), ``send[r]``
    rows to rank ``r``; returns the received ``(rows, weights, ids)``. Differentiable w.r.t. rows and weights."""
    return _DispatchExchange.apply(rows, weights.float(), ids.to(torch.int32), list(send), list(recv), group)


def all_to_all(x: Tensor, send: list[int], recv: list[int], group, what: str) -> Tensor:
    """Rows ``x`` (``send[r]`` of them for rank ``r``, in rank order) to the ranks; returns the ``recv[r]`` rows
    from each rank ``r``, in rank order. Differentiable (backward: the reverse all-to-all)."""
    return _AllToAll.apply(x, list(send), list(recv), group, what)


def exchange_counts(send: Tensor, group, what: str) -> Tensor:
    """``send`` ``[W, n]`` int64, row ``r`` for rank ``r``; returns ``[W, n]``, row ``r`` from rank ``r``."""
    out = torch.empty_like(send)
    _collective(what, group, dist.all_to_all_single, out, send.contiguous(), None, None, group)
    return out
