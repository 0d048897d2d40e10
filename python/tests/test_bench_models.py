"""bench/models.py's summary (no model is run): per-round ratios of the medians and, where the workers recorded
them, of the best repetitions (issue 51: on a shared 2-core machine the medians swing with the load)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

_env = dict(os.environ)
from bench import models  # noqa: E402  (it pins the thread variables for its workers: not this process's)

os.environ.clear()
os.environ.update(_env)


def _rec(decode_med, decode_best, train_med, train_min):
    rec = {"decode": {"per_token_ms": decode_med, "compile_s": 1.0},
           "train": {"ms": {"median_ms": train_med}, "compile_s": 1.0}}
    if decode_best is not None:
        rec["decode"]["per_token_best_ms"] = decode_best
        rec["train"]["ms"]["min_ms"] = train_min
    return rec


def test_summary_gives_median_and_best_ratios_per_round():
    rounds = [{"m": {"eager": _rec(4.0, 3.0, 200.0, 150.0), "inductor": _rec(2.0, 1.5, 100.0, 90.0),
                     "moe": _rec(4.0, 1.0, 80.0, 60.0)}},
              {"m": {"eager": _rec(4.0, 3.0, 200.0, 150.0), "inductor": _rec(2.0, 1.5, 100.0, 90.0),
                     "moe": _rec(1.0, 1.2, 50.0, 45.0)}}]
    rows = {r["phase"]: r for r in models.summarize(rounds, ["decode", "train"])}
    d, t = rows["decode"], rows["train"]
    assert d["moe_vs_inductor_spread"] == [0.5, 2.0]
    assert d["moe_vs_inductor_best_spread"] == [1.25, 1.5]
    assert d["moe_vs_eager_best_spread"] == [2.5, 3.0]
    assert t["moe_vs_inductor_best_spread"] == [1.5, 2.0]
    md = models.markdown({"machine": {"cpu_model": "x"}, "date": "d", "threads": 2, "rounds": rounds,
                          "checks": [], "loadavg_before": 0.1, "loadavg_after": 0.2, "summary": list(rows.values())})
    assert "| m | decode |" in md and "1.38x [1.25, 1.50]" in md


def test_runs_without_best_figures_summarize_as_before():
    rounds = [{"m": {b: _rec(2.0, None, 100.0, None) for b in models.BACKENDS}}]
    (d,) = [r for r in models.summarize(rounds, ["decode"])]
    assert d["moe_vs_inductor"] == 1.0 and d["moe_vs_inductor_best"] is None
