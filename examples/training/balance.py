"""The load-balancing loss at work: a router that starts collapsed onto two experts is trained with and without
Switch's auxiliary loss, and the expert load is printed before and after.

    .venv/bin/python examples/training/balance.py [--coef 0.1] [--steps 100] [--compile]

The model is ``moe_mlir.models.StandardSMoEBlock`` (Switch/GLaM-style: linear router, top-2 of 8 experts) with
``balance_loss_coef`` (ACMoE's fine-tuning recipe, 0.1, by default) and a small z-loss (ST-MoE's 1e-3); both are
``torch.ops.moe.load_balancing_loss`` / ``router_z_loss`` (fused forward and backward into the logits), added to
the task loss through the block's ``aux_loss``. The router's bias starts skewed (experts 0 and 1 take almost every
token, the collapse the loss exists to prevent). Two copies of that initialisation train on the same batches with
Adam, one with the loss coefficients at 0: the script prints the per-expert token counts (a held-out batch, top-2
slots) and the max/mean load ratio (1 = perfectly balanced, E/k = 4 = every token on the same two experts) before
and after, and exits with status 1 unless the balanced run ends below ``--target`` while the other does not.
``--compile`` runs both through ``torch.compile(backend="moe")``. The run's time is the block's small dense
matmuls (2 x 100 steps); the loss ops take tens of microseconds per call at this size (docs/Training.md).

The task is the one of train.py: a fixed random teacher (a two-layer tanh network plus the sequence mean), MSE.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import moe_mlir  # noqa: E402,F401  (registers torch.ops.moe.* and the "moe" backend)
from moe_mlir.models import StandardSMoEBlock  # noqa: E402

E, K, D = 8, 2, 32


def make_model(coef: float, z_coef: float, seed: int = 0) -> StandardSMoEBlock:
    torch.manual_seed(seed)
    m = StandardSMoEBlock(d_model=D, n_heads=4, num_experts=E, k=K, d_ff=2 * D, return_routing=True,
                          balance_loss_coef=coef, z_loss_coef=z_coef).train()
    with torch.no_grad():  # a collapsed router: experts 0 and 1 win almost every token
        m.gate.bias.copy_(torch.tensor([4.0, 4.0] + [0.0] * (E - 2)))
    return m


def make_batch(g: torch.Generator, w1: torch.Tensor, w2: torch.Tensor, batch: int = 8, seq: int = 32):
    x = torch.randn(batch, seq, D, generator=g)
    y = torch.tanh(x @ w1) @ w2 + x.mean(1, keepdim=True)
    return x, y


def expert_load(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Top-k slots per expert on ``x`` (int64 [E])."""
    with torch.no_grad():
        _, _, idx = model(x)
    return torch.bincount(idx.reshape(-1).long(), minlength=E)


def ratio(counts: torch.Tensor) -> float:
    return float(counts.max()) / float(counts.float().mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coef", type=float, default=0.1, help="balance loss coefficient (ACMoE: 0.01 / 0.1)")
    ap.add_argument("--z-coef", type=float, default=1e-3, help="router z-loss coefficient (ST-MoE: 1e-3)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--target", type=float, default=1.5, help="max/mean load the balanced run must end below")
    ap.add_argument("--compile", action="store_true", help='train through torch.compile(backend="moe")')
    args = ap.parse_args()

    g = torch.Generator().manual_seed(1)
    w1 = torch.randn(D, 2 * D, generator=g) / D ** 0.5
    w2 = torch.randn(2 * D, D, generator=g) / (2 * D) ** 0.5
    held_out, _ = make_batch(g, w1, w2, batch=16)
    balanced = make_model(args.coef, args.z_coef)
    plain = make_model(0.0, 0.0)
    plain.load_state_dict(balanced.state_dict())
    runs = {"with the loss": balanced, "without": plain}
    before = {name: expert_load(m, held_out) for name, m in runs.items()}
    start = time.perf_counter()
    for name, model in runs.items():
        step_fn = torch.compile(model, backend="moe") if args.compile else model
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        gb = torch.Generator().manual_seed(2)
        for _ in range(args.steps):
            x, y = make_batch(gb, w1, w2)
            out, _, _ = step_fn(x)
            task = F.mse_loss(out, y)
            loss = task + model.aux_loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"{name:>14}: final task loss {task.detach().item():.4f}, aux loss {model.aux_loss.detach().item():.4f}")
    elapsed = time.perf_counter() - start
    after = {name: expert_load(m, held_out) for name, m in runs.items()}

    print(f"\nexpert load (top-{K} slots of {held_out.shape[0] * held_out.shape[1]} held-out tokens; "
          f"max/mean 1 = balanced, {E // K} = collapsed)")
    for name in runs:
        for when, counts in (("before", before[name]), ("after", after[name])):
            print(f"{name:>14} {when:>6}: {' '.join(f'{int(c):4d}' for c in counts)}   max/mean {ratio(counts):.2f}")
    print(f"\n{2 * args.steps} steps in {elapsed:.1f} s (balance coefficient {args.coef}, z-loss {args.z_coef}"
          f"{', backend=moe' if args.compile else ''}, {torch.get_num_threads()} threads)")
    ok = ratio(after["with the loss"]) < args.target <= ratio(after["without"])
    if not ok:
        print(f"FAIL: expected the balanced run below {args.target} and the other not", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
