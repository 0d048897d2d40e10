"""End-to-end speed of ``torch.compile(backend="moe")`` against inductor and eager, on whole MoE blocks.

Cases:

* HF's own ``Qwen3MoeSparseMoeBlock`` with a Qwen3-MoE-shaped config (hidden 2048, 128 experts, k=8,
  moe_intermediate 768; random weights), at prefill (4096 tokens) and decode (64 tokens) sizes: the whole block
  (the router, then HF's data-dependent expert loop: graph breaks) and its routing step alone
  (``Qwen3MoeTopKRouter``: linear, softmax, top-k, renormalize);
* the five seed SMoE blocks (python/moe_mlir/models, plain-torch formulation) at 64 and 4096 tokens;
* the same Qwen3-MoE block's expert dispatch (issue 13 item 3, issue 9 item 7), at 64 and 4096 tokens: HF's eager
  loop, HF's ``grouped_mm`` experts implementation, the dispatch-plan implementation ``"moe"``
  (:mod:`moe_mlir.experts`) run eagerly, ``torch.compile(backend="inductor")`` (HF's loop, graph breaks) and
  ``moe_mlir.compile`` (the dispatch plan + raising + inductor), all in the same rounds;
* the same block's routing step split into its parts (issue 9 item 7: "routing step >= 2x eager's"): eager's
  ``Qwen3MoeTopKRouter`` whole, its ``linear`` alone and its softmax + top-k + renormalize alone, and the router
  through ``torch.compile(backend="moe")`` (the linear, then ``moe.topk_renorm``), in the same rounds: the share of
  the gate GEMM in eager's routing step bounds what any faster top-k can give (Amdahl).

Each case: eager, ``torch.compile(backend="inductor")`` and ``torch.compile(backend="moe")`` (torch.compile's
defaults otherwise), in the same process, the same thread count, the same inputs; compile time (the first call)
recorded apart; after warm-up, rounds of one call of each in turn (a shared machine's load falls on all three
alike), medians; outputs checked against eager. The number of moe ops the
backend raised is recorded per case.

    .venv/bin/python -m bench.e2e --threads 2            # writes bench/results/e2e-<date>.{json,md}
    .venv/bin/python -m bench.e2e --threads 2 --quick    # smaller sizes, no files (a smoke test)
    .venv/bin/python -m bench.e2e --threads 2 --only Router seed --tag routing   # a subset: e2e-<date>-routing
    .venv/bin/python -m bench.e2e --threads 2 --only experts --tag experts       # the expert-dispatch cases
    .venv/bin/python -m bench.e2e --threads 2 --only "routing parts" --tag routing-parts   # the routing step's parts
"""

from __future__ import annotations

import os
import sys

from .cpu import _THREADS  # noqa: F401  (sets OMP/MOE thread variables from --threads before torch starts)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from .cpu import machine_info  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import moe_mlir  # noqa: E402
from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402


def qwen3_moe(hidden: int, experts: int, k: int, inter: int):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=hidden, num_experts=experts, num_experts_per_tok=k,
                         moe_intermediate_size=inter, norm_topk_prob=True)
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, hidden ** -0.5)
    return block


def _flat(out: Any) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]


def _check(got: Any, want: Any, index_outputs: bool) -> str:
    for g, w in zip(_flat(got), _flat(want)):
        if g.dtype in (torch.int32, torch.int64):
            if index_outputs and not torch.equal(g, w):
                return "indices differ"
            continue
        if not torch.allclose(g.float(), w.float(), atol=1e-4, rtol=1e-3):
            return f"max abs diff {(g.float() - w.float()).abs().max().item():.3g}"
    return "ok"


def interleaved(fns: dict[str, Callable[[], Any]], budget: float) -> dict[str, dict]:
    """Warm-up, then rounds of one timed call of each implementation in turn (so that a shared machine's load
    falls on all of them alike) until about ``budget`` seconds per implementation (3 to 50 rounds)."""
    est = {}
    for b, fn in fns.items():  # the warm-up call (each was called once already: compile, or eager's reference)
        t0 = time.perf_counter()
        fn()
        est[b] = time.perf_counter() - t0
    rounds = max(3, min(50, int(budget / max(max(est.values()), 1e-6))))
    times: dict[str, list[float]] = {b: [] for b in fns}
    for _ in range(rounds):
        for b, fn in fns.items():
            t0 = time.perf_counter_ns()
            fn()
            times[b].append((time.perf_counter_ns() - t0) / 1e6)
    return {b: {"median_ms": statistics.median(t), "min_ms": min(t), "reps": len(t)} for b, t in times.items()}


