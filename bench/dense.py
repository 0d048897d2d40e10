"""Dense CPU benchmark: whole imported models and dense shapes through moe-lower-to-llvm vs eager PyTorch.

  .venv/bin/python -m bench.dense [--threads 2] [--quick] [--only SUBSTR ...] [--out bench/results/dense-<date>]

Every case is a torch module imported with ``moe_mlir.import_model`` (the importer's own linalg), compiled by the
execution API (``moe_mlir.compile(..., backend="executor")``: ``--moe-lower-to-llvm`` + JIT) in up to three
configurations of the same pipeline, chosen per compilation by environment variables the execution API reads:

* ``blas``: the dense strategy with large matmuls on OpenBLAS (``MOE_BLAS=1``, the default);
* ``codegen``: the dense strategy only (``MOE_BLAS=0``: tiled, fused, vectorized MLIR code for every matmul);
* ``loops``: the old path (``MOE_DENSE=0``: ``convert-linalg-to-loops``), router only (it takes seconds).

Baseline: eager PyTorch at the same thread count, in the same run. Outputs are checked against eager once per
configuration (max abs error). The machine's FMA peak is measured first (a C kernel of independent AVX-512 FMA
chains, one per thread) and every GEMM reports its fraction of it.

Writes ``<out>.json`` (machine, peak, records) and ``<out>.md`` (tables).
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

_THREADS = pin_threads(2, ("OPENBLAS_NUM_THREADS",))

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .cpu import machine_info  # noqa: E402
from .ours import REPO  # noqa: E402

# The package from this checkout, as the other benchmarks import it (nothing is installed into the venv).
sys.path.insert(0, str(REPO / "python"))
from .timing import measure  # noqa: E402

PEAK_C = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static long iters;
/* Ten independent accumulators in registers (more than FMA latency x FMA ports on AVX-512 cores), the loop
   body written out so that no compiler keeps them in memory: the throughput of the FMA units, nothing else. */
static void *run(void *out) {
  __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(-0.0000001f);
  __m512 a0 = _mm512_set1_ps(0.f), a1 = _mm512_set1_ps(1.f), a2 = _mm512_set1_ps(2.f), a3 = _mm512_set1_ps(3.f),
         a4 = _mm512_set1_ps(4.f), a5 = _mm512_set1_ps(5.f), a6 = _mm512_set1_ps(6.f), a7 = _mm512_set1_ps(7.f),
         a8 = _mm512_set1_ps(8.f), a9 = _mm512_set1_ps(9.f);
  for (long i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, x, y); a1 = _mm512_fmadd_ps(a1, x, y); a2 = _mm512_fmadd_ps(a2, x, y);
    a3 = _mm512_fmadd_ps(a3, x, y); a4 = _mm512_fmadd_ps(a4, x, y); a5 = _mm512_fmadd_ps(a5, x, y);
    a6 = _mm512_fmadd_ps(a6, x, y); a7 = _mm512_fmadd_ps(a7, x, y); a8 = _mm512_fmadd_ps(a8, x, y);
    a9 = _mm512_fmadd_ps(a9, x, y);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(a8, a9));
  *(float *)out = _mm512_reduce_add_ps(s);
  return NULL;
}
int main(int argc, char **argv) {
  int threads = atoi(argv[1]);
  iters = atol(argv[2]);
  pthread_t t[64]; float sink[64];
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < threads; ++i) pthread_create(&t[i], NULL, run, &sink[i]);
  for (int i = 0; i < threads; ++i) pthread_join(t[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
  printf("%.3f %g\n", 2.0 * 16 * 10 * iters * threads / s / 1e9, sink[0]);
  return 0;
}
"""


def fma_peak_gflops(threads: int) -> float:
    """f32 GFLOP/s (2 per FMA) of independent AVX-512 FMA chains on `threads` threads, best of 5."""
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "peak.c", Path(d) / "peak"
        src.write_text(PEAK_C)
        subprocess.run(["cc", "-O3", "-mavx512f", "-mfma", "-pthread", str(src), "-o", str(exe)], check=True)
        best = 0.0
        for _ in range(5):
            out = subprocess.run([str(exe), str(threads), "50000000"], capture_output=True, text=True, check=True)
            best = max(best, float(out.stdout.split()[0]))
        return best


# ---------------------------------------------------------------------------------------------------------------
# Cases: (name, kind, module, example inputs, flops (2 per multiply-add) or None, bytes moved or None)


