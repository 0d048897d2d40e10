"""Production routers: ``torch.ops.moe.route`` (and ``dispatch_plan``) vs PyTorch eager and torch.compile (inductor)
of the models' own routing code, same inputs, same threads, same run.

  .venv/bin/python -m bench.routing [--threads 2] [--quick] [--only SUBSTR ...] [--no-compile] [--budget S]

Cases (from the router logits on; the router matmul is the same dense GEMM for every implementation and is left out):

* DeepSeek-V3: E = 256, sigmoid scores, e_score_correction_bias, 8 groups scored by their top-2 sum, top-4 groups,
  top-8, renormalize, routed scaling 2.5; the eager baseline is HF's DeepseekV3TopkRouter.forward after its linear;
* Kimi-K2: E = 384, one group (no group step), k = 8, scaling 2.827; eager: the same code without the group mask;
* dispatch_plan of the DeepSeek-V3 indices (block 64, vLLM's moe_align_block_size layout); eager: a stable
  argsort, bincount and cumsum (moe_mlir/reference/routing.py).

at T = 1, 16, 64 (decode) and 4096 (prefill). Targets (issue 13): >= 3x eager at T >= 4096 and >= 1x at T <= 64.
Records have the shape of bench/torch_ops.py's and are written with its markdown writer:
bench/results/routing-<date>-t<threads>[-quick].json and .md. Exit status 1 when one of our outputs is wrong.
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

# Before torch and the kernel cache read them.
_THREADS = pin_threads(2)

import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import torch  # noqa: E402

from .baselines import hf_grouped_router  # noqa: E402
from .ours import REPO  # noqa: E402
from .timing import measure  # noqa: E402
from . import torch_ops  # noqa: E402
from .torch_ops import (SizedCase, add_speedups, bench_main, compile_inductor, named_cases,  # noqa: E402
                        record_correct)

sys.path.insert(0, str(REPO / "python"))
import moe_mlir  # noqa: E402,F401
from moe_mlir.reference import routing as RR  # noqa: E402
from moe_mlir.runtime import cache as kcache  # noqa: E402

DECODE_T = (1, 16, 64)
PREFILL_T = (4096,)


def sigmoid_bias_router(logits, bias, k: int, scale: float):
    """Kimi-K2 / GLM-4.5 (one group): the same code without the group step (its strongest eager form)."""
    scores = logits.sigmoid()
    topk_indices = torch.topk(scores + bias, k=k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    return topk_weights * scale, topk_indices


@dataclass
class Case(SizedCase):
    make_inputs: Callable[[torch.Generator], list]
    ours: Callable[..., object]
    eager: Callable[..., object]
    check: Callable[[list, object, object], float]


def _check_route(inputs, ours, ref) -> float:
    """The same experts per token (the eager order is unspecified) and weights within 1e-5 relative."""
    w, i = ours
    w_e, i_e = ref
    o, o_e = i.long().argsort(-1), i_e.argsort(-1)
    if not torch.equal(i.long().gather(-1, o), i_e.gather(-1, o_e)):
        raise AssertionError("different experts chosen")
    err = (w.gather(-1, o) - w_e.gather(-1, o_e)).abs()
    if not torch.allclose(w.gather(-1, o), w_e.gather(-1, o_e), rtol=1e-5, atol=1e-6):
        raise AssertionError(f"weights differ (max abs err {err.max().item():.3g})")
    return err.max().item() if err.numel() else 0.0


def _check_exact(inputs, ours, ref) -> float:
    for a, b in zip(ours, ref):
        if not torch.equal(a, b):
            raise AssertionError("plan differs")
    return 0.0


def cases(ts) -> list[Case]:
    out = []
    for T in ts:
        regime = "decode" if T <= 64 else "prefill"

        def deepseek_inputs(g, T=T):
            return [torch.randn(T, 256, generator=g), 0.1 * torch.randn(256, generator=g)]

        def kimi_inputs(g, T=T):
            return [torch.randn(T, 384, generator=g), 0.1 * torch.randn(384, generator=g)]

        def plan_inputs(g, T=T):
            x, b = deepseek_inputs(g)
            return [RR.route(x, b, 8, "sigmoid", n_group=8, topk_group=4)[1]]

        out += [
            Case(f"deepseek_v3_T{T}", "route", regime, T, deepseek_inputs,
                 lambda x, b: torch.ops.moe.route(x, b, 8, "sigmoid", "score_then_topk", 8, 4, "top2_sum", True, 2.5),
                 lambda x, b: hf_grouped_router(x, b, 8, 8, 4, 2.5), _check_route),
            Case(f"kimi_k2_T{T}", "route", regime, T, kimi_inputs,
                 lambda x, b: torch.ops.moe.route(x, b, 8, "sigmoid", "score_then_topk", 1, 1, "top2_sum", True,
                                                  2.827),
                 lambda x, b: sigmoid_bias_router(x, b, 8, 2.827), _check_route),
            Case(f"dispatch_plan_E256_k8_B64_T{T}", "dispatch_plan", regime, T, plan_inputs,
                 lambda i: torch.ops.moe.dispatch_plan(i, 256, 64),
                 lambda i: RR.dispatch_plan(i, 256, 64), _check_exact),
        ]
    return out


def run_case(case: Case, args) -> dict:
    rec = {"case": case.name, "op": case.op, "regime": case.regime, "T": case.T,
           "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    inputs = case.make_inputs(torch.Generator().manual_seed(20261122))
    compiles, loads = kcache.stats.compiles, kcache.stats.disk_loads
    t0 = time.perf_counter()
    out = case.ours(*inputs)
    rec["first_call_ms"] = (time.perf_counter() - t0) * 1e3
    rec["kernel_compiled"] = kcache.stats.compiles > compiles
    rec["kernel_loaded_from_disk"] = kcache.stats.disk_loads > loads
    record_correct(rec, lambda: case.check(inputs, out, case.eager(*inputs)))
    reps = 20000 if case.regime == "decode" else 200
    rec["ours"] = measure(lambda: case.ours(*inputs), args.budget, reps)
    rec["eager"] = measure(lambda: case.eager(*inputs), args.budget, reps)
    if not args.no_compile:
        compiled = compile_inductor(rec, case.eager, lambda fn: lambda: fn(*inputs))
        if compiled is not None:
            rec["inductor"] = measure(compiled, args.budget, reps)
    add_speedups(rec)
    return rec


def write_markdown(doc: dict, path: Path) -> None:
    """The shared table; its text names bench/baselines.py, here eager is the models' routing code (this module's
    doc)."""
    torch_ops.write_markdown(doc, path)
    path.write_text(path.read_text().replace("Eager = bench/baselines.py", "Eager = the models' routing code "
                                             "(bench/routing.py: HF DeepseekV3TopkRouter after its linear; Kimi-K2 "
                                             "without groups; a stable-argsort dispatch plan)"))


def main() -> int:
    return bench_main(__doc__, "routing", lambda args: named_cases(args, cases(
        DECODE_T + (() if args.quick else PREFILL_T))), run_case, markdown=write_markdown)


if __name__ == "__main__":
    sys.exit(main())