def run_case(name: str, model: torch.nn.Module, x: torch.Tensor, budget: float, index_outputs: bool = True) -> dict:
    rec: dict[str, Any] = {"case": name, "input": list(x.shape), "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    with torch.no_grad():
        want = model(x)
        fns: dict[str, Callable[[], Any]] = {"eager": lambda: model(x)}
        torch._dynamo.reset()
        compiled = {b: torch.compile(model, backend=b) for b in ("inductor", "moe")}
        for b, c in compiled.items():
            t0 = time.perf_counter()
            with capture_graphs() as log:
                got = c(x)
            rec[f"{b}_compile_s"] = round(time.perf_counter() - t0, 2)
            rec[f"{b}_check"] = _check(got, want, index_outputs)
            if b == "moe":
                rec["moe_ops_raised"] = sorted(op for g in log for op in g.moe_ops())
                rec["moe_fallbacks"] = [g.fallback for g in log if g.fallback]
            fns[b] = (lambda c=c: c(x))
        for b, m in interleaved(fns, budget).items():
            rec[f"{b}_ms"] = m["median_ms"]
            rec[f"{b}_min_ms"] = m["min_ms"]
            rec[f"{b}_reps"] = m["reps"]
    rec["moe_vs_eager"] = rec["eager_ms"] / rec["moe_ms"]
    rec["moe_vs_inductor"] = rec["inductor_ms"] / rec["moe_ms"]
    rec["inductor_vs_eager"] = rec["eager_ms"] / rec["inductor_ms"]
    print(f"{name:48s} eager {rec['eager_ms']:9.3f} ms  inductor {rec['inductor_ms']:9.3f} ms  "
          f"moe {rec['moe_ms']:9.3f} ms  moe/eager {rec['moe_vs_eager']:.2f}x  moe/inductor "
          f"{rec['moe_vs_inductor']:.2f}x  raised {rec['moe_ops_raised']}  checks {rec['inductor_check']}/"
          f"{rec['moe_check']}", flush=True)
    return rec


def cases(quick: bool):
    from moe_mlir.models import acmoe, attention_inform, hyper_router, similarity_inform, symphony

    if quick:
        shape, tokens, seed_tokens = (256, 16, 4, 128), (256, 16), (64,)
    else:
        shape, tokens, seed_tokens = (2048, 128, 8, 768), (4096, 64), (4096, 64)
    hidden, experts, k, inter = shape
    block = qwen3_moe(hidden, experts, k, inter)
    tag = f"hidden={hidden} E={experts} k={k} inter={inter}"
    g = torch.Generator().manual_seed(1)
    for t in tokens:
        x = torch.randn(1, t, hidden, generator=g)
        yield f"Qwen3MoeSparseMoeBlock {tag} T={t}", block, x, True
        yield f"Qwen3MoeTopKRouter (routing step) {tag} T={t}", block.gate, x.view(t, hidden), True
    for mod in (similarity_inform, attention_inform, hyper_router, acmoe, symphony):
        model, (x0,) = mod.example(use_custom_ops=False)
        for t in seed_tokens:
            x = torch.randn(1, t, x0.shape[-1], generator=g)
            yield f"seed {mod.__name__.split('.')[-1]} T={t}", model, x, True


@contextlib.contextmanager
def _experts_impl(block: torch.nn.Module, impl: str):
    """HF's experts implementation ``impl`` for the calls inside (``"moe"``: moe_mlir.experts)."""
    from moe_mlir import experts as X

    if impl == "moe":
        with X.use_moe_experts(block):
            yield
        return
    cfg = block.experts.config
    old = cfg._experts_implementation
    cfg._experts_implementation = impl
    try:
        yield
    finally:
        cfg._experts_implementation = old


def run_experts_case(name: str, block: torch.nn.Module, x: torch.Tensor, budget: float) -> dict:
    """The Qwen3-MoE block with five expert paths (see the module doc); ratios against HF eager and inductor."""
    rec: dict[str, Any] = {"case": name, "kind": "experts", "input": list(x.shape),
                           "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    with torch.no_grad():
        want = block(x)
        torch._dynamo.reset()
        inductor = torch.compile(block, backend="inductor")
        moe = moe_mlir.compile(block)

        def under(impl, fn):
            def call():
                with _experts_impl(block, impl):
                    return fn(x)
            return call

        fns = {"eager": lambda: block(x), "hf_grouped_mm": under("grouped_mm", block),
               "dispatch_eager": under("moe", block), "inductor": lambda: inductor(x), "moe": lambda: moe(x)}
        for b, fn in fns.items():
            t0 = time.perf_counter()
            with capture_graphs() as log:
                got = fn()
            rec[f"{b}_first_s"] = round(time.perf_counter() - t0, 2)
            rec[f"{b}_check"] = _check(got, want, True)
            if b == "moe":
                rec["moe_ops_raised"] = sorted(op for g in log for op in g.moe_ops())
        for b, m in interleaved(fns, budget).items():
            rec[f"{b}_ms"] = m["median_ms"]
            rec[f"{b}_reps"] = m["reps"]
    best = min(rec["eager_ms"], rec["inductor_ms"], rec["hf_grouped_mm_ms"])
    rec["moe_vs_eager"] = rec["eager_ms"] / rec["moe_ms"]
    rec["moe_vs_inductor"] = rec["inductor_ms"] / rec["moe_ms"]
    rec["dispatch_eager_vs_eager"] = rec["eager_ms"] / rec["dispatch_eager_ms"]
    rec["moe_vs_best_baseline"] = best / rec["moe_ms"]
    print(f"{name:48s} " + "  ".join(f"{b} {rec[b + '_ms']:9.3f} ms" for b in fns) +
          f"  moe/eager {rec['moe_vs_eager']:.2f}x  moe/inductor {rec['moe_vs_inductor']:.2f}x  dispatch(eager)/eager "
          f"{rec['dispatch_eager_vs_eager']:.2f}x  checks {[rec[b + '_check'] for b in fns]}", flush=True)
    return rec


def experts_cases(quick: bool):
    hidden, experts, k, inter = (256, 16, 4, 128) if quick else (2048, 128, 8, 768)
    block = qwen3_moe(hidden, experts, k, inter)
    g = torch.Generator().manual_seed(2)
    for t in ((256, 16) if quick else (4096, 64)):
        yield (f"Qwen3MoeSparseMoeBlock experts hidden={hidden} E={experts} k={k} inter={inter} T={t}", block,
               torch.randn(1, t, hidden, generator=g))


def run_router_parts_case(name: str, router: torch.nn.Module, x: torch.Tensor, budget: float) -> dict:
    """Eager's routing step and its parts (gate GEMM; softmax + top-k + renormalize) and the moe-compiled router,
    in the same rounds; ``gemm_share``: the GEMM's median over the whole step's (bounds any top-k speed-up)."""
    import torch.nn.functional as F

    rec: dict[str, Any] = {"case": name, "kind": "router_parts", "input": list(x.shape),
                           "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    with torch.no_grad():
        logits = F.linear(x, router.weight)

        def select():
            top, idx = torch.topk(F.softmax(logits, dtype=torch.float, dim=-1), router.top_k, dim=-1)
            return top / top.sum(dim=-1, keepdim=True), idx

        torch._dynamo.reset()
        moe = torch.compile(router, backend="moe")
        with capture_graphs() as log:
            rec["moe_check"] = _check(moe(x), router(x), True)
        rec["moe_ops_raised"] = sorted(op for g in log for op in g.moe_ops())
        fns = {"eager": lambda: router(x), "eager_gemm": lambda: F.linear(x, router.weight),
               "eager_softmax_topk_renorm": select, "moe": lambda: moe(x)}
        for b, m in interleaved(fns, budget).items():
            rec[f"{b}_ms"] = m["median_ms"]
            rec[f"{b}_min_ms"] = m["min_ms"]
    rec["gemm_share"] = rec["eager_gemm_ms"] / rec["eager_ms"]
    rec["moe_vs_eager"] = rec["eager_ms"] / rec["moe_ms"]
    rec["max_vs_eager_with_eager_gemm"] = 1 / rec["gemm_share"]
    print(f"{name:48s} " + "  ".join(f"{b} {rec[b + '_ms']:8.3f} ms" for b in fns) +
          f"  GEMM share {rec['gemm_share']:.0%}  moe/eager {rec['moe_vs_eager']:.2f}x  raised "
          f"{rec['moe_ops_raised']}  check {rec['moe_check']}", flush=True)
    return rec


def router_parts_cases(quick: bool):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    hidden, experts, k = (256, 16, 4) if quick else (2048, 128, 8)
    router = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=hidden, num_experts=experts, num_experts_per_tok=k,
                                               norm_topk_prob=True)).eval()
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(0)))
        router.weight.mul_(hidden ** -0.5)
    g = torch.Generator().manual_seed(3)
    for t in ((256,) if quick else (4096, 64)):
        yield (f"Qwen3MoeTopKRouter routing parts hidden={hidden} E={experts} k={k} T={t}", router,
               torch.randn(t, hidden, generator=g))


