"""Peak memory of similarity_inform: ours vs PyTorch eager, each in its own process.

  python -m bench.memory measure --impl ours|eager [--B 1 --N 16384 --D 64 --K 16]

``measure`` starts a worker process for one implementation and reports the worker's peak RSS as
``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` (the worker is its only child), plus the worker's own peak RSS
before the op runs (interpreter + imports + inputs: the floor) and after it. Our worker imports numpy and ctypes
only (no torch): it is what a C/C++ caller of the execution API pays, JIT compilation included. The eager worker
imports torch and runs bench.baselines.similarity_mix (the N×N formulation).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _self_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker(args) -> dict:
    stages = {"start_kib": _self_kib()}
    if args.impl == "ours":
        import numpy as np

        from . import mlir as M
        from .ours import Executor, BoundCall, numpy_buf

        rng = np.random.default_rng(0)
        u = (rng.standard_normal((args.B, args.N, args.D), dtype=np.float32) / args.D ** 0.25).astype(np.float32)
        le = rng.standard_normal((args.B, args.N, args.K), dtype=np.float32)
        e = np.exp(le - le.max(-1, keepdims=True))
        e = (e / e.sum(-1, keepdims=True)).astype(np.float32)
        p = np.empty((args.B, args.N, args.K), dtype=np.float32)
        exe = Executor(args.lib)
        stages["inputs_kib"] = _self_kib()
        h, compile_s = exe.compile(M.similarity_inform("mem", args.B, args.N, args.D, args.K))
        stages["compiled_kib"] = _self_kib()
        call = BoundCall(exe, h, "mem", [numpy_buf(u), numpy_buf(e)], [numpy_buf(p)])
        t0 = time.perf_counter()
        call()
        run_s = time.perf_counter() - t0
        stages["after_op_kib"] = _self_kib()
        rowsum = p.sum(-1)
        ok = bool(np.all(np.abs(rowsum - 1) < 1e-3))
        return dict(stages, compile_s=compile_s, run_s=run_s, rows_sum_to_1=ok)
    import torch

    from . import baselines as bl

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    u = torch.randn(args.B, args.N, args.D, generator=g) / args.D ** 0.25
    e = torch.softmax(torch.randn(args.B, args.N, args.K, generator=g), -1)
    stages["inputs_kib"] = _self_kib()
    t0 = time.perf_counter()
    p = bl.similarity_mix(u, e, 1.0)
    run_s = time.perf_counter() - t0
    stages["after_op_kib"] = _self_kib()
    ok = bool(((p.sum(-1) - 1).abs() < 1e-3).all())
    return dict(stages, run_s=run_s, rows_sum_to_1=ok)


def measure(impl: str, B: int = 1, N: int = 16384, D: int = 64, K: int = 16, threads: int = 2,
            lib: str = "") -> dict:
    """Runs the worker in a child process (from any parent: the wrapper keeps RUSAGE_CHILDREN clean)."""
    cmd = [sys.executable, "-m", "bench.memory", "measure", "--impl", impl, "--B", str(B), "--N", str(N),
           "--D", str(D), "--K", str(K), "--threads", str(threads)]
    if lib:
        cmd += ["--lib", lib]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=here, timeout=1800)
    if proc.returncode != 0:
        return {"impl": impl, "error": (proc.stderr or proc.stdout).strip()[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["measure", "worker"])
    ap.add_argument("--impl", choices=["ours", "eager"], required=True)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--N", type=int, default=16384)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--K", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lib", default="")
    args = ap.parse_args()
    if args.mode == "worker":
        print(json.dumps(worker(args)))
        return 0
    if args.impl == "ours" and not args.lib:
        from .ours import find_library

        args.lib = find_library()
    cmd = [sys.executable, "-m", "bench.memory", "worker"] + sys.argv[2:]
    if args.impl == "ours" and "--lib" not in cmd:
        cmd += ["--lib", args.lib]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MOE_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return proc.returncode
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res.update(impl=args.impl, B=args.B, N=args.N, D=args.D, K=args.K, threads=args.threads,
               peak_rss_mib=peak_kib / 1024.0, peak_rss_kib=peak_kib)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
