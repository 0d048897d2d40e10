"""The demo's compile-time comparison (``moe_mlir.demo.compare_compiles``, also bench/compile.py's part 2) runs each
backend's compiles in fresh processes with caches of its own: a cold process on empty caches, then a warm one on the
caches that process filled. Nothing here runs a compile or looks at a time: the processes are recorded, not run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from moe_mlir import demo

CACHE_VARS = ("MOE_KERNEL_CACHE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def _fake_result(first: float, **stages: float) -> dict:
    r = {"first_call_s": first, "steady_call_ms": 1.0, "kernels_built": 0, "kernels_loaded": 0,
         "import_inductor_s": 0.0, "kernel_build_s": 0.0, "raise_s": 0.0, "compile_fx_s": 0.0}
    r.update(stages)
    return r


def test_each_backend_in_fresh_processes_with_caches_of_its_own(monkeypatch, tmp_path):
    runs = []

    def fake_run(argv, env, capture_output, text, timeout):
        # What each process found in its cache directories when it started.
        found = {v: sorted(p.name for p in Path(env[v]).glob("*")) if Path(env[v]).exists() else None
                 for v in CACHE_VARS}
        runs.append({"argv": argv, "env": {v: env[v] for v in CACHE_VARS}, "found": found})
        Path(env["MOE_KERNEL_CACHE"]).mkdir(parents=True, exist_ok=True)
        (Path(env["MOE_KERNEL_CACHE"]) / f"kernel-{len(runs)}").write_text("")  # the compile fills its cache
        return subprocess.CompletedProcess(argv, 0, stdout="noise\n" + json.dumps(_fake_result(1.0)) + "\n",
                                           stderr="")

    monkeypatch.setattr(demo.subprocess, "run", fake_run)
    res = demo.compare_compiles("deepseek_v3_routing", {"PATH": "/bin", "OMP_NUM_THREADS": "2"}, workdir=tmp_path)
    assert set(res) == {"moe", "inductor"} and all(set(r) == {"cold", "warm"} for r in res.values())
    assert len(runs) == 4  # a new interpreter per compile: cold and warm, per backend
    for r in runs:
        assert r["argv"][0] == sys.executable and r["argv"][1:3] == ["-m", "moe_mlir.demo"]
        assert r["argv"][3:] in (["--compile-child", "deepseek_v3_routing", b] for b in demo.BACKENDS)
    by_backend = {b: [r for r in runs if r["argv"][-1] == b] for b in demo.BACKENDS}
    assert all(len(v) == 2 for v in by_backend.values())
    for b, (cold, warm) in by_backend.items():
        assert cold["env"] == warm["env"]  # the warm process gets the caches the cold one filled
        assert all(cold["found"][v] is None for v in CACHE_VARS)  # cold: every cache empty
        assert warm["found"]["MOE_KERNEL_CACHE"]  # warm: the cold process's products are there
    moe_dirs = set(by_backend["moe"][0]["env"].values())
    inductor_dirs = set(by_backend["inductor"][0]["env"].values())
    assert len(moe_dirs) == len(inductor_dirs) == len(CACHE_VARS) and not moe_dirs & inductor_dirs
    # the moe processes ran first; inductor's cold process still found nothing of theirs
    assert [r["argv"][-1] for r in runs] == ["moe", "moe", "inductor", "inductor"]
    assert not list(tmp_path.iterdir())  # the temporary caches are removed


def test_compile_lines_print_every_figure_and_the_cause_of_a_loss():
    res = {"moe": {"cold": _fake_result(12.0, kernels_built=1, kernel_build_s=4.0, compile_fx_s=6.0),
                   "warm": _fake_result(1.0, compile_fx_s=0.5)},
           "inductor": {"cold": _fake_result(10.0, compile_fx_s=9.0), "warm": _fake_result(2.0, compile_fx_s=1.5)}}
    cold, warm = demo.compile_lines(res)
    assert "moe 12.0 s, inductor 10.0 s (1.20x" in cold
    assert "1 kernels built 4.0 s" in cold and "compile_fx (AOTAutograd + inductor) 9.0 s" in cold  # the cause
    assert "moe 1.0 s, inductor 2.0 s (0.50x" in warm and "slower" not in warm
