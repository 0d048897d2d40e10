"""A router's training step with its auxiliary losses: ``torch.ops.moe.*`` vs eager PyTorch, inductor and
``torch.compile(backend="moe")`` of the eager code, same inputs, same threads, same run (issue #32 item 5).

  .venv/bin/python -m bench.router_losses [--threads 2] [--quick] [--only SUBSTR ...] [--no-compile] [--budget S]

One timed call, from the router logits ``[T, E]`` (the router GEMM is the same dense matmul everywhere and is left
out) to their gradient:

* forward: the routing weights (softmax, top-k, renormalized: Mixtral / Qwen3-MoE / OLMoE's router), Switch's
  load-balancing loss (transformers' ``load_balancing_loss_func`` on the layer's logits) and ST-MoE's z-loss
  (``mean(logsumexp(logits)²)``);
* backward: ``torch.autograd.grad`` of ``Σ w·g + 0.01·L_balance + 0.001·L_z`` (``g`` a fixed [T, k] upstream
  gradient standing for the experts') into the logits.

Implementations: eager = that code as transformers writes it (bench/router_losses.py ``eager_step``), under
autograd; inductor = ``torch.compile`` of it (static shapes, AOTAutograd); moe backend = ``torch.compile(...,
backend="moe")`` of the same code, whose softmax/top-k/renormalize, loss and z-loss are raised to the ops (the
record keeps the raised op names); ours = ``torch.ops.moe.topk_renorm`` + ``load_balancing_loss`` +
``router_z_loss`` called directly. Interleaved rounds (bench/torch_ops.py ``interleaved``): one batch of calls of
each implementation in turn, medians and spreads over the rounds. Our loss and gradient are checked against eager.

Cases: E = 64 and E = 256, k = 8, at T = 16384 (prefill/training) and T = 64 (decode-size). Target (issue #32):
>= 2x eager and >= 1x inductor at T = 16384. Writes bench/results/router-losses-<date>-t<threads>[-tag].json/.md.
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

_THREADS = pin_threads(2)

import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from .ours import REPO  # noqa: E402
from .torch_ops import (SizedCase, _fmt_ms, bench_main, interleaved, machine_line, named_cases,  # noqa: E402
                        record_correct)

sys.path.insert(0, str(REPO / "python"))
import moe_mlir  # noqa: E402,F401
from moe_mlir.backends.dynamo import MoERaisingWarning, capture_graphs  # noqa: E402

K = 8
BALANCE_COEF, Z_COEF = 0.01, 0.001
PREFILL_T, DECODE_T = (16384,), (64,)


def load_balancing_loss(logits: torch.Tensor, num_experts: int, top_k: int) -> torch.Tensor:
    """transformers' ``load_balancing_loss_func`` (Mixtral, Qwen3-MoE, OLMoE: the installed release's per-layer
    form) on one layer's logits, without its device and dtype plumbing."""
    routing_weights = F.softmax(logits, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    tokens_per_expert = torch.histc(selected_experts.reshape(-1).float(), bins=num_experts, min=0, max=num_experts)
    router_prob = routing_weights.float().sum(dim=0)
    rows = routing_weights.shape[0]
    return torch.sum(tokens_per_expert / rows * (router_prob / rows).unsqueeze(0)) * num_experts


def eager_step(logits: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The router's forward as the HF models write it, plus both losses: the objective whose gradient is timed."""
    E = logits.shape[-1]
    p = F.softmax(logits, dim=-1, dtype=torch.float)
    w, _ = torch.topk(p, K, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    return (w * g).sum() + BALANCE_COEF * load_balancing_loss(logits, E, K) + Z_COEF * z


def ours_step(logits: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    w, _ = torch.ops.moe.topk_renorm(logits, K, "logits", True)
    return ((w * g).sum() + BALANCE_COEF * torch.ops.moe.load_balancing_loss(logits, K)
            + Z_COEF * torch.ops.moe.router_z_loss(logits))


@dataclass
class Case(SizedCase):
    E: int


def cases(ts) -> list[Case]:
    return [Case(f"router_losses_E{E}_k{K}_T{T}", "router_losses", "decode" if T <= 64 else "prefill", T, E)
            for T in ts for E in (64, 256)]


def fwd_bwd(fn, logits: torch.Tensor, g: torch.Tensor):
    x = logits.detach().requires_grad_()

    def step():
        loss = fn(x, g)
        (grad,) = torch.autograd.grad(loss, x)
        return loss.detach(), grad

    return step


def _check(ours, eager) -> float:
    (l, gr), (l_e, gr_e) = ours, eager
    if not torch.allclose(l, l_e, rtol=1e-5, atol=1e-6):
        raise AssertionError(f"loss {l.item()} vs eager {l_e.item()}")
    err = (gr - gr_e).abs().max().item()
    if not torch.allclose(gr, gr_e, rtol=1e-4, atol=1e-7):
        raise AssertionError(f"gradients differ: max abs err {err:.3g}")
    return err


def _compiled(rec: dict, key: str, backend: str, logits, g):
    """torch.compile(eager_step) with ``backend`` made a timed call; its compile seconds (and, for the moe backend,
    the raised ops) go to ``rec``; None with rec[key + '_error'] on failure."""
    try:
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as record, capture_graphs() as log:
            warnings.simplefilter("always")
            call = fwd_bwd(torch.compile(eager_step, backend=backend, dynamic=False), logits, g)
            t0 = time.perf_counter()
            out = call()
            rec[f"{key}_compile_s"] = time.perf_counter() - t0
        if backend == "moe":
            rec["moe_backend_raised"] = [op for gr in log for op in gr.moe_ops()]
            rec["moe_backend_skipped"] = [str(w.message)[:200] for w in record
                                          if issubclass(w.category, MoERaisingWarning)]
        _check(out, fwd_bwd(eager_step, logits, g)())
        return call
    except Exception as err:  # noqa: BLE001
        rec[f"{key}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return None


def run_case(case: Case, args) -> dict:
    rec = {"case": case.name, "op": case.op, "regime": case.regime, "T": case.T, "E": case.E, "k": K,
           "loadavg_1min_before": round(os.getloadavg()[0], 2)}
    gen = torch.Generator().manual_seed(20261124)
    logits = torch.randn(case.T, case.E, generator=gen)
    g = torch.randn(case.T, K, generator=gen)
    ours, eager = fwd_bwd(ours_step, logits, g), fwd_bwd(eager_step, logits, g)
    t0 = time.perf_counter()
    got = ours()
    rec["first_call_ms"] = (time.perf_counter() - t0) * 1e3
    record_correct(rec, lambda: _check(got, eager()), key="max_abs_grad_err")
    fns = {"ours": ours, "eager": eager}
    if not args.no_compile:
        for key, backend in (("inductor", "inductor"), ("moe_backend", "moe")):
            call = _compiled(rec, key, backend, logits, g)
            if call is not None:
                fns[key] = call
    rec.update(interleaved(fns, args.budget, 2000 if case.regime == "decode" else 200))
    ours_ms = rec["ours"]["median_ms"]
    for key in ("eager", "inductor", "moe_backend"):
        if key in rec:
            rec[f"speedup_vs_{key}"] = rec[key]["median_ms"] / ours_ms
    if "moe_backend" in rec:  # what the raising gives the unchanged eager code
        rec["moe_backend_vs_eager"] = rec["eager"]["median_ms"] / rec["moe_backend"]["median_ms"]
        if "inductor" in rec:
            rec["moe_backend_vs_inductor"] = rec["inductor"]["median_ms"] / rec["moe_backend"]["median_ms"]
    return rec


def _spread(m: dict) -> str:
    return f"{_fmt_ms(m['median_ms'])} ({_fmt_ms(m['p25_ms'])}-{_fmt_ms(m['p75_ms'])})" if "p25_ms" in m else \
        _fmt_ms(m["median_ms"])


def write_markdown(doc: dict, path: Path) -> None:
    lines = [
        f"# Router forward + backward with the balancing loss and the z-loss ({doc['date']})", "",
        machine_line(doc) + (f". {doc['note']}" if doc.get("note") else "")
        + " (ratios within one run are what counts).", "",
        "One call = logits [T, E] -> softmax/top-8/renormalized weights + Switch balancing loss + z-loss -> gradient "
        "into the logits (bench/router_losses.py). Ours = torch.ops.moe.topk_renorm + load_balancing_loss + "
        "router_z_loss; eager = the transformers-style code under autograd; inductor = torch.compile of it; moe "
        "backend = torch.compile(backend=\"moe\") of the same eager code (raised ops listed). Medians of "
        "interleaved rounds, (p25-p75) in brackets; x = their time / ours.", "",
        "| case | ours | eager | inductor | moe backend | x eager | x inductor | moe backend x eager / x inductor "
        "| raised | max grad err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        if "ours" not in r:
            lines.append(f"| {r['case']} | error: {r.get('error', '')[:100]} | | | | | | | | |")
            continue
        ind = _spread(r["inductor"]) if "inductor" in r else r.get("inductor_error", "-")[:40]
        mb = _spread(r["moe_backend"]) if "moe_backend" in r else r.get("moe_backend_error", "-")[:40]
        xi = f"{r['speedup_vs_inductor']:.2f}" if "speedup_vs_inductor" in r else "-"
        mbx = (f"{r['moe_backend_vs_eager']:.2f} / {r.get('moe_backend_vs_inductor', float('nan')):.2f}"
               if "moe_backend_vs_eager" in r else "-")
        raised = ", ".join(r.get("moe_backend_raised", [])) + (" (skipped!)" if r.get("moe_backend_skipped") else "")
        err = f"{r['max_abs_grad_err']:.1e}" if "max_abs_grad_err" in r else ("WRONG: " + r.get("error", "")[:40])
        lines.append(f"| {r['case']} | {_spread(r['ours'])} | {_spread(r['eager'])} | {ind} | {mb} | "
                     f"{r['speedup_vs_eager']:.2f} | {xi} | {mbx} | {raised} | {err} |")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    return bench_main(__doc__, "router-losses", lambda args: named_cases(args, cases(
        DECODE_T + (() if args.quick else PREFILL_T))), run_case, markdown=write_markdown)


if __name__ == "__main__":
    sys.exit(main())
