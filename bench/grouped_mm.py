"""The CPU grouped GEMM alone (``torch.ops.moe_mlir.grouped_mm_cpu`` and ``grouped_mm_backward_cpu``, the kernels
under transformers' experts in the moe backend) at fixed expert row counts: min and median of ``--reps`` calls.

Builds are compared one process each, alternated, with ``MOE_TORCH_LIB`` naming each build's ``libmoe_torch.so``
(bench/results/grouped-mm-2026-11-27-t2-epyc-cost-shares-ab.md):

    for lib in old/lib/libmoe_torch.so build/lib/libmoe_torch.so; do
        MOE_TORCH_LIB=$lib .venv/bin/python -m bench.grouped_mm --threads 2; done

``--op expert_mlp`` times the fused expert MLP (``expert_mlp_cpu`` and its backward: hidden K, intermediate N) at the
same counts instead (bench/results/expert-mlp-2026-11-28-t2-xeon-whole-item-ab.md).

Cases: transformers' Mixtral at random weights (hidden 512, E = 8, k = 2, 4 x 128 tokens) routes its two layers'
rows as ``mixtral-l1`` (skewed: 305 against 719 rows in contiguous halves) and ``mixtral-l2``; even counts; many
small experts; decode sizes (one row per busy expert). Weights in nn.Linear's layout, passed transposed, as the
backend passes them.
"""

from __future__ import annotations

import sys

from .threads import pin_threads

_THREADS = pin_threads(2)

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

CASES = {  # name: (rows per expert, K, N)
    "mixtral-l1": ([71, 92, 70, 72, 215, 58, 295, 151], 512, 1024),
    "mixtral-l2": ([232, 181, 16, 81, 217, 133, 53, 111], 512, 1024),
    "equal8": ([128] * 8, 512, 1024),
    "e64x16": ([16] * 64, 256, 256),
    "decode8": ([1] * 8 + [0] * 56, 256, 256),
    "decode3": ([1, 0, 1, 0, 1, 0, 0, 0], 512, 1024),
}


def calls_of(op: str, counts: list[int], K: int, N: int, g) -> dict:
    """The timed calls of one case: the grouped GEMM x [S, K] . w[e]^T (w [E, N, K]) and its backward, or
    (``--op expert_mlp``) the fused expert MLP with hidden K and intermediate N (SiLU GLU: w1 [E, 2N, K], w2
    [E, K, N]) over S rows of S / 2 tokens, and its backward."""
    import torch

    ends = torch.tensor(counts).cumsum(0)
    S, E = sum(counts), len(counts)
    if op == "grouped_mm":
        x = torch.randn(S, K, generator=g)
        w = torch.randn(E, N, K, generator=g)
        grad = torch.randn(S, N, generator=g)
        return {"fwd": lambda: torch.ops.moe_mlir.grouped_mm_cpu(x, w, ends, True),
                "bwd": lambda: torch.ops.moe_mlir.grouped_mm_backward_cpu(grad, x, w, ends, False, True)}
    T = max(S // 2, 1)
    x = torch.randn(T, K, generator=g)
    token = torch.randint(0, T, (S,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), ends])
    rw = torch.rand(S, generator=g)
    w1 = torch.randn(E, 2 * N, K, generator=g) * 0.02
    w2 = torch.randn(E, K, N, generator=g) * 0.02
    grad = torch.randn(T, K, generator=g)
    args = (x, token, offsets, rw, w1, None, w2, None, "silu_glu", 1.0, 0.0)
    return {"fwd": lambda: torch.ops.moe_mlir.expert_mlp_cpu(*args),
            "bwd": lambda: torch.ops.moe_mlir.expert_mlp_backward_cpu(grad, *args)}


def run(names: list[str], reps: int, op: str = "grouped_mm") -> dict[str, tuple[float, float]]:
    import torch

    sys.path.insert(0, str(REPO / "python"))
    import moe_mlir.experts  # noqa: F401  (loads the extension)

    g = torch.Generator().manual_seed(0)
    res = {}
    for name in names:
        counts, K, N = CASES[name]
        for tag, fn in calls_of(op, counts, K, N, g).items():
            for _ in range(3):
                fn()
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            ts.sort()
            res[f"{name}/{tag}"] = (round(ts[0] * 1e3, 3), round(ts[len(ts) // 2] * 1e3, 3))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--op", default="grouped_mm", choices=("grouped_mm", "expert_mlp"))
    args = ap.parse_args(argv)
    print(json.dumps({"threads": _THREADS, "op": args.op, "ms_min_median": run(args.cases, args.reps, args.op)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
