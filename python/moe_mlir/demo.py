"""The README demo, two parts (``.venv/bin/python -m moe_mlir.demo``; scripts/demo.sh runs it):

1. HF's own ``Qwen3MoeSparseMoeBlock`` (a Qwen3-MoE-shaped config scaled down so that the demo stays short: hidden
   512, 32 experts, k=4, moe_intermediate 256; 512 tokens; random weights, nothing downloaded) through
   ``torch.compile(backend="moe")``: the routing raised to ``torch.ops.moe.topk_renorm``, the rest compiled by
   inductor, HF's data-dependent expert loop handled by graph breaks. Checked against eager and timed against eager
   and ``backend="inductor"`` (medians over interleaved rounds, same process, same thread count).
2. The whole-graph path: a Similarity-Inform SMoE block imported with torch.export, the routing op the importer
   produced, compiled through moe-opt and the execution API, checked and timed against eager.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

import moe_mlir
from moe_mlir.backends.dynamo import capture_graphs
from moe_mlir.models import similarity_inform


def _median_ms(fn, repeats: int = 20) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _interleaved_ms(fns: dict, rounds: int) -> dict:
    for fn in fns.values():
        fn()  # warm-up
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - start) * 1e3)
    return {k: statistics.median(t) for k, t in times.items()}


def hf_block(hidden: int = 512, experts: int = 32, k: int = 4, inter: int = 256, tokens: int = 512) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    except ImportError:
        print("(part 1 skipped: transformers is not installed; scripts/install-python.sh installs it)")
        return
    cfg = Qwen3MoeConfig(hidden_size=hidden, num_experts=experts, num_experts_per_tok=k, moe_intermediate_size=inter,
                         norm_topk_prob=True)
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, hidden ** -0.5)
    x = torch.randn(1, tokens, hidden)
    moe = torch.compile(block, backend="moe")
    inductor = torch.compile(block, backend="inductor")
    with torch.no_grad():
        start = time.perf_counter()
        with capture_graphs() as log:
            got = moe(x)
        compile_s = time.perf_counter() - start
        want = block(x)
        inductor(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        raised = sorted({op for g in log for op in g.moe_ops()})
        print(f"1. HF Qwen3MoeSparseMoeBlock (hidden {hidden}, {experts} experts, k={k}, {tokens} tokens) through "
              f"torch.compile(backend='moe'): {len(log)} graphs compiled in {compile_s:.1f} s, routing raised to "
              f"{raised}; output matches eager (max abs diff {float((got - want).abs().max()):.2e})")
        ms = _interleaved_ms({"eager": lambda: block(x), "inductor": lambda: inductor(x), "moe": lambda: moe(x)},
                             rounds=5)
    print(f"   forward, {torch.get_num_threads()} threads, median of 5 interleaved rounds: eager {ms['eager']:.1f} ms, "
          f"inductor {ms['inductor']:.1f} ms, moe {ms['moe']:.1f} ms: speed-up {ms['eager'] / ms['moe']:.2f}x over "
          f"eager, {ms['inductor'] / ms['moe']:.2f}x over inductor")


def main() -> int:
    hf_block()
    model, (x,) = similarity_inform.example(batch=2, seq=64)
    text = moe_mlir.import_model(model, (x,))
    routing = sorted({line.split('"')[1] for line in text.splitlines() if '"moe.' in line})
    print(f"2. whole-graph path: imported {type(model).__name__}: {len(text.splitlines())} lines of MLIR, "
          f"routing ops {routing}")

    compiled = moe_mlir.compile(model, (x,), backend="auto")
    with torch.no_grad():
        eager = model(x)
    ours = compiled(x)
    eager_t = eager[0] if isinstance(eager, (tuple, list)) else eager
    ours_t = ours[0] if isinstance(ours, (tuple, list)) else ours
    # f32 throughout; sums in a different order than PyTorch's kernels: a few ulps of the outputs' scale.
    torch.testing.assert_close(ours_t, eager_t, rtol=1e-4, atol=1e-5)
    print(f"   compiled output matches eager PyTorch (max abs diff {float((ours_t - eager_t).abs().max()):.2e})")

    with torch.no_grad():
        eager_ms = _median_ms(lambda: model(x))
    ours_ms = _median_ms(lambda: compiled(x))
    print(f"   block forward on the CPU ({torch.get_num_threads()} threads), median of 20 calls: "
          f"eager PyTorch {eager_ms:.3f} ms, moe-mlir compiled {ours_ms:.3f} ms ({compiled.backend} backend)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
