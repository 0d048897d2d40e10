"""A scoring function written in Python only against the built-in sigmoid (issue #48 item 6): the same router,
same inputs, same run.

  .venv/bin/python -m bench.route_score [--threads 2] [--budget 2.0] [--no-compile]

T = 4096 tokens, E = 256 experts, k = 8, a selection bias, renormalized and scaled weights (DeepSeek-V3 without
groups). Rows: ``torch.ops.moe.route`` with ``scoring="sigmoid"`` (the preset), with the same sigmoid written in
Python (``custom_scoring(lambda x: 1 / (1 + exp(-x)))``: what the region costs by itself) and with
``custom_scoring(sqrt(softplus(x)))`` (DeepSeek-V4's sqrtsoftplus, a region the dialect has never seen), forward
and forward + backward (both through the fused moe.route_grad kernel on the CPU), and scoring none (the kernel
without a score pass); the same PyTorch router eager and under inductor (unless --no-compile). Interleaved rounds;
prints the load average before and after: on a shared machine the numbers are indicative.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from .threads import pin_threads

_THREADS = pin_threads(2)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .ours import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "python"))
from moe_mlir import ops  # noqa: E402

T, E, K, SCALE = 4096, 256, 8, 2.5


def sqrtsoftplus(x):
    return torch.sqrt(F.softplus(x))


def eager_router(act):
    """The HF-style router (DeepseekV4TopKRouter after its linear): act, biased top-k, weights over sum + 1e-20."""
    def run(logits, bias):
        scores = act(logits)
        idx = torch.topk(scores + bias, k=K, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * SCALE, idx
    return run


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=_THREADS)
    p.add_argument("--budget", type=float, default=2.0)
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args()
    print(f"load average before: {os.getloadavg()}  threads={_THREADS}  T={T} E={E} k={K}")
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(T, E, generator=g)
    bias = 0.1 * torch.randn(E, generator=g)
    gw = torch.randn(T, K, generator=g)
    # The preset against the same function written in Python (what a custom region costs by itself), and a
    # function the dialect has never seen.
    scorings = {"sigmoid (preset)": "sigmoid",
                "sigmoid (custom region)": ops.custom_scoring(lambda x: 1 / (1 + torch.exp(-x))),
                "sqrtsoftplus (custom region)": ops.custom_scoring(sqrtsoftplus)}

    def fwd(scoring):
        return lambda: torch.ops.moe.route(logits, bias, K, scoring, "score_then_topk", 1, 1, "top2_sum", True, SCALE)

    def fwd_bwd(scoring):
        x = logits.clone().requires_grad_(True)

        def run():
            w, _ = torch.ops.moe.route(x, bias, K, scoring, "score_then_topk", 1, 1, "top2_sum", True, SCALE)
            torch.autograd.grad(w, x, gw)
        return run

    fns = {}
    for name, scoring in scorings.items():
        fns[(f"moe.route {name}", "forward")] = fwd(scoring)
        fns[(f"moe.route {name}", "forward+backward")] = fwd_bwd(scoring)
    fns[("moe.route none (no score pass)", "forward")] = fwd("none")
    if not a.no_compile:
        for name, act in (("sigmoid", torch.sigmoid), ("sqrtsoftplus", sqrtsoftplus)):
            fn = torch.compile(eager_router(act), backend="inductor")
            fns[(f"inductor {name}", "forward")] = lambda fn=fn: fn(logits, bias)
            x = logits.clone().requires_grad_(True)

            def run(fn=fn, x=x):
                w, _ = fn(x, bias)
                torch.autograd.grad(w, x, gw)
            fns[(f"inductor {name}", "forward+backward")] = run
    for name, act in (("sigmoid", torch.sigmoid), ("sqrtsoftplus", sqrtsoftplus)):
        fns[(f"eager torch {name}", "forward")] = lambda fn=eager_router(act): fn(logits, bias)
    # Interleaved rounds (every implementation once a round, the order rotating) until the budget is spent: on a
    # shared machine a change of load then hits every row alike.
    for f in fns.values():
        f()
    times = {key: [] for key in fns}
    keys = list(fns)
    end = time.perf_counter() + a.budget * len(keys)
    r = 0
    while time.perf_counter() < end or r < 5:
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            t0 = time.perf_counter()
            fns[key]()
            times[key].append((time.perf_counter() - t0) * 1e3)
        r += 1
    rows = [(impl, what, statistics.median(v), min(v)) for (impl, what), v in times.items()]
    print(f"{r} interleaved rounds")
    # On a loaded machine the minimum is the steadier statistic of the two.
    print(f"{'implementation':40s} {'pass':18s} {'median ms':>10s} {'min ms':>10s}")
    for impl, what, ms, low in rows:
        print(f"{impl:40s} {what:18s} {ms:10.3f} {low:10.3f}")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
