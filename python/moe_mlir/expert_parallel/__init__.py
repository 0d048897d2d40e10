"""Expert parallelism on ``torch.distributed``, driven by our routing's dispatch plan.

* :func:`dispatch` / :func:`combine` (DeepEP-shaped): tokens to the ranks holding their experts, once per rank,
  with the plan extended by a rank dimension computed by ``moe.dispatch_plan`` (:mod:`.plan`), the exchange by
  ``torch.distributed.all_to_all_single`` on the given process group (:mod:`.exchange`);
* :class:`TorchTitanDispatcher`: TorchTitan's ``dispatch``/``combine`` signature;
* :func:`shard_experts`: HF transformers' MoE models with their experts sharded over a process group (the experts
  implementation ``"moe_ep"``).

See docs/ExpertParallel.md.
"""

from .dispatch import Dispatched, DispatchHandle, combine, dispatch, expert_rows, traffic, weighted_reduce
from .exchange import ExpertParallelError
from .hf import IMPLEMENTATION, allreduce_replicated_grads, hf_ep_experts_forward, register, shard_experts
from .layout import ExpertLayout
from .plan import LocalPlan, RankPlan, local_plan, rank_plan
from .torchtitan import TorchTitanDispatcher

__all__ = ["Dispatched", "DispatchHandle", "combine", "dispatch", "expert_rows", "traffic", "weighted_reduce",
           "ExpertParallelError", "IMPLEMENTATION", "allreduce_replicated_grads", "hf_ep_experts_forward",
           "register", "shard_experts", "ExpertLayout", "LocalPlan", "RankPlan", "local_plan", "rank_plan",
           "TorchTitanDispatcher"]
