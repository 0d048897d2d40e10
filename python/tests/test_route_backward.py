"""``moe.route``'s backward (python/moe_mlir/ops/routing.py): the weights of the forward's own choice re-computed from
the logits (reference.routing.route_weights), never the choice again. The gradient equals the reference's (which
chooses again: the same indices) on random and adversarial logits, and the traced backward of a training step holds
no sort or top-k (the choice over [T, E] ran once, in the forward)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import moe_mlir  # noqa: F401  (registers torch.ops.moe)
from moe_mlir.reference import routing as RR
from torch_checks import needs_cpu_kernels

pytestmark = needs_cpu_kernels

# (E, k, scoring, order, n_group, topk_group, group_score, renormalize, routed_scaling_factor, bias)
CASES = {
    "deepseek_v3": (64, 8, "sigmoid", "score_then_topk", 8, 4, "top2_sum", True, 2.5, True),
    "deepseek_v2_max": (32, 6, "softmax", "score_then_topk", 8, 3, "max", False, 16.0, False),
    "mixtral": (8, 2, "softmax", "score_then_topk", 1, 1, "top2_sum", True, 1.0, False),
    "gpt_oss": (32, 4, "softmax", "topk_then_score", 1, 1, "top2_sum", False, 1.0, False),
    "llama4_k_eq_1": (16, 1, "sigmoid", "topk_then_score", 1, 1, "top2_sum", False, 1.0, True),
    "none_renorm": (12, 12, "none", "score_then_topk", 1, 1, "top2_sum", True, 0.5, False),  # k = E
}


def _logits(T: int, E: int, kind: str) -> torch.Tensor:
    x = torch.randn(T, E, generator=torch.Generator().manual_seed(T + E))
    if kind == "ties":
        x = x.round(decimals=0)  # many equal logits: ties go to the lowest index on both sides
    elif kind == "zero_rows":
        x[::3] = 0.0  # renormalizing raw zero scores: a zero sum gives zero weights (and zero gradient)
    elif kind == "nan_inf":
        x[0, 0] = float("nan")
        x[-1, :] = float("-inf")
    return x


@pytest.mark.parametrize("kind", ["random", "ties", "zero_rows", "nan_inf"])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("T", [1, 7])
def test_gradient_equals_the_reference(name, kind, T):
    E, k, *attrs, with_bias = CASES[name]
    bias = 0.1 * torch.randn(E, generator=torch.Generator().manual_seed(1)) if with_bias else None
    x = _logits(T, E, kind)
    cot = torch.randn(T, k, generator=torch.Generator().manual_seed(2))
    xa = x.clone().requires_grad_(True)
    w, i = torch.ops.moe.route(xa, bias, k, *attrs)
    (ga,) = torch.autograd.grad(w, xa, cot)
    xb = x.clone().requires_grad_(True)
    w_r, i_r = RR.route(xb, bias, k, *attrs)
    (gb,) = torch.autograd.grad(w_r, xb, cot)
    assert torch.equal(i, i_r)
    torch.testing.assert_close(ga, gb, atol=1e-6, rtol=1e-5, equal_nan=True)


def test_zero_tokens():
    x = torch.zeros(0, 16, requires_grad=True)
    w, _ = torch.ops.moe.route(x, None, 4, "softmax", "score_then_topk", 1, 1, "top2_sum", True, 1.0)
    (g,) = torch.autograd.grad(w.sum(), x)
    assert g.shape == (0, 16)


def test_backward_does_not_choose_again():
    """The joint forward + backward, traced: one choice (the route kernel) in the forward, and the backward the
    fused moe.route_grad kernel (the sigmoid's derivative and the renormalization at the saved indices): no
    second route, no topk, sort or group scoring."""

    def step(x, b):
        w, _ = torch.ops.moe.route(x, b, 8, "sigmoid", "score_then_topk", 8, 4, "top2_sum", True, 2.5)
        return torch.autograd.grad((w * w).sum(), x)[0]

    x = torch.randn(16, 64, requires_grad=True)
    gm = make_fx(step)(x, torch.randn(64))
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert ops.count("moe.route.default") == 1 and ops.count("moe.route_backward.default") == 1, ops
    assert not [o for o in ops if "topk" in o or "sort" in o], ops