def _router_parts_table(recs: list[dict]) -> list[str]:
    if not recs:
        return []
    lines = ["", "## Qwen3-MoE routing step, part by part", "",
             "`eager`: HF's `Qwen3MoeTopKRouter` (linear, softmax, top-k, renormalize); `eager GEMM`: its "
             "`F.linear` alone; `eager softmax+topk+renorm`: the rest alone; `moe`: torch.compile(backend=\"moe\") "
             "of the router (the linear, then the raised `moe.topk_renorm`). GEMM share = eager GEMM / eager: with "
             "the same GEMM, no routing kernel can make the step faster than 1 / GEMM share times eager's.", "",
             "| case | eager ms | eager GEMM ms | eager softmax+topk+renorm ms | moe ms | GEMM share | moe vs eager | "
             "bound (1 / GEMM share) | check |", "|---|--:|--:|--:|--:|--:|--:|--:|---|"]
    for r in recs:
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error']} ||||||||")
            continue
        lines.append(f"| {r['case']} | {r['eager_ms']:.4g} | {r['eager_gemm_ms']:.4g} | "
                     f"{r['eager_softmax_topk_renorm_ms']:.4g} | {r['moe_ms']:.4g} | {r['gemm_share']:.0%} | "
                     f"{r['moe_vs_eager']:.2f}x | {r['max_vs_eager_with_eager_gemm']:.2f}x | {r['moe_check']} |")
    return lines


