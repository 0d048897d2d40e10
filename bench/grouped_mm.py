"""The CPU grouped GEMM alone (``torch.ops.moe_mlir.grouped_mm_cpu`` and ``grouped_mm_backward_cpu``, the kernels
under transformers' experts in the moe backend) at fixed expert row counts: min and median of ``--reps`` calls.

Builds are compared one process each, alternated, with ``MOE_TORCH_LIB`` naming each build's ``libmoe_torch.so``
(bench/results/grouped-mm-2026-11-27-t2-epyc-cost-shares-ab.md):

    for lib in old/lib/libmoe_torch.so build/lib/libmoe_torch.so; do
        MOE_TORCH_LIB=$lib .venv/bin/python -m bench.grouped_mm --threads 2; done

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


def run(names: list[str], reps: int) -> dict[str, tuple[float, float]]:
    import torch

    sys.path.insert(0, str(REPO / "python"))
    import moe_mlir.experts  # noqa: F401  (loads the extension)

    g = torch.Generator().manual_seed(0)
    res = {}
    for name in names:
        counts, K, N = CASES[name]
        ends = torch.tensor(counts).cumsum(0)
        x = torch.randn(sum(counts), K, generator=g)
        w = torch.randn(len(counts), N, K, generator=g)
        grad = torch.randn(sum(counts), N, generator=g)
        calls = {"fwd": lambda: torch.ops.moe_mlir.grouped_mm_cpu(x, w, ends, True),
                 "bwd": lambda: torch.ops.moe_mlir.grouped_mm_backward_cpu(grad, x, w, ends, False, True)}
        for tag, fn in calls.items():
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
    args = ap.parse_args(argv)
    print(json.dumps({"threads": _THREADS, "ms_min_median": run(args.cases, args.reps)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
