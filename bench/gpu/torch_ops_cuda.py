"""torch.ops.moe.* on CUDA tensors as users call them (Python -> dispatcher -> libmoe_torch -> our kernel on torch's
current stream) vs the eager baseline on the same CUDA tensors, same run, interleaved rounds.

  python3 -m bench.gpu.torch_ops_cuda [--out DIR] [--only SUBSTR ...] [--budget S]     (on a GPU machine)
  python3 -m bench.gpu.torch_ops_cuda --record                                         (here, MOE_KERNEL_RECORD set)

The cases are bench/torch_ops.py's decode cases (every op at T = 1, 16, 64) and a few prefill shapes. Per case and
implementation, two numbers:

* ``issue_us``: a batch of calls issued back to back, then one ``torch.cuda.synchronize()``; the mean per call. A
  server's step chains calls like this, so at decode sizes this is the cost that counts: host dispatch plus launch
  (and, at large sizes, the GPU time).
* ``sync_us``: one call followed by a synchronization, median (latency of a lone call).

``--record`` runs each case's call once on CPU tensors so that ``$MOE_KERNEL_RECORD`` lists the kernels; the GPU
check (scripts/gpu-check.sh) prebuilds them for the chip, since the GPU machine has no LLVM. Writes
torch-ops-cuda-<date>-<gpu>.json/.md into --out. Exit status 1 when one of our outputs is wrong.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "python"))

from bench import cases as C  # noqa: E402
from bench.torch_ops import decode_cases, ours_call, record_correct  # noqa: E402


def cases() -> list[C.Case]:
    prefill = [C.topk_case("prefill", 4096, 128, 8), C.topk_case("prefill", 65536, 128, 8),
               C.similarity_case("prefill", 1, 4096, 64, 16), C.mad_case("prefill", 16384, 1024, 64),
               C.adjacency_case("prefill", 65536, 256, 8)]
    return decode_cases() + prefill


def _sync() -> None:
    torch.cuda.synchronize()


def issue_us(fn, budget_s: float, batch: int) -> float:
    """Mean per call of `batch` calls issued back to back and one synchronization (best of the rounds)."""
    best = float("inf")
    end = time.perf_counter() + budget_s
    while True:
        _sync()
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        _sync()
        best = min(best, (time.perf_counter() - t0) / batch * 1e6)
        if time.perf_counter() > end:
            return best


def sync_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def run_case(case: C.Case, args) -> dict:
    g = torch.Generator().manual_seed(20260521)
    inputs = [t.contiguous().to("cuda") for t in case.make_inputs(g)]
    ours = ours_call(case)
    out = [o.cpu() for o in (lambda r: r if isinstance(r, (tuple, list)) else [r])(ours(*inputs))]
    ref = case.eager(*[t.cpu() for t in inputs])
    rec = {"case": case.name, "op": case.op, "regime": case.regime, "T": case.params.get("T")}
    record_correct(rec, lambda: case.check([t.cpu() for t in inputs], out, ref))
    fns = {"ours": lambda: ours(*inputs), "eager": lambda: case.eager(*inputs)}
    for fn in fns.values():  # warm-up (the eager path's first CUDA calls load its kernels)
        fn()
    batch = 200 if case.regime == "decode" else 20
    # Interleaved: each round times every implementation once, so clock and load changes fall on all alike.
    rounds = {n: [] for n in fns}
    for _ in range(3):
        for n, fn in fns.items():
            rounds[n].append(issue_us(fn, args.budget / 3, batch))
    for n, fn in fns.items():
        rec[n] = {"issue_us": min(rounds[n]), "sync_us": sync_us(fn, 50 if case.regime == "decode" else 10)}
    rec["issue_vs_eager"] = rec["eager"]["issue_us"] / rec["ours"]["issue_us"]
    rec["sync_vs_eager"] = rec["eager"]["sync_us"] / rec["ours"]["sync_us"]
    return rec


def markdown(doc: dict) -> str:
    lines = [f"# torch.ops.moe.* on CUDA tensors {doc['date']}", "",
             f"{doc['device']}, torch {doc['torch']}. issue = mean per call of a batch issued back to back and one "
             "synchronization (best of 3 interleaved rounds); sync = one call then a synchronization (median). "
             "Baseline: bench/baselines.py eager on the same CUDA tensors.", "",
             "| case | regime | ours issue us | eager issue us | vs eager | ours sync us | eager sync us | vs eager "
             "| check |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in doc["results"]:
        if "ours" not in r:
            lines.append(f"| {r['case']} | {r['regime']} | | | | | | | FAIL: {r.get('error', '')[:120]} |")
            continue
        chk = "ok" if r["correct"] else "FAIL: " + r.get("error", "")[:100]
        lines.append(f"| {r['case']} | {r['regime']} | {r['ours']['issue_us']:.1f} | {r['eager']['issue_us']:.1f} | "
                     f"{r['issue_vs_eager']:.2f}x | {r['ours']['sync_us']:.1f} | {r['eager']['sync_us']:.1f} | "
                     f"{r['sync_vs_eager']:.2f}x | {chk} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--budget", type=float, default=0.6, help="seconds of timing per implementation and case")
    ap.add_argument("--record", action="store_true", help="run each call once on CPU tensors (kernel recording)")
    args = ap.parse_args()
    todo = [c for c in cases() if not args.only or any(s in c.name for s in args.only)]
    if args.only and not todo:
        ap.error(f"--only {args.only} matches no case")
    if args.record:
        for case in todo:
            ours_call(case)(*case.make_inputs(torch.Generator().manual_seed(0)))
        return 0
    import moe_mlir.ops  # noqa: F401  (registers the CUDA kernels)
    from moe_mlir.runtime import cuda as moe_cuda
    results = []
    for case in todo:
        try:
            results.append(run_case(case, args))
        except Exception as err:  # noqa: BLE001  (one case's failure is reported, the others still run)
            results.append({"case": case.name, "regime": case.regime, "correct": False,
                            "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"})
        print(markdown({"date": "", "device": "", "torch": "", "results": results[-1:]}).splitlines()[-1],
              flush=True)
    moe_cuda.check_errors()
    name = torch.cuda.get_device_name()
    doc = {"date": datetime.date.today().isoformat(), "device": name, "torch": torch.__version__, "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"torch-ops-cuda-{doc['date']}-{name.split()[-1].lower()}"
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    (out / f"{stem}.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0 if all(r.get("correct") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
