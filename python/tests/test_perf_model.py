"""The GPU performance model (issue 81, item 1): bench/results/gpu-perf-model.md is what bench/gpu/perf_model.py
writes from the committed figures and runs, and the model's median error over the modelled cases stays within
its stated bound. No GPU, no moe-opt (the figures are bench/gpu/perf_figures.json; --refresh-figures rewrites
them from today's SASS)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_table_is_current_and_error_within_bound():
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu" / "perf_model.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_table_names_every_run():
    sys.path.insert(0, str(REPO / "bench" / "gpu"))
    import perf_model as pm

    table = pm.TABLE.read_text()
    for run in pm.RUNS:
        assert f"| {run.removeprefix('gpu-2026-')} |" in table, run
