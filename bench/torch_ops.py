"""torch.ops.moe.* as users call them (from Python, through the dispatcher and the C++ extension) vs PyTorch eager and
torch.compile (inductor) of the eager formulation, same inputs, same threads, same run.

  .venv/bin/python -m bench.torch_ops [--threads 2] [--quick] [--only SUBSTR ...] [--no-compile] [--budget S]

Cases: bench/cases.py's shapes, plus every op at the decode token counts T = 1, 16, 64 (for similarity and attention
T = N = Nk, one sequence; hyper_router is token-independent). The eager baseline is bench/baselines.py (the papers' §2
pseudocode, the strongest plain-torch form we have); inductor compiles that same function (static shapes). Our first
call (kernel compile or disk-cache load) is reported separately and never timed. Outputs are checked against eager
with the cases' checks.

Writes bench/results/torch-ops-<date>-t<threads>[-quick].json and .md. Exit status 1 when one of our outputs is wrong.
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

# Before torch and the kernel cache read them.
_THREADS = pin_threads(2)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import torch  # noqa: E402

from . import cases as C  # noqa: E402
from .cpu import machine_info  # noqa: E402
from .ours import REPO  # noqa: E402
from .timing import measure  # noqa: E402

sys.path.insert(0, str(REPO / "python"))
import moe_mlir  # noqa: E402,F401
from moe_mlir import ops as moe_ops  # noqa: E402
from moe_mlir.runtime import cache as kcache  # noqa: E402

DECODE_T = (1, 16, 64)


def decode_cases() -> list[C.Case]:
    cs: list[C.Case] = []
    for T in DECODE_T:
        cs += [
            C.topk_case("decode", T, 64, 8),
            C.topk_case("decode", T, 256, 8),
            C.similarity_case("decode", 1, T, 64, 16),
            C.similarity_case("decode", 1, T, 64, 16, k=2),
            C.attention_case("decode", 1, 8, T, T, 512, 64, 16),
            C.mad_case("decode", T, 256, 8),
            C.adjacency_case("decode", T, 64, 8),
        ]
    cs.append(C.hyper_case("decode", 256, 256, 64, 8))
    return cs


def prefill_cases() -> list[C.Case]:
    return [c for c in C.full_cases() if c.regime == "prefill"]


def ours_call(case: C.Case) -> Callable[..., object]:
    """torch.ops.moe.<op> with the case's attributes, as a user would call it."""
    p = case.params
    op = getattr(torch.ops.moe, case.op)
    if case.op == "topk_renorm":
        return lambda s: op(s, p["k"], p["mode"], p["renormalize"])
    if case.op == "similarity_inform":
        return lambda u, e: op(u, e, None, None, p["tau"], p["causal"])
    if case.op == "similarity_inform_topk":
        return lambda u, e: op(u, e, p["k"], None, None, p["tau"], p["causal"], True)
    if case.op == "attention_posterior":
        return lambda s, u, v, wo, e: op(s, u, v, wo, e, p["sigma"], p["head_select"], None)
    if case.op == "mad_dispersion":
        return lambda x, a: op(x, a, p["E"], p["eps"], p["clip"], p["normalize"], p["measure"], p["empty"])
    if case.op == "adjacency_update":
        return lambda a, idx: op(a, idx, p["beta"], p["norm"], p["include_self"])
    if case.op == "hyper_router":
        return lambda emb, w1, b1, w2, b2: op(emb, w1, b1, w2, b2, p["E"])
    raise KeyError(case.op)


