"""The README demo: a Similarity-Inform SMoE transformer block, imported from PyTorch, compiled for the CPU.

Run: ``.venv/bin/python -m moe_mlir.demo`` (scripts/setup.sh does it after the build). It imports the block with
torch.export, shows the routing op the importer produced, compiles it through moe-opt and the execution API, checks
the result against eager PyTorch and prints the time of both (median of repeated calls, same process, same
thread count).
"""

from __future__ import annotations

import statistics
import time

import torch

import moe_mlir
from moe_mlir.models import similarity_inform


def _median_ms(fn, repeats: int = 20) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> int:
    model, (x,) = similarity_inform.example(batch=2, seq=64)
    text = moe_mlir.import_model(model, (x,))
    routing = sorted({line.split('"')[1] for line in text.splitlines() if '"moe.' in line})
    print(f"imported {type(model).__name__}: {len(text.splitlines())} lines of MLIR, routing ops {routing}")

    compiled = moe_mlir.compile(model, (x,), target="cpu")
    with torch.no_grad():
        eager = model(x)
    ours = compiled(x)
    eager_t = eager[0] if isinstance(eager, (tuple, list)) else eager
    ours_t = ours[0] if isinstance(ours, (tuple, list)) else ours
    # f32 throughout; sums in a different order than PyTorch's kernels: a few ulps of the outputs' scale.
    torch.testing.assert_close(ours_t, eager_t, rtol=1e-4, atol=1e-5)
    print(f"compiled output matches eager PyTorch (max abs diff {float((ours_t - eager_t).abs().max()):.2e})")

    with torch.no_grad():
        eager_ms = _median_ms(lambda: model(x))
    ours_ms = _median_ms(lambda: compiled(x))
    print(f"block forward on the CPU ({torch.get_num_threads()} threads), median of 20 calls: "
          f"eager PyTorch {eager_ms:.3f} ms, moe-mlir compiled {ours_ms:.3f} ms ({compiled.backend} backend)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
