"""Hash routers under ``torch.compile(backend="moe")`` against inductor and eager (issue #79).

  .venv/bin/python -m bench.hash_routing [--threads 2] [--tokens 16 64 4096] [--only CASE ...] [--rounds 100]

A hash router takes each token's experts from a frozen table (``idx = table[input_ids]``) and weighs them with the
router's scores gathered there, renormalised and scaled; backend "moe" raises the weights to
``moe.route(..., replay=idx)`` (python/moe_mlir/frontend/raising_replay.py). As bench/raising_corpus.py does for
the corpus, each case is the routing program on logits ``[T, E]`` (the gate GEMM before them is the same matmul in
every implementation) and the token ids, compiled once per backend with ``dynamic=True``:

* ``softmax`` (E = 64, k = 6) and ``softmax_e256`` (E = 256, k = 6): softmax scores; the renormalised softmax's
  normaliser cancels, so the kernel reads the row's max and takes k exponentials a token, not E;
* ``deepseek_v4``: transformers' DeepseekV4HashRouter's weights (sqrt(softplus(x)) scores, a custom score region;
  sum + 1e-20; routed scaling 1.5) at DeepSeek-V4's E = 256, k = 6.

Forward without grad at each token count (after a checked call of each backend), forward + backward of the
weights' sum at the largest; one call of each backend per round, interleaved; the median and the fastest round.
The load average before and after is printed: on a shared machine the ratios of one run are what counts.

Writes bench/results/hash-routing-<date>-t<threads>[-<tag>].md (and .json).
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

_THREADS = pin_threads(2)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import datetime  # noqa: E402
import json  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402

from .ours import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "python"))
import moe_mlir  # noqa: E402,F401
from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402
from moe_mlir.profiling import interleaved_runs  # noqa: E402

from .compile_report import arguments, machine, medians, ratio, write  # noqa: E402

VOCAB = 4096


def _table(experts: int, k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(experts + k)
    return torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(VOCAB)])


def softmax_hash(logits: torch.Tensor, table: torch.Tensor, input_ids: torch.Tensor):
    """A hash router with softmax scores, as DeepseekV4HashRouter writes its weights."""
    scores = logits.softmax(dim=-1)
    indices = table[input_ids.reshape(-1)]
    weights = scores.gather(1, indices)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, indices


def deepseek_v4_hash(logits: torch.Tensor, table: torch.Tensor, input_ids: torch.Tensor):
    """transformers' DeepseekV4HashRouter after its gate GEMM: sqrt(softplus(x)) scores (ACT2FN["sqrtsoftplus"]),
    the table's experts, renormalised with its 1e-20, scaled by 1.5."""
    from transformers.activations import ACT2FN

    scores = ACT2FN["sqrtsoftplus"](logits)
    indices = table[input_ids.reshape(-1)].long()
    weights = scores.gather(1, indices)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * 1.5, indices


#: name -> (routing program, E, k)
CASES = {"softmax": (softmax_hash, 64, 6), "softmax_e256": (softmax_hash, 256, 6),
         "deepseek_v4": (deepseek_v4_hash, 256, 6)}
BACKENDS = ("eager", "inductor", "moe")


def _inputs(E: int, T: int):
    g = torch.Generator().manual_seed(T)
    return torch.randn(T, E, generator=g) * 2, torch.randint(0, VOCAB, (T,), generator=g)


def measure(name: str, tokens: list[int], rounds: int) -> dict:
    fn, E, k = CASES[name]
    table = _table(E, k)
    torch._dynamo.reset()
    fns = {"eager": fn, "inductor": torch.compile(fn, dynamic=True),
           "moe": torch.compile(fn, backend="moe", dynamic=True)}
    row: dict = {"case": name, "E": E, "k": k}
    with capture_graphs() as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for T in tokens:
            x, ids = _inputs(E, T)
            with torch.no_grad():
                want = fn(x, table, ids)
                for b in ("inductor", "moe"):
                    for got, ref in zip(fns[b](x, table, ids), want):
                        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
                row[f"fwd_T{T}"] = medians(interleaved_runs(
                    {b: (lambda f=f: f(x, table, ids)) for b, f in fns.items()}, rounds))
            print(json.dumps({name: {T: {b: round(v["median_us"], 1) for b, v in row[f"fwd_T{T}"].items()}}}),
                  flush=True)
        T = max(tokens)
        x, ids = _inputs(E, T)
        xs = {b: x.clone().requires_grad_(True) for b in fns}

        def train(b):
            w, _ = fns[b](xs[b], table, ids)
            w.sum().backward()
        row[f"train_T{T}"] = medians(interleaved_runs({b: (lambda b=b: train(b)) for b in fns}, max(rounds // 4, 5)))
    row["raised"] = sorted({op for g in log for op in g.moe_ops()})
    return row


def _markdown(rows: list[dict], tokens: list[int], header: str) -> str:
    cols = [f"fwd_T{T}" for T in tokens] + [f"train_T{max(tokens)}"]
    lines = [header, "", "Each cell: moe / inductor / eager medians (us), then x inductor / x eager (> 1: moe faster).",
             "", "| case | E | k | raised | " + " | ".join(cols) + " |", "|---" * (4 + len(cols)) + "|"]
    for r in rows:
        cells = [f"{r[c]['moe']['median_us']:.1f} / {r[c]['inductor']['median_us']:.1f} / "
                 f"{r[c]['eager']['median_us']:.1f}: {ratio(r[c], 'inductor'):.2f} / {ratio(r[c], 'eager'):.2f}"
                 for c in cols]
        lines.append(f"| {r['case']} | {r['E']} | {r['k']} | {', '.join(r['raised']) or '-'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = arguments(_THREADS, [16, 64, 4096], 100).parse_args(argv)
    load0 = os.getloadavg()
    rows = [measure(name, args.tokens, args.rounds) for name in CASES if not args.only or name in args.only]
    load1 = os.getloadavg()
    header = (f"# Hash routers: backend \"moe\" vs inductor and eager ({datetime.date.today()})\n\n"
              f"{machine(args.threads, load0, load1)} `python -m bench.hash_routing` "
              f"(bench/hash_routing.py: each routing program on logits [T, E] and token ids, compiled once with "
              f"dynamic=True; forward without grad, {args.rounds} interleaved rounds; forward + backward of the "
              f"weights' sum at the largest T, {max(args.rounds // 4, 5)} rounds; medians).")
    text = _markdown(rows, args.tokens, header)
    print(text)
    write(args.out, "hash-routing", args.threads, args.tag, text,
          {"load_before": load0, "load_after": load1, "threads": args.threads, "rounds": args.rounds, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
