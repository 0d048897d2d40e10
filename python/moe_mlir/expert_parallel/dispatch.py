"""Dispatch and combine: tokens to the ranks that hold their experts and back, driven by our routing's plan.

The shape of the API is DeepEP's (``dispatch(x, topk_idx, topk_weights, num_experts) -> recv_x, recv ids,
recv weights, handle``; ``combine(x, handle)``): each token row reaches each rank that owns one of its experts
exactly once, with its k expert ids made local to that rank (``-1`` for the others) and its k gate weights. The rank
computes its experts on the received rows and reduces each received row's expert outputs, weighted, in increasing
expert order (:func:`weighted_reduce`), so one row per received row goes back; :func:`combine` adds a token's rows
from its ranks in increasing rank order. With experts in contiguous blocks, a token's output is therefore always the
weighted expert outputs added in increasing expert id, only grouped by rank: results depend on the number of ranks
by float rounding only (single rank: the order of HF's eager ``index_add_`` loop).

The exchange (on the given process group, default: the default group; gloo with CPU tensors, NCCL with CUDA tensors):

1. a header all-to-all (int64, 39 per peer): the row counts for each rank — "counts first, as torch does" — plus
   each rank's status, hidden size, k, dtype, E and layout fingerprint, and its error message if its inputs are
   bad. Every rank checks every rank's header, so a bad expert id or mismatched shapes on one rank raise the same
   ``ValueError`` on all of them (never a hang in the next collective);
2. the rows (``all_to_all_single``, the row counts as splits);
3. the k gate weights (f32) and local ids (i32, bit-cast into the same f32 tensor) of each sent row (one
   ``all_to_all_single``).

Combine is one ``all_to_all_single`` (the reverse splits). Backward: dispatch's is a combine and combine's a
dispatch (:mod:`.exchange`); the gate weights get their gradient through the exchange too.

``torch.compile``: :func:`dispatch` and :func:`combine` are excluded from graphs (``torch.compiler.disable``): their
output sizes depend on the data (the counts received), so a compiled model graph-breaks at each of them and the
experts between them compile as usual. (Functional collectives would need the splits as unbacked SymInts and a
device-to-host read of the counts inside the graph; see docs/ExpertParallel.md.)
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .exchange import all_to_all, dispatch_exchange, exchange_counts, expand, reduce
from .layout import ExpertLayout
from .plan import LocalPlan, RankPlan, local_ids, local_plan, rank_plan

__all__ = ["DispatchHandle", "Dispatched", "dispatch", "combine", "expert_rows", "weighted_reduce", "traffic"]

_MSG_WORDS = 32  # the error message travels as 256 bytes
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass
class DispatchHandle:
    """What :func:`combine` (and the backward) needs; also the local plan of the received rows.

    Attributes:
        layout, group, rank: the expert layout, the process group and this rank in it.
        plan: the send plan of this rank's tokens (:class:`~moe_mlir.expert_parallel.plan.RankPlan`).
        local: the plan of the received rows against this rank's experts
            (:class:`~moe_mlir.expert_parallel.plan.LocalPlan`; ``local.tokens_per_expert`` are TorchTitan's
            tokens per local expert).
        send_splits, recv_splits: rows sent to / received from each rank.
        num_tokens: T, this rank's tokens.
    """

    layout: ExpertLayout
    group: Optional["dist.ProcessGroup"]
    rank: int
    plan: RankPlan
    local: LocalPlan
    send_splits: list[int]
    recv_splits: list[int]
    num_tokens: int

    @property
    def rows_sent(self) -> int:
        """Rows sent to other ranks (this rank's own rows stay local) — see :func:`traffic`."""
        return sum(n for r, n in enumerate(self.send_splits) if r != self.rank)


@dataclass
class Dispatched:
    """The result of :func:`dispatch`.

    Attributes:
        x: ``[R, D]`` the received token rows, in rank order of their source, each source's rows by token.
        ids: ``[R, k]`` int32 their expert ids local to this rank (``0 <= id < E_local``), ``-1`` where the slot's
            expert is on another rank.
        weights: ``[R, k]`` f32 their gate weights (differentiable; only the slots with ``ids >= 0`` are used).
        handle: for :func:`combine`.
    """

    x: Tensor
    ids: Tensor
    weights: Tensor
    handle: DispatchHandle


def _layout_fingerprint(layout: ExpertLayout) -> int:
    return zlib.crc32(repr(layout.experts_per_rank).encode())


def _local_error(x: Tensor, ids: Tensor, weights: Tensor, layout: ExpertLayout, world: int) -> str:
    """This rank's problem with its inputs ('' when none)."""
    if layout.world_size != world:
        return (f"the expert layout has {layout.world_size} ranks (experts_per_rank "
                f"{list(layout.experts_per_rank)}) but the process group has {world}")
    if x.dim() != 2 or not x.is_floating_point():
        return f"hidden states must be a floating [T, D] tensor, got {x.dtype} of shape {list(x.shape)}"
    if x.dtype not in _DTYPES:
        return f"hidden states of dtype {x.dtype} are not supported (f32, bf16, f16, f64)"
    if ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        return f"expert ids must be [T, k] with T = {x.shape[0]} (the hidden states' rows), got {list(ids.shape)}"
    if ids.dtype not in (torch.int32, torch.int64):
        return f"expert ids must be int32 or int64, got {ids.dtype}"
    if ids.shape[1] < 1:
        return "expert ids must have k >= 1 columns"
    if weights.shape != ids.shape or not weights.is_floating_point():
        return (f"gate weights must be a floating tensor of the expert ids' shape {list(ids.shape)}, got "
                f"{weights.dtype} of shape {list(weights.shape)}")
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= layout.num_experts:
            bad = lo if lo < 0 else hi
            t = int((ids == bad).nonzero()[0, 0])
            return f"expert id {bad} (token {t}) is outside [0, {layout.num_experts})"
    return ""


def _encode(msg: str, device) -> Tensor:
    raw = msg.encode()[: 8 * _MSG_WORDS].ljust(8 * _MSG_WORDS, b"\0")
    return torch.frombuffer(bytearray(raw), dtype=torch.int64).to(device)


def _decode(words: Tensor) -> str:
    return words.cpu().contiguous().numpy().tobytes().rstrip(b"\0").decode(errors="replace")


def _exchange_headers(counts: Tensor, status: str, x: Tensor, ids: Tensor, layout: ExpertLayout, group,
                      rank: int, world: int) -> list[int]:
    """The header all-to-all (see the module doc); raises the same ValueError on every rank when any rank's inputs
    are bad or the ranks disagree. Returns the rows to receive from each rank."""
    dev = counts.device
    D = x.shape[1] if x.dim() == 2 else -1
    k = ids.shape[1] if ids.dim() == 2 else -1
    dt = _DTYPES.index(x.dtype) if x.dtype in _DTYPES else -1
    head = torch.tensor([1 if status else 0, D, k, dt, layout.num_experts, _layout_fingerprint(layout)],
                        dtype=torch.int64, device=dev)
    row = torch.cat([head, _encode(status, dev)])
    send = torch.cat([counts.view(world, 1), row.expand(world, -1)], 1)
    recv = exchange_counts(send, group, "header").cpu()
    bad = [f"rank {r}: {_decode(recv[r, 7:])}" for r in range(world) if recv[r, 1]]
    if bad:
        raise ValueError("expert_parallel.dispatch: bad inputs on " + "; ".join(bad))
    for col, name in ((2, "hidden size D"), (3, "k (experts per token)"), (4, "dtype"), (5, "num_experts"),
                      (6, "expert layout")):
        vals = recv[:, col].tolist()
        if len(set(vals)) > 1:
            shown = [str(_DTYPES[v]) for v in vals] if col == 4 else vals
            raise ValueError(f"expert_parallel.dispatch: the ranks disagree on {name}: " +
                             ", ".join(f"rank {r}: {v}" for r, v in enumerate(shown)))
    return recv[:, 0].tolist()


@torch.compiler.disable
def dispatch(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, layout: ExpertLayout,
             group: Optional["dist.ProcessGroup"] = None) -> Dispatched:
    """Sends each token row once to every rank owning one of its experts (see the module doc).

    Args:
        x: ``[T, D]`` this rank's tokens (T may differ by rank, 0 included).
        topk_ids: ``[T, k]`` int32/int64 global expert ids in ``[0, E)`` (our routing's indices).
        topk_weights: ``[T, k]`` their gate weights.
        layout: which rank owns which experts (the same on every rank).
        group: the expert-parallel process group (None: the default group).

    Raises:
        ValueError: on every rank, when any rank's inputs are bad (shapes, an expert id outside ``[0, E)``) or the
            ranks disagree on D, k, dtype, E or the layout.
        ExpertParallelError: a collective failed (a rank died, or the group's timeout passed).
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    try:
        status = _local_error(x, topk_ids, topk_weights, layout, world)
        plan = None if status else rank_plan(topk_ids, layout)
    except Exception as e:  # noqa: BLE001  (an unforeseen local failure still reaches every rank, as a ValueError)
        status, plan = f"{type(e).__name__}: {e}", None
    dev = x.device
    if status:
        counts = torch.zeros(world, dtype=torch.int64, device=dev)
    else:
        counts = plan.send_counts
    recv_splits = _exchange_headers(counts, status, x, topk_ids, layout, group, rank, world)
    send_splits = counts.tolist()
    rows = expand(x, plan.send_token, plan.gather)
    w_rows = expand(topk_weights.float(), plan.send_token, plan.gather)
    recv_x, recv_w, recv_ids = dispatch_exchange(rows, w_rows, local_ids(topk_ids, plan, layout), send_splits,
                                                 recv_splits, group)
    local = local_plan(recv_ids, layout.experts_per_rank[rank])
    handle = DispatchHandle(layout, group, rank, plan, local, send_splits, recv_splits, x.shape[0])
    return Dispatched(recv_x, recv_ids, recv_w, handle)


@torch.compiler.disable
def combine(y: Tensor, handle: DispatchHandle) -> Tensor:
    """Sends each received row's result ``y`` ``[R, D]`` back to its source and adds, for each token, the rows from
    its ranks in increasing rank order. Returns ``[T, D]``."""
    if y.dim() != 2 or y.shape[0] != sum(handle.recv_splits):
        raise ValueError(f"expert_parallel.combine: expected [{sum(handle.recv_splits)}, D] rows (one per received "
                         f"row), got {list(y.shape)}")
    back = all_to_all(y, handle.recv_splits, handle.send_splits, handle.group, "combine")
    return reduce(back, handle.plan.gather, handle.plan.send_token)


def expert_rows(d: Dispatched) -> Tensor:
    """``[S_local, D]`` one row per (received row, local expert), sorted by local expert
    (``d.handle.local.tokens_per_expert`` rows each): the grouped GEMMs' input (TorchTitan's ``routed_input``)."""
    return expand(d.x, d.handle.local.row, d.handle.local.gather)


def weighted_reduce(out: Tensor, d: Dispatched) -> Tensor:
    """From the experts' outputs on :func:`expert_rows` (``[S_local, D]``), each received row's outputs times its
    gate weights, added in increasing local expert order: ``[R, D]``, what :func:`combine` sends back."""
    local = d.handle.local
    w = d.weights.reshape(-1)[local.slot]
    weighted = (out.float() * w[:, None]).to(out.dtype)
    return reduce(weighted, local.gather, local.row)


def traffic(handle: DispatchHandle, row_bytes: int, meta_bytes: int) -> dict:
    """Bytes this rank sends to other ranks in one dispatch + combine: token rows (each once per destination rank
    that needs it, the minimum), and the per-row gate weights and ids."""
    rows = handle.rows_sent
    back = sum(n for r, n in enumerate(handle.recv_splits) if r != handle.rank)
    return {"dispatch_rows": rows * row_bytes, "dispatch_meta": rows * meta_bytes, "combine_rows": back * row_bytes}
