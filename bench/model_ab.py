"""Backends side by side in one process: a whole model's decode step or training step, the backends' calls
interleaved (issue 51 item 1).

On a shared 2-core machine one process's timings swing 5-50x with what else runs (every OpenMP region waits for its
second thread); with the backends alternating call by call the same load falls on all of them, and the min, p10 and
median of each are comparable. One model instance per backend (same weights); decode is the compiled forward on one
token over a KV cache cut back to the same length before every call, as in :mod:`bench.model_profile`. The backends
share the process (inductor's caches, torch's thread team): a diagnosis, not a replacement for ``bench.models``'
one-process-per-backend protocol.

    .venv/bin/python -m bench.model_ab deepseek_v3_mla decode --backends inductor moe --reps 300
    .venv/bin/python -m bench.model_ab qwen3_moe train --backends inductor moe eager --reps 12
    .venv/bin/python -m bench.model_ab olmoe_e32_k4 prefill --backends inductor moe eager --reps 30
"""

from __future__ import annotations

import sys

from .threads import pin_threads

_THREADS = pin_threads(2)

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _decode_step(name: str, backend: str):
    import torch
    from transformers import DynamicCache

    from .models import build_model

    model, _ = build_model(name, False)
    prompt = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(2))
    fwd = model.forward if backend == "eager" else torch.compile(model.forward, backend=backend)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        tok = model(prompt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        pos = prompt.shape[1]
        for _ in range(4):  # the compiles (prefill-free decode graphs, then the dynamic one)
            fwd(tok, past_key_values=cache, use_cache=True, cache_position=torch.tensor([pos]))
            pos += 1

    def step():
        with torch.no_grad():
            extra = cache.get_seq_length() - pos
            if extra > 0:
                cache.crop(-extra)
            fwd(tok, past_key_values=cache, use_cache=True, cache_position=torch.tensor([pos]))

    return step


def _prefill_step(name: str, backend: str):
    """bench.models' prefill: one forward over 512 tokens, batch 1, no cache, no grad."""
    import torch

    from .models import build_model

    model, _ = build_model(name, False)
    ids = torch.randint(0, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(4))
    c = model if backend == "eager" else torch.compile(model, backend=backend)

    def step():
        with torch.no_grad():
            c(input_ids=ids, use_cache=False)

    return step


def _train_step(name: str, backend: str):
    import torch

    from .models import build_model

    model, _ = build_model(name, False)
    ids = torch.randint(0, model.config.vocab_size, (4, 128), generator=torch.Generator().manual_seed(3))
    model.train()
    model.config.output_router_logits = True
    c = model if backend == "eager" else torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        c(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        opt.step()

    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("phase", choices=("decode", "prefill", "train"))
    ap.add_argument("--backends", nargs="+", default=["inductor", "moe"], choices=("eager", "inductor", "moe"))
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    sys.path.insert(0, str(REPO / "python"))
    import moe_mlir  # noqa: F401

    torch.set_num_threads(_THREADS)
    make = {"decode": _decode_step, "prefill": _prefill_step, "train": _train_step}[args.phase]
    steps = {}
    for b in args.backends:
        steps[b] = make(args.model, b)
        for _ in range(3):
            steps[b]()
    load0 = os.getloadavg()[0]
    times: dict[str, list[float]] = {b: [] for b in args.backends}
    for i in range(args.reps):
        for b in (args.backends if i % 2 == 0 else args.backends[::-1]):
            t0 = time.perf_counter_ns()
            steps[b]()
            times[b].append((time.perf_counter_ns() - t0) / 1e6)
    print(f"{args.model} {args.phase}, {args.reps} interleaved calls each, {_THREADS} threads, "
          f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    stats = {}
    for b, t in times.items():
        t.sort()
        n = len(t)
        stats[b] = (t[0], t[n // 10], t[n // 2])
        print(f"  {b:9s} min {t[0]:.3f}  p10 {t[n // 10]:.3f}  median {t[n // 2]:.3f} ms")
    if "moe" in stats:
        for b in stats:
            if b != "moe":
                r = [x / y for x, y in zip(stats[b], stats["moe"])]
                print(f"  moe vs {b}: {r[0]:.2f}x (min), {r[1]:.2f}x (p10), {r[2]:.2f}x (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
