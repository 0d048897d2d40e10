"""moe.route's few-expert CPU kernel (lib/Conversion/MoEToCPU/Route.cpp, RowLanes.h): with E a power of two <= 16,
k <= 8, no groups or replay and an elementwise score (sigmoid, a custom score region; either order) or none, each block of 8
(AVX2) or 16 (AVX-512) rows runs one row per lane, and the rows past the last whole block the per-row path.

Checked here: the reference (moe_mlir/reference/routing.py) at every E, k and score mode the layout takes, at token
counts that are whole blocks, blocks plus a rest and less than a block; the same bits for a row whichever path ran it
(each row alone, T = 1, is the per-row path: batch invariance, which serving and RL replay rely on); the dialect's
rules on adversarial rows (ties to the lowest index, saturated sigmoids that tie, NaN first, -inf, a bias that flips
the choice); and the custom score of a compiled router.
"""

from __future__ import annotations

import pytest
import torch

from moe_mlir import ops
from moe_mlir.profiling import ops_run
from moe_mlir.reference import routing as RR

NAN, INF = float("nan"), float("inf")

pytestmark = pytest.mark.skipif(not ops.kernels_available(), reason="compiled CPU kernels unavailable")

#: (E, k, route options): every mode the row-per-lane layout takes.
CASES = [
    (16, 1, dict(scoring="sigmoid")),                                       # one pick of 16 scores: the per-row path
    (16, 2, dict(scoring="sigmoid", bias=True, renormalize=True, routed_scaling_factor=2.5)),
    (16, 8, dict(scoring="sigmoid", bias=True)),
    (8, 8, dict(scoring="sigmoid", renormalize=True)),                                     # k = E
    (4, 3, dict(scoring="none", routed_scaling_factor=0.5)),                               # raw logits, k not 2^n
    (2, 1, dict(scoring="none", order="topk_then_score")),
    (16, 4, dict(scoring="none", order="topk_then_score", bias=True)),
    (16, 1, dict(scoring="sigmoid", order="topk_then_score")),                             # Llama 4's router
    (8, 2, dict(scoring="sigmoid", order="topk_then_score", bias=True, renormalize=True, routed_scaling_factor=1.5)),
]
TOKENS = (1, 7, 8, 9, 16, 33, 100)


def _route(x, bias, k, kw):
    kw = dict(kw)
    kw.pop("bias", None)
    return torch.ops.moe.route(x, bias, k, kw.get("scoring", "softmax"), kw.get("order", "score_then_topk"), 1, 1,
                               "top2_sum", kw.get("renormalize", False), kw.get("routed_scaling_factor", 1.0))


def _ref(x, bias, k, kw):
    kw = dict(kw)
    kw.pop("bias", None)
    return RR.route(x, bias, k, kw.get("scoring", "softmax"), kw.get("order", "score_then_topk"), 1, 1, "top2_sum",
                    kw.get("renormalize", False), kw.get("routed_scaling_factor", 1.0))


def _bias(E, kw, seed=0):
    return 0.3 * torch.randn(E, generator=torch.Generator().manual_seed(seed)) if kw.get("bias") else None


def _same_bits_as_each_row_alone(x, bias, k, kw):
    w, i = _route(x, bias, k, kw)
    for r in range(x.shape[0]):
        w1, i1 = _route(x[r:r + 1], bias, k, kw)
        assert torch.equal(i[r], i1[0]), (r, i[r], i1[0])
        assert torch.equal(w[r].view(torch.int32), w1[0].view(torch.int32)), (r, w[r], w1[0])
    return w, i


