"""Routing replay (issue #48 item 5): ``torch.ops.moe.route(..., replay=indices)`` takes the choice as given (an
inference engine's recorded routing, a hash table's experts) and returns its weights, as the router would weigh
them, and their gradients. Checked on the CPU kernels (the eager reference must not run) against the float64
reference on random and adversarial rows, through ``torch.compile(backend="moe")``, and for bad indices (a clear
error, never a read out of bounds)."""

from __future__ import annotations

import pytest
import torch

import moe_mlir  # noqa: F401  (registers torch.ops.moe)
from moe_mlir.ops import custom_scoring
from moe_mlir.ops import routing as R
from moe_mlir.reference import routing as RR
from test_route_backward import CASES as ROUTERS
from torch_checks import needs_cpu_kernels

pytestmark = needs_cpu_kernels

# test_route_backward's routers (E, k, scoring, order, n_group, topk_group, group_score, renormalize,
# routed_scaling_factor, bias), and DeepSeek-V4's sqrtsoftplus as a custom score (None: custom_scoring below).
CASES = dict(ROUTERS, sqrtsoftplus=(40, 6, None, "score_then_topk", 1, 1, "top2_sum", True, 1.5, True))


def _sqrtsoftplus(x):
    return torch.sqrt(torch.nn.functional.softplus(x))


def _attrs(name):
    E, k, scoring, *rest, with_bias = CASES[name]
    if scoring is None:
        scoring = custom_scoring(_sqrtsoftplus)
    bias = 0.1 * torch.randn(E, generator=torch.Generator().manual_seed(1)) if with_bias else None
    return E, k, bias, (scoring, *rest)


