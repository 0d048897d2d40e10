"""TorchTitan's token-dispatcher interface on our dispatch and combine.

TorchTitan's MoE layer (``torchtitan/models/common/token_dispatcher.py``) calls

* ``dispatch(x_TD, topk_scores_TK, topk_expert_ids_TK, num_local_tokens_per_expert_E)
  -> (routed_input, num_tokens_per_local_expert, metadata)``: ``routed_input`` one row per (token, local expert),
  sorted by local expert, for its grouped GEMMs;
* ``combine(routed_output, metadata, x_TD, **kwargs) -> [T, D]``: the scores applied to the expert outputs and the
  rows added back into their tokens.

:class:`TorchTitanDispatcher` has those two methods. Unlike TorchTitan's ``AllToAllTokenDispatcher`` (which sends
``T·k`` rows: one per (token, expert)), a token row crosses the network once per rank that needs it; the expansion to
one row per local expert happens on the receiving rank, and the scores are applied there before the one-row-per-rank
result goes back (same maths; the sums in a fixed order, see :mod:`.dispatch`). ``num_local_tokens_per_expert_E`` is
accepted for the signature (its shape is checked; our plan recomputes the counts from the ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .dispatch import Dispatched, combine, dispatch, expert_rows, weighted_reduce
from .layout import ExpertLayout

__all__ = ["TorchTitanDispatcher", "TitanMetadata"]


@dataclass
class TitanMetadata:
    """What :meth:`TorchTitanDispatcher.combine` needs (opaque to the caller)."""

    dispatched: Dispatched


class TorchTitanDispatcher:
    """Expert-parallel token dispatcher with TorchTitan's ``dispatch``/``combine`` signature.

    Args:
        num_experts: E (global); top_k: k; group: the expert-parallel process group (None: default group);
        experts_per_rank: block sizes (default even).
    """

    def __init__(self, num_experts: int, top_k: int, group: Optional["dist.ProcessGroup"] = None,
                 experts_per_rank: Optional[Sequence[int]] = None) -> None:
        self.num_experts, self.top_k, self.group = num_experts, top_k, group
        self.layout = ExpertLayout.make(num_experts, dist.get_world_size(group), experts_per_rank)
        self.rank = dist.get_rank(group)

    @property
    def local_experts(self) -> range:
        """The global ids of this rank's experts."""
        return self.layout.local_experts(self.rank)

    def dispatch(self, x_TD: Tensor, topk_scores_TK: Tensor, topk_expert_ids_TK: Tensor,
                 num_local_tokens_per_expert_E: Optional[Tensor] = None) -> tuple[Tensor, Tensor, TitanMetadata]:
        if topk_expert_ids_TK.dim() == 2 and topk_expert_ids_TK.shape[1] != self.top_k:
            raise ValueError(f"TorchTitanDispatcher.dispatch: topk ids have {topk_expert_ids_TK.shape[1]} columns, "
                             f"top_k = {self.top_k}")
        if num_local_tokens_per_expert_E is not None and num_local_tokens_per_expert_E.shape != (self.num_experts,):
            raise ValueError(f"TorchTitanDispatcher.dispatch: num_local_tokens_per_expert must be [{self.num_experts}]"
                             f", got {list(num_local_tokens_per_expert_E.shape)}")
        d = dispatch(x_TD, topk_expert_ids_TK, topk_scores_TK, self.layout, self.group)
        return expert_rows(d), d.handle.local.tokens_per_expert, TitanMetadata(d)

    def combine(self, routed_output: Tensor, metadata: TitanMetadata, x_TD: Tensor, **_: Any) -> Tensor:
        d = metadata.dispatched
        if routed_output.dim() != 2 or routed_output.shape[0] != d.handle.local.row.shape[0]:
            raise ValueError(f"TorchTitanDispatcher.combine: routed_output must be [{d.handle.local.row.shape[0]}, D] "
                             f"(the rows dispatch returned), got {list(routed_output.shape)}")
        return combine(weighted_reduce(routed_output, d), d.handle).to(x_TD.dtype)
