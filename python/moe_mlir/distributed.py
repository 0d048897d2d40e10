"""Router state under data parallelism: every rank routes with the statistics of the *global* batch.

Two seed routers keep state computed from the batch rather than learned by gradient: Symphony's expert co-selection
graph ``A`` (``moe.adjacency_update``, 004 Alg. 1 l.3-9) and ACMoE's cluster statistics (``moe.mad_dispersion``,
003 Def. 1). Computed per rank, the replicas' ``A`` drift apart (004 §3 "[S] all-reduce C") and ACMoE routes each
rank with different feature weights (003 §5.8). The models of :mod:`moe_mlir.models` call this module, so a user of
``torch.nn.parallel.DistributedDataParallel`` (or any data-parallel loop on ``torch.distributed``) gets the global
statistics without extra code:

* :class:`~moe_mlir.models.SymphonyBlock` (training mode): the base router's top-k indices of every rank are
  gathered (:func:`gather_rows`, rank order) and ``moe.adjacency_update`` runs on the concatenation. The counts are
  integers, so the new ``A`` is bit-identical on every rank *and* to one process updating on the concatenated
  batch. Traffic: ``T·k`` int32 per rank and step (64 KiB at T = 8192, k = 2).
* :class:`~moe_mlir.models.ACMoEBlock` (training mode): :func:`mad_dispersion` all-gathers the sufficient
  statistics in two rounds (per-cluster token counts as int64 and feature sums in float64, then the sums of
  ``|x - μ|`` (or ``(x - μ)²``) around the global means) and adds them in rank order, so that every rank computes
  bit-identical weights whatever the collective's own reduction order; they equal one process's
  ``moe.mad_dispersion`` on the concatenated batch up to f32 rounding (the single process sums in f32, this in f64).
  Traffic: ``2·E·D`` float64 and ``E`` int64 per rank and step. Eval mode keeps the per-rank statistics (the authors'
  code; no collective a rank could wait on forever when ranks evaluate different numbers of batches).

The collectives run on the default process group, or the one given to :func:`set_group` (e.g. the data-parallel
group of a model that is also tensor-parallel); they use the tensors' device, so the same code runs with gloo on CPU
tensors and NCCL on CUDA tensors. The collectives are excluded from ``torch.compile`` graphs
(:func:`torch.compiler.disable`: a graph break where they run, in training under ``torch.distributed`` only).
:func:`local_router_state` turns the synchronisation off (per-rank statistics, the authors' code).

Expert parallelism (experts sharded over ranks, tokens exchanged by all-to-all, driven by ``moe.dispatch_plan``)
is :mod:`moe_mlir.expert_parallel` (docs/ExpertParallel.md).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from .reference import _dispersion_weights

__all__ = ["active", "set_group", "local_router_state", "gather_rows", "sum_over_ranks", "mad_dispersion"]

_GROUP: Optional["dist.ProcessGroup"] = None
_DISABLED = 0


def set_group(group: Optional["dist.ProcessGroup"]) -> None:
    """The process group whose ranks share router state (None: the default group)."""
    global _GROUP
    _GROUP = group


@contextlib.contextmanager
def local_router_state() -> Iterator[None]:
    """Inside the block, router statistics stay per rank (no collective)."""
    global _DISABLED
    _DISABLED += 1
    try:
        yield
    finally:
        _DISABLED -= 1


def active() -> bool:
    """True when router state is synchronised: torch.distributed is initialised with more than one rank in the
    group and :func:`local_router_state` is not in effect."""
    return (not _DISABLED and dist.is_available() and dist.is_initialized()
            and dist.get_world_size(_GROUP) > 1)


@torch.compiler.disable
def gather_rows(t: Tensor) -> Tensor:
    """The rows of ``t`` ``[T_r, ...]`` of every rank, concatenated in rank order (``T_r`` may differ by rank)."""
    world = dist.get_world_size(_GROUP)
    n = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=_GROUP)
    rows = [int(s) for s in sizes]
    padded = t.new_zeros((max(rows), *t.shape[1:]))
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous(), group=_GROUP)
    return torch.cat([p[:r] for p, r in zip(parts, rows)])


@torch.compiler.disable
def sum_over_ranks(t: Tensor) -> Tensor:
    """``Σ_r t_r`` added in rank order on every rank: the same bits everywhere, whatever the backend's reduction
    order (all_reduce leaves that to the backend)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(_GROUP))]
    dist.all_gather(parts, t.contiguous(), group=_GROUP)
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    return total


@torch.compiler.disable
def mad_dispersion(tokens: Tensor, assign: Tensor, num_experts: int, eps: float = 1e-4, clip: float = 10.0,
                   normalize: str = "feature", measure: str = "mad", empty: str = "identity") -> tuple[Tensor, Tensor]:
    """``moe.mad_dispersion`` over the tokens of every rank (same arguments and results; no gradient).

    Two rounds of sufficient statistics: counts ``N_k`` (int64) and sums ``Σ x`` (float64) give the global means
    ``μ_k``; then the sums of ``|x - μ_k|`` (``"mad"``) or ``(x - μ_k)²`` (``"variance"``). Every rank finishes the
    weights from the same totals with the reference's formula (:func:`moe_mlir.reference._dispersion_weights`).

    Raises:
        ValueError: a value of ``assign`` outside ``[0, num_experts)``.
    """
    from .ops._checks import _check_index_range
    from .ops.seed_routers import mad_dispersion

    mad_dispersion.check(tokens, assign, num_experts, eps, clip, normalize, measure, empty)
    _check_index_range("mad_dispersion", "assign", assign, num_experts)
    x = tokens.detach().to(torch.float64)
    a = assign.long()
    onehot = torch.nn.functional.one_hot(a, num_experts).to(torch.float64)  # [T, E]
    counts = sum_over_ranks(torch.bincount(a, minlength=num_experts))  # exact integers
    denom = counts.clamp_min(1).to(torch.float64)[:, None]
    mu = sum_over_ranks(onehot.t() @ x) / denom  # [E, D]; an empty cluster: 0
    dev = x - mu[a]
    dev = dev.abs() if measure == "mad" else dev * dev
    s = (sum_over_ranks(onehot.t() @ dev) / denom).to(torch.float32)
    return _dispersion_weights(s, counts.to(torch.float32), eps, clip, normalize, empty), counts.to(torch.int32)
