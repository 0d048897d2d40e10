"""CPU benchmark suite: our compiled kernels vs PyTorch eager (and torch.compile) on the same inputs and threads.

  ./scripts/bench.sh [--quick] [--threads N] [--target native|x86-64-v3|x86-64-v4] [--only SUBSTR ...]
                     [--no-compile] [--no-memory]
  (= .venv/bin/python -m bench.cpu ...)

For every case of bench/cases.py: generate the inputs (outside the timed region), compile our MLIR function once
through the execution API's C interface (compile time reported separately), time it (warm-up, then repeated
calls: median, quartiles, min/max), time the eager baseline (bench/baselines.py: the papers' §2 pseudocode) and
torch.compile of the same function (inductor; failures recorded), then check our outputs against torch's once.
torch.set_num_threads and OMP_NUM_THREADS / MOE_NUM_THREADS all get the same thread count. ``--target`` compiles ours
for another x86-64 level than the host (x86-64-v3: AVX2 on an AVX-512 machine) and holds torch's libraries to it
(bench/target.py); the results are named cpu-<date>-<target>.

Writes bench/results/cpu-<date>.json (machine, per-case records, peak-memory measurement), cpu-<date>.md (summary,
cases below the 2x target) and cpu-<date>.png (speedups). Exit status 1 when one of our outputs is wrong.
"""

from __future__ import annotations

import os
import sys

from .target import pin_target, target_info
from .threads import pin_threads

# Before torch (and our JIT-compiled code) read them.
_THREADS = pin_threads(int(os.environ.get("MOE_BENCH_THREADS", os.cpu_count() or 1)))
_TARGET = pin_target()

import argparse  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from . import cases as C  # noqa: E402
from . import memory, report  # noqa: E402
from .ours import REPO, BoundCall, Executor, build_dir, torch_buf  # noqa: E402
from .timing import measure  # noqa: E402


def _sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001
        return ""


def copy_bandwidth() -> float:
    """GB/s of a 256 MiB tensor copy (read + write) at torch's thread count, best of 5: the memory ceiling that
    memory-bound cases (hyper_router) are judged against."""
    x = torch.ones(1 << 26)
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        y.copy_(x)
        best = min(best, time.perf_counter() - t0)
    return 2 * x.numel() * 4 / best / 1e9


def triad_bandwidth() -> float:
    """GB/s of a STREAM triad a = b + s·c over 3 x 128 MiB f32 arrays (3 streams: 2 reads, 1 write) at torch's
    thread count, best of 5: the machine's memory bandwidth for hyper_router's achieved fraction."""
    n = 1 << 25
    b, c = torch.ones(n), torch.full((n,), 2.0)
    a = torch.empty(n)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        best = min(best, time.perf_counter() - t0)
    return 3 * n * 4 / best / 1e9


def machine_info(threads: int) -> dict:
    model, flags = "unknown", ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1]
    except OSError:
        pass
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile") if f in flags.split()]
    mem_gib = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    snap = build_dir() / "MOE_SOURCE_COMMIT"
    if snap.is_file():  # built by bench/build_snapshot.sh from a committed snapshot
        commit, dirty, source = snap.read_text().strip(), False, "committed snapshot (bench/build_snapshot.sh)"
    else:
        commit = _sh(["git", "rev-parse", "HEAD"])
        dirty = bool(_sh(["git", "status", "--porcelain", "--untracked-files=no", "--", "lib", "include", "tools"]))
        source = "working tree" + (" with uncommitted changes under lib/include/tools" if dirty else "")
    last_lowering = _sh(["git", "log", "-1", "--format=%h %s", commit, "--", "lib/Conversion/MoEToLinalg",
                         "lib/Pipelines"])
    return {
        "cpu_model": model,
        "simd": simd,
        "logical_cpus": os.cpu_count(),
        "memory_gib": mem_gib,
        "threads": threads,
        "torch_threads": torch.get_num_threads(),
        "env": {v: os.environ.get(v) for v in ("OMP_NUM_THREADS", "MOE_NUM_THREADS", "MKL_NUM_THREADS")},
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": commit,
        "git_lib_dirty": dirty,
        "source": source,
        "last_lowering_commit": last_lowering,
        "build_dir": str(build_dir()),
        "loadavg_start": list(os.getloadavg()),
    }