def _experts_table(recs: list[dict]) -> list[str]:
    if not recs:
        return []
    impls = ("eager", "hf_grouped_mm", "dispatch_eager", "inductor", "moe")
    lines = ["", "## Qwen3-MoE expert dispatch", "",
             "`eager`: HF's loop; `hf_grouped_mm`: HF's `grouped_mm` experts implementation; `dispatch_eager`: "
             "moe_mlir.experts (`moe.dispatch_plan`, then the fused per-expert loop `moe_mlir::expert_mlp`: gather, "
             "both projections, gate, routing weight and accumulation per expert in reused buffers) without "
             "compiling; "
             "`inductor`: torch.compile(backend=\"inductor\") of HF's loop; `moe`: moe_mlir.compile (dispatch plan, "
             "raised router, inductor). Medians in ms; ratios above 1: moe is faster.", "",
             "| case | " + " | ".join(f"{b} ms" for b in impls) + " | moe vs eager | moe vs inductor | "
             "moe vs best of eager/inductor/hf_grouped_mm | checks |",
             "|---|" + "--:|" * (len(impls) + 3) + "---|"]
    for r in recs:
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error']} |" + "|" * (len(impls) + 3))
            continue
        lines.append(f"| {r['case']} | " + " | ".join(f"{r[b + '_ms']:.4g}" for b in impls) +
                     f" | {r['moe_vs_eager']:.2f}x | {r['moe_vs_inductor']:.2f}x | {r['moe_vs_best_baseline']:.2f}x | "
                     + ", ".join(r[b + "_check"] for b in impls) + " |")
    return lines


