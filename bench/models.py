"""Whole transformers MoE causal LMs under eager, ``torch.compile(backend="inductor")`` and ``backend="moe"``.

Issue 35 item 2: blocks and routers are benchmarked elsewhere (bench/e2e.py, bench/routing.py); this measures what
a user sees on a whole model. Models (transformers' own classes, random weights, nothing downloaded; small real
shapes: hidden 256, 2 layers, E >= 32): Mixtral, Qwen3-MoE, OLMoE, gpt-oss, DeepSeek-V3, and DeepSeek-V3 with
E = 256 (its production routing: 8 groups, top-4 groups, k = 8; a small hidden size, so routing is a large share).
Issue 51's second configurations, tuned for by no one: deepseek_v3_mla (MLA with a low-rank query), qwen3_moe_e128
(hidden 384, E = 128), mixtral_h512 (hidden 512, E = 8, k = 2), olmoe_e32_k4 (hidden 384, E = 32, k = 4, renormalized)
and gpt_oss_e128 (hidden 384, E = 128, k = 4).

Per model and backend, three phases:

* ``decode``: greedy ``generate`` from a 32-token prompt (``model.forward`` compiled, as HF's docs do it); per
  generated token = (time of N new tokens - time of 1 new token) / (N - 1), so the prompt's prefill is not counted;
  the tokens must equal eager's;
* ``prefill``: one forward over 512 tokens (batch 1, no cache, no grad); logits checked against eager's;
* ``train``: one training step (forward with labels and ``output_router_logits=True``, so the load-balancing loss
  is in the graph; backward; SGD) on a 4 x 128 batch; the first step's loss checked against eager's.

The compile time of each phase is its ``torch.compile`` call plus its first call (after ``torch._dynamo.reset()``),
minus nothing: inductor imports its compiler in the former, moe in the latter. Caches are the
user's: inductor's FX-graph cache and the moe kernel cache persist across rounds (so round 1 is cold, later rounds
warm); ``--cold`` gives every process fresh cache directories (both cold every round).

Protocol: each (model, backend) runs in its own process (``--worker``; nothing compiled by one backend can help
another); rounds interleave the backends (their order rotates per round) so a shared machine's load falls on all
alike; the thread count is pinned (``--threads``, default 2) before torch starts. Ratios (``moe`` over ``inductor``
and over ``eager``) are taken per round from that round's medians; the summary gives their median over rounds and
the spread [min, max].

    .venv/bin/python -m bench.models --threads 2 --rounds 2          # writes bench/results/models-<date>-t2.{json,md}
    .venv/bin/python -m bench.models --quick                          # tiny sizes, 1 round, no files (a smoke test)
    .venv/bin/python -m bench.models --only mixtral deepseek_v3_e256 --phases decode train
    .venv/bin/python -m bench.models --only mixtral --phases decode --profile-dir /tmp/prof   # + where the time goes

On a GPU (issue 35 item 4; the GPU machine's check bundle runs it as its ``models-bench`` step, scripts/gpu-check.sh):
``--device cuda`` puts the models and inputs on the GPU and synchronizes after each timed call; the moe backend's
CUDA kernels come prebuilt (the GPU machine has no LLVM): ``--record`` runs the moe backend's phases once on the CPU
with ``$MOE_KERNEL_RECORD`` set, which lists the kernels to build (``python -m moe_mlir.runtime.prebuild``).
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

_THREADS = pin_threads(2)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("eager", "inductor", "moe")
PHASES = ("decode", "prefill", "train")
MODELS = ("mixtral", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v3", "deepseek_v3_e256", "qwen3_moe_e128",
          "deepseek_v3_mla", "mixtral_h512", "olmoe_e32_k4", "gpt_oss_e128")


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------


def _sizes(quick: bool) -> dict[str, int]:
    if quick:
        return dict(hidden=64, layers=2, heads=4, kv=2, head_dim=16, inter=32, vocab=256, experts=8, big=32)
    return dict(hidden=256, layers=2, heads=4, kv=2, head_dim=64, inter=128, vocab=1024, experts=64, big=256)


def build_model(name: str, quick: bool):
    """The model ``name`` (eval mode), its weights drawn from a fixed seed (the same in every process)."""
    import torch
    import transformers as tf

    s = _sizes(quick)
    k = min(8, s["experts"] // 2)  # Qwen3-MoE's, OLMoE's and DeepSeek-V3's k = 8 (fewer at --quick sizes)
    common = dict(hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                  num_key_value_heads=s["kv"], vocab_size=s["vocab"], bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  tie_word_embeddings=False)
    # Issue 51 item 2, a second configuration of the families below (none tuned for): hidden 384 or 512 where the
    # first is 256, other expert counts and k.
    wider = dict(common, hidden_size=s["hidden"] * 3 // 2, num_attention_heads=s["heads"] * 3 // 2)
    if name == "mixtral":  # Mixtral's k = 2 of 8, scaled to E = experts / 2
        cfg = tf.MixtralConfig(intermediate_size=2 * s["inter"], num_local_experts=s["experts"] // 2,
                               num_experts_per_tok=2, **common)
        cls = tf.MixtralForCausalLM
    elif name == "mixtral_h512":  # Mixtral's own E = 8, k = 2, at hidden 512 (8 heads) with wider experts
        cfg = tf.MixtralConfig(intermediate_size=4 * s["inter"], num_local_experts=max(2, s["experts"] // 8),
                               num_experts_per_tok=2,
                               **dict(common, hidden_size=2 * s["hidden"], num_attention_heads=2 * s["heads"]))
        cls = tf.MixtralForCausalLM
    elif name in ("qwen3_moe", "qwen3_moe_e128"):
        # qwen3_moe_e128 (issue 51 item 2, a second configuration): Qwen3-MoE's own E = 128, k = 8, narrower
        # experts (inter / 2), hidden 384 with 6 heads
        wide = name == "qwen3_moe_e128"
        cfg = tf.Qwen3MoeConfig(moe_intermediate_size=s["inter"] // 2 if wide else s["inter"],
                                intermediate_size=4 * s["inter"],
                                num_experts=2 * s["experts"] if wide else s["experts"], num_experts_per_tok=k,
                                head_dim=s["head_dim"], norm_topk_prob=True,
                                **(wider if wide else common))
        cls = tf.Qwen3MoeForCausalLM
    elif name == "olmoe":
        cfg = tf.OlmoeConfig(intermediate_size=s["inter"], num_experts=s["experts"], num_experts_per_tok=k,
                             norm_topk_prob=False, **common)
        cls = tf.OlmoeForCausalLM
    elif name == "olmoe_e32_k4":  # E = 32, k = 4, renormalized top-k, hidden 384
        cfg = tf.OlmoeConfig(intermediate_size=s["inter"], num_experts=s["experts"] // 2,
                             num_experts_per_tok=max(1, k // 2), norm_topk_prob=True, **wider)
        cls = tf.OlmoeForCausalLM
    elif name in ("gpt_oss", "gpt_oss_e128"):
        # gpt_oss_e128: gpt-oss-120b's E = 128 (k = 4), narrower experts (inter / 2), hidden 384
        e128 = name == "gpt_oss_e128"
        cfg = tf.GptOssConfig(intermediate_size=s["inter"] // 2 if e128 else s["inter"],
                              num_local_experts=2 * s["experts"] if e128 else s["experts"] // 2,
                              num_experts_per_tok=4, head_dim=s["head_dim"], sliding_window=128,
                              layer_types=["sliding_attention", "full_attention"] * (s["layers"] // 2),
                              **(wider if e128 else common))
        cls = tf.GptOssForCausalLM
    elif name in ("deepseek_v3", "deepseek_v3_e256", "deepseek_v3_mla"):
        # deepseek_v3_mla: issue 51's configuration (E = 64, k = 8, 8 groups, top-4 groups, one shared expert,
        # MLA with q_lora_rank 64 and kv_lora_rank 32: a low-rank query as well as the latent key/value)
        experts = s["big"] if name == "deepseek_v3_e256" else s["experts"]
        mla = name == "deepseek_v3_mla"
        groups = 8 if experts >= 32 else 4  # DeepSeek-V3's 8 groups (4 kept); at least 2 experts per group
        cfg = tf.DeepseekV3Config(moe_intermediate_size=s["inter"] // 2 if name == "deepseek_v3_e256" else s["inter"],
                                  intermediate_size=4 * s["inter"], n_routed_experts=experts, num_experts_per_tok=k,
                                  n_group=groups, topk_group=groups // 2, n_shared_experts=1, first_k_dense_replace=0,
                                  routed_scaling_factor=2.5, norm_topk_prob=True,
                                  q_lora_rank=s["hidden"] // 4 if mla else None,
                                  kv_lora_rank=s["hidden"] // 8 if mla else s["hidden"] // 4, qk_rope_head_dim=s["head_dim"] // 2,
                                  qk_nope_head_dim=s["head_dim"] // 2, v_head_dim=s["head_dim"],
                                  **dict(common, num_key_value_heads=s["heads"]))  # MLA: no grouped KV heads
        cls = tf.DeepseekV3ForCausalLM
    else:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    torch.manual_seed(0)
    model = cls(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pname, p in model.named_parameters():  # norms' weights around 1, the rest small
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / s["hidden"] ** 0.5 if p.dim() > 1 else 0.02)
                    + (1.0 if p.dim() == 1 and "norm" in pname else 0.0))
        for bname, b in model.named_buffers():
            if "e_score_correction_bias" in bname:
                b.copy_(torch.randn(b.shape, generator=g) * 0.01)
    desc = {"hidden": cfg.hidden_size, "layers": s["layers"], "experts": _experts(cfg), "k": cfg.num_experts_per_tok}
    return model.eval(), desc


def _experts(cfg) -> int:
    for a in ("num_local_experts", "num_experts", "n_routed_experts"):
        v = getattr(cfg, a, None)
        if isinstance(v, int):
            return v
    return -1


# ----------------------------------------------------------------------------------------------------------------
# The worker: one model, one backend, the phases
# ----------------------------------------------------------------------------------------------------------------


def _compile(fn: Callable, backend: str) -> tuple[Callable, float]:
    """``fn`` compiled, and the seconds the ``torch.compile`` call itself took: part of the compile time, since
    backend "inductor" imports its compiler there (~1 s on a fresh process) where "moe" imports it in the first
    call."""
    import torch

    t0 = time.perf_counter()
    out = fn if backend == "eager" else torch.compile(fn, backend=backend)
    return out, time.perf_counter() - t0


def sgd_step(model, compiled: Callable, ids) -> Callable[[], Any]:
    """One training step of `model` (run through `compiled`, the model or its compiled form): the language-model
    loss on `ids` [B, T] as its own labels, backward, one SGD step (lr 1e-4). Returns the step, which returns the
    loss (detached)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = compiled(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _timed(fn: Callable[[], Any], budget: float, min_reps: int = 3, max_reps: int = 30) -> dict:
    from .timing import measure

    m = measure(fn, budget, max_reps, min_reps=min_reps, cap_s=budget * 3)
    return {"median_ms": m["median_ms"], "p25_ms": m["p25_ms"], "p75_ms": m["p75_ms"], "min_ms": m["min_ms"],
            "reps": m["reps"]}


def _first_call(fn: Callable[[], Any], backend: str) -> tuple[Any, float, dict]:
    """Calls ``fn`` once (the compile, for a compiled backend); returns its result, the seconds, and what the moe
    backend raised (ops, fallbacks)."""
    sys.path.insert(0, str(REPO / "python"))
    from moe_mlir.backends.dynamo import capture_graphs

    t0 = time.perf_counter()
    with capture_graphs() as log:
        out = fn()
    secs = time.perf_counter() - t0
    info = {}
    if backend == "moe":
        ops: dict[str, int] = {}
        for g in log:
            for op in g.moe_ops():
                ops[op] = ops.get(op, 0) + 1
        info = {"raised": ops, "fallbacks": [g.fallback for g in log if g.fallback], "graphs": len(log)}
    return out, secs, info


def _synced(fn: Callable[[], Any], device: str) -> Callable[[], Any]:
    """``fn`` followed by a synchronization on a GPU (a timed call ends when its kernels have run)."""
    import torch

    if device == "cpu":
        return fn

    def call():
        out = fn()
        torch.cuda.synchronize()
        return out

    return call


def _profiled(fn: Callable[[], Any], device: str, path: Optional[Path], what: str) -> None:
    """One more call of ``fn`` under torch.profiler, its op table written to ``path`` (nothing without one): the
    ops by self CPU time, and on a GPU by self device time, so that a run on a lent GPU brings back where each
    backend's time goes along with its ratios."""
    if path is None:
        return
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
    ops = prof.key_averages()
    text = [f"# {what}\n\n## by self CPU time\n",
            ops.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=90)]
    if device == "cuda":
        text += ["\n## by self device time\n",
                 ops.table(sort_by="self_device_time_total", row_limit=30, max_name_column_width=90)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(text))