class MatMul(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


class ScoresT(torch.nn.Module):
    def forward(self, q, k):
        return torch.matmul(q, k.transpose(-1, -2))


class Softmax(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Router(torch.nn.Module):
    """The Qwen3-MoE router: one linear D -> E, softmax, top-k, renormalized."""

    def __init__(self, d: int, e: int, k: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(d, e, bias=False)
        self.k = k

    def forward(self, x):
        p = torch.softmax(self.lin(x), dim=-1)
        w, i = torch.topk(p, self.k, dim=-1)
        return w / w.sum(-1, keepdim=True), i


def dense_cases(g: torch.Generator, quick: bool):
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    T = 1024 if quick else 4096
    yield ("gemm_%dx2048x64" % T, "gemm", MatMul(), (r(T, 2048), r(2048, 64)), 2 * T * 2048 * 64, None)
    yield ("gemm_%dx1024x1024" % T, "gemm", MatMul(), (r(T, 1024), r(1024, 1024)), 2 * T * 1024 * 1024, None)
    B, H, N, Dh = 1, 8, 512, 64
    yield ("attn_scores_%dx%dx%dx%d" % (B * H, N, N, Dh), "gemm", ScoresT(), (r(B, H, N, Dh), r(B, H, N, Dh)),
           2 * B * H * N * N * Dh, None)
    yield ("attn_ctx_%dx%dx%dx%d" % (B * H, N, Dh, N), "gemm", MatMul(), (r(B, H, N, N), r(B, H, N, Dh)),
           2 * B * H * N * N * Dh, None)
    ln = torch.nn.LayerNorm(1024).eval()
    with torch.no_grad():
        ln.weight.copy_(1 + 0.1 * r(1024))
        ln.bias.copy_(0.1 * r(1024))
    yield ("layer_norm_%dx1024" % T, "memory", ln, (r(T, 1024),), None, 2 * T * 1024 * 4)
    yield ("softmax_%dx1024" % T, "memory", Softmax(), (r(T, 1024),), None, 2 * T * 1024 * 4)


def router_case(g: torch.Generator, quick: bool):
    T = 1024 if quick else 4096
    torch.manual_seed(0)
    m = Router(2048, 64, 8).eval()
    return ("qwen3_moe_router_T%d_D2048_E64_k8" % T, "router", m, (torch.randn(T, 2048, generator=g),),
            2 * T * 2048 * 64, None)


BLOCKS = ["similarity_inform", "attention_inform", "hyper_router", "acmoe", "symphony"]


def block_cases(quick: bool):
    # The two corners of the issue's range (seq 512-2048, hidden 512-1024).
    sizes = [(128, 256)] if quick else [(512, 512), (2048, 1024)]
    for seq, d in sizes:
        for name in BLOCKS:
            mod = importlib.import_module("moe_mlir.models." + name)
            m, args = mod.example(1, seq, d_model=d, n_heads=8, d_ff=d)
            m.eval()
            yield ("block_%s_seq%d_d%d" % (name, seq, d), "block", m, args, None, None)


# ---------------------------------------------------------------------------------------------------------------


def _flat(x):
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _flat(y)]
    return [x]


def max_err(out, ref) -> float:
    err = 0.0
    for o, r in zip(_flat(out), _flat(ref)):
        if o.dtype.is_floating_point:
            err = max(err, (o.double() - r.double()).abs().max().item())
        else:
            err = max(err, float((o.long() != r.long()).sum().item()))
    return err


def run_case(case, configs, budget: float, peak: float) -> dict:
    import moe_mlir

    name, kind, module, args, flops, nbytes = case
    rec = {"case": name, "kind": kind, "shapes": [list(a.shape) for a in args], "loadavg_1min_before":
           round(os.getloadavg()[0], 2)}
    with torch.no_grad():
        ref = module(*args)
        m = measure(lambda: module(*args), budget, 200, cap_s=30)
    rec["eager_ms"] = m["median_ms"]
    rec["eager"] = m
    for cfg in configs:
        env = {"blas": {"MOE_BLAS": "1", "MOE_DENSE": "1"}, "codegen": {"MOE_BLAS": "0", "MOE_DENSE": "1"},
               "loops": {"MOE_BLAS": "0", "MOE_DENSE": "0"}}[cfg]
        os.environ.update(env)
        try:
            t0 = time.perf_counter()
            cm = moe_mlir.compile(module, args, backend="executor")
            rec[f"{cfg}_compile_s"] = round(time.perf_counter() - t0, 2)
            out = cm(*args)
            rec[f"{cfg}_max_err"] = max_err(out, ref)
            m = measure(lambda: cm(*args), budget, 200, cap_s=30)
            rec[f"{cfg}_ms"] = m["median_ms"]
            rec[cfg] = m
            rec[f"{cfg}_vs_eager"] = m["median_ms"] / rec["eager_ms"]
            if flops:
                rec[f"{cfg}_gflops"] = flops / m["median_ms"] / 1e6
                rec[f"{cfg}_peak_frac"] = rec[f"{cfg}_gflops"] / peak
            if nbytes:
                rec[f"{cfg}_gbps"] = nbytes / m["median_ms"] / 1e6
            del cm
        except Exception as exc:  # noqa: BLE001
            rec[f"{cfg}_error"] = f"{type(exc).__name__}: {exc}"[:2000]
        print(f"  {name} [{cfg}] " + (f"{rec.get(cfg + '_ms', float('nan')):.2f} ms" if cfg in rec else
                                      rec.get(cfg + "_error", "")[:300]), flush=True)
    if flops:
        rec["eager_gflops"] = flops / rec["eager_ms"] / 1e6
        rec["eager_peak_frac"] = rec["eager_gflops"] / peak
    if nbytes:
        rec["eager_gbps"] = nbytes / rec["eager_ms"] / 1e6
    print(f"  {name} eager {rec['eager_ms']:.2f} ms", flush=True)
    return rec


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def markdown(report: dict) -> str:
    mi, recs = report["machine"], report["records"]
    lines = [f"# Dense CPU benchmark, {report['date']}", "",
             f"{mi['cpu_model']}, {report['threads']} threads (ours and eager), torch {mi['torch']}, "
             f"git {mi['git_commit'][:10]}. Measured FMA peak: **{report['peak_gflops']:.1f} GFLOP/s** f32 "
             f"({report['threads']} threads of independent AVX-512 FMA chains). Median of repeated calls; "
             "ratio = ours / eager (< 1: ours faster). `blas`: large matmuls on OpenBLAS; `codegen`: MLIR code only; "
             "`loops`: the pipeline before the dense strategy.", ""]
    lines += ["## Qwen3-MoE router and SMoE blocks", "",
              "| case | eager ms | blas ms | ratio | codegen ms | ratio | loops ms | max err (blas/codegen) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in recs:
        if r["kind"] in ("router", "block"):
            lines.append(f"| {r['case']} | {_fmt(r['eager_ms'])} | {_fmt(r.get('blas_ms'))} | "
                         f"{_fmt(r.get('blas_vs_eager'))} | {_fmt(r.get('codegen_ms'))} | "
                         f"{_fmt(r.get('codegen_vs_eager'))} | {_fmt(r.get('loops_ms'))} | "
                         f"{_fmt(r.get('blas_max_err'), '.1e')} / {_fmt(r.get('codegen_max_err'), '.1e')} |")
    lines += ["", "## Dense shapes", "",
              "| case | eager ms | blas ms | codegen ms | eager % peak | blas % peak | codegen % peak | "
              "GB/s eager / blas / codegen |", "|---|---|---|---|---|---|---|---|"]
    pct = lambda x: None if x is None else 100 * x  # noqa: E731
    for r in recs:
        if r["kind"] in ("gemm", "memory"):
            gbps = ("-" if r["kind"] == "gemm" else
                    f"{_fmt(r.get('eager_gbps'), '.1f')} / {_fmt(r.get('blas_gbps'), '.1f')} / "
                    f"{_fmt(r.get('codegen_gbps'), '.1f')}")
            lines.append(f"| {r['case']} | {_fmt(r['eager_ms'])} | {_fmt(r.get('blas_ms'))} | "
                         f"{_fmt(r.get('codegen_ms'))} | {_fmt(pct(r.get('eager_peak_frac')), '.0f')} | "
                         f"{_fmt(pct(r.get('blas_peak_frac')), '.0f')} | "
                         f"{_fmt(pct(r.get('codegen_peak_frac')), '.0f')} | {gbps} |")
    errors = [f"- {r['case']} [{c}]: {r[c + '_error'][:300]}" for r in recs for c in ("blas", "codegen", "loops")
              if c + "_error" in r]
    if errors:
        lines += ["", "## Errors", ""] + errors
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=_THREADS)
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run)")
    ap.add_argument("--only", nargs="*", default=[], help="run the cases whose name contains one of these")
    ap.add_argument("--budget", type=float, default=1.5, help="seconds of timed calls per configuration")
    ap.add_argument("--out", default=None, help="output stem (default bench/results/dense-<date>)")
    ap.add_argument("--configs", default="blas,codegen,loops",
                    help="comma-separated configurations to run (of blas, codegen, loops; loops: the router only)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"dense-{date}"
    peak = fma_peak_gflops(args.threads)
    print(f"FMA peak: {peak:.1f} GFLOP/s on {args.threads} threads", flush=True)
    g = torch.Generator().manual_seed(20261122)

    def selected(name):
        return not args.only or any(s in name for s in args.only)

    configs = set(args.configs.split(","))
    records = []
    case = router_case(g, args.quick)
    if selected(case[0]):
        records.append(run_case(case, [c for c in ["blas", "codegen", "loops"] if c in configs], args.budget, peak))
    for case in block_cases(args.quick):
        if selected(case[0]):
            records.append(run_case(case, [c for c in ["blas", "codegen"] if c in configs], args.budget, peak))
    for case in dense_cases(g, args.quick):
        if selected(case[0]):
            records.append(run_case(case, [c for c in ["blas", "codegen"] if c in configs], args.budget, peak))
    report = {"date": date, "threads": args.threads, "peak_gflops": peak, "machine": machine_info(args.threads),
              "records": records}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {out}.json and {out}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
