"""Every transformers MoE family's router under ``torch.compile(backend="moe")`` against inductor (issue #48 item 6).

  .venv/bin/python -m bench.hf_routers [--threads 2] [--tokens 16 2048] [--only FAMILY ...] [--rounds 30]

Each family of python/tests/hf_families.py (the discovery the families test uses) is built at router-sized
dimensions larger than the test's tiny ones (hidden 256, 64 experts, top-8, 2 groups of which 1 is kept where the
family has groups) and its first router module is taken (the submodule whose class is the family's ``*Router`` /
``*TopkRouter``, the gate of its first MoE block). The router runs on hidden states ``[T, hidden]`` (``[1, T,
hidden]`` where it wants a batch) at each token count, as compiled by backend "moe" (its dense part by inductor)
and by inductor, without grad; one call of each per round, interleaved, after a warm-up; per backend the median and
the fastest of the rounds. A family is reported with what backend "moe" raised in the router's graph (a routing op,
or nothing: then both backends run inductor's code), or why it could not be measured (no router class, a build
or call that fails at these sizes). The load average before and after is printed: on a shared machine the
ratios of one run are what counts.

Writes bench/results/hf-routers-<date>-t<threads>[-<tag>].md (and .json).
"""

from __future__ import annotations

import os
import sys

from .threads import pin_threads

_THREADS = pin_threads(2)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import datetime  # noqa: E402
import inspect  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402

from .ours import REPO  # noqa: E402

sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "python" / "tests"))
import hf_families  # noqa: E402
import moe_mlir  # noqa: E402,F401
from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402
from moe_mlir.profiling import interleaved_runs  # noqa: E402

from .compile_report import arguments, machine, measure_each, medians, write  # noqa: E402

#: Router-sized dimensions (hf_families' shrinker applies them where a config has the attribute).
SIZES = {"hidden_size": 256, "d_model": 256, "num_experts": 64, "num_local_experts": 64, "n_routed_experts": 64,
         "moe_num_experts": 64, "num_experts_per_tok": 8, "top_k_experts": 8, "moe_k": 8, "moe_topk": 8,
         "moe_intermediate_size": 32, "expert_intermediate_size": 32}


def _router(model: torch.nn.Module) -> torch.nn.Module | None:
    """The first submodule whose class is a router of the model's own modeling module."""
    for _, mod in model.named_modules():
        name = type(mod).__name__
        if name.endswith(("TopKRouter", "TopkRouter", "Router")) and "MLP" not in name:
            return mod
    return None


def _build(family: str) -> torch.nn.Module:
    saved = dict(hf_families._SIZES)
    hf_families._SIZES.update(SIZES)
    try:
        return hf_families.build(family)
    finally:
        hf_families._SIZES.clear()
        hf_families._SIZES.update(saved)


