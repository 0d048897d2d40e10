"""Trains a tiny HF transformers Qwen3-MoE model with its experts sharded over the ranks (expert parallelism).

    torchrun --nproc-per-node 2 examples/expert_parallel/train_qwen3_moe.py [--steps 5]

Every rank builds the same model (same seed), then :func:`moe_mlir.expert_parallel.shard_experts` keeps only the
rank's block of experts in each MoE layer (8 experts: 4 per rank) and selects the experts implementation
``"moe_ep"``: in each layer the tokens go to the ranks holding their experts and back (``all_to_all_single`` on
the default group: gloo for CPU tensors, NCCL when run on GPUs with ``--device cuda``). Each rank trains on its own
batches (data parallel for the replicated weights: attention, router, embeddings — their gradients are averaged
with :func:`~moe_mlir.expert_parallel.allreduce_replicated_grads`; each expert's gradient is already complete on its
owner, summed over every rank's tokens, and is scaled the same way).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

from moe_mlir import expert_parallel as ep  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    torch.manual_seed(0)  # the same initial model on every rank
    cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64)
    model = Qwen3MoeForCausalLM(cfg).to(device)
    sharded = ep.shard_experts(model)
    if rank == 0:
        mine = sharded[0].ep_layout.local_experts(rank)
        print(f"{world} ranks, {len(sharded)} MoE layers, experts {mine.start}..{mine.stop - 1} on rank 0, "
              f"implementation {sharded[0].config._experts_implementation!r}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch, memorised over the steps
    ids = torch.randint(0, cfg.vocab_size, (4, 32), generator=g).to(device)
    for step in range(args.steps):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        ep.allreduce_replicated_grads(model)
        for p in model.parameters():  # the mean over ranks of each rank's loss
            if p.grad is not None:
                p.grad /= world
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step}: mean loss over ranks {float(total) / world:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
