"""Routing is deterministic: the same bits at one and two kernel threads, and from one run to the next.

RL pipelines replay a routing recorded by an inference engine, and data-parallel ranks must pick the same experts
for the same tokens: torch.ops.moe.route, topk_renorm and dispatch_plan, forward and backward, give bitwise equal
results whatever the thread count of their CPU kernels (each worker computes fixed rows; sums run in a fixed order)
and in every run. Each configuration runs in its own process (the thread count is part of a kernel's build), at a
token count past the extension's grain (32768 elements), so that two threads really split the work.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from torch_checks import needs_cpu_kernels

PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])

pytestmark = needs_cpu_kernels

_SCRIPT = textwrap.dedent("""
    import sys, torch, moe_mlir
    g = torch.Generator().manual_seed(0)
    T = 4096
    out = []
    # DeepSeek-V3's routing: sigmoid scores, a selection bias, 8 groups of 32, the best 4 groups, k = 8. Ties on
    # purpose: every fourth token's logits repeat one value 16 times.
    x = torch.randn(T, 256, generator=g)
    x[::4, :16] = 0.5
    x.requires_grad_(True)
    bias = torch.randn(256, generator=g) * 0.1
    w, i = torch.ops.moe.route(x, bias, 8, "sigmoid", "score_then_topk", 8, 4, "top2_sum", True, 2.5)
    (w * torch.linspace(0.5, 1.5, w.numel()).view_as(w)).sum().backward()
    out += [w.detach(), i, x.grad]
    # A replayed choice (routing replay, hash routing): sigmoid weights of given experts, and their backward.
    x2 = torch.randn(T, 256, generator=g, requires_grad=True)
    given = torch.randint(0, 256, (T, 8), generator=g)
    w, i = torch.ops.moe.route(x2, bias, 8, "sigmoid", "score_then_topk", 8, 4, "top2_sum", True, 2.5, given)
    (w * torch.linspace(0.5, 1.5, w.numel()).view_as(w)).sum().backward()
    out += [w.detach(), i, x2.grad]
    # Softmax top-k (Qwen3 / Mixtral), renormalized, and its backward.
    s = torch.randn(T, 128, generator=g)
    s[1::4, 32:48] = -0.25
    s.requires_grad_(True)
    w, i = torch.ops.moe.topk_renorm(s, 8, "logits", True)
    (w * torch.linspace(0.5, 1.5, w.numel()).view_as(w)).sum().backward()
    out += [w.detach(), i, s.grad]
    # The dispatch plan of the routing above (counts, offsets, the permutation, padded blocks).
    out += list(torch.ops.moe.dispatch_plan(out[1], 256, 64))
    torch.save(out, sys.argv[1])
""")


def _run(tmp_path: Path, threads: str, tag: str) -> list[torch.Tensor]:
    path = tmp_path / f"{tag}.pt"
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, MOE_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
    p = subprocess.run([sys.executable, "-c", _SCRIPT, str(path)], env=env, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return torch.load(path)


def test_routing_same_bits_at_one_and_two_threads_and_across_runs(tmp_path):
    one = _run(tmp_path, "1", "one")
    two = _run(tmp_path, "2", "two")
    again = _run(tmp_path, "2", "again")
    names = ["route weights", "route indices", "route grad", "replay weights", "replay indices", "replay grad",
             "topk weights", "topk indices", "topk grad"] + [
        f"dispatch_plan output {j}" for j in range(7)]
    assert len(one) == len(names)
    for name, a, b, c in zip(names, one, two, again):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        # Bitwise: NaN-free here, so equal values are equal bits (torch.equal compares values).
        assert torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                           b.view(torch.int32) if b.dtype == torch.float32 else b), f"{name}: 1 vs 2 threads"
        assert torch.equal(b, c), f"{name}: two runs at 2 threads"
