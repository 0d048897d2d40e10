"""Wall-clock timing: warm-up, then repeated calls; median and spread."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Callable


def measure(fn: Callable[[], object], budget_s: float, max_reps: int, min_reps: int = 3,
            cap_s: float = 20.0) -> dict:
    """Warm-up call(s), then timed calls until ``budget_s`` is used (at least ``min_reps``, at most ``max_reps``;
    a slow kernel gets fewer so that one implementation of one case stays under ``cap_s``)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first >= cap_s:  # too slow to repeat within the cap: the warm-up call is the measurement
        ms = first * 1e3
        return {"median_ms": ms, "min_ms": ms, "max_ms": ms, "p25_ms": ms, "p75_ms": ms, "iqr_rel": 0.0,
                "reps": 1, "first_call_ms": ms, "note": "single call (slower than the cap)"}
    # more warm-up for fast functions (caches, allocator, branch predictors): ~5% of the budget
    if first < budget_s * 0.01:
        end = time.perf_counter() + budget_s * 0.05
        while time.perf_counter() < end:
            fn()
    est = max(first, 1e-7)
    reps = int(budget_s / est)
    reps = max(min_reps, min(max_reps, reps))
    if est * reps > cap_s:
        reps = max(1, int(cap_s / est))
    times = []
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(reps):
            a = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - a) / 1e6)
    finally:
        if was:
            gc.enable()
    times.sort()
    n = len(times)
    q = lambda f: times[min(n - 1, int(round(f * (n - 1))))]
    return {
        "median_ms": statistics.median(times),
        "min_ms": times[0],
        "max_ms": times[-1],
        "p25_ms": q(0.25),
        "p75_ms": q(0.75),
        "iqr_rel": (q(0.75) - q(0.25)) / statistics.median(times) if statistics.median(times) > 0 else 0.0,
        "reps": n,
        "first_call_ms": first * 1e3,
    }
