"""The README demo (``.venv/bin/python -m moe_mlir.demo``; scripts/demo.sh runs it): what the project is best at,
each measured in this run against PyTorch eager and ``torch.compile(backend="inductor")`` of the same code, same
inputs, same thread count (medians of interleaved rounds; ratios are what count on a shared machine).

1. **A DeepSeek-V3 router** (HF transformers' own ``DeepseekV3TopkRouter`` code: E = 256 experts, sigmoid scores with
   the correction bias, 8 groups scored by their top-2 sum, top-4 groups, top-8 experts, renormalized, scaled by 2.5)
   at T = 4096 tokens through ``torch.compile(backend="moe")``: the routing is raised to one ``torch.ops.moe.route``
   kernel. Timed from the router logits on (the routing proper), then the whole HF module, whose gate GEMM
   (hidden 7168 x 256, the same dense matmul in every implementation) is most of its time.
2. **A training step of a seed router**: Similarity-Inform's mixing ``softmax(u uᵀ / tau) @ e`` written as a user
   writes it, forward + backward through ``torch.compile(backend="moe")`` (raised to ``moe.similarity_inform``
   and its flash-style backward: the N x N matrix is never built), gradients checked against eager.
3. **The whole-graph path**: a Similarity-Inform SMoE block imported with torch.export into MLIR, compiled by
   moe-opt for the CPU and run through the execution API, checked and timed against eager.

**Compile time** (1 and 2): :func:`compare_compiles`, per backend, ``torch.compile`` of the block in a fresh
process with every cache empty (a directory per backend: ``$MOE_KERNEL_CACHE`` with the raised graphs,
``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``): the *cold* compile; then a second fresh process on the caches the
first filled: the *warm* compile (a user's second run). Both figures are printed for both backends, win or loss;
where ``backend="moe"`` takes longer, the line says where each backend's time went (inductor's import, kernel
builds, raising, ``compile_fx``, Dynamo and the first run). bench/compile.py's part 2 is this measurement.

The demo prints no warning that is not about the user's own code: torch's import-time log lines about a CUDA
build on a machine without CUDA (``No CUDA runtime is found``, ``triton not found``), which inductor triggers, are
filtered around these calls (exactly those two messages; any other warning still shows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from moe_mlir.profiling import interleaved_ms

#: torch's import-time log lines on a CUDA build of torch without a GPU: (logger, message prefix).
_TORCH_NOISE = (("torch.utils.cpp_extension", "No CUDA runtime is found"),
                ("torch.utils.flop_counter", "triton not found"))


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


@contextlib.contextmanager
def quiet_torch_noise() -> Iterator[None]:
    """Drops exactly the messages of :data:`_TORCH_NOISE` while the block runs."""
    filters = [(logging.getLogger(name), _DropMessage(prefix)) for name, prefix in _TORCH_NOISE]
    for logger, f in filters:
        logger.addFilter(f)
    try:
        yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)


def _ratios(ms: dict[str, float]) -> str:
    return (f"eager {ms['eager']:.2f} ms, inductor {ms['inductor']:.2f} ms, moe {ms['moe']:.2f} ms: "
            f"{ms['eager'] / ms['moe']:.2f}x eager, {ms['inductor'] / ms['moe']:.2f}x inductor")


def _timed_first_call(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


# ----------------------------------------------------------------------------------------------------------------
# Compile time, each backend in fresh processes (also bench/compile.py's part 2)
# ----------------------------------------------------------------------------------------------------------------

#: The blocks whose ``torch.compile`` time :func:`compare_compiles` measures (the models and inputs of 1 and 2 below).
COMPILE_BLOCKS = ("deepseek_v3_routing", "similarity_training")
BACKENDS = ("moe", "inductor")


def _block(block: str, backend: str):
    """``(start, call)``: ``torch.compile`` of the block under ``backend`` (timed from the torch.compile call on:
    resolving the backend is part of the wait) and its call on the block's inputs."""
    if block == "deepseek_v3_routing":
        _, from_logits = deepseek_v3_router(hidden=256)  # only the router logits enter: T x E = 4096 x 256
        logits = torch.randn(4096, 256)
        start = time.perf_counter()
        fn = torch.compile(from_logits, backend=backend)

        def call():
            with torch.no_grad():
                return fn(logits)
    elif block == "similarity_training":
        u = torch.randn(4, 1024, 128) * 128 ** -0.25
        e = torch.softmax(torch.randn(4, 1024, 16), -1)
        start = time.perf_counter()
        fn = torch.compile(similarity_mixing, backend=backend)

        def call():
            return _step(fn, u, e)
    else:
        raise ValueError(f"unknown block {block!r} (known: {COMPILE_BLOCKS})")
    return start, call


