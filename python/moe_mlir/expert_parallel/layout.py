"""Which rank owns which experts: contiguous blocks in rank order (TorchTitan's and Megatron-core's layout).

Rank ``r`` owns the experts ``[starts[r], starts[r+1])``. Blocks may be uneven (``experts_per_rank``, any
non-negative counts summing to E); the default is the even split of TorchTitan/Megatron when ``W`` divides ``E``
and otherwise ``ceil``-sized blocks first (e.g. E = 10 on 4 ranks: 3, 3, 2, 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["ExpertLayout"]


@dataclass(frozen=True)
class ExpertLayout:
    """``num_experts`` experts over ``world_size`` ranks in contiguous blocks.

    Attributes:
        num_experts: E, the global number of experts (the router's ids are in ``[0, E)``).
        experts_per_rank: the size of each rank's block (length ``world_size``, sum ``E``).
    """

    num_experts: int
    experts_per_rank: tuple[int, ...]

    @staticmethod
    def even(num_experts: int, world_size: int) -> "ExpertLayout":
        """Blocks as even as possible, the larger ones first."""
        if world_size < 1:
            raise ValueError(f"expert_parallel: world_size ({world_size}) must be >= 1")
        base, extra = divmod(num_experts, world_size)
        return ExpertLayout(num_experts, tuple(base + (r < extra) for r in range(world_size)))

    @staticmethod
    def make(num_experts: int, world_size: int, experts_per_rank: Optional[Sequence[int]] = None) -> "ExpertLayout":
        if experts_per_rank is None:
            return ExpertLayout.even(num_experts, world_size)
        return ExpertLayout(num_experts, tuple(int(n) for n in experts_per_rank))

    def __post_init__(self) -> None:
        if self.num_experts < 1:
            raise ValueError(f"expert_parallel: num_experts ({self.num_experts}) must be >= 1")
        if not self.experts_per_rank or any(n < 0 for n in self.experts_per_rank):
            raise ValueError(f"expert_parallel: experts_per_rank {list(self.experts_per_rank)} must be one "
                             "non-negative count per rank")
        if sum(self.experts_per_rank) != self.num_experts:
            raise ValueError(f"expert_parallel: experts_per_rank {list(self.experts_per_rank)} sums to "
                             f"{sum(self.experts_per_rank)}, not num_experts = {self.num_experts}")

    @property
    def world_size(self) -> int:
        return len(self.experts_per_rank)

    def start(self, rank: int) -> int:
        """The first global expert id of ``rank``'s block."""
        return sum(self.experts_per_rank[:rank])

    def local_experts(self, rank: int) -> range:
        s = self.start(rank)
        return range(s, s + self.experts_per_rank[rank])

    def starts(self, device: torch.device) -> Tensor:
        """``[W+1]`` int64: block boundaries (``starts[W] = E``)."""
        out = [0]
        for n in self.experts_per_rank:
            out.append(out[-1] + n)
        return torch.tensor(out, dtype=torch.int64, device=device)

    def rank_of(self, expert_ids: Tensor) -> Tensor:
        """The owning rank of each expert id (ids in ``[0, E)``), int64, same shape. Empty blocks own nothing."""
        ends = self.starts(expert_ids.device)[1:]
        return torch.bucketize(expert_ids.long(), ends, right=True)
