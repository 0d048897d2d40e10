"""bench/cases.py's forward + backward cases (similarity_grad_case: the GPU bench's simgrad_* against SDPA's forward
and backward, issue #47 item 5): their baselines are autograd, and the benches time every baseline under
torch.inference_mode, where autograd records nothing. Each baseline must still return both gradients there, equal to
float64 autograd's, and the torch.compile baseline must be skipped with its reason (dynamo breaks its graph at the
grad) rather than time a graph-broken eager."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import cases as C  # noqa: E402


def reference(u, e, dp, tau, causal):
    u = u.double().requires_grad_()
    e = e.double().requires_grad_()
    n = u.shape[1]
    s = u @ u.transpose(1, 2) / tau
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, -1) @ e
    return torch.autograd.grad(p, [u, e], dp.double())


@pytest.mark.parametrize("D,K,causal", [(64, 16, False), (256, 64, True)])
def test_grad_baselines_run_under_inference_mode(D, K, causal):
    case = C.similarity_grad_case("prefill", 2, 48, D, K, tau=1.0, causal=causal)
    inputs = case.make_inputs(torch.Generator().manual_seed(3))
    want = reference(*inputs, 1.0, causal)
    with torch.inference_mode():
        for name, fn in (("eager", case.eager), ("sdpa", case.extra["sdpa"])):
            got = fn(*inputs)
            assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want], name
            for g, w in zip(got, want):
                scale = w.abs().max().item()
                # eager: f32 from the rounded operands, its gradients in the operands' bf16 (autograd's dtype);
                # sdpa: in bf16, dp rounded too
                tol = 1e-2 if name == "eager" else 3e-2
                torch.testing.assert_close(g.double(), w, rtol=0, atol=tol * scale)


def test_grad_case_skips_torch_compile():
    case = C.similarity_grad_case("prefill", 1, 16, 16, 8)
    rec = {}
    C.record_torch_compile(rec, case, case.make_inputs(torch.Generator().manual_seed(0)),
                           lambda fn: pytest.fail("timed a compiled autograd baseline"))
    assert rec["torch_compile_ms"] is None and rec["torch_compile_error"].startswith("not run")


def test_gpu_bench_times_the_grad_cases():
    """The GPU bench's pool holds the forward + backward cases the lease compares with SDPA's (issue #47 item 5),
    the causal D = 256 one too (the passes' feature split)."""
    names = {c.name for c in C.gpu_cases()}
    assert {"simgrad_B1_N16384_D64_K16_bf16", "simgrad_B4_N4096_D64_K16_causal_bf16",
            "simgrad_B4_N4096_D256_K64_causal_bf16"} <= names