def compile_child(block: str, backend: str) -> dict:
    """One compile, in this (fresh) process: the first call from ``torch.compile`` on (with inductor's import,
    which both backends make in their first compile), where it went (kernel builds:
    in process, libmoe_compiler.so; raising; ``compile_fx``: AOTAutograd and inductor's code generation and C++
    compile; the rest: Dynamo's tracing and the first run), and a steady call."""
    import moe_mlir  # noqa: F401  (registers the backend and the ops, as a user's import does)
    from moe_mlir.backends import dynamo
    from moe_mlir.runtime import cache

    # Both backends import inductor in their first compile: imported here to be timed apart (and patched), and
    # added to the first call.
    s = time.perf_counter()
    import torch._inductor.compile_fx as cfx

    import_inductor = time.perf_counter() - s

    spent = {"kernel_build_s": 0.0, "raise_s": 0.0, "compile_fx_s": 0.0}
    depth = [0]

    def timed(name, fn, outermost=False):
        def wrapper(*a, **k):
            if outermost and depth[0]:
                return fn(*a, **k)
            depth[0] += outermost
            s = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - s
                depth[0] -= outermost
        return wrapper

    cache.build_cpu_kernel = timed("kernel_build_s", cache.build_cpu_kernel)
    cache.build_cuda_kernel = timed("kernel_build_s", cache.build_cuda_kernel)
    dynamo._raise = timed("raise_s", dynamo._raise)
    cfx.compile_fx = timed("compile_fx_s", cfx.compile_fx, outermost=True)
    with quiet_torch_noise():
        start, call = _block(block, backend)
        call()
        first = time.perf_counter() - start + import_inductor
        steady = []
        for _ in range(3):
            s = time.perf_counter()
            call()
            steady.append(time.perf_counter() - s)
    return {"first_call_s": first, "steady_call_ms": statistics.median(steady) * 1e3,
            "kernels_built": cache.stats.compiles, "kernels_loaded": cache.stats.disk_loads,
            "import_inductor_s": import_inductor, **spent}


def _run_child(block: str, backend: str, env: dict) -> dict:
    """:func:`compile_child` in a new interpreter with ``env``; its result."""
    proc = subprocess.run([sys.executable, "-m", "moe_mlir.demo", "--compile-child", block, backend], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"compile of {block} under {backend} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cache_env(root: Path, base: Optional[dict] = None) -> dict:
    """``base`` (default ``os.environ``) with every cache a first compile fills under ``root``: our kernel cache
    and raised graphs (``$MOE_KERNEL_CACHE``, ``<it>/raised``), inductor's (``TORCHINDUCTOR_CACHE_DIR``: its FX
    graph, AOTAutograd and C++ caches) and Triton's (``TRITON_CACHE_DIR``, used on a GPU)."""
    env = dict(os.environ if base is None else base)
    env.update(MOE_KERNEL_CACHE=str(root / "kernels"), TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),
               TRITON_CACHE_DIR=str(root / "triton"))
    return env


def compare_compiles(block: str, base: Optional[dict] = None, workdir: Optional[Path] = None) -> dict:
    """``{backend: {"cold": ..., "warm": ...}}`` for ``block``: per backend a cold compile (a fresh process, every
    cache empty: a directory of its own) and a warm one (a second fresh process with the caches the first filled).
    Backends run one after the other, never side by side."""
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="moe-demo-compile-", dir=workdir) as tmp:
        for backend in BACKENDS:
            root = Path(tmp) / backend
            root.mkdir()
            env = cache_env(root, base)
            out[backend] = {"cold": _run_child(block, backend, env), "warm": _run_child(block, backend, env)}
    return out