def worker(name: str, backend: str, phases: list[str], quick: bool, budget: float, out_dir: Path,
           device: str = "cpu", profile_dir: Optional[Path] = None) -> dict:
    import torch

    sys.path.insert(0, str(REPO / "python"))
    import moe_mlir  # noqa: F401  (registers backend "moe")

    torch.set_num_threads(_THREADS)
    model, desc = build_model(name, quick)
    model.to(device)
    rec: dict[str, Any] = {"model": name, "backend": backend, "device": device, **desc}
    g = torch.Generator().manual_seed(2)
    vocab = model.config.vocab_size
    if "decode" in phases:
        n = 6 if quick else 24
        prompt = torch.randint(0, vocab, (1, 32), generator=g).to(device)
        torch._dynamo.reset()
        forward = model.forward
        model.forward, wrap_s = _compile(forward, backend)
        kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
        gen = lambda m: _synced(lambda: model.generate(prompt, max_new_tokens=m, min_new_tokens=m, **kw),  # noqa: E731
                                device)
        with torch.no_grad():
            tokens, secs, info = _first_call(gen(n), backend)
            secs += wrap_s
            many = _timed(gen(n), budget)
            one = _timed(gen(1), budget / 2)
            _profiled(gen(n), device, profile_dir and profile_dir / f"{name}-{backend}-decode.txt",
                      f"{name} under {backend}: generate {n} tokens ({device})")
        model.forward = forward
        rec["decode"] = {"compile_s": secs, "per_token_ms": (many["median_ms"] - one["median_ms"]) / (n - 1),
                         "per_token_best_ms": (many["min_ms"] - one["min_ms"]) / (n - 1),
                         "generate_ms": many, "generate1_ms": one, "new_tokens": n,
                         "tokens": tokens[0, prompt.shape[1]:].tolist(), **info}
    if "prefill" in phases:
        ids = torch.randint(0, vocab, (1, 64 if quick else 512), generator=g).to(device)
        torch._dynamo.reset()
        c, wrap_s = _compile(model, backend)
        call = _synced(lambda: c(input_ids=ids, use_cache=False).logits, device)
        with torch.no_grad():
            logits, secs, info = _first_call(call, backend)
            secs += wrap_s
            t = _timed(call, budget)
            _profiled(call, device, profile_dir and profile_dir / f"{name}-{backend}-prefill.txt",
                      f"{name} under {backend}: prefill of {ids.shape[1]} tokens ({device})")
        torch.save(logits[0, -8:].cpu(), out_dir / f"{name}-{backend}-prefill.pt")
        rec["prefill"] = {"compile_s": secs, "ms": t, "tokens": ids.shape[1], **info}
    if "train" in phases:
        b, t_len = (2, 32) if quick else (4, 128)
        ids = torch.randint(0, vocab, (b, t_len), generator=g).to(device)
        model.train()
        model.config.output_router_logits = True
        torch._dynamo.reset()
        c, wrap_s = _compile(model, backend)
        step = _synced(sgd_step(model, c, ids), device)
        loss, secs, info = _first_call(step, backend)
        secs += wrap_s
        t = _timed(step, budget)
        _profiled(step, device, profile_dir and profile_dir / f"{name}-{backend}-train.txt",
                  f"{name} under {backend}: one training step, batch {b}x{t_len} ({device})")
        model.eval()
        rec["train"] = {"compile_s": secs, "ms": t, "batch": [b, t_len], "first_loss": float(loss), **info}
    return rec


