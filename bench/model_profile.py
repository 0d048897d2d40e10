"""Where a whole model's decode step and training step spend their time under each backend (issue 51 item 1).

One model (a configuration of :mod:`bench.models`), one backend, in this process (run one process per backend):

* ``decode``: the compiled ``model.forward`` on one new token with a KV cache filled by a 32-token prompt, the same
  call HF's ``generate`` makes per token (no sampling loop around it); timed over many calls;
* ``train``: one training step (forward with labels and the router logits, backward, SGD) on a 4 x 128 batch.

For each: the median time, a torch.profiler op table (self CPU time, call counts per step), the graphs the backend
compiled (Dynamo graphs, graph breaks, recompiles) and, from inductor's output code (``TORCH_LOGS=output_code``),
the generated C++ kernels, the extern calls and the OpenMP parallel regions per graph. ``--json`` writes it all.

    .venv/bin/python -m bench.model_profile deepseek_v3_mla moe --phases decode train --json /tmp/p.json
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

_THREADS = pin_threads(2)

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

_LOG = Path(tempfile.mkdtemp(prefix="moe-profile-")) / "torch.log"
if "TORCH_LOGS" not in os.environ:
    os.environ["TORCH_LOGS"] = "output_code,graph_breaks,recompiles"
    os.environ["TORCH_LOGS_OUT"] = str(_LOG)


def _median_ms(fn, reps: int) -> dict:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        ts.append((time.perf_counter_ns() - t0) / 1e6)
    ts.sort()
    return {"median_ms": ts[len(ts) // 2], "p25_ms": ts[len(ts) // 4], "p75_ms": ts[3 * len(ts) // 4],
            "reps": reps}


def _op_table(fn, steps: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    rows = []
    for e in prof.key_averages():
        rows.append({"name": e.key, "self_us": e.self_cpu_time_total / steps, "total_us": e.cpu_time_total / steps,
                     "calls": e.count / steps})
    rows.sort(key=lambda r: -r["self_us"])
    return rows


def _output_code_summary(text: str) -> list[dict]:
    """Per inductor output-code module in ``text``: its C++ kernels, extern calls, parallel regions."""
    text = "\n".join(re.sub(r"^.*?\[__output_code\] ?", "", ln) for ln in text.splitlines()
                     if "[__output_code]" in ln)
    mods = re.split(r"\nOutput code: ?\n", "\n" + text)[1:]
    out = []
    for m in mods:
        call = m.split("def call(", 1)[1] if "def call(" in m else ""
        call = call.split("\ndef benchmark_compiled_module", 1)[0]
        kernels = re.findall(r"^\s+(cpp_fused_\w+)\(", call, flags=re.M)
        externs = re.findall(r"(extern_kernels\.\w+|torch\.ops\.[\w.]+|aten\.[\w.]+)\(", call)
        parallel = len(re.findall(r"#pragma omp parallel", m))
        out.append({"kernels": len(kernels), "kernel_names": Counter(kernels).most_common(),
                    "externs": Counter(externs).most_common(), "omp_parallel_regions": parallel})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("backend", choices=("eager", "inductor", "moe"))
    ap.add_argument("--phases", nargs="+", default=["decode", "train"], choices=("decode", "train"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=200, help="timed decode calls (train: reps / 20)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--table", type=int, default=25, help="op table rows printed")
    args = ap.parse_args()

    import torch

    sys.path.insert(0, str(REPO / "python"))
    import moe_mlir  # noqa: F401
    from moe_mlir.backends.dynamo import capture_graphs

    from .models import build_model, sgd_step

    torch.set_num_threads(_THREADS)
    model, desc = build_model(args.model, False)
    res: dict = {"model": args.model, "backend": args.backend, "threads": _THREADS, **desc}
    g = torch.Generator().manual_seed(2)
    vocab = model.config.vocab_size
    counters = None
    if "decode" in args.phases:
        from transformers import DynamicCache

        prompt = torch.randint(0, vocab, (1, 32), generator=g)
        torch._dynamo.reset()
        fwd = model.forward if args.backend == "eager" else torch.compile(model.forward, backend=args.backend)
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            out = model(prompt, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            pos = prompt.shape[1]
            # grow the cache through a few compiled steps (compiles, then a steady state of dynamic shapes)
            with capture_graphs() as log:
                for _ in range(4):
                    out = fwd(tok, past_key_values=cache, use_cache=True,
                              cache_position=torch.tensor([pos]))
                    tok = out.logits[:, -1:].argmax(-1)
                    pos += 1
            base = pos

            def step():
                # the cache is cut back to the same length before each step: every timed call is the same
                extra = cache.get_seq_length() - base
                if extra > 0:
                    cache.crop(-extra)
                fwd(tok, past_key_values=cache, use_cache=True, cache_position=torch.tensor([base]))

            for _ in range(20):
                step()
            res["decode"] = {"time": _median_ms(step, args.reps), "ops": _op_table(step, 20),
                             "graphs": len(log), "raised": [g_.counts for g_ in log if g_.raised]}
    if "train" in args.phases:
        ids = torch.randint(0, vocab, (4, 128), generator=g)
        model.train()
        model.config.output_router_logits = True
        torch._dynamo.reset()
        c = model if args.backend == "eager" else torch.compile(model, backend=args.backend)
        tstep = sgd_step(model, c, ids)

        with capture_graphs() as log:
            tstep()
        for _ in range(2):
            tstep()
        res["train"] = {"time": _median_ms(tstep, max(5, args.reps // 20)), "ops": _op_table(tstep, 3),
                        "graphs": len(log), "raised": [g_.counts for g_ in log if g_.raised]}
    from torch._dynamo.utils import counters as dyn_counters

    counters = {k: dict(v) for k, v in dyn_counters.items() if k in ("graph_break", "stats", "inductor")}
    res["dynamo_counters"] = {k: {kk: vv for kk, vv in v.items() if isinstance(vv, int)} for k, v in counters.items()}
    if _LOG.is_file():
        res["output_code"] = _output_code_summary(_LOG.read_text(errors="replace"))
        res["log"] = str(_LOG)
    for ph in args.phases:
        r = res[ph]
        print(f"== {args.model} {args.backend} {ph}: {r['time']['median_ms']:.3f} ms "
              f"[{r['time']['p25_ms']:.3f}, {r['time']['p75_ms']:.3f}] graphs {r['graphs']} raised {r['raised']}")
        print(f"{'op':70s} {'self us':>9s} {'total us':>9s} {'calls':>7s}")
        for row in r["ops"][:args.table]:
            print(f"{row['name'][:70]:70s} {row['self_us']:9.1f} {row['total_us']:9.1f} {row['calls']:7.1f}")
    for i, m in enumerate(res.get("output_code", [])):
        print(f"-- output code {i}: {m['kernels']} C++ kernels, {m['omp_parallel_regions']} omp parallel, "
              f"externs {m['externs']}")
    print("dynamo counters:", res["dynamo_counters"])
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
