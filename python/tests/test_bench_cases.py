"""Every case of the torch-op benches calls an op that exists, with arguments it accepts (issue #83: the bench's two
forward + backward cases named ``torch.ops.moe.similarity_inform_grad``, the dialect's name, where the torch op is
``similarity_inform_backward``, and ``python -m bench.torch_ops`` errored on them).

The case lists: bench/torch_ops.py's decode and prefill cases (bench/training.py takes its differentiable ones) and
bench/gpu/torch_ops_cuda.py's. Every case's call runs on fake tensors at the case's own size (the op's schema and its
checks, no maths), and every decode case, with a small instance of each forward + backward case, runs through the
bench's own ``run_case`` on real tensors (the outputs checked against eager, a few timed rounds): a few seconds.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch_checks import needs_cpu_kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# The bench modules pin the thread variables of the process they start in: keep them out of the other tests' env.
_saved_env = dict(os.environ)
try:
    from bench import cases as C  # noqa: E402
    from bench import torch_ops as T  # noqa: E402
    from bench.gpu import torch_ops_cuda as TC  # noqa: E402
finally:
    os.environ.clear()
    os.environ.update(_saved_env)


def bench_cases() -> list[C.Case]:
    """Every case the torch-op benches time, once by name."""
    cases = {c.name: c for c in T.decode_cases() + T.prefill_cases() + TC.cases()}
    return list(cases.values())


def _tiny_grad_cases() -> list[C.Case]:
    """The forward + backward cases of the prefill list at a small N (the prefill ones are N = 4096 to 16384)."""
    return [C.similarity_grad_case("prefill", 1, 64, 64, 16), C.similarity_grad_case("prefill", 2, 48, 64, 16, causal=True)]


def test_the_case_lists_hold_every_op_the_bench_calls():
    ops = {c.op for c in bench_cases()}
    assert {"topk_renorm", "similarity_inform", "similarity_inform_topk", "attention_posterior",
            "similarity_inform_grad", "mad_dispersion", "adjacency_update", "hyper_router"} <= ops


def test_every_case_names_a_torch_op_that_exists():
    """Needs no build: ``ours_call`` resolves each case's op on torch.ops.moe (a renamed op fails here)."""
    for case in bench_cases():
        T.ours_call(case)


@needs_cpu_kernels  # the op's checks run the verifier of the build's libmoe_keys
@pytest.mark.parametrize("case", bench_cases(), ids=lambda c: c.name)
def test_every_case_calls_an_op_that_accepts_its_inputs(case):
    """``ours_call`` resolves the case's op on torch.ops.moe, and the call goes through the op's schema, its checks
    and its fake kernel at the case's own sizes; the outputs have the case's shapes."""
    call = T.ours_call(case)
    inputs = case.make_inputs(torch.Generator().manual_seed(0))
    with FakeTensorMode() as mode:
        out = call(*[mode.from_tensor(t.contiguous()) for t in inputs])
    out = list(out) if isinstance(out, (tuple, list)) else [out]
    assert [tuple(o.shape) for o in out] == [tuple(s) for s, _ in case.out_specs[:len(out)]]


@needs_cpu_kernels
@pytest.mark.parametrize("case", T.decode_cases() + _tiny_grad_cases(), ids=lambda c: c.name)
def test_bench_run_case(case):
    """The bench's own path: the first call, the check against eager, a few interleaved rounds, the table row."""
    args = argparse.Namespace(no_compile=True, sequential=False, budget=1e-3)
    rec = T.run_case(case, args)
    assert rec["correct"], rec.get("error")
    assert rec["ours"]["median_ms"] > 0 and rec["speedup_vs_eager"] > 0
    assert rec["case"] in T.table_row(rec, "")