def _logits(T, E, kind, dtype=torch.float32):
    x = torch.randn(T, E, generator=torch.Generator().manual_seed(T + E))
    if kind == "ties":
        x = x.round(decimals=0)
    elif kind == "nan_inf" and T:
        x[0, 0] = float("nan")
        x[-1, :] = float("-inf")
        x[T // 2, 1] = float("inf")
    return x.to(dtype)


def _given(T, E, k, kind, dtype):
    g = torch.Generator().manual_seed(7 * T + k)
    if kind == "repeated":  # an engine may record the same expert twice: weighed twice, never merged
        idx = torch.randint(0, E, (T, 1), generator=g).expand(T, k)
    else:  # any k distinct experts, in any order (not the router's own choice)
        idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T else torch.zeros(0, k)
    return idx.to(dtype).contiguous()


@pytest.fixture
def kernels_only(monkeypatch):
    """The eager reference of torch.ops.moe.route must not run: the CPU kernel serves every call."""
    def fail(*a, **kw):
        raise AssertionError("the eager reference ran instead of the CPU kernel")
    monkeypatch.setattr(R, "_route_ref", fail)


def _reference(x, idx, scoring, order, renormalize, scale):
    """Weights of the given experts in float64 (the op description's step 5)."""
    if scoring.startswith("custom:"):
        s = _sqrtsoftplus(x.double())
        w = s.gather(1, idx.long())
        if renormalize:
            total = w.sum(-1, keepdim=True)
            w = torch.where(total == 0, torch.zeros_like(w), w / total)
        return w * scale
    return RR.route_weights(x.double(), idx, scoring, order, renormalize, scale).double()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("kind", ["random", "ties", "nan_inf"])
@pytest.mark.parametrize("given", ["distinct", "repeated"])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("T", [0, 1, 5, 33])
def test_weights_of_the_given_choice(name, T, given, kind, dtype, kernels_only):
    E, k, bias, attrs = _attrs(name)
    x = _logits(T, E, kind)
    idx = _given(T, E, k, given, dtype)
    w, i = torch.ops.moe.route(x, bias, k, *attrs, replay=idx)
    assert w.dtype == torch.float32 and i.dtype == torch.int32 and w.shape == (T, k)
    assert torch.equal(i, idx.to(torch.int32))  # the given choice, in its order
    scoring, order, _, _, _, renormalize, scale = attrs
    ref = _reference(x, idx, scoring, order, renormalize, scale)
    # rtol: renormalizing raw logits ("none") divides by sums near 0 (weights ~100, f32 sums of 12 terms).
    torch.testing.assert_close(w.double(), ref, atol=2e-6, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("T", [1, 7, 64])
def test_replaying_its_own_choice_is_the_identity(name, T, kernels_only):
    """What the router chose, replayed, gives the same weights bit for bit (RL: the trainer's weights are the
    engine's)."""
    E, k, bias, attrs = _attrs(name)
    x = _logits(T, E, "ties")
    w, i = torch.ops.moe.route(x, bias, k, *attrs)
    w2, i2 = torch.ops.moe.route(x, bias, k, *attrs, replay=i)
    assert torch.equal(i2, i)
    assert torch.equal(w2, w)


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_of_the_given_choice(name, kernels_only):
    E, k, bias, attrs = _attrs(name)
    T = 9
    x = _logits(T, E, "random")
    idx = _given(T, E, k, "distinct", torch.int64)
    cot = torch.randn(T, k, generator=torch.Generator().manual_seed(3))
    xa = x.clone().requires_grad_(True)
    w, _ = torch.ops.moe.route(xa, bias, k, *attrs, replay=idx)
    (ga,) = torch.autograd.grad(w, xa, cot)
    scoring, order, _, _, _, renormalize, scale = attrs
    xr = x.double().requires_grad_(True)
    (gr,) = torch.autograd.grad(_reference(xr, idx, scoring, order, renormalize, scale), xr, cot.double())
    torch.testing.assert_close(ga.double(), gr, atol=2e-6, rtol=1e-5)


def test_bf16_logits(kernels_only):
    E, k, bias, attrs = _attrs("deepseek_v3")
    x = _logits(17, E, "random", torch.bfloat16)
    idx = _given(17, E, k, "distinct", torch.int32)
    w, _ = torch.ops.moe.route(x, bias, k, *attrs, replay=idx)
    scoring, order, _, _, _, renormalize, scale = attrs
    torch.testing.assert_close(w.double(), _reference(x.float(), idx, scoring, order, renormalize, scale),
                               atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("bad", [-1, 64, 2**31, 2**32])
def test_an_index_outside_the_experts_is_an_error(bad):
    """2^32 as an i64 index must not wrap to expert 0."""
    x = torch.randn(4, 64)
    idx = torch.zeros(4, 8, dtype=torch.int64)
    idx[2, 5] = bad
    with pytest.raises(ValueError, match=rf"moe.route: 'replay' holds {bad}, outside \[0, 64\)"):
        torch.ops.moe.route(x, None, 8, "sigmoid", replay=idx)


@pytest.mark.parametrize("shape,message", [
    ((4, 7), r"'replay'.*k"),
    ((3, 8), r"'replay'"),
    ((4,), r"'replay'"),
])
def test_a_replay_of_the_wrong_shape_is_refused(shape, message):
    with pytest.raises(ValueError, match=message):
        torch.ops.moe.route(torch.randn(4, 64), None, 8, "sigmoid", replay=torch.zeros(shape, dtype=torch.int32))


def test_a_float_replay_is_refused():
    with pytest.raises(TypeError, match="'replay' must be i32 or i64"):
        torch.ops.moe.route(torch.randn(4, 64), None, 8, "sigmoid", replay=torch.zeros(4, 8))


def test_replay_under_torch_compile():
    """The whole-graph path imports moe.route with its replay operand (the generic form's operand segments)."""
    E, k, bias, attrs = _attrs("deepseek_v3")

    def f(x, idx):
        w, i = torch.ops.moe.route(x, bias, k, *attrs, replay=idx)
        return (w * 2).sum(-1), i

    x = _logits(13, E, "random")
    idx = _given(13, E, k, "distinct", torch.int64)
    compiled = torch.compile(f, backend="moe", dynamic=True)
    for T in (13, 4):
        got, want = compiled(x[:T], idx[:T]), f(x[:T], idx[:T])
        torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-6)
        assert torch.equal(got[1], want[1])
