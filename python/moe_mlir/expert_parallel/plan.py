"""The dispatch plan with a rank dimension, computed by ``moe.dispatch_plan`` (``torch.ops.moe.dispatch_plan``).

**Send side** (:func:`rank_plan`). Each slot ``(t, j)`` of the routing goes to the rank owning expert
``ids[t, j]``. A token whose k experts sit on the same rank must reach that rank *once* (bytes moved = the
minimum: one row per destination rank that needs it, not one per expert). So the slots are bucketed by rank, a slot
whose rank already appears in an earlier slot of the same token going to an extra bucket ``W`` ("already sent"),
and ``moe.dispatch_plan`` over those ``W + 1`` buckets — the same stable counting-sort kernel that sorts slots by
expert — gives, in one call:

* ``counts[:W]``: the rows sent to each rank (the all-to-all's input splits);
* ``order[:S]``: the rank-major send order (within a rank, by token, since the sort is stable), ``S = Σ counts[:W]``;
* ``inverse``: where each slot's row sits in that order, from which each token's rows are found again in rank
  order for the combine (:attr:`RankPlan.gather`).

**Receive side** (:func:`local_plan`). A received row carries its token's k expert ids, made local to this rank
(``-1`` for a slot owned elsewhere). ``moe.dispatch_plan`` over ``E_local + 1`` experts (``-1`` mapped to the extra
one, which sorts last) gives the tokens per local expert, the expert-sorted rows for the grouped GEMMs, and for each
received row its expert rows in increasing expert order (the order of the weighted sum).

Everything here is integer-valued, local to the rank, and costs O(T·k) (plus an O(T·k²) compare of each slot's rank
with the earlier slots' that is negligible next to the rows moved for k <= 16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .. import ops as _ops  # noqa: F401  (registers torch.ops.moe.dispatch_plan)
from .layout import ExpertLayout

__all__ = ["RankPlan", "LocalPlan", "rank_plan", "local_plan"]


@dataclass
class RankPlan:
    """How a rank's tokens are sent (all int64, on the tokens' device).

    Attributes:
        send_counts: ``[W]`` rows sent to each rank.
        send_token: ``[S]`` the token of each sent row, rank-major.
        send_rank: ``[S]`` the destination of each sent row.
        send_slot: ``[S]`` the slot ``t*k + j`` that first needed the row (its expert's rank).
        gather: ``[T, C]`` (``C = min(k, W)``) each token's sent rows in increasing rank order; ``S`` (past the
            end) where a token needs fewer than ``C`` ranks.
        slot_rank: ``[T, k]`` the owning rank of each slot.
    """

    send_counts: Tensor
    send_token: Tensor
    send_rank: Tensor
    send_slot: Tensor
    gather: Tensor
    slot_rank: Tensor


@dataclass
class LocalPlan:
    """How the received rows meet this rank's experts (all int64).

    Attributes:
        tokens_per_expert: ``[E_local]`` expert rows per local expert (TorchTitan's ``num_tokens_per_local_expert``).
        offsets: ``[E_local + 1]`` their offsets in the expert-sorted rows.
        row: ``[S_local]`` the received row of each expert-sorted row.
        slot: ``[S_local]`` the slot ``i*k + j`` of each expert-sorted row (for its gate weight).
        expert: ``[S_local]`` the local expert of each expert-sorted row.
        gather: ``[R, C]`` (``C = min(k, E_local)``) each received row's expert rows in increasing expert order;
            ``S_local`` where it has fewer.
    """

    tokens_per_expert: Tensor
    offsets: Tensor
    row: Tensor
    slot: Tensor
    expert: Tensor
    gather: Tensor


def _first_of_their_value(v: Tensor) -> Tensor:
    """``[T, k]`` bool: ``v[t, j]`` differs from every ``v[t, j']``, ``j' < j``."""
    k = v.shape[1]
    earlier = torch.ones(k, k, dtype=torch.bool, device=v.device).tril(-1)  # [j, j']: j' < j
    return ~((v[:, :, None] == v[:, None, :]) & earlier).any(-1)


def _sorted_gather(inverse: Tensor, keep: Tensor, past_end: int, width: int) -> Tensor:
    """Per row, the sorted positions of its kept slots, ``past_end`` for the others; the first ``width`` columns
    (a row keeps at most ``width`` slots)."""
    pos = torch.where(keep, inverse, torch.full_like(inverse, past_end))
    return pos.sort(dim=1).values[:, :width].contiguous()


def rank_plan(expert_ids: Tensor, layout: ExpertLayout) -> RankPlan:
    """The send plan of ``expert_ids`` ``[T, k]`` (ids in ``[0, E)``, checked by the caller)."""
    T, k = expert_ids.shape
    W = layout.world_size
    slot_rank = layout.rank_of(expert_ids)
    first = _first_of_their_value(slot_rank)
    bucket = torch.where(first, slot_rank, torch.full_like(slot_rank, W)).to(torch.int32)
    counts, offsets, order, inverse = torch.ops.moe.dispatch_plan(bucket, W + 1, 1)[:4]
    S = int(offsets[W])
    send_slot = order[:S].long()
    return RankPlan(
        send_counts=counts[:W].long(),
        send_token=torch.div(send_slot, k, rounding_mode="floor"),
        send_rank=slot_rank.reshape(-1)[send_slot],
        send_slot=send_slot,
        gather=_sorted_gather(inverse.long().view(T, k), first, S, min(k, W)),
        slot_rank=slot_rank,
    )


def local_ids(expert_ids: Tensor, plan: RankPlan, layout: ExpertLayout) -> Tensor:
    """``[S, k]`` int32: each sent row's k expert ids made local to its destination, ``-1`` where a slot is owned by
    another rank."""
    ids = expert_ids.long()[plan.send_token]
    starts = layout.starts(ids.device)
    dest = plan.send_rank[:, None]
    mine = plan.slot_rank[plan.send_token] == dest
    return torch.where(mine, ids - starts[dest], torch.full_like(ids, -1)).to(torch.int32)


def local_plan(recv_ids: Tensor, num_local_experts: int) -> LocalPlan:
    """The plan of the received rows' local ids ``[R, k]`` (``-1``: not this rank's)."""
    R, k = recv_ids.shape
    El = num_local_experts
    mine = recv_ids >= 0
    bucket = torch.where(mine, recv_ids, torch.full_like(recv_ids, El)).to(torch.int32)
    counts, offsets, order, inverse = torch.ops.moe.dispatch_plan(bucket, El + 1, 1)[:4]
    offsets = offsets.long()
    S = int(offsets[El])
    slot = order[:S].long()
    return LocalPlan(
        tokens_per_expert=counts[:El].long(),
        offsets=offsets[: El + 1],
        row=torch.div(slot, k, rounding_mode="floor"),
        slot=slot,
        expert=bucket.reshape(-1)[slot].long(),
        gather=_sorted_gather(inverse.long().view(R, k), mine, S, max(min(k, El), 1)),
    )