def write_report(doc: dict, out: Path) -> None:
    m = doc["machine"]
    lines = [f"# End-to-end benchmark {doc['date']}: torch.compile(backend=\"moe\") vs inductor vs eager", "",
             f"Machine: **{m['cpu_model']}**, {m['logical_cpus']} logical CPUs ({', '.join(m['simd'])}), "
             f"{m['memory_gib']} GiB; threads = {m['threads']} for all three (same process, same inputs). "
             f"torch {m['torch']}, transformers {doc['transformers']}. Commit `{m['git_commit'][:12]}`. "
             f"Load average at start {'/'.join(f'{v:.2f}' for v in m['loadavg_start'])}, at end "
             f"{'/'.join(f'{v:.2f}' for v in doc['loadavg_end'])}; run time {doc['run_s']:.0f} s.", "",
             f"moe ops behind `torch.ops.moe.*` in this run: {doc['moe_ops_impl']}.", "",
             "Times are medians over rounds of one call of each implementation in turn, after warm-up (compile = "
             "the first call, excluded; `moe_vs_*` columns: above 1 means moe is faster); ratios are "
             "eager/moe, inductor/moe and eager/inductor (above 1: the first is slower). Outputs checked against "
             "eager (indices exactly, values atol 1e-4 rtol 1e-3).", "",
             "| case | eager ms | inductor ms | moe ms | moe vs eager | moe vs inductor | inductor vs eager | "
             "raised | compile s (inductor / moe) | check (inductor / moe) |",
             "|---|--:|--:|--:|--:|--:|--:|---|--:|---|"]
    if all(r.get("kind") in ("experts", "router_parts") for r in doc["cases"]):
        del lines[-3:]  # only the expert-dispatch / routing-parts cases ran: their tables below
    for r in doc["cases"]:
        if r.get("kind") in ("experts", "router_parts"):
            continue
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error']} |||||||||")
            continue
        lines.append(f"| {r['case']} | {r['eager_ms']:.3g} | {r['inductor_ms']:.3g} | {r['moe_ms']:.3g} | "
                     f"{r['moe_vs_eager']:.2f}x | {r['moe_vs_inductor']:.2f}x | {r['inductor_vs_eager']:.2f}x | "
                     f"{', '.join(r['moe_ops_raised']) or '-'} | {r['inductor_compile_s']} / {r['moe_compile_s']} | "
                     f"{r['inductor_check']} / {r['moe_check']} |")
    lines += _experts_table([r for r in doc["cases"] if r.get("kind") == "experts"])
    lines += _router_parts_table([r for r in doc["cases"] if r.get("kind") == "router_parts"])
    if doc.get("note"):
        lines += ["", f"**Note:** {doc['note']}"]
    out.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=_THREADS)
    ap.add_argument("--quick", action="store_true", help="small sizes, no result files")
    ap.add_argument("--budget", type=float, default=None, help="seconds of timed calls per implementation")
    ap.add_argument("--note", default="", help="a note for the report")
    ap.add_argument("--only", nargs="*", default=None, help="substrings of case names to run")
    ap.add_argument("--tag", default="", help="a suffix of the result files' names (e2e-<date>-<tag>)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    budget = args.budget or (0.5 if args.quick else 3.0)
    info = machine_info(args.threads)
    print(f"machine: {info['cpu_model']} ({info['logical_cpus']} logical CPUs), threads={args.threads}", flush=True)
    t0 = time.perf_counter()
    recs: list[dict] = []

    def run_all(found, run, kind=None):
        for name, *case in found:
            if args.only and not any(s in name for s in args.only):
                continue
            try:
                recs.append(run(name, *case))
            except Exception as e:  # noqa: BLE001 - record and go on
                print(f"{name}: {type(e).__name__}: {e}", flush=True)
                recs.append({"case": name, "error": f"{type(e).__name__}: {e}", **({"kind": kind} if kind else {})})

    run_all(cases(args.quick), lambda name, model, x, idx: run_case(name, model, x, budget, idx))
    run_all(experts_cases(args.quick), lambda name, block, x: run_experts_case(name, block, x, budget), "experts")
    run_all(router_parts_cases(args.quick), lambda name, router, x: run_router_parts_case(name, router, x, budget),
            "router_parts")
    import transformers

    impl = getattr(moe_mlir.ops, "IMPLEMENTATION", None) or "the implementation registered by moe_mlir.ops"
    doc = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": info, "quick": args.quick,
           "transformers": transformers.__version__, "moe_ops_impl": impl, "cases": recs,
           "loadavg_end": list(os.getloadavg()), "run_s": time.perf_counter() - t0, "note": args.note}
    bad = [r["case"] for r in recs if "error" in r or any(v != "ok" for key, v in r.items() if key.endswith("_check"))]
    if not args.quick:
        day = datetime.date.today().isoformat() + (f"-{args.tag}" if args.tag else "")
        out = REPO / "bench" / "results"
        (out / f"e2e-{day}.json").write_text(json.dumps(doc, indent=1) + "\n")
        write_report(doc, out / f"e2e-{day}.md")
        print(f"wrote bench/results/e2e-{day}.json and .md", flush=True)
    if bad:
        print(f"checks failed: {bad}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