@pytest.mark.parametrize("E,k,kw", CASES, ids=[f"E{e}k{k}-{'-'.join(map(str, kw.values()))}" for e, k, kw in CASES])
def test_matches_the_reference_and_each_row_alone(E, k, kw):
    bias = _bias(E, kw)
    for T in TOKENS:
        x = 2.0 * torch.randn(T, E, generator=torch.Generator().manual_seed(T))
        w, i = _same_bits_as_each_row_alone(x, bias, k, kw)
        w_r, i_r = _ref(x, bias, k, kw)
        assert torch.equal(i, i_r), (T, i, i_r)
        torch.testing.assert_close(w, w_r, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("E,k,kw", CASES[:3] + CASES[4:5] + CASES[7:], ids=["E16k1", "E16k2-bias", "E16k8-bias",
                                                                          "E4k3-none", "E16k1-topk-first",
                                                                          "E8k2-topk-first-bias"])
def test_adversarial_rows(E, k, kw):
    """Integer logits (exact ties: the lowest index wins), sigmoids that saturate to 1.0 and tie although their
    logits differ, NaN (first, as the largest), -inf, a row of -inf and a row of zeros, in a whole block and its
    rest: the reference's picks and weights, and each row's bits alone."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-2, 3, (24, E), generator=g).float()
    x[1, E // 2:] = torch.linspace(30.0, 60.0, E - E // 2)  # sigmoid(30..60) == 1.0 in f32: tied scores
    x[2, 1] = NAN
    x[3] = -INF
    x[4, ::2] = -INF
    x[5] = 0.0
    x[11, -1] = INF
    x[12, 0] = NAN
    x[12, -1] = NAN
    bias = torch.randint(-1, 2, (E,), generator=g).float() * 0.5 if kw.get("bias") else None
    w, i = _same_bits_as_each_row_alone(x, bias, k, kw)
    w_r, i_r = _ref(x, bias, k, kw)
    assert torch.equal(i, i_r), (i, i_r)
    torch.testing.assert_close(w, w_r, atol=2e-6, rtol=2e-5, equal_nan=True)
    if kw.get("scoring") == "sigmoid" and bias is None:
        # the first of the tied 1.0 scores, or the largest logit when the logits are chosen from
        assert i[1, 0] == (E - 1 if kw.get("order") == "topk_then_score" else E // 2)


def test_a_bias_flips_the_choice_in_every_lane():
    """The bias steers the selection only: the weights are the unbiased scores of the picks."""
    E, k = 8, 2
    x = torch.zeros(16, E)
    x[:, 0] = 1.0
    bias = torch.zeros(E)
    bias[5] = 2.0
    w, i = _route(x, bias, k, dict(scoring="sigmoid"))
    assert torch.equal(i, torch.tensor([[5, 0]] * 16, dtype=torch.int32))
    torch.testing.assert_close(w, torch.tensor([[0.5, torch.sigmoid(torch.tensor(1.0)).item()]] * 16))


def test_custom_score_compiled_router():
    """A custom score (sqrt(softplus(x)): DeepSeek-V4's) raised from PyTorch into the kernel's score region, 16
    experts top-2 with a bias: the lanes and the per-row path give eager's picks and weights, and each row's bits."""
    import torch.nn.functional as F

    bias = 0.2 * torch.randn(16, generator=torch.Generator().manual_seed(1))

    def router(x):
        s = torch.sqrt(F.softplus(x))
        idx = torch.topk(s + bias, 2, dim=-1).indices
        w = s.gather(1, idx)
        return w / w.sum(-1, keepdim=True), idx

    torch._dynamo.reset()
    compiled = torch.compile(router, backend="moe", dynamic=True)
    for T in (9, 40):
        x = torch.randn(T, 16, generator=torch.Generator().manual_seed(T))
        w, i = compiled(x)
        assert ops_run(lambda: compiled(x)) == {"moe::route": 1}  # raised: the kernel ran, not inductor's topk
        w_e, i_e = router(x)
        assert torch.equal(i.long(), i_e)
        torch.testing.assert_close(w, w_e, atol=2e-6, rtol=2e-5)
        for r in range(T):
            w1, _ = compiled(x[r:r + 1])
            assert torch.equal(w[r], w1[0])



#: (E, k, route_backward options): the backward of the few-expert forms above.
GRAD_CASES = [
    (16, 1, dict(scoring="sigmoid")),
    (16, 2, dict(scoring="sigmoid", renormalize=True, routed_scaling_factor=2.5)),
    (8, 8, dict(scoring="sigmoid", renormalize=True)),
    (4, 4, dict(scoring="none", routed_scaling_factor=0.5)),
]


def _grad_ref(g, x, idx, kw):
    with torch.enable_grad():
        xr = x.detach().clone().requires_grad_(True)
        w = RR.route_weights(xr, idx, kw["scoring"], "score_then_topk", kw.get("renormalize", False),
                             kw.get("routed_scaling_factor", 1.0))
        (d,) = torch.autograd.grad(w, xr, g)
    return d


def _backward(g, x, idx, kw):
    return torch.ops.moe.route_backward(g, x, idx, kw["scoring"], kw.get("renormalize", False),
                                        kw.get("routed_scaling_factor", 1.0))


@pytest.mark.parametrize("E,k,kw", GRAD_CASES, ids=[f"E{e}k{k}-{kw['scoring']}" for e, k, kw in GRAD_CASES])
def test_backward_matches_the_reference_and_each_row_alone(E, k, kw):
    """route_backward (moe.route_grad, a row at a time: a row per lane measured slower, its gradient built as E
    columns) at the same sizes: autograd of the reference's weights, each row alone the same bits, and a row that
    names an expert twice accumulates both picks' gradients."""
    for T in TOKENS:
        gen = torch.Generator().manual_seed(100 + T)
        x = 3.0 * torch.randn(T, E, generator=gen)
        idx = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]).int()
        if k > 1 and T > 3:
            idx[3, 1] = idx[3, 0]  # a repeated expert
        x[min(2, T - 1), 0] = 40.0  # a saturated score
        g = torch.randn(T, k, generator=gen)
        d = _backward(g, x, idx, kw)
        torch.testing.assert_close(d, _grad_ref(g, x, idx, kw), atol=2e-6, rtol=2e-5)
        for r in range(T):
            d1 = _backward(g[r:r + 1], x[r:r + 1], idx[r:r + 1], kw)
            assert torch.equal(d[r].view(torch.int32), d1[0].view(torch.int32)), (T, r, d[r], d1[0])