def _as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_case(case: C.Case, args) -> dict:
    rec = {"case": case.name, "op": case.op, "regime": case.regime, "params": case.params,
           "T": case.params.get("T"), "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    g = torch.Generator().manual_seed(20260521)
    inputs = [t.contiguous() for t in case.make_inputs(g)]
    ours = ours_call(case)
    compiles, loads = kcache.stats.compiles, kcache.stats.disk_loads
    t0 = time.perf_counter()
    out = _as_list(ours(*inputs))
    rec["first_call_ms"] = (time.perf_counter() - t0) * 1e3
    rec["kernel_compiled"] = kcache.stats.compiles > compiles
    rec["kernel_loaded_from_disk"] = kcache.stats.disk_loads > loads
    ref = case.eager(*inputs)
    try:
        rec["max_abs_err"] = case.check(inputs, out, ref)
        rec["correct"] = True
    except AssertionError as err:
        rec["correct"] = False
        rec["error"] = str(err)
    budget = args.budget
    reps = 20000 if case.regime == "decode" else 200
    rec["ours"] = measure(lambda: ours(*inputs), budget, reps)
    rec["eager"] = measure(lambda: case.eager(*inputs), budget, reps)
    if not args.no_compile:
        try:
            # The cases of one op share the eager function's code object: without a reset, dynamo's recompile
            # limit would silently turn later cases' "inductor" into eager.
            torch._dynamo.reset()
            fn = torch.compile(case.eager, dynamic=False)
            t0 = time.perf_counter()
            fn(*inputs)
            rec["inductor_compile_s"] = time.perf_counter() - t0
            rec["inductor"] = measure(lambda: fn(*inputs), budget, reps)
        except Exception as err:  # noqa: BLE001
            rec["inductor_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    ours_ms = rec["ours"]["median_ms"]
    rec["speedup_vs_eager"] = rec["eager"]["median_ms"] / ours_ms
    if "inductor" in rec:
        rec["speedup_vs_inductor"] = rec["inductor"]["median_ms"] / ours_ms
    return rec


def _fmt_ms(ms: float) -> str:
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.2f} ms"


def table_row(r: dict, last: str) -> str:
    """The markdown row of one result: case, regime, T, ours, eager, inductor, x eager, x inductor, ``last``."""
    if "ours" not in r:
        return f"| {r['case']} | {r['regime']} | {r.get('T')} | error: {r.get('error', '')[:80]} | | | | | |"
    ind = _fmt_ms(r["inductor"]["median_ms"]) if "inductor" in r else r.get("inductor_error", "-")[:40]
    xi = f"{r['speedup_vs_inductor']:.2f}" if "speedup_vs_inductor" in r else "-"
    ok = "" if r["correct"] else " **WRONG**"
    return (f"| {r['case']}{ok} | {r['regime']} | {r.get('T')} | {_fmt_ms(r['ours']['median_ms'])} | "
            f"{_fmt_ms(r['eager']['median_ms'])} | {ind} | {r['speedup_vs_eager']:.2f} | {xi} | {last} |")


def write_markdown(doc: dict, path: Path) -> None:
    m = doc["machine"]
    lines = [
        f"# torch.ops.moe.* vs eager and inductor ({doc['date']})",
        "",
        f"Machine: {m['cpu_model']} ({m['logical_cpus']} logical CPUs, {m['memory_gib']} GiB; SIMD "
        f"{', '.join(m['simd'])}), {m['threads']} threads (torch and our kernels), torch {m['torch']}, commit "
        f"{m['git_commit'][:10]}. Load average at start {m['loadavg_start']}, at end {doc['loadavg_end']} "
        "(a shared machine: ratios within one run are what counts).",
        "",
        "Ours = `torch.ops.moe.<op>(...)` called from Python (dispatcher -> C++ extension -> compiled kernel; outputs "
        "allocated by torch). Eager = bench/baselines.py; inductor = `torch.compile` of that function (static "
        "shapes). Times are medians; x = eager (or inductor) time / ours.",
        "",
        "| case | regime | T | ours | eager | inductor | x eager | x inductor | first call (ours) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        first = ""
        if "ours" in r:
            first = _fmt_ms(r["first_call_ms"]) + (" (compiled)" if r["kernel_compiled"] else
                                                   " (disk)" if r["kernel_loaded_from_disk"] else "")
        lines.append(table_row(r, first))
    below = [r for r in doc["results"] if r["regime"] == "decode" and "ours" in r and r["speedup_vs_eager"] < 1.0]
    lines += ["", f"Decode cases below 1.0x eager: {len(below)}" +
              (": " + ", ".join(f"{r['case']} ({r['speedup_vs_eager']:.2f}x)" for r in below) if below else "")]
    path.write_text("\n".join(lines) + "\n")


def parse_args(doc: str) -> argparse.Namespace:
    """The command line shared by the op benchmarks (this one and bench/training.py)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=_THREADS)
    ap.add_argument("--quick", action="store_true", help="decode cases only")
    ap.add_argument("--only", nargs="*", default=[], help="cases whose name contains one of these")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (inductor)")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timed calls per implementation and case")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def select_cases(args: argparse.Namespace, keep: Callable[[C.Case], bool] = lambda c: True) -> list[C.Case]:
    cases = [c for c in decode_cases() + ([] if args.quick else prefill_cases()) if keep(c)]
    if args.only:
        cases = [c for c in cases if any(s in c.name for s in args.only)]
    return cases


def run_all(cases: list[C.Case], run: Callable[[C.Case, argparse.Namespace], dict],
            markdown: Callable[[dict, Path], None], prefix: str, args: argparse.Namespace) -> int:
    """Runs ``run`` on every case (an exception is recorded as that case's error), prints one line per case and
    writes bench/results/<prefix>-<date>-t<threads>[-quick].json and .md; exit status 1 when a result is wrong."""
    if not moe_ops.kernels_available():
        print(f"the compiled kernels are unavailable: {moe_ops._KERNELS_UNAVAILABLE}", file=sys.stderr)
        return 2
    info = machine_info(args.threads)
    print(f"{info['cpu_model']}, {args.threads} threads, torch {info['torch']}, load {info['loadavg_start']}",
          flush=True)
    results = []
    for case in cases:
        try:
            rec = run(case, args)
        except Exception as err:  # noqa: BLE001
            rec = {"case": case.name, "op": case.op, "regime": case.regime, "T": case.params.get("T"),
                   "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
        results.append(rec)
        if "ours" in rec:
            print(f"{case.name:40s} ours {_fmt_ms(rec['ours']['median_ms']):>10s}  eager "
                  f"{_fmt_ms(rec['eager']['median_ms']):>10s}  x{rec['speedup_vs_eager']:.2f}"
                  + (f"  inductor x{rec['speedup_vs_inductor']:.2f}" if "speedup_vs_inductor" in rec else "")
                  + ("" if rec["correct"] else "  WRONG"), flush=True)
        else:
            print(f"{case.name:40s} ERROR {rec['error'][:200]}", flush=True)
    date = datetime.date.today().isoformat()
    doc = {"date": date, "machine": info, "loadavg_end": list(os.getloadavg()), "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{prefix}-{date}-t{args.threads}" + ("-quick" if args.quick else "")
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    markdown(doc, out / f"{stem}.md")
    print(f"wrote {out / stem}.json and .md")
    return 0 if all(r.get("correct", False) for r in results) else 1


def main() -> int:
    args = parse_args(__doc__)
    return run_all(select_cases(args), run_case, write_markdown, "torch-ops", args)


if __name__ == "__main__":
    sys.exit(main())