def _inputs(router: torch.nn.Module, T: int, hidden: int) -> tuple:
    """Hidden states the router takes: [T, hidden], else [1, T, hidden] (and its extra required arguments, such
    as DeepSeek-V4's hash layers' token ids)."""
    g = torch.Generator().manual_seed(T)
    extra = [p for p in list(inspect.signature(router.forward).parameters.values())[1:]
             if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for shape in ((T, hidden), (1, T, hidden)):
        x = torch.randn(*shape, generator=g)
        args = (x,) + tuple(torch.randint(0, 64, shape[:-1], generator=g) for _ in extra)
        try:
            with torch.no_grad():
                router(*args)
            return args
        except Exception:  # noqa: BLE001 - the other layout
            continue
    raise RuntimeError("the router takes neither [T, hidden] nor [1, T, hidden]")


def measure(family: str, tokens: list[int], rounds: int) -> dict:
    row: dict = {"family": family}
    try:
        model = _build(family)
    except Exception as e:  # noqa: BLE001
        return dict(row, skipped=f"build: {type(e).__name__}: {str(e)[:120]}")
    router = _router(model)
    if router is None:
        return dict(row, skipped="no *Router module (routing inside the block's forward)")
    row["router"] = type(router).__name__
    hidden = next(p.shape[-1] for p in router.parameters() if p.dim() == 2)
    row["experts"] = next(p.shape[0] for p in router.parameters() if p.dim() == 2)
    for T in tokens:
        try:
            args = _inputs(router, T, hidden)
        except RuntimeError as e:
            return dict(row, skipped=str(e))
        torch._dynamo.reset()
        moe = torch.compile(router, backend="moe", dynamic=False)
        ind = torch.compile(router, dynamic=False)
        with capture_graphs() as log, warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            want = router(*args)
            got_m, got_i = moe(*args), ind(*args)
        row.setdefault("raised", sorted({op for g in log for op in g.moe_ops()}))
        _check(got_m, want)
        _check(got_i, want)
        with torch.no_grad():
            row[f"T{T}"] = medians(interleaved_runs({"moe": lambda: moe(*args), "inductor": lambda: ind(*args)},
                                                    rounds))
    return row


def _check(got, want) -> None:
    """A router's outputs agree with eager's: its logits as they are; its weights and indices as the dense [T, E]
    gate they scatter to (an unsorted top-k may list the same experts in another order)."""
    got, want = _flat(got), _flat(want)
    assert len(got) == len(want)
    idx = [i for i, t in enumerate(want) if not t.is_floating_point() and t.dim() >= 1]
    weights = [i for i, t in enumerate(want) if t.is_floating_point() and idx and t.shape == want[idx[0]].shape]
    for i, (a, b) in enumerate(zip(got, want)):
        if i not in idx and i not in weights:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    if idx and weights:
        j, w = idx[0], weights[0]
        E = max(int(want[j].max()), int(got[j].max())) + 1 if want[j].numel() else 1

        def dense(ts):
            flat_w, flat_i = ts[w].reshape(-1, ts[w].shape[-1]).float(), ts[j].reshape(-1, ts[j].shape[-1]).long()
            return torch.zeros(flat_w.shape[0], E).scatter_add(1, flat_i, flat_w)
        torch.testing.assert_close(dense(got), dense(want), atol=1e-5, rtol=1e-4)


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


def _markdown(rows: list[dict], tokens: list[int], header: str) -> str:
    lines = [header, "", "| family | router | E | raised | " + " | ".join(
        f"T={T} moe / inductor (us, median) | x" for T in tokens) + " |",
        "|---" * (4 + 2 * len(tokens)) + "|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['family']} | - | - | not measured: {r['skipped']} |" + " |" * (2 * len(tokens)))
            continue
        cells = []
        for T in tokens:
            t = r[f"T{T}"]
            cells += [f"{t['moe']['median_us']:.1f} / {t['inductor']['median_us']:.1f}",
                      f"{t['inductor']['median_us'] / t['moe']['median_us']:.2f}"]
        lines.append(f"| {r['family']} | {r['router']} | {r['experts']} | {', '.join(r['raised']) or '-'} | "
                     + " | ".join(cells) + " |")
    measured = [r for r in rows if "skipped" not in r and r["raised"]]
    for T in tokens:
        below = [r["family"] for r in measured
                 if r[f"T{T}"]["inductor"]["median_us"] < r[f"T{T}"]["moe"]["median_us"]]
        lines.append(f"\nT = {T}: {len(measured)} raised routers measured, below 1.0x inductor (median): "
                     f"{len(below)} {below if below else ''}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = arguments(_THREADS, [16, 2048], 30).parse_args(argv)
    families = [f for f in hf_families.families() if not args.only or f in args.only]
    load0 = os.getloadavg()
    rows = measure_each(families, lambda f: measure(f, args.tokens, args.rounds), "family", failed="skipped")
    load1 = os.getloadavg()
    header = (f"# transformers MoE routers: backend \"moe\" vs inductor ({datetime.date.today()})\n\n"
              f"{machine(args.threads, load0, load1)} `python -m bench.hf_routers` "
              f"(bench/hf_routers.py: each family's first router at hidden 256, 64 experts, top-8; forward, no "
              f"grad; {args.rounds} interleaved rounds; x = inductor / moe, medians).")
    text = _markdown(rows, args.tokens, header)
    print(text)
    write(args.out, "hf-routers", args.threads, args.tag, text, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