def _where(r: dict) -> str:
    rest = r["first_call_s"] - r["import_inductor_s"] - r["kernel_build_s"] - r["raise_s"] - r["compile_fx_s"]
    parts = [f"import of inductor {r['import_inductor_s']:.1f} s"]
    if r["kernel_build_s"] or r["kernels_built"]:
        parts.append(f"{r['kernels_built']} kernels built {r['kernel_build_s']:.1f} s")
    if r["raise_s"]:
        parts.append(f"raising {r['raise_s']:.1f} s")
    parts += [f"compile_fx (AOTAutograd + inductor) {r['compile_fx_s']:.1f} s",
              f"Dynamo + first run {rest:.1f} s"]
    return ", ".join(parts)


def compile_lines(res: dict) -> list[str]:
    """What the demo prints of :func:`compare_compiles`: each figure, win or loss, and where ours loses, where its
    time went next to inductor's."""
    lines = []
    for phase, what in (("cold", "cold compile (fresh process, empty caches)"),
                        ("warm", "warm compile (fresh process, caches filled)")):
        m, i = res["moe"][phase], res["inductor"][phase]
        ratio = m["first_call_s"] / i["first_call_s"]
        line = (f"   {what}: moe {m['first_call_s']:.1f} s, inductor {i['first_call_s']:.1f} s "
                f"({ratio:.2f}x inductor's time)")
        if ratio > 1:
            line += f"; slower: moe {_where(m)}; inductor {_where(i)}"
        lines.append(line)
    return lines


# ----------------------------------------------------------------------------------------------------------------
# 1. DeepSeek-V3 routing
# ----------------------------------------------------------------------------------------------------------------


