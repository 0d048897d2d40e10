"""torch.ops.moe.* as users call them (from Python, through the dispatcher and the C++ extension) vs PyTorch eager and
torch.compile (inductor) of the eager formulation, same inputs, same threads, same run.

  .venv/bin/python -m bench.torch_ops [--threads 2] [--quick] [--only SUBSTR ...] [--no-compile] [--budget S] [--tag T] [--sequential]

Cases: bench/cases.py's shapes, plus every op at the decode token counts T = 1, 16, 64 (for similarity and attention
T = N = Nk, one sequence; hyper_router is token-independent). The eager baseline is bench/baselines.py (the papers' §2
pseudocode, the strongest plain-torch form we have); inductor compiles that same function (static shapes). Our first
call (kernel compile or disk-cache load) is reported separately and never timed. Ours, eager and inductor are timed
in interleaved rounds (one batch of calls of each in turn), so that load and clock changes fall on all three alike.
Outputs are checked against eager with the cases' checks.

Writes bench/results/torch-ops-<date>-t<threads>[-quick][-<tag>].json and .md.
Exit status 1 when one of our outputs is wrong.
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

# Before torch and the kernel cache read them.
_THREADS = pin_threads(2)
# Inductor compiles in this process: a pool of compile workers would start (and import torch) in the background
# after the first torch.compile and load the machine while the first cases are timed.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from dataclasses import dataclass  # noqa: E402
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


def interleaved(fns: dict[str, Callable[[], object]], budget_s: float, max_rounds: int,
                cap_s: float = 20.0, sample_s: float = 5e-3) -> dict[str, dict]:
    """Times the implementations in rounds, one sample of each in turn, so that a shared machine's load (and the
    caches' and clock's state) falls on all of them alike. A sample is a batch of back-to-back calls (about
    ``sample_s``: each implementation runs warm, its thread pool awake, as in a loop of calls; timer overhead stays out
    of microsecond calls) divided by its size. Warm-up first (5% of the budget for fast
    functions); about ``budget_s`` seconds per implementation, 3 to ``max_rounds`` rounds; a function slower than
    ``cap_s`` is timed by its warm-up call alone."""
    est: dict[str, float] = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        est[name] = time.perf_counter() - t0
        if est[name] < budget_s * 0.01:
            end = time.perf_counter() + budget_s * 0.05
            n = 0
            while time.perf_counter() < end:
                fn()
                n += 1
            est[name] = budget_s * 0.05 / max(n, 1)
    slow = {n for n, e in est.items() if e >= cap_s}
    live = {n: fn for n, fn in fns.items() if n not in slow}
    batch = {n: max(1, int(sample_s / max(est[n], 1e-8))) for n in live}
    round_s = sum(batch[n] * est[n] for n in live) or 1e-6
    rounds = max(3, min(max_rounds, int(budget_s * max(len(live), 1) / round_s)))
    if rounds * round_s > cap_s * max(len(live), 1):
        rounds = max(1, int(cap_s * max(len(live), 1) / round_s))
    times: dict[str, list[float]] = {n: [] for n in live}
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for n, fn in live.items():
                m = batch[n]
                a = time.perf_counter_ns()
                for _ in range(m):
                    fn()
                times[n].append((time.perf_counter_ns() - a) / 1e6 / m)
    finally:
        if was:
            gc.enable()
    out: dict[str, dict] = {}
    for n in fns:
        if n in slow:
            ms = est[n] * 1e3
            out[n] = {"median_ms": ms, "min_ms": ms, "max_ms": ms, "iqr_rel": 0.0, "reps": 1, "batch": 1,
                      "note": "single call (slower than the cap)"}
            continue
        t = sorted(times[n])
        q = lambda f: t[min(len(t) - 1, int(round(f * (len(t) - 1))))]  # noqa: E731
        med = statistics.median(t)
        out[n] = {"median_ms": med, "min_ms": t[0], "max_ms": t[-1], "p25_ms": q(0.25), "p75_ms": q(0.75),
                  "iqr_rel": (q(0.75) - q(0.25)) / med if med > 0 else 0.0, "reps": len(t), "batch": batch[n]}
    return out


#: The torch op of a case's dialect op where their names differ (a case's ``op`` is the dialect's name).
TORCH_OP = {"similarity_inform_grad": "similarity_inform_backward"}


def ours_call(case: C.Case) -> Callable[..., object]:
    """torch.ops.moe.<op> with the case's attributes, as a user would call it (``TORCH_OP`` maps the dialect op's
    name to the torch op's where they differ); KeyError for an op this bench does not call."""
    p = case.params
    op = getattr(torch.ops.moe, TORCH_OP.get(case.op, case.op))
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
    if case.op == "similarity_inform_grad":
        # The case's inputs are (u, e, grad_p) and its eager baseline returns [du, de]; without ws, dws is empty.
        return lambda u, e, dp: op(dp, u, e, None, None, p["tau"], p["causal"])[:2]
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
    record_correct(rec, lambda: case.check(inputs, out, ref))
    fns: dict[str, Callable[[], object]] = {"ours": lambda: ours(*inputs), "eager": lambda: case.eager(*inputs)}
    if not args.no_compile:
        compiled = compile_inductor(rec, case.eager, lambda fn: lambda: fn(*inputs))
        if compiled is not None:
            fns["inductor"] = compiled
    if args.sequential:  # the earlier method: each implementation's calls back to back, one after the other
        reps = 20000 if case.regime == "decode" else 200
        rec.update({n: measure(fn, args.budget, reps) for n, fn in fns.items()})
    else:
        rec.update(interleaved(fns, args.budget, 400 if case.regime == "decode" else 50))
    add_speedups(rec)
    return rec