def run_case(exe: Executor, case: C.Case, args) -> dict:
    rec = {"case": case.name, "op": case.op, "regime": case.regime, "params": case.params, "note": case.note,
           "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    g = torch.Generator().manual_seed(20260521)
    inputs = [t.contiguous() for t in case.make_inputs(g)]
    budget = args.budget
    max_reps = 2000 if case.regime == "decode" else 200

    # ---- ours
    handle = None
    try:
        handle, compile_s = exe.compile(case.mlir)
        rec["ours_compile_s"] = round(compile_s, 4)
        outs = [torch.empty(shape, dtype=dt) for shape, dt in case.out_specs]
        call = BoundCall(exe, handle, case.name, [torch_buf(t) for t in inputs], [torch_buf(o) for o in outs])
        m = measure(call, budget, max_reps, cap_s=args.cap)
        rec["ours"] = m
        rec["ours_ms"] = m["median_ms"]
    except Exception as exc:  # noqa: BLE001
        rec["ours_error"] = f"{type(exc).__name__}: {exc}"[:2000]
        outs = None

    # ---- torch eager
    eager = lambda: case.eager(*inputs)  # noqa: E731
    with torch.inference_mode():
        m = measure(eager, budget, max_reps, cap_s=args.cap)
        rec["torch"] = m
        rec["torch_ms"] = m["median_ms"]
        ref = case.eager(*inputs)
    C.record_check(rec, case, inputs, outs, ref)  # once per case
    del ref

    # ---- torch.compile (inductor) of the same baseline function
    if args.compile:
        def time_compiled(fn):
            rec["torch_compile"] = measure(fn, budget, max_reps, cap_s=args.cap)
            rec["torch_compile_ms"] = rec["torch_compile"]["median_ms"]

        C.record_torch_compile(rec, case, inputs, time_compiled)
    else:
        rec["torch_compile_ms"] = None
        rec["torch_compile_error"] = "not run (--no-compile)"

    if case.extra.get("bytes"):  # memory-bound cases: achieved bandwidth (input bytes read once / time)
        rec["bytes_read"] = case.extra["bytes"]
        for key in ("ours", "torch", "torch_compile"):
            if rec.get(f"{key}_ms"):
                rec[f"{key}_GBps"] = case.extra["bytes"] / (rec[f"{key}_ms"] * 1e-3) / 1e9
                # The triad is a best of 5 (STREAM's convention), so the fraction of it compares the best
                # call with it; the median call's fraction is kept next to it.
                best_ms = (rec.get(key) or {}).get("min_ms") or rec[f"{key}_ms"]
                rec[f"{key}_best_GBps"] = case.extra["bytes"] / (best_ms * 1e-3) / 1e9
                if args.triad_GBps:
                    rec[f"{key}_frac_triad"] = rec[f"{key}_best_GBps"] / args.triad_GBps
                    rec[f"{key}_median_frac_triad"] = rec[f"{key}_GBps"] / args.triad_GBps
    ok = rec.get("check") == "ok" and rec.get("ours_ms")
    rec["speedup"] = rec["torch_ms"] / rec["ours_ms"] if ok else None
    rec["speedup_vs_compile"] = (rec["torch_compile_ms"] / rec["ours_ms"]
                                 if ok and rec.get("torch_compile_ms") else None)
    if handle is not None:
        exe.lib.moeExecDestroy(handle)
    del inputs, outs
    gc.collect()
    return rec


def fmt_line(r: dict) -> str:
    def ms(x):
        return "-" if x is None else (f"{x:.3g}")

    sp = r.get("speedup")
    return (f"{r['case']:<40} ours {ms(r.get('ours_ms')):>9} ms  torch {ms(r.get('torch_ms')):>9} ms  "
            f"compile {ms(r.get('torch_compile_ms')):>9} ms  speedup {('%.2fx' % sp) if sp else '-':>8}  "
            f"[{r.get('check')}]" + (f" ours_error={r['ours_error'][:200]}" if r.get("ours_error") else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small smoke-test sizes, no torch.compile, no memory run")
    ap.add_argument("--threads", type=int, default=_THREADS)
    ap.add_argument("--target", default=_TARGET,
                    help="CPU our JIT compiles for: native (default), x86-64-v3 (AVX2), x86-64-v4 (AVX-512) or an "
                         "LLVM x86-64 CPU name; torch's libraries are held to the same level (bench/target.py)")
    ap.add_argument("--only", nargs="*", help="run the cases whose name or op contains one of these strings")
    ap.add_argument("--compile", dest="compile", action="store_true", default=None,
                    help="measure torch.compile (default: on, off with --quick)")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-RSS measurement")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timed calls per implementation")
    ap.add_argument("--cap", type=float, default=None, help="max seconds per implementation and case")
    ap.add_argument("--wait-quiet", type=float, default=None, metavar="LOAD",
                    help="first wait (up to --wait-max s) until the 1-minute load average is below LOAD")
    ap.add_argument("--wait-max", type=float, default=1800)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--note", default="", help="a remark stored in the JSON and printed in the summary")
    ap.add_argument("--tag", default=None, help="file name tag (default: the date; --quick adds '-quick')")
    args = ap.parse_args()
    if args.compile is None:
        args.compile = not args.quick
    if args.budget is None:
        args.budget = 0.2 if args.quick else 1.0
    if args.cap is None:
        args.cap = 5.0 if args.quick else 15.0
    torch.set_num_threads(args.threads)

    cases = C.quick_cases() if args.quick else C.full_cases()
    if args.only:
        cases = [c for c in cases if any(s in c.name or s == c.op for s in args.only)]
    if args.wait_quiet is not None:
        t_wait = time.time()
        while os.getloadavg()[0] >= args.wait_quiet and time.time() - t_wait < args.wait_max:
            time.sleep(10)
        print(f"waited {time.time() - t_wait:.0f} s for load < {args.wait_quiet}: now {os.getloadavg()}", flush=True)
    info = machine_info(args.threads)
    info["copy_bandwidth_GBps"] = round(copy_bandwidth(), 1)
    args.triad_GBps = triad_bandwidth()
    info["triad_bandwidth_GBps"] = round(args.triad_GBps, 1)
    info["target"] = target_info(_TARGET)
    print(f"machine: {info['cpu_model']} ({info['logical_cpus']} logical CPUs), threads={args.threads}, "
          f"target {_TARGET} (torch {info['target']['torch_cpu_capability']}), torch {info['torch']}, "
          f"commit {info['git_commit'][:10]}, load {info['loadavg_start']}, triad {info['triad_bandwidth_GBps']} GB/s",
          flush=True)
    if args.compile:
        # Import inductor (and triton, which bundles its own LLVM) BEFORE libMoEExecutorC.so (linked to the system's
        # libLLVM/libMLIR): the other order segfaults in triton's import (seen with torch 2.15 + triton 3.9).
        import importlib

        for mod in ("torch._dynamo", "torch._inductor.compile_fx", "triton"):
            try:
                importlib.import_module(mod)
            except ImportError:
                pass
    exe = Executor()
    print(f"executor: {exe.path}", flush=True)

    t_start = time.time()
    records = []
    for case in cases:
        try:
            rec = run_case(exe, case, args)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            rec = {"case": case.name, "op": case.op, "regime": case.regime, "params": case.params,
                   "error": f"{type(exc).__name__}: {exc}"[:2000], "speedup": None}
        records.append(rec)
        print(fmt_line(rec), flush=True)

    mem = None
    if not args.quick and not args.no_memory:
        print("peak memory: similarity_inform B=1 N=16384 D=64 K=16 ...", flush=True)
        mem = {impl: memory.measure(impl, 1, 16384, 64, 16, args.threads, exe.path) for impl in ("ours", "eager")}
        for impl, r in mem.items():
            print(f"  {impl}: peak RSS {r.get('peak_rss_mib', float('nan')):.1f} MiB {r.get('error', '')}",
                  flush=True)

    info["loadavg_end"] = list(os.getloadavg())
    info["suite_seconds"] = round(time.time() - t_start, 1)
    date = datetime.date.today().isoformat()
    tag = args.tag or (date + ("" if _TARGET == "native" else f"-{_TARGET}") + ("-quick" if args.quick else ""))
    doc = {
        "suite": "cpu",
        "cpu_target": _TARGET,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "note": args.note,
        "target": "ours >= 2x faster than PyTorch eager at prefill-like sizes",
        "methodology": {
            "ours": "execution API C interface (libMoEExecutorC): compiled once (ours_compile_s), timed per "
                    "moeExecCall with pre-built descriptors; results copied into caller buffers (included)",
            "torch": "bench/baselines.py (papers' §2 pseudocode), torch.inference_mode",
            "torch_compile": "torch.compile(baseline, dynamic=False), inductor; compile time excluded",
            "timing": f"warm-up, then repeated calls for ~{args.budget}s (>=3 reps, <= {args.cap}s per impl); "
                      "median reported, p25/p75/min/max kept",
            "check": "our outputs vs torch's, once per case (top-k: scores at the chosen indices, weights)",
        },
        "machine": info,
        "records": records,
        "memory": mem,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jpath = out / f"cpu-{tag}.json"
    jpath.write_text(json.dumps(doc, indent=1))
    md = report.write_markdown(doc, out / f"cpu-{tag}.md", f"cpu-{tag}.png")
    try:
        report.plot(doc, out / f"cpu-{tag}.png")
    except Exception as exc:  # noqa: BLE001
        print(f"plot failed: {exc}")
    print(f"wrote {jpath}, {out / f'cpu-{tag}.md'}, {out / f'cpu-{tag}.png'} ({info['suite_seconds']} s)")
    print(md)
    bad = [r for r in records if r.get("check", "").startswith("FAIL") or r.get("error") or r.get("ours_error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