def deepseek_v3_router(hidden: int = 7168):
    """HF's ``DeepseekV3TopkRouter`` at DeepSeek-V3's routing configuration (random weights, nothing downloaded), and
    a module running the same HF code from the router logits on (its ``forward`` without the ``F.linear``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = DeepseekV3Config(hidden_size=hidden, n_routed_experts=256, num_experts_per_tok=8, n_group=8,
                           topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5)
    torch.manual_seed(0)
    router = DeepseekV3TopkRouter(cfg).eval()
    with torch.no_grad():
        router.weight.normal_(0, hidden ** -0.5)
        router.e_score_correction_bias.normal_(0, 0.1)

    class FromLogits(torch.nn.Module):
        """``DeepseekV3TopkRouter.forward`` after its ``F.linear`` (transformers 5.x, the same lines)."""

        def __init__(self, r: DeepseekV3TopkRouter) -> None:
            super().__init__()
            self.r = r

        def forward(self, router_logits: torch.Tensor):
            r = self.r
            scores = router_logits.sigmoid()
            scores_for_choice = scores + r.e_score_correction_bias
            group_scores = (scores_for_choice.view(-1, r.num_group, r.num_experts // r.num_group)
                            .topk(2, dim=-1)[0].sum(dim=-1))
            group_idx = torch.topk(group_scores, k=r.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores)
            group_mask.scatter_(1, group_idx, 1)
            score_mask = (group_mask.unsqueeze(-1).expand(-1, r.num_group, r.num_experts // r.num_group)
                          .reshape(-1, r.num_experts))
            scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
            topk_indices = torch.topk(scores_for_choice, k=r.top_k, dim=-1, sorted=False)[1]
            topk_weights = scores.gather(1, topk_indices)
            if r.norm_topk_prob:
                denominator = topk_weights.sum(dim=-1, keepdim=True) + 1e-20
                topk_weights /= denominator
            topk_weights = topk_weights * r.routed_scaling_factor
            return topk_weights, topk_indices

    return router, FromLogits(router)


def _same_routing(got, want) -> float:
    """The same experts per token (topk(sorted=False) leaves the order open) and the weights within f32 rounding;
    returns the largest weight difference."""
    (w, i), (w_e, i_e) = got, want
    o, o_e = i.long().argsort(-1), i_e.long().argsort(-1)
    i_s, i_es = i.long().gather(-1, o), i_e.long().gather(-1, o_e)
    if not torch.equal(i_s, i_es):
        raise AssertionError("torch.compile(backend='moe') chose other experts than eager")
    w_s, w_es = w.gather(-1, o), w_e.gather(-1, o_e)
    torch.testing.assert_close(w_s, w_es, rtol=1e-5, atol=1e-6)
    return float((w_s - w_es).abs().max())


def routing_demo(tokens: int = 4096, hidden: int = 7168, rounds: int = 15, module_rounds: int = 3) -> None:
    from .backends.dynamo import capture_graphs

    router, from_logits = deepseek_v3_router(hidden)
    x = torch.randn(tokens, hidden)
    with torch.no_grad():
        logits = torch.nn.functional.linear(x, router.weight)
        moe = torch.compile(from_logits, backend="moe")
        inductor = torch.compile(from_logits, backend="inductor")
        with capture_graphs() as log:
            got = moe(logits)
        inductor(logits)
        err = _same_routing(got, from_logits(logits))
        print(f"1. DeepSeek-V3 routing (HF DeepseekV3TopkRouter: E=256, 8 groups, top-4 groups, k=8), T={tokens}, "
              f"through torch.compile(backend='moe'): raised to {_raised_ops(log)}; same experts as "
              f"eager, weights within {err:.1e}")
        _print_compiles("deepseek_v3_routing")
        ms = interleaved_ms({"eager": lambda: from_logits(logits), "inductor": lambda: inductor(logits),
                             "moe": lambda: moe(logits)}, rounds)
        print(f"   routing from the logits, median of {rounds} rounds: {_ratios(ms)}")

        moe_m = torch.compile(router, backend="moe")
        inductor_m = torch.compile(router, backend="inductor")
        ms = interleaved_ms({"eager": lambda: router(x), "inductor": lambda: inductor_m(x), "moe": lambda: moe_m(x)},
                            module_rounds)
        print(f"   the whole HF module with its gate GEMM ({tokens}x{hidden} @ {hidden}x256, the same in all three), "
              f"median of {module_rounds} rounds: {_ratios(ms)}")


# ----------------------------------------------------------------------------------------------------------------
# 2. A training step of a seed router
# ----------------------------------------------------------------------------------------------------------------


def similarity_mixing(u: torch.Tensor, e: torch.Tensor, tau: float = 0.5) -> torch.Tensor:
    """Similarity-Inform's mixed routing distribution (Mutual-Inform eq. 8) as a user writes it: the N x N
    similarity softmax times the dense routing distribution."""
    return torch.softmax(torch.matmul(u, u.transpose(-1, -2)) / tau, dim=-1) @ e


def _step(fn, u: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One training step's router work: forward, loss, backward; the gradients w.r.t. the token states and the
    dense routing distribution."""
    u = u.detach().requires_grad_()
    e = e.detach().requires_grad_()
    fn(u, e).square().sum().backward()
    return u.grad, e.grad


def training_demo(batch: int = 4, seq: int = 1024, d: int = 128, experts: int = 16, rounds: int = 5) -> None:
    from .backends.dynamo import capture_graphs

    g = torch.Generator().manual_seed(0)
    u = torch.randn(batch, seq, d, generator=g) * d ** -0.25
    e = torch.softmax(torch.randn(batch, seq, experts, generator=g), -1)
    moe = torch.compile(similarity_mixing, backend="moe")
    inductor = torch.compile(similarity_mixing, backend="inductor")
    with capture_graphs() as log:
        got = _step(moe, u, e)
    _step(inductor, u, e)
    want = _step(similarity_mixing, u, e)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    err = max(float((a - b).abs().max()) for a, b in zip(got, want))
    print(f"2. training step of Similarity-Inform's router, softmax(u uᵀ/tau) @ e (B={batch}, N={seq}, D={d}, "
          f"K={experts}), forward + backward through torch.compile(backend='moe'): raised to "
          f"{_raised_ops(log)}; gradients match eager (max abs diff {err:.1e})")
    _print_compiles("similarity_training")
    ms = interleaved_ms({"eager": lambda: _step(similarity_mixing, u, e), "inductor": lambda: _step(inductor, u, e),
                         "moe": lambda: _step(moe, u, e)}, rounds)
    print(f"   forward + backward, median of {rounds} rounds: {_ratios(ms)}")


