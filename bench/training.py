"""Forward + backward of every differentiable ``torch.ops.moe.*`` op vs eager PyTorch and inductor, same inputs,
same threads, same run.

  .venv/bin/python -m bench.training [--threads 2] [--quick] [--only SUBSTR ...] [--no-compile] [--budget S]

Cases: the differentiable ops of bench/torch_ops.py's decode (T = 1, 16, 64) and prefill cases (topk_renorm,
similarity_inform and its fused top-k, attention_posterior, hyper_router; mad_dispersion and adjacency_update carry
no gradient). One timed call = the op's forward, then ``torch.autograd.grad`` of ``Σ out²`` over its float outputs
with respect to every float input. Eager = bench/baselines.py (the papers' formulation) under autograd; inductor =
``torch.compile`` of that function, differentiated through AOTAutograd (static shapes). Ours = the op as a user
calls it (its registered backward, whatever implements it). Our gradients are checked against eager's. Each
hyper_router case runs twice: as above, and ``_frozen``: gradients w.r.t. ``emb`` only (HyperRouter's hypernetwork
w1, b1, w2, b2 is frozen by design, 002 §1.10), where eager's autograd skips the weights' gradients.

Writes bench/results/training-<date>-t<threads>[-quick].json and .md.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys

from .threads import pin_threads

_THREADS = pin_threads(2)

import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Optional  # noqa: E402

import torch  # noqa: E402

from . import cases as C  # noqa: E402
from .timing import measure  # noqa: E402
from .torch_ops import (add_speedups, bench_main, compile_inductor, machine_line, ours_call,  # noqa: E402
                        record_correct, select_cases, table_row)

DIFFERENTIABLE = ("topk_renorm", "similarity_inform", "similarity_inform_topk", "attention_posterior",
                  "hyper_router")
#: Gradient check: f32 maths in other orders (flash-style recompute vs the materialized N×N softmax). The mixing
#: gradients are sums over N keys or queries accumulated tile by tile in f32, so their error grows with N: atol
#: scales with the number of summed terms, the rule of python/tests/test_grad_ops.py (2e-5 · max(1, N/32) there).
#: Measured at N=16384 (sim_B1_N16384_D64_K16) against a float64 reference: ours max 1.2e-5 / mean 1.2e-8 on du,
#: eager's f32 GEMMs max 1.8e-6 / mean 5.6e-9.
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-5


def grad_atol(params: dict) -> float:
    n = params.get("Nk", params.get("N", 1))
    return GRAD_ATOL * max(1.0, n / 32)


def fwd_bwd(fn: Callable, inputs: list, trainable: Optional[tuple[int, ...]] = None) -> Callable[[], list]:
    """A call of ``fn`` then the gradients of ``Σ out²`` (float outputs) w.r.t. the float inputs (those at the
    positions ``trainable`` when given; the others are constants)."""
    leaves = [t.detach().requires_grad_(t.is_floating_point() and (trainable is None or i in trainable))
              for i, t in enumerate(inputs)]
    diff = [t for t in leaves if t.requires_grad]

    def step() -> list:
        outs = fn(*leaves)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        loss = sum((o.float() * o.float()).sum() for o in outs if o.is_floating_point() and o.requires_grad)
        return list(torch.autograd.grad(loss, diff, allow_unused=True))

    return step


def _grad_error(ours: list, eager: list, atol: float = GRAD_ATOL,
                reference64: Optional[Callable[[], list]] = None) -> float:
    """Max abs difference of our gradients from eager's. Outside the tolerance, both are compared with a float64
    reference (``reference64``, when given): ours pass when no further from it than eager's own float32 result
    (with a factor 2 of slack), e.g. hyper_router's E·(D+1) = 262400-term sums, where eager's error is the larger."""
    worst = 0.0
    for n, (a, b) in enumerate(zip(ours, eager)):
        a = torch.zeros_like(b) if a is None else a
        b = torch.zeros_like(a) if b is None else b
        err = (a.float() - b.float()).abs()
        if (err > atol + GRAD_RTOL * b.float().abs()).any():
            msg = f"gradients differ: max abs err {err.max().item():.3g}"
            if reference64 is None:
                raise AssertionError(msg)
            r = reference64()[n]
            ours64 = float((a.double() - r).abs().max())
            eager64 = float((b.double() - r).abs().max())
            if not ours64 <= 2 * eager64 + atol:
                raise AssertionError(f"{msg}; against float64: ours {ours64:.3g}, eager {eager64:.3g}")
        worst = max(worst, float(err.max()) if err.numel() else 0.0)
    return worst


def run_case(case: C.Case, args) -> dict:
    rec = {"case": case.name, "op": case.op, "regime": case.regime, "params": case.params,
           "T": case.params.get("T"), "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    g = torch.Generator().manual_seed(20260521)
    inputs = [t.contiguous() for t in case.make_inputs(g)]
    trainable = case.params.get("trainable")
    ours = fwd_bwd(ours_call(case), inputs, trainable)
    eager = fwd_bwd(case.eager, inputs, trainable)
    t0 = time.perf_counter()
    got = ours()
    rec["first_call_ms"] = (time.perf_counter() - t0) * 1e3
    inputs64 = [t.double() if t.is_floating_point() else t for t in inputs]
    reference64 = functools.lru_cache(maxsize=None)(lambda: fwd_bwd(case.eager, inputs64, trainable)())
    record_correct(rec, lambda: _grad_error(got, eager(), grad_atol(case.params), reference64),
                   key="max_abs_grad_err")
    reps = 20000 if case.regime == "decode" else 100
    rec["ours"] = measure(ours, args.budget, reps)
    rec["eager"] = measure(eager, args.budget, reps)
    if not args.no_compile:
        compiled = compile_inductor(rec, case.eager, lambda fn: fwd_bwd(fn, inputs, trainable))
        if compiled is not None:
            rec["inductor"] = measure(compiled, args.budget, reps)
    add_speedups(rec)
    return rec


def write_markdown(doc: dict, path: Path) -> None:
    lines = [
        f"# Forward + backward: torch.ops.moe.* vs eager and inductor ({doc['date']})", "",
        machine_line(doc) + " (ratios within one run are what counts; a loaded machine's numbers need a quiet rerun).", "",
        "One call = forward, then the gradients of sum(out^2) w.r.t. every float input. Ours = the op with its "
        "registered backward; eager = bench/baselines.py under autograd; inductor = torch.compile of it (AOTAutograd)."
        " x = eager (inductor) time / ours.", "",
        "| case | regime | T | ours | eager | inductor | x eager | x inductor | max grad err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        err = f"{r['max_abs_grad_err']:.1e}" if "max_abs_grad_err" in r else r.get("error", "")[:40]
        lines.append(table_row(r, err))
    path.write_text("\n".join(lines) + "\n")


def with_frozen_hypernetwork(cases: list[C.Case]) -> list[C.Case]:
    """Each hyper_router case followed by its ``_frozen`` twin: gradients w.r.t. ``emb`` (input 0) only."""
    out = []
    for c in cases:
        out.append(c)
        if c.op == "hyper_router":
            out.append(dataclasses.replace(c, name=c.name + "_frozen", params={**c.params, "trainable": (0,)}))
    return out


def main() -> int:
    return bench_main(__doc__, "training", lambda args: with_frozen_hypernetwork(
        select_cases(args, lambda c: c.op in DIFFERENTIABLE)), run_case, markdown=write_markdown)


if __name__ == "__main__":
    sys.exit(main())
