"""Where pytest's kernel compiles go: a pytest plugin that logs every in-process kernel build, and its summary.

Every ``torch.ops.moe.*`` kernel a test calls is built, on a cold cache, by ``libmoe_compiler.so`` in the test's
process (:func:`moe_mlir.runtime.compiler.compile_kernel`, which times its five stages). The plugin wraps that
function and appends one JSON line per build to ``$MOE_COMPILE_PROFILE``: the key (the module's header comment),
the process CPU seconds of the build, the stages' wall seconds and the shared object's size::

    rm -rf /tmp/kc && MOE_KERNEL_CACHE=/tmp/kc MOE_COMPILE_PROFILE=/tmp/kc.jsonl MOE_BUILD_DIR=build \\
        .venv/bin/python -m pytest python/tests/test_functional_api.py -q -p bench.compile_profile
    .venv/bin/python -m bench.compile_profile /tmp/kc.jsonl     # the summary

The summary: the builds' CPU seconds, each stage's share, the ops that cost most, and how much of the CPU went to
keys that another key of the run differs from only in static sizes, or in static sizes and a float attribute
(``tau``, ``sigma``, ...): what shape-generic kernels, or such attributes as run-time operands, would not compile.
Figures: bench/results/test-time-2026-11-29-epyc.md.
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
import time

_FLOAT_ATTRS = re.compile(r"(tau|sigma|rate|alpha|eps|beta|gamma)=")


def pytest_configure(config) -> None:  # noqa: ARG001 (pytest's hook signature)
    log = os.environ.get("MOE_COMPILE_PROFILE")
    if not log:
        return
    from moe_mlir.runtime import compiler

    build = compiler.compile_kernel

    def profiled(mlir, pipeline, dest, *args, **kwargs):
        cpu, wall = time.process_time(), time.perf_counter()
        stages = build(mlir, pipeline, dest, *args, **kwargs)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        first = mlir.split("\n", 1)[0]
        row = {"key": first[3:] if first.startswith("// ") else "", "cpu": cpu, "wall": wall, "stages": stages,
               "so_bytes": os.path.getsize(dest) if os.path.exists(dest) else 0,
               "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
        with open(log, "a") as f:
            f.write(json.dumps(row) + "\n")
        return stages

    compiler.compile_kernel = profiled  # the driver looks it up at each build


def _class(key: str, float_attrs: bool) -> str:
    out = []
    for part in key.split("|"):
        if part.startswith("in:"):
            name = part.split(":")
            out.append(":".join(name[:3]) + ":" + "x".join("?" if d == "?" else "N" for d in name[3].split("x")))
        elif float_attrs and _FLOAT_ATTRS.match(part):
            out.append(part.split("=")[0] + "=F")
        else:
            out.append(part)
    return "|".join(out)


def summarize(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    cpu = sum(r["cpu"] for r in rows)
    print(f"{len(rows)} kernel builds, {cpu:.1f} CPU s ({cpu / max(1, len(rows)):.2f} s each)")
    stages: collections.Counter = collections.Counter()
    for r in rows:
        stages.update(r["stages"])
    wall = sum(stages.values()) or 1.0
    print("stages (wall): " + ", ".join(f"{s} {v:.1f} s ({100 * v / wall:.0f}%)" for s, v in stages.items()))
    ops: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        op = ops[r["key"].split("|")[0]]
        op[0] += 1
        op[1] += r["cpu"]
    for name, (n, c) in sorted(ops.items(), key=lambda x: -x[1][1])[:12]:
        print(f"  {name:40s} {n:4d} builds {c:7.1f} CPU s")
    for float_attrs, what in ((False, "static sizes"), (True, "static sizes or a float attribute")):
        groups: dict[str, list] = collections.defaultdict(list)
        for r in rows:
            groups[_class(r["key"], float_attrs)].append(r)
        extra = sum(sum(r["cpu"] for r in g[1:]) for g in groups.values())
        print(f"keys that differ from another only in {what}: {len(rows) - len(groups)} builds, {extra:.1f} CPU s "
              f"({100 * extra / max(cpu, 1e-9):.0f}%)")


if __name__ == "__main__":
    summarize(sys.argv[1])