def record_correct(rec: dict, check: Callable[[], float], key: str = "max_abs_err") -> None:
    """rec["correct"], with rec[key] the error ``check()`` returns, or rec["error"] when it raises AssertionError."""
    try:
        rec[key] = check()
        rec["correct"] = True
    except AssertionError as err:
        rec["correct"] = False
        rec["error"] = str(err)


def compile_inductor(rec: dict, eager: Callable,
                     bind: Callable[[Callable], Callable[[], object]]) -> Callable[[], object] | None:
    """torch.compile(eager) (inductor, static shapes) made a call by ``bind``, after a first call whose seconds go
    to rec["inductor_compile_s"]; None, with rec["inductor_error"], when inductor fails. Resets dynamo first: the
    cases of one op share the eager function's code object, and without a reset dynamo's recompile limit would
    silently turn later cases' "inductor" into eager."""
    try:
        torch._dynamo.reset()
        call = bind(torch.compile(eager, dynamic=False))
        t0 = time.perf_counter()
        call()
        rec["inductor_compile_s"] = time.perf_counter() - t0
        return call
    except Exception as err:  # noqa: BLE001
        rec["inductor_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return None


def add_speedups(rec: dict) -> None:
    """``speedup_vs_eager`` (and ``speedup_vs_inductor`` when timed): their median over ours."""
    ours_ms = rec["ours"]["median_ms"]
    rec["speedup_vs_eager"] = rec["eager"]["median_ms"] / ours_ms
    if "inductor" in rec:
        rec["speedup_vs_inductor"] = rec["inductor"]["median_ms"] / ours_ms


@dataclass
class SizedCase:
    """What run_all reads of a benchmark's own case type (bench/routing.py, bench/router_losses.py): its name, op,
    regime (decode | prefill) and token count T."""
    name: str
    op: str
    regime: str
    T: int


def kernels_ready() -> bool:
    """Whether the compiled kernels are usable; says why on stderr when not."""
    if moe_ops.kernels_available():
        return True
    print(f"the compiled kernels are unavailable: {moe_ops._KERNELS_UNAVAILABLE}", file=sys.stderr)
    return False


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


def machine_line(doc: dict) -> str:
    """The report's machine sentence: CPU, memory, SIMD, threads (torch and our kernels), torch, commit, load."""
    m = doc["machine"]
    return (f"Machine: {m['cpu_model']} ({m['logical_cpus']} logical CPUs, {m['memory_gib']} GiB; SIMD "
            f"{', '.join(m['simd'])}), {m['threads']} threads (torch and our kernels), torch {m['torch']}, "
            f"commit {m['git_commit'][:10]}. Load average at start {m['loadavg_start']}, at end {doc['loadavg_end']}")


def write_markdown(doc: dict, path: Path) -> None:
    lines = [
        f"# torch.ops.moe.* vs eager and inductor ({doc['date']})",
        "",
        machine_line(doc) + " (a shared machine: ratios within one run are what counts).",
        "",
        "Ours = `torch.ops.moe.<op>(...)` called from Python (dispatcher -> C++ extension -> compiled kernel; outputs "
        "allocated by torch). Eager = bench/baselines.py; inductor = `torch.compile` of that function (static "
        "shapes). Times are medians of interleaved rounds (one batch of calls of each in turn); x = eager (or "
        "inductor) time / ours.",
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


def add_common_args(ap: argparse.ArgumentParser) -> None:
    """The options every torch-op benchmark takes (also bench/routing.py)."""
    ap.add_argument("--threads", type=int, default=_THREADS)
    ap.add_argument("--quick", action="store_true", help="decode cases only")
    ap.add_argument("--only", nargs="*", default=[], help="cases whose name contains one of these")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (inductor)")
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timed calls per implementation and case")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--tag", default="", help="a suffix of the result files' names (e.g. 'loaded')")
    ap.add_argument("--sequential", action="store_true",
                    help="time each implementation's calls back to back, one implementation after the other "
                         "(the method before interleaving, for comparison)")


def parse_args(doc: str) -> argparse.Namespace:
    """The command line of the op benchmarks (this one and bench/training.py); sets torch's thread count."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def named_cases(args: argparse.Namespace, cases: list) -> list:
    """The cases whose name contains one of --only's strings (all of them without --only)."""
    return [c for c in cases if not args.only or any(s in c.name for s in args.only)]


def select_cases(args: argparse.Namespace, keep: Callable[[C.Case], bool] = lambda c: True) -> list[C.Case]:
    """The decode (and unless --quick, prefill) cases that ``keep`` accepts and --only names."""
    return named_cases(args, [c for c in decode_cases() + ([] if args.quick else prefill_cases()) if keep(c)])


def result_stem(prefix: str, args: argparse.Namespace) -> str:
    """``<prefix>-<date>-t<threads>[-quick][-<tag>]``."""
    date = datetime.date.today().isoformat()
    return (f"{prefix}-{date}-t{args.threads}" + ("-quick" if args.quick else "")
            + (f"-{args.tag}" if args.tag else ""))


def run_all(todo: list, run_one: Callable, args, stem: str,
            markdown: Callable[[dict, Path], None] | None = None) -> tuple[list[dict], Path]:
    """Runs ``run_one(case, args)`` for every case (an exception becomes an error record), prints one line per case,
    writes ``<out>/<stem>.json`` and ``.md`` (``markdown``, default this benchmark's table); returns the records and
    the markdown path."""
    info = machine_info(args.threads)
    print(f"{info['cpu_model']}, {args.threads} threads, torch {info['torch']}, load {info['loadavg_start']}",
          flush=True)
    results = []
    for case in todo:
        try:
            rec = run_one(case, args)
        except Exception as err:  # noqa: BLE001
            T = case.params.get("T") if hasattr(case, "params") else getattr(case, "T", None)
            rec = {"case": case.name, "op": case.op, "regime": case.regime, "T": T,
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
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    (markdown or write_markdown)(doc, out / f"{stem}.md")
    print(f"wrote {out / stem}.json and .md")
    return results, out / f"{stem}.md"


def bench_main(doc: str, prefix: str, todo: Callable[[argparse.Namespace], list], run_one: Callable,
               markdown: Callable[[dict, Path], None] | None = None) -> int:
    """The main of an op benchmark: its command line (``doc``), the kernels' check, ``run_one`` over ``todo(args)``
    into ``<prefix>-...`` result files; exits 0 when every result is correct, 1 otherwise, 2 without the kernels."""
    args = parse_args(doc)
    if not kernels_ready():
        return 2
    results, _ = run_all(todo(args), run_one, args, result_stem(prefix, args), markdown=markdown)
    return 0 if all(r.get("correct", False) for r in results) else 1


def main() -> int:
    return bench_main(__doc__, "torch-ops", select_cases, run_case)


if __name__ == "__main__":
    sys.exit(main())
