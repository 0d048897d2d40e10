"""A raised router whose readers take int64 indices (torch.topk's): the kernel writing them (``indices_dtype=
torch.int64``) against the kernel's int32 and a cast after it (what raising emits), both compiled in one process
under ``torch.compile(backend="moe", dynamic=True)``, interleaved: why raising keeps the cast.

  .venv/bin/python -m bench.index_dtype [--threads 2] [--tokens 16 64 4096] [--rounds 120] [--only NAME ...]

The "int64" form is the same compile with the raising's moe op made with ``indices_dtype=torch.int64`` (no cast
then: raising casts only where the dtypes differ; the raised graphs' cache off, so that raising runs for each form):
the only difference between the two compiled graphs is the dtype argument against the cast kernel and its buffer
after the extern call, which the run asserts on the graphs it compiles. Each round times a batch of 200 calls of each form, the order
alternating; the median and fastest of the rounds. Writes bench/results/index-dtype-<date>-t<threads>[-<tag>].md
(and .json).
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import time

from .threads import pin_threads

_THREADS = pin_threads(2)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Raising runs for each form: the raised graphs' disk cache (keyed by the Dynamo graph, the same for both forms)
# would hand the cast form the int64 one.
os.environ["MOE_RAISE_CACHE"] = "0"

import statistics  # noqa: E402

import torch  # noqa: E402

from .ours import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "python" / "tests"))
import moe_mlir  # noqa: E402,F401
import moe_mlir.frontend.routing_region as routing_region  # noqa: E402
from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402
from routing_corpus import CORPUS  # noqa: E402

from .compile_report import arguments, run_header, write  # noqa: E402

#: Routers whose index output is int64 (raised to topk_renorm and route), top-1 and top-8.
PROGRAMS = ("switch/hf_max", "softmax_renorm/hf", "dsv3/hf", "top1_sigmoid/train")
BATCH = 200


_MOE_ROUTING = (torch.ops.moe.topk_renorm.default, torch.ops.moe.route.default)


@contextlib.contextmanager
def _kernel_int64():
    """Raising with the moe op's node made with ``indices_dtype=torch.int64``: no cast for int64 readers."""
    make = routing_region.new_node

    def with_index_dtype(graph, target, args, kwargs=None, like=None):
        if target in _MOE_ROUTING:
            kwargs = {**(kwargs or {}), "indices_dtype": torch.int64}
        return make(graph, target, args, kwargs, like=like)

    routing_region.new_node = with_index_dtype
    try:
        yield
    finally:
        routing_region.new_node = make


def _casts(compiled) -> int:
    """The dtype casts of a compiled graph's moe op's index output."""
    return sum(1 for n in compiled.graph_module.graph.nodes
               if n.target is torch.ops.aten._to_copy.default and isinstance(n.args[0], torch.fx.Node)
               and n.args[0].target is operator.getitem and getattr(n.args[0].args[0].target, "namespace", "") == "moe")


def measure(program, tokens: list[int], rounds: int) -> dict:
    torch._dynamo.reset()
    inputs = {}
    for T in tokens:
        g = torch.Generator().manual_seed(T)
        inputs[T] = torch.randn(T, program.E, generator=g) * 2, torch.randn(program.E, generator=g) * 0.3
    # Every compile (a recompile at a token count too) happens here, the cast form's under the old raising.
    forms = {"int64": torch.compile(program.fn, backend="moe", dynamic=True),
             "cast": torch.compile(lambda x, b: program.fn(x, b), backend="moe", dynamic=True)}
    with torch.no_grad():
        for x, b in inputs.values():
            with capture_graphs() as new, _kernel_int64():
                forms["int64"](x, b)
            with capture_graphs() as old:
                forms["cast"](x, b)
            # The two forms differ as said: the moe op's index dtype, and a cast only in the old one.
            assert all(_casts(g) == 0 for g in new) and all(_casts(g) >= 1 for g in old), program.name
    row: dict = {"program": program.name}
    for T in tokens:
        x, b = inputs[T]
        with torch.no_grad():
            outs = {k: f(x, b) for k, f in forms.items()}
            assert outs["int64"][1].dtype == outs["cast"][1].dtype == torch.int64
            assert torch.equal(outs["int64"][1], outs["cast"][1])
            times: dict[str, list[float]] = {k: [] for k in forms}
            for r in range(rounds):
                for k in (("int64", "cast") if r % 2 == 0 else ("cast", "int64")):
                    start = time.perf_counter()
                    for _ in range(BATCH):
                        forms[k](x, b)
                    times[k].append((time.perf_counter() - start) / BATCH * 1e6)
        row[f"T{T}"] = {k: {"median_us": statistics.median(v), "min_us": min(v)} for k, v in times.items()}
    return row


def _markdown(rows: list[dict], tokens: list[int], header: str) -> str:
    lines = [header, "",
             "Each cell: int64 from the kernel, int32 + cast (median us, fastest in brackets), then cast / int64 "
             "(medians; > 1: the kernel's int64 faster).", "",
             "| program | " + " | ".join(f"T = {T}" for T in tokens) + " |",
             "|---|" + "---|" * len(tokens)]
    for row in rows:
        cells = []
        for T in tokens:
            c = row[f"T{T}"]
            cells.append(f"{c['int64']['median_us']:.1f} ({c['int64']['min_us']:.1f}), "
                         f"{c['cast']['median_us']:.1f} ({c['cast']['min_us']:.1f}): "
                         f"{c['cast']['median_us'] / c['int64']['median_us']:.2f}x")
        lines.append(f"| {row['program']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = arguments(_THREADS, [16, 64, 4096], 120).parse_args(argv)
    names = [n for n in PROGRAMS if not args.only or any(n.startswith(o) for o in args.only)]
    programs = [p for p in CORPUS if p.name in names]
    load0 = os.getloadavg()
    rows = [measure(p, args.tokens, args.rounds) for p in programs]
    load1 = os.getloadavg()
    title = "int64 indices from the kernel against int32 and a cast, in raised routers"
    header = run_header(title, "index_dtype", args, load0, load1)
    path = write(args.out, "index-dtype", args.threads, args.tag, _markdown(rows, args.tokens, header), rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
