"""What the compile benches (hash_routing, raising_corpus, hf_routers) share: their command line, the loop over
their cases, the machine line of a result's header, the median of interleaved rounds, the ratio against a baseline
and the two result files."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from .ours import REPO


def arguments(threads: int, tokens: list[int], rounds: int) -> argparse.ArgumentParser:
    """The shared options; a bench adds its own before parsing."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--tokens", type=int, nargs="*", default=tokens)
    ap.add_argument("--only", nargs="*", default=[], help="the cases to run (by name prefix); default all")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--tag", default="", help="appended to the result files' names")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    return ap


def medians(times: dict[str, list[float]]) -> dict:
    """Each backend's median and minimum (us) of interleaved rounds given in ms (moe_mlir.profiling.interleaved_runs)."""
    return {k: {"median_us": statistics.median(v) * 1e3, "min_us": min(v) * 1e3} for k, v in times.items()}


def ratio(cell: dict, base: str) -> float:
    """``base``'s median over moe's (> 1: moe faster)."""
    return cell[base]["median_us"] / cell["moe"]["median_us"]


def measure_each(cases: list, measure, label: str, failed: str = "error") -> list[dict]:
    """``measure(case)`` for each case, each row printed as a JSON line as it comes (its "misses" left out); a case
    that raises is a row ``{label: case's name, failed: the error}``: reported in the result, never hidden, and the
    next case still runs."""
    rows = []
    for case in cases:
        try:
            rows.append(measure(case))
        except Exception as e:  # noqa: BLE001 - reported, never hidden
            rows.append({label: getattr(case, "name", case), failed: f"{type(e).__name__}: {str(e)[:160]}"})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "misses"}), flush=True)
    return rows


def machine(threads: int, load_before: tuple, load_after: tuple) -> str:
    """The machine sentence of a result's header: CPU model, threads, torch, and the load average around the run
    (a benchmark counts only on a quiet machine)."""
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or platform.machine())
    return (f"Machine: {cpu}, {os.cpu_count()} CPUs, {threads} threads, torch {torch.__version__}; load average "
            f"before {[round(x, 2) for x in load_before]}, after {[round(x, 2) for x in load_after]}.")


def run_header(title: str, module: str, args, load_before: tuple, load_after: tuple) -> str:
    """A result's title line and its command and machine sentence (``args`` of :func:`arguments`)."""
    tokens = " ".join(map(str, args.tokens))
    return (f"# {title} ({datetime.date.today()})\n\n`python -m bench.{module} --threads {args.threads} --tokens "
            f"{tokens} --rounds {args.rounds}`. {machine(args.threads, load_before, load_after)}")


def result_stem(out: str, name: str, threads: int, tag: str) -> Path:
    """``<out>/<name>-<date>-t<threads>[-<tag>]``, which must not exist yet: a result the docs may cite is never
    replaced by a later run of the same day (that run names itself with ``--tag``). Call it before a long run too."""
    stem = Path(out) / (f"{name}-{datetime.date.today()}-t{threads}" + (f"-{tag}" if tag else ""))
    for suffix in (".md", ".json"):
        if stem.with_name(stem.name + suffix).exists():
            raise SystemExit(f"{stem}{suffix} exists: run again with --tag NAME (a result is never overwritten)")
    return stem


def write(out: str, name: str, threads: int, tag: str, markdown: str, payload) -> Path:
    """``<out>/<name>-<date>-t<threads>[-<tag>].md`` and ``.json`` (:func:`result_stem`); returns the markdown's
    path."""
    stem = result_stem(out, name, threads, tag).name
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n")
    path = Path(out) / f"{stem}.md"
    path.write_text(markdown)
    return path
