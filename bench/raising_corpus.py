"""The corpus of routing programs (python/tests/routing_corpus.py) under ``torch.compile(backend="moe")`` against
inductor and eager (issue 79 item 4).

  .venv/bin/python -m bench.raising_corpus [--threads 2] [--tokens 16 64 4096] [--only NAME ...] [--rounds 30]

Each program runs on logits ``[T, E]`` (the gate GEMM before them is the same matmul in every implementation) and
its bias, compiled once per backend with ``dynamic=True`` (one graph for every token count, as a server compiles
its routing), without grad at each token count and with grad (forward + backward of the weights' weighted sum) at
the largest. One call of each backend per round, interleaved, after a warm-up; the median and the fastest of the
rounds. The raised ops are printed per program (a program not raised runs inductor's code under both backends).
The load average before and after is printed: on a shared machine only the ratios of one run count.

Writes bench/results/raising-corpus-<date>-t<threads>[-<tag>].md (and .json).
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

_THREADS = pin_threads(2)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import statistics  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402

from .ours import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "python" / "tests"))
import moe_mlir  # noqa: E402,F401
from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402
from moe_mlir.profiling import interleaved_runs  # noqa: E402
from routing_corpus import CORPUS, Program  # noqa: E402

from .compile_report import arguments, measure_each, medians, ratio, result_stem, run_header, write  # noqa: E402

BACKENDS = ("eager", "inductor", "moe")


def _inputs(p: Program, T: int):
    g = torch.Generator().manual_seed(T)
    return torch.randn(T, p.E, generator=g) * 2, torch.randn(p.E, generator=g) * 0.3


def measure(p: Program, tokens: list[int], rounds: int) -> dict:
    torch._dynamo.reset()
    fns = {"eager": p.fn, "inductor": torch.compile(p.fn, dynamic=True),
           "moe": torch.compile(p.fn, backend="moe", dynamic=True)}
    row: dict = {"program": p.name, "E": p.E, "k": p.k}
    with capture_graphs() as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for T in tokens:
            x, b = _inputs(p, T)
            with torch.no_grad():
                row[f"fwd_T{T}"] = medians(interleaved_runs({k: (lambda f=f: f(x, b)) for k, f in fns.items()},
                                                           rounds))
        T = max(tokens)
        x, b = _inputs(p, T)
        xs = {k: x.clone().requires_grad_(True) for k in fns}

        def train(k):
            w, _ = fns[k](xs[k], b)
            w.sum().backward()
        row[f"train_T{T}"] = medians(interleaved_runs({k: (lambda k=k: train(k)) for k in fns}, rounds))
    row["raised"] = sorted({op for g in log for op in g.moe_ops()})
    row["misses"] = sorted({m for g in log for m in g.misses})
    return row


def _markdown(rows: list[dict], tokens: list[int], header: str) -> str:
    cols = [f"fwd_T{T}" for T in tokens] + [f"train_T{max(tokens)}"]
    lines = [header, "", "Each cell: moe's median (us), then x inductor / x eager (medians; > 1: moe faster).", "",
             "| program | E | k | raised | " + " | ".join(cols) + " |", "|---" * (4 + len(cols)) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['program']} | - | - | error: {r['error']} |" + " |" * len(cols))
            continue
        cells = [f"{r[c]['moe']['median_us']:.1f}: {ratio(r[c], 'inductor'):.2f} / {ratio(r[c], 'eager'):.2f}"
                 for c in cols]
        lines.append(f"| {r['program']} | {r['E']} | {r['k']} | {', '.join(r['raised']) or '-'} | "
                     + " | ".join(cells) + " |")
    ok = [r for r in rows if "error" not in r]
    for c in cols:
        below = [r["program"] for r in ok if ratio(r[c], "inductor") < 1.0]
        ratios = sorted(ratio(r[c], "inductor") for r in ok)
        if ratios:
            lines.append(f"\n{c}: {len(ok)} programs, x inductor {ratios[0]:.2f}-{ratios[-1]:.2f} (median "
                         f"{statistics.median(ratios):.2f}); below 1.0x: {len(below)} {below if below else ''}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = arguments(_THREADS, [16, 64, 4096], 30).parse_args(argv)
    result_stem(args.out, "raising-corpus", args.threads, args.tag)  # before the run, not after it
    programs = [p for p in CORPUS if not args.only or any(p.name.startswith(o) for o in args.only)]
    load0 = os.getloadavg()
    rows = measure_each(programs, lambda p: measure(p, args.tokens, args.rounds), "program")
    load1 = os.getloadavg()
    header = run_header('The routing corpus: backend "moe" against inductor and eager', "raising_corpus", args, load0,
                        load1)
    path = write(args.out, "raising-corpus", args.threads, args.tag, _markdown(rows, args.tokens, header), rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
