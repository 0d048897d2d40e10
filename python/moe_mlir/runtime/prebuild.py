"""Building kernels ahead of their first call.

* ``python -m moe_mlir.runtime.prebuild --cpu [-j N]``: the CPU kernels of the common configurations
  (:data:`COMMON_CALLS`: the production routers' gates, the demo's kernels, the seed routers at their example sizes)
  into the kernel cache (``$MOE_KERNEL_CACHE``, default ``~/.cache/moe_mlir/kernels``), for this machine's CPU and
  thread setting, by calling each op once on a one-token input (the token dimensions are dynamic: the kernel serves
  every token count). The set-up runs it (scripts/demo.sh), so the first call of these ops in a new process loads a
  cached kernel (a few ms) instead of compiling one (0.5-1 s each): bench/compile.py measures both.
* ``python -m moe_mlir.runtime.prebuild KEYS OUT_DIR [--chip sm_90]``: builds the CUDA kernels of the keys in file KEYS
  (one per line, as ``$MOE_KERNEL_RECORD`` writes them) for the chip into OUT_DIR, the layout ``$MOE_KERNEL_PREBUILT``
  reads (:func:`moe_mlir.runtime.cache.prebuild_cuda`), in process with the one CUDA recipe (a fatbin). Needs the
  compiler library and the CUDA toolkit's ptxas/fatbinary, no GPU: scripts/gpu-check.sh runs it for the GPU
  machine, which has no LLVM.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

#: name -> a call of torch.ops.moe.* at a common configuration on one token (``torch`` is passed in: importing this
#: module stays cheap). Calls with ``grad`` also run the backward, which builds the backward op's kernel.
COMMON_CALLS: dict[str, Callable] = {}


def _common(name: str):
    def register(fn: Callable) -> Callable:
        COMMON_CALLS[name] = fn
        return fn

    return register


def _topk(E: int, k: int, mode: str = "logits"):
    return lambda torch: torch.ops.moe.topk_renorm(torch.randn(1, E), k, mode, True)


# The gates HF's MoE models raise to (torch.compile(backend="moe")), at the models' expert counts.
for _name, (_E, _k) in {"mixtral": (8, 2), "gpt_oss": (32, 4), "olmoe": (64, 8), "qwen3_moe": (128, 8)}.items():
    _common(f"topk_renorm {_name} E={_E} k={_k}")(_topk(_E, _k))
    _common(f"topk_renorm {_name} E={_E} k={_k} probs")(_topk(_E, _k, "probs"))


@_common("route deepseek_v3 E=256 k=8 groups 8/4")
def _deepseek(torch):
    return torch.ops.moe.route(torch.randn(1, 256), torch.zeros(256), 8, "sigmoid", "score_then_topk", 8, 4,
                               "top2_sum", True, 2.5)


@_common("route kimi_k2 E=384 k=8")
def _kimi(torch):
    return torch.ops.moe.route(torch.randn(1, 384), torch.zeros(384), 8, "sigmoid", "score_then_topk", 1, 1,
                               "top2_sum", True, 2.827)


@_common("dispatch_plan E=256 k=8")
def _plan(torch):
    idx = torch.arange(8, dtype=torch.int32).view(1, 8)
    return torch.ops.moe.dispatch_plan(idx, 256, 1), torch.ops.moe.dispatch_plan(idx, 256, 64)


@_common("similarity_inform D=128 K=16 tau=0.5 (demo, with backward)")
def _sim_demo(torch):
    u = torch.randn(1, 1, 128, requires_grad=True)
    e = torch.softmax(torch.randn(1, 1, 16), -1).requires_grad_()
    torch.ops.moe.similarity_inform(u, e, None, None, 0.5, False).square().sum().backward()


@_common("similarity_inform D=64 K=16 (with backward)")
def _sim(torch):
    u = torch.randn(1, 1, 64, requires_grad=True)
    e = torch.softmax(torch.randn(1, 1, 16), -1).requires_grad_()
    torch.ops.moe.similarity_inform(u, e, None, None, 1.0, False).square().sum().backward()


@_common("similarity_inform_topk D=64 K=16 k=2")
def _sim_topk(torch):
    u, e = torch.randn(1, 1, 64), torch.softmax(torch.randn(1, 1, 16), -1)
    return torch.ops.moe.similarity_inform_topk(u, e, 2, None, None, 1.0, False, True)


def _posterior_inputs(torch):
    B, H, N, D, Dh, K = 1, 8, 1, 512, 64, 16
    return (torch.randn(B, H, N, N), torch.randn(B, N, D), torch.randn(B, H, N, Dh), torch.randn(D, H * Dh),
            torch.softmax(torch.randn(B, N, K), -1))


@_common("attention_posterior H=8 D=512 Dh=64 K=16")
def _posterior(torch):
    return torch.ops.moe.attention_posterior(*_posterior_inputs(torch), 1.0, "min_entropy", None)


@_common("attention_posterior_topk H=8 D=512 Dh=64 K=16 k=2")
def _posterior_topk(torch):
    return torch.ops.moe.attention_posterior_topk(*_posterior_inputs(torch), 2, 1.0, "min_entropy", None, True)


@_common("mad_dispersion D=256 E=8")
def _mad(torch):
    return torch.ops.moe.mad_dispersion(torch.randn(1, 256), torch.zeros(1, dtype=torch.int32), 8, 1e-4, 10.0,
                                        "feature", "mad", "identity")


@_common("adjacency_update E=64 k=8")
def _adjacency(torch):
    idx = torch.arange(8, dtype=torch.int32).view(1, 8)
    return torch.ops.moe.adjacency_update(torch.rand(64, 64), idx, 0.9, "row", True)


@_common("hyper_router De=256 Dh=256 D=64 E=8")
def _hyper(torch):
    E, D, De, Dh = 8, 64, 256, 256
    return torch.ops.moe.hyper_router(torch.randn(De), torch.randn(Dh, De), torch.randn(Dh),
                                      torch.randn(E * (D + 1), Dh), torch.randn(E * (D + 1)), E)


def run_calls(names: list[str]) -> tuple[int, int]:
    """Calls the named :data:`COMMON_CALLS` in this process; returns (kernels compiled, kernels found on disk)."""
    import torch

    import moe_mlir  # noqa: F401  (registers torch.ops.moe.*)
    from moe_mlir import ops

    from . import cache

    if not ops.kernels_available():
        raise RuntimeError(f"the compiled kernels are unavailable: {ops._KERNELS_UNAVAILABLE}")
    for name in names:
        COMMON_CALLS[name](torch)
    return cache.stats.compiles, cache.stats.disk_loads


def prebuild_cpu(jobs: int) -> None:
    """Builds the kernels of :data:`COMMON_CALLS` in ``jobs`` processes (each imports torch once; the builds
    themselves are moe-opt and clang processes)."""
    names = list(COMMON_CALLS)
    start = time.perf_counter()
    procs = []
    for j in range(jobs):
        share = names[j::jobs]
        if share:
            procs.append(subprocess.Popen([sys.executable, "-m", "moe_mlir.runtime.prebuild", "--cpu-calls", *share],
                                          stdout=subprocess.PIPE, text=True))
    compiled = cached = 0
    outs = [p.communicate()[0] for p in procs]  # every worker finished before a failure is raised: none left behind
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"prebuild: a worker failed (exit {p.returncode})")
        c, d = (int(v) for v in out.split()[-2:])
        compiled, cached = compiled + c, cached + d
    from .cache import cache_dir

    print(f"prebuild: {compiled} CPU kernels compiled, {cached} already cached, for {len(names)} common "
          f"configurations in {time.perf_counter() - start:.1f} s ({cache_dir()})")


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_mlir.runtime.prebuild", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("keys", nargs="?", help="file of CUDA kernel keys, one per line")
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--chip", default="sm_90")
    ap.add_argument("--cpu", action="store_true", help="build the CPU kernels of the common configurations")
    ap.add_argument("--cpu-calls", nargs="+", metavar="NAME", help=argparse.SUPPRESS)  # one worker of --cpu
    ap.add_argument("--list", action="store_true", help="list the common configurations")
    ap.add_argument("-j", "--jobs", type=int, default=None,
                    help="--cpu: builds at a time (default: the CPU count; CUDA kernels build one at a time)")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(COMMON_CALLS))
        return 0
    if args.cpu_calls:
        compiled, cached = run_calls(args.cpu_calls)
        print(compiled, cached)
        return 0
    if args.cpu:
        prebuild_cpu(args.jobs or os.cpu_count() or 1)
        return 0
    if not (args.keys and args.out_dir):
        ap.error("give --cpu, or KEYS and OUT_DIR for CUDA kernels")
    from .cache import prebuild_cuda

    keys = [line.strip() for line in Path(args.keys).read_text().splitlines() if line.strip()]
    n = prebuild_cuda(keys, Path(args.out_dir), args.chip)
    print(f"prebuild: {n} CUDA kernels built, {len(set(keys)) - n} already there, in {args.out_dir} for {args.chip}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