# ----------------------------------------------------------------------------------------------------------------
# The parent: rounds of worker processes, ratios, files
# ----------------------------------------------------------------------------------------------------------------


def _run_worker(name: str, backend: str, args, out_dir: Path, env: dict) -> dict:
    out = out_dir / f"{name}-{backend}.json"
    cmd = [sys.executable, "-m", "bench.models", "--worker", name, backend, "--threads", str(_THREADS),
           "--budget", str(args.budget), "--out-dir", str(out_dir), "--device", args.device, "--phases", *args.phases]
    if args.quick:
        cmd.append("--quick")
    if args.profile_dir:
        cmd += ["--profile-dir", str(args.profile_dir)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0 or not out.is_file():
        return {"model": name, "backend": backend, "error": (p.stderr or p.stdout)[-2000:]}
    rec = json.loads(out.read_text())
    rec["process_s"] = round(time.perf_counter() - t0, 1)
    return rec


def _phase_ms(rec: dict, phase: str, best: bool = False) -> float | None:
    """The phase's median time; with ``best``, its best (fastest) repetition's: on a shared 2-core machine a
    repetition during which another process runs waits for its second thread at every OpenMP region (a decode
    step 5-20x its quiet time), so the medians swing with the load and the best repetitions give the uncontended
    figure (issue 51; runs before the best was recorded have none)."""
    p = rec.get(phase)
    if not p:
        return None
    if best:
        v = p.get("per_token_best_ms") if phase == "decode" else p["ms"].get("min_ms")
        return v if v is None or v > 0 else None
    return p["per_token_ms"] if phase == "decode" else p["ms"]["median_ms"]


def _checks(recs: dict[str, dict], out_dir: Path) -> dict[str, dict[str, str]]:
    """Each compiled backend's outputs against eager's in the same round."""
    import torch

    res: dict[str, dict[str, str]] = {}
    e = recs.get("eager", {})
    for b in ("inductor", "moe"):
        r = recs.get(b, {})
        c: dict[str, str] = {}
        if "decode" in r and "decode" in e:
            c["decode"] = "ok" if r["decode"]["tokens"] == e["decode"]["tokens"] else "tokens differ"
        if "prefill" in r and "prefill" in e:
            name = r["model"]
            got = torch.load(out_dir / f"{name}-{b}-prefill.pt")
            want = torch.load(out_dir / f"{name}-eager-prefill.pt")
            diff = (got - want).abs().max().item()
            c["prefill"] = "ok" if torch.allclose(got, want, atol=1e-3, rtol=1e-3) else f"max abs diff {diff:.3g}"
        if "train" in r and "train" in e:
            a, w = r["train"]["first_loss"], e["train"]["first_loss"]
            c["train"] = "ok" if abs(a - w) <= 1e-4 * max(1.0, abs(w)) else f"loss {a} vs {w}"
        res[b] = c
    return res


def summarize(rounds: list[dict[str, dict[str, dict]]], phases: list[str],
              cold_every_round: bool = False) -> list[dict]:
    """Per model and phase: medians over rounds of each backend's time and compile time (also apart: cold, the
    first round's, and warm, the later rounds'), and the per-round ratios moe/inductor and moe/eager (speed-ups:
    > 1 means moe is faster) with their spread."""
    rows = []
    models = list(dict.fromkeys(m for r in rounds for m in r))
    for m in models:
        for ph in phases:
            per: dict[str, list[float]] = {b: [] for b in BACKENDS}
            comp: dict[str, list[float]] = {b: [] for b in BACKENDS}
            vs_ind, vs_eager, best_ind, best_eager = [], [], [], []
            for r in rounds:
                recs = r.get(m, {})
                ms = {b: _phase_ms(recs.get(b, {}), ph) for b in BACKENDS}
                best = {b: _phase_ms(recs.get(b, {}), ph, best=True) for b in BACKENDS}
                if best["moe"] and best["inductor"]:
                    best_ind.append(best["inductor"] / best["moe"])
                if best["moe"] and best["eager"]:
                    best_eager.append(best["eager"] / best["moe"])
                for b in BACKENDS:
                    if ms[b] is not None:
                        per[b].append(ms[b])
                        comp[b].append(recs[b][ph]["compile_s"])
                if ms["moe"] and ms["inductor"]:
                    vs_ind.append(ms["inductor"] / ms["moe"])
                if ms["moe"] and ms["eager"]:
                    vs_eager.append(ms["eager"] / ms["moe"])
            if not per["moe"]:
                continue
            row = {"model": m, "phase": ph}
            for b in BACKENDS:
                row[f"{b}_ms"] = statistics.median(per[b]) if per[b] else None
                c = comp[b] if b != "eager" else []
                row[f"{b}_compile_s"] = statistics.median(c) if c else None
                # round 1 compiles with empty caches; later rounds find inductor's FX-graph cache and the moe
                # kernel cache filled (unless --cold: then every round is cold)
                cold = c if cold_every_round else c[:1]
                warm = [] if cold_every_round else c[1:]
                row[f"{b}_compile_cold_s"] = statistics.median(cold) if cold else None
                row[f"{b}_compile_warm_s"] = statistics.median(warm) if warm else None
            for key, v in (("moe_vs_inductor", vs_ind), ("moe_vs_eager", vs_eager),
                           ("moe_vs_inductor_best", best_ind), ("moe_vs_eager_best", best_eager)):
                row[key] = statistics.median(v) if v else None
                row[key + "_spread"] = [min(v), max(v)] if v else None
            rows.append(row)
    return rows


def _error_line(text: str) -> str:
    """The line of a worker's stderr that says what failed (the last one naming an error), else its last line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    return (named or lines or ["(no output)"])[-1][:300]


def _fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def _best(row: dict, key: str) -> str:
    v, sp = row.get(key), row.get(key + "_spread")
    return "-" if v is None else f"{v:.2f}x [{_fmt(sp[0])}, {_fmt(sp[1])}]"


def markdown(result: dict) -> str:
    m = result["machine"]
    where = m.get("cpu_model") if result.get("device", "cpu") == "cpu" else f"{m.get('gpu')} (host {m.get('cpu_model')})"
    lines = [f"# Whole MoE causal LMs: eager vs inductor vs moe ({result['date']})", "",
             f"{where}, {result['threads']} threads, torch {m.get('torch')}, commit "
             f"{str(m.get('git_commit'))[:10]}; {len(result['rounds'])} interleaved round(s), each backend in its own "
             f"process; load average before/after: {result['loadavg_before']} / {result['loadavg_after']}.", "",
             "Speed-ups are per-round ratios of medians (> 1: moe faster), median over rounds [min, max]. decode: "
             "ms per generated token; prefill: ms per forward over the prompt (512 tokens; 64 with --quick); train: "
             "ms per step (fwd + bwd + SGD). best: the same ratios from each process's fastest repetitions (decode: "
             "fastest 24-token generate minus fastest 1-token one), the figure a shared machine's load disturbs least.",
             "",
             "Compile s: the phase's first call, inductor / moe; cold: empty caches (round 1, or every round with "
             "--cold); warm: inductor's FX-graph cache and the moe kernel cache filled by round 1 (a user's second "
             "run), median of the later rounds.", "",
             "| model | phase | eager ms | inductor ms | moe ms | moe vs inductor | moe vs eager | best: vs inductor "
             "| best: vs eager | compile s cold | compile s warm |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["summary"]:
        sp = r["moe_vs_inductor_spread"]
        se = r["moe_vs_eager_spread"]
        lines.append(
            f"| {r['model']} | {r['phase']} | {_fmt(r['eager_ms'])} | {_fmt(r['inductor_ms'])} | {_fmt(r['moe_ms'])} "
            f"| {_fmt(r['moe_vs_inductor'])}x [{_fmt(sp and sp[0])}, {_fmt(sp and sp[1])}] "
            f"| {_fmt(r['moe_vs_eager'])}x [{_fmt(se and se[0])}, {_fmt(se and se[1])}] "
            f"| {_best(r, 'moe_vs_inductor_best')} | {_best(r, 'moe_vs_eager_best')} "
            f"| {_fmt(r.get('inductor_compile_cold_s'), '.1f')} / {_fmt(r.get('moe_compile_cold_s'), '.1f')} "
            f"| {_fmt(r.get('inductor_compile_warm_s'), '.1f')} / {_fmt(r.get('moe_compile_warm_s'), '.1f')} |")
    bad = [(i, m_, b, ph, c) for i, rnd in enumerate(result["checks"]) for m_, per in rnd.items()
           for b, cs in per.items() for ph, c in cs.items() if c != "ok"]
    lines += ["", "Checks against eager (tokens, prefill logits, first training loss): "
              + ("all ok" if not bad else "; ".join(f"round {i} {m_} {b} {ph}: {c}" for i, m_, b, ph, c in bad))]
    skipped = [(m_, ph, f) for rnd in result["rounds"] for m_, per in rnd.items() for ph in PHASES
               for f in (per.get("moe", {}).get(ph) or {}).get("fallbacks", [])]
    lines.append("Raising skipped (MoERaisingWarning): " + ("never" if not skipped else
                                                             "; ".join(f"{a} {b}: {c}" for a, b, c in skipped)))
    errors = [(m_, b, _error_line(r["error"])) for rnd in result["rounds"] for m_, per in rnd.items()
              for b, r in per.items() if "error" in r]
    if errors:
        lines.append("Errors: " + "; ".join(f"{a} {b}: {c}" for a, b, c in errors))
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round, no files")
    ap.add_argument("--only", nargs="+", default=None, help="models to run (default: all)")
    ap.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds of timed calls per phase and process")
    ap.add_argument("--cold", action="store_true", help="fresh inductor and moe kernel caches for every process")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    ap.add_argument("--tag", default="")
    ap.add_argument("--results-dir", type=Path, default=None, help="where the files go (default: bench/results)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the models run (default: cpu)")
    ap.add_argument("--record", action="store_true",
                    help="run the moe backend's phases once on the CPU, in this process (kernel recording for a GPU "
                         "run: set $MOE_KERNEL_RECORD); no timing, no files")
    ap.add_argument("--profile-dir", type=Path, default=None,
                    help="after each phase's timing, one more call under torch.profiler: its op tables (self CPU time; "
                         "self device time on a GPU) to DIR/<model>-<backend>-<phase>.txt (the last round's)")
    ap.add_argument("--resummarize", type=Path, default=None, metavar="JSON",
                    help="recompute a results file's summary and markdown (JSON and .md beside it) with this "
                         "version's columns; runs nothing")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.resummarize:
        result = json.loads(args.resummarize.read_text())
        result["summary"] = summarize(result["rounds"], result["phases"], result.get("cold_caches", False))
        args.resummarize.write_text(json.dumps(result, indent=1))
        args.resummarize.with_suffix(".md").write_text(markdown(result))
        print(markdown(result))
        return 0
    if args.worker:
        name, backend = args.worker
        rec = worker(name, backend, args.phases, args.quick, args.budget, args.out_dir, args.device,
                     args.profile_dir)
        (args.out_dir / f"{name}-{backend}.json").write_text(json.dumps(rec))
        return 0
    if args.record:
        for m in args.only or MODELS:
            with tempfile.TemporaryDirectory(prefix="moe-models-record-") as tmp:
                worker(m, "moe", args.phases, args.quick, 0.0, Path(tmp))
            print(f"record: {m} done", flush=True)
        return 0

    from .cpu import machine_info

    models = args.only or list(MODELS)
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r} (known: {', '.join(MODELS)})")
    n_rounds = 1 if args.quick else args.rounds
    result: dict[str, Any] = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "threads": _THREADS,
                              "machine": machine_info(_THREADS), "loadavg_before": round(os.getloadavg()[0], 2),
                              "quick": args.quick, "phases": args.phases, "cold_caches": args.cold, "rounds": [],
                              "checks": [], "device": args.device}
    if args.device == "cuda":
        import torch

        result["machine"]["gpu"] = torch.cuda.get_device_name()
    for i in range(n_rounds):
        order = BACKENDS[i % 3:] + BACKENDS[:i % 3]
        rnd: dict[str, dict[str, dict]] = {}
        checks: dict[str, dict] = {}
        with tempfile.TemporaryDirectory(prefix="moe-models-") as tmp:
            out_dir = Path(tmp)
            for m in models:
                rnd[m] = {}
                for b in order:
                    env = dict(os.environ)
                    if args.cold:
                        env["TORCHINDUCTOR_CACHE_DIR"] = str(out_dir / f"inductor-{m}-{b}")
                        env["MOE_KERNEL_CACHE"] = str(out_dir / f"kernels-{m}-{b}")
                    rnd[m][b] = _run_worker(m, b, args, out_dir, env)
                    r = rnd[m][b]
                    status = _error_line(r["error"]) if "error" in r else "ok"
                    print(f"round {i + 1} {m:18s} {b:8s} " + "  ".join(
                        f"{ph} {_fmt(_phase_ms(r, ph), '.3f')} ms (compile {_fmt(r[ph]['compile_s'], '.1f')} s)"
                        for ph in args.phases if ph in r) + ("" if status == "ok" else f"  ERROR {status}"),
                        flush=True)
                checks[m] = _checks(rnd[m], out_dir)
        result["rounds"].append(rnd)
        result["checks"].append(checks)
        # Written after every round: a run cut short keeps the rounds it finished (the file says how many).
        result["loadavg_after"] = round(os.getloadavg()[0], 2)
        result["summary"] = summarize(result["rounds"], args.phases, args.cold)
        md = markdown(result)
        if not args.quick:
            out = args.results_dir or REPO / "bench" / "results"
            out.mkdir(parents=True, exist_ok=True)
            where = f"t{_THREADS}" if args.device == "cpu" else "cuda-" + result["machine"]["gpu"].split()[-1].lower()
            stem = f"models-{datetime.date.today().isoformat()}-{where}" + (f"-{args.tag}" if args.tag else "")
            (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
            (out / f"{stem}.md").write_text(md)
            print(f"round {i + 1} of {n_rounds}: wrote {out / stem}.json and .md", flush=True)
    print(md)
    bad = any(c != "ok" for rnd in result["checks"] for per in rnd.values() for cs in per.values()
              for c in cs.values())
    errors = any("error" in r for rnd in result["rounds"] for per in rnd.values() for r in per.values())
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
