"""Timing and op counting for comparing a compiled model against eager and inductor on a shared machine.

Public: the examples and the benchmarks use these, and so can a user checking what ``backend="moe"`` did::

    from moe_mlir.profiling import interleaved_times, ops_run
    fastest, median = interleaved_times({"eager": f, "moe": g}, rounds=20)["moe"]
    ops_run(g)            # Counter({'moe::route': 1, ...}): which fused ops one call ran

Rounds are interleaved (one call of each function per round) so that a busy core slows every contender alike
rather than whichever happened to run then.
"""

from __future__ import annotations

import collections
import statistics
import time
from typing import Callable

import torch


def interleaved_runs(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """The times (ms) of each function over ``rounds`` rounds, one call of each per round, after one warm-up call of
    each (which compiles what it compiles)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - start) * 1e3)
    return times


def interleaved_times(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, float]]:
    """(fastest, median) ms of each function over ``rounds`` interleaved rounds (:func:`interleaved_runs`). On a
    shared machine the fastest is the figure to read: a round that waited for a core counts in the median only."""
    return {k: (min(t), statistics.median(t)) for k, t in interleaved_runs(fns, rounds).items()}


def interleaved_ms(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """The median ms of each function over ``rounds`` interleaved rounds (:func:`interleaved_runs`)."""
    return {k: statistics.median(t) for k, t in interleaved_runs(fns, rounds).items()}


def ops_run(fn: Callable[[], object], namespaces: tuple[str, ...] = ("moe",)) -> collections.Counter:
    """The torch ops of ``namespaces`` (e.g. ``("moe", "aten")``) that one call of ``fn`` runs, with their counts
    (torch.profiler's CPU events named ``namespace::op``)."""
    prefixes = tuple(f"{ns}::" for ns in namespaces)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return collections.Counter(e.name for e in prof.events() if e.name.startswith(prefixes))