# ----------------------------------------------------------------------------------------------------------------
# 3. The whole-graph path
# ----------------------------------------------------------------------------------------------------------------


def whole_graph_demo(batch: int = 2, seq: int = 64, calls: int = 20) -> None:
    import moe_mlir
    from moe_mlir.models import similarity_inform

    model, (x,) = similarity_inform.example(batch=batch, seq=seq)
    text = moe_mlir.import_model(model, (x,))
    routing = sorted({line.split('"')[1] for line in text.splitlines() if '"moe.' in line})
    compiled, compile_s = _timed_first_call(lambda: moe_mlir.compile(model, (x,), backend="auto"))
    with torch.no_grad():
        eager = model(x)
    ours = compiled(x)
    eager_t = eager[0] if isinstance(eager, (tuple, list)) else eager
    ours_t = ours[0] if isinstance(ours, (tuple, list)) else ours
    # f32 throughout; sums in a different order than PyTorch's kernels: a few ulps of the outputs' scale.
    torch.testing.assert_close(ours_t, eager_t, rtol=1e-4, atol=1e-5)
    print(f"3. whole-graph path: {type(model).__name__} (B={batch}, N={seq}) imported with torch.export into "
          f"{len(text.splitlines())} lines of MLIR (routing ops {routing}), compiled by moe-opt in {compile_s:.1f} s; "
          f"output matches eager (max abs diff {float((ours_t - eager_t).abs().max()):.1e})")
    with torch.no_grad():
        ms = interleaved_ms({"eager": lambda: model(x), "moe": lambda: compiled(x)}, calls)
    print(f"   block forward, median of {calls} rounds: eager {ms['eager']:.3f} ms, moe-mlir {ms['moe']:.3f} ms "
          f"({ms['eager'] / ms['moe']:.2f}x eager; {compiled.backend} backend, no inductor on this path)")


def _raised_ops(log) -> list[str]:
    """The moe ops the graphs captured in `log` were raised to, as ``moe.<op>``, sorted."""
    return ["moe." + op for op in sorted({op for g in log for op in g.moe_ops()})]


def _print_compiles(block: str) -> None:
    """Prints :func:`compare_compiles`' lines for demo block `block` (each backend compiled in a fresh process)."""
    for line in compile_lines(compare_compiles(block, _child_env())):
        print(line, flush=True)


def _child_env() -> dict:
    """The environment of :func:`compare_compiles`' processes: this one's, at this process's thread count."""
    return dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="The MoE-MLIR demo (module doc of moe_mlir.demo).")
    ap.add_argument("--compile-child", nargs=2, metavar=("BLOCK", "BACKEND"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile_child:
        print(json.dumps(compile_child(*args.compile_child)), flush=True)
        sys.stderr.flush()
        os._exit(0)  # the interpreter's teardown (torch, inductor's worker pool: 1-3 s) is no part of a figure
    with quiet_torch_noise():
        import moe_mlir  # noqa: F401  (registers torch.ops.moe.* and the "moe" backend)
        import torch._inductor.compile_fx  # noqa: F401  (both backends compile with it: imported before either is timed)

        print(f"MoE-MLIR demo: PyTorch {torch.__version__}, {torch.get_num_threads()} threads; every ratio below is "
              "measured in this run (x eager = eager time / ours)")
        try:
            routing_demo()
        except ImportError:
            print("1. (skipped: transformers is not installed; scripts/install-python.sh installs it)")
        training_demo()
        whole_graph_demo()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
