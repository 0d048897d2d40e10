"""torch.ops.moe.route with a scoring function the dialect has never seen (issue #48 item 2): the score is the
``score`` region of moe.route, written from a PyTorch function by ``custom_scoring`` (ops/score_region.py), inlined
by the CPU kernel and differentiated symbolically by the fused backward kernel (moe.route_grad).

The two scores below are defined here only: DeepSeek-V4's sqrtsoftplus (``sqrt(softplus(x))``, with a selection
bias and renormalized weights, as ``DeepseekV4TopKRouter`` scores with ``ACT2FN["sqrtsoftplus"]``) and
``x * tanh(x) + 2``. Ground truth: the selection of the eager reference (reference/routing.py, which evaluates the
region with torch ops), the weights recomputed in float64 from the PyTorch function at that selection, and the
gradient from float64 autograd of that PyTorch function (not of the region: the tracer, the region and the
differentiator are all under test).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from moe_mlir import ops
from moe_mlir.reference import routing as RR

NAN, INF = float("nan"), float("inf")
TOKENS = (0, 1, 5, 33, 130)

needs_kernels = pytest.mark.skipif(
    not ops.kernels_available(),
    reason=f"compiled kernels unavailable: {ops._KERNELS_UNAVAILABLE} (build the project: cmake --build build)")


def sqrtsoftplus(x):
    return torch.sqrt(F.softplus(x))


def xtanh2(x):
    return x * torch.tanh(x) + 2


SCORES = {"sqrtsoftplus": sqrtsoftplus, "xtanh2": xtanh2}

#: name -> (E, route kwargs without scoring)
CONFIGS = {
    # DeepSeek-V4-like: a selection bias, renormalized (the HF router divides by sum + 1e-20; zero sums give zeros
    # here), scaled.
    "v4": (64, dict(k=8, bias=True, renormalize=True, routed_scaling_factor=2.5)),
    "groups_bias": (64, dict(k=6, bias=True, n_group=8, topk_group=3, renormalize=True, routed_scaling_factor=1.5)),
    "raw": (24, dict(k=3)),
    "topk_then_score": (16, dict(k=4, order="topk_then_score", bias=True, renormalize=True)),
    "k_eq_e": (12, dict(k=12, renormalize=True)),
    "k_17": (40, dict(k=17, renormalize=True)),  # more picks than the backward's vector lanes: its scalar loops
}


def _call(logits, bias, k, scoring, kw):
    return torch.ops.moe.route(logits, bias, k, scoring, kw.get("order", "score_then_topk"), kw.get("n_group", 1),
                               kw.get("topk_group", 1), kw.get("group_score", "top2_sum"),
                               kw.get("renormalize", False), kw.get("routed_scaling_factor", 1.0))


def _inputs(T, E, kw, seed, dtype=torch.float32, adversarial=False):
    g = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(T, E, generator=g)
    if adversarial and T >= 5:
        x[0, : E // 2] = 0.75              # ties: the lowest index wins
        x[1, 3] = INF
        x[2] = -INF                         # a fully masked row: zero weights
        x[3, 5] = NAN                       # NaN ranks first and propagates
        x[4, ::3] = -INF
    bias = 0.1 * torch.randn(E, generator=g) if kw.get("bias") else None
    return x.to(dtype), bias


def _weights64(fn, x, idx, kw):
    """The weights in float64 from the PyTorch function at the selection ``idx``."""
    s = fn(torch.gather(x.double(), 1, idx.long()))
    if kw.get("renormalize"):
        den = s.sum(-1, keepdim=True)
        s = torch.where(den == 0, torch.zeros_like(s), s / torch.where(den == 0, torch.ones_like(den), den))
    return s * kw.get("routed_scaling_factor", 1.0)


@needs_kernels
@pytest.mark.parametrize("score", sorted(SCORES))
@pytest.mark.parametrize("cfg", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_against_reference_and_float64(score, cfg, dtype):
    fn = SCORES[score]
    scoring = ops.custom_scoring(fn)
    E, kw = CONFIGS[cfg]
    k = kw["k"]
    for seed, T in enumerate(TOKENS):
        x, bias = _inputs(T, E, kw, seed, dtype, adversarial=seed % 2 == 0)
        w, idx = _call(x, bias, k, scoring, kw)
        w_ref, idx_ref = RR.route(x, bias, k, scoring, kw.get("order", "score_then_topk"), kw.get("n_group", 1),
                                  kw.get("topk_group", 1), "top2_sum", kw.get("renormalize", False),
                                  kw.get("routed_scaling_factor", 1.0))
        assert w.dtype == torch.float32 and idx.dtype == torch.int32 and w.shape == (T, k)
        assert torch.equal(idx, idx_ref), (T, idx, idx_ref)
        # f32 scores (the kernel's polynomial exp/log1p, tanh) against float64: a few ulp of each term.
        torch.testing.assert_close(w, w_ref, atol=1e-5, rtol=1e-5, equal_nan=True)
        torch.testing.assert_close(w.double(), _weights64(fn, x, idx, kw), atol=1e-5, rtol=1e-5, equal_nan=True)


@needs_kernels
@pytest.mark.parametrize("score", sorted(SCORES))
@pytest.mark.parametrize("cfg", sorted(CONFIGS))
def test_backward_against_float64_autograd(score, cfg):
    fn = SCORES[score]
    scoring = ops.custom_scoring(fn)
    E, kw = CONFIGS[cfg]
    k = kw["k"]
    for seed, T in enumerate((1, 5, 33, 130)):
        x, bias = _inputs(T, E, kw, 10 + seed)
        x.requires_grad_(True)
        w, idx = _call(x, bias, k, scoring, kw)
        gw = torch.randn(T, k, generator=torch.Generator().manual_seed(seed))
        (g,) = torch.autograd.grad(w, x, gw)
        x64 = x.detach().double().requires_grad_(True)
        (g64,) = torch.autograd.grad(_weights64(fn, x64, idx, kw), x64, gw.double())
        assert g.dtype == torch.float32 and g.shape == x.shape
        # f32 derivative terms against float64 autograd of the torch function.
        torch.testing.assert_close(g.double(), g64, atol=2e-5, rtol=1e-4)


@needs_kernels
def test_backward_adversarial_rows_match_float64():
    """Ties, a -inf expert, a NaN logit (NaN ranks first and propagates to its row's gradient, as in autograd)."""
    fn, E, kw = sqrtsoftplus, 16, dict(k=4, renormalize=True, routed_scaling_factor=2.0)
    scoring = ops.custom_scoring(fn)
    x = torch.randn(6, E, generator=torch.Generator().manual_seed(3))
    x[0, :8], x[0, 8:] = 0.5, -1.0   # eight tied leaders
    x[1, 2] = -INF
    x[3, 7] = NAN
    x.requires_grad_(True)
    w, idx = _call(x, None, 4, scoring, kw)
    gw = torch.ones(6, 4)
    (g,) = torch.autograd.grad(w, x, gw)
    x64 = x.detach().double().requires_grad_(True)
    (g64,) = torch.autograd.grad(_weights64(fn, x64, idx, kw), x64, gw.double())
    torch.testing.assert_close(g.double(), g64, atol=2e-5, rtol=1e-4, equal_nan=True)
    assert torch.equal(idx[0], torch.arange(4, dtype=torch.int32))  # the tie: lowest indices
    assert torch.equal(g[0, :4], g[0, :1].expand(4))  # tied picks, equal gradients
    assert g[3].isnan().any() and not g[4].isnan().any()


@needs_kernels
def test_backward_fully_masked_row_gets_zero_gradient():
    """A row of -inf logits: every sqrtsoftplus score is 0, the weights are 0 (a zero sum) and constant, so the row
    gets no gradient (moe.route_grad: 0 where S = 0; float64 autograd of the torch function gives NaN there, from
    sqrt'(0) = inf times 0). The other rows match float64 autograd."""
    kw = dict(renormalize=True)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(5))
    x[1] = -INF
    x.requires_grad_(True)
    scoring = ops.custom_scoring(sqrtsoftplus)
    w, idx = _call(x, None, 2, scoring, kw)
    assert torch.equal(w[1], torch.zeros(2))
    gw = torch.ones(3, 2)
    (g,) = torch.autograd.grad(w, x, gw)
    assert torch.equal(g[1], torch.zeros(8))
    x64 = x.detach().double().requires_grad_(True)
    (g64,) = torch.autograd.grad(_weights64(sqrtsoftplus, x64, idx, kw), x64, gw.double())
    assert g64[1].isnan().any()
    torch.testing.assert_close(g[[0, 2]].double(), g64[[0, 2]], atol=2e-5, rtol=1e-4)


@needs_kernels
@pytest.mark.parametrize("T", TOKENS)
def test_sigmoid_as_custom_region_matches_the_preset(T):
    """The built-in sigmoid written as a region (custom_scoring(torch.sigmoid): 1 / (1 + exp(-x))) chooses the same
    experts and gives the preset's weights (the same f32 operations: bitwise) and gradients (the fused backward
    kernel against autograd of the reference)."""
    E, kw = 64, dict(k=8, bias=True, n_group=8, topk_group=4, renormalize=True, routed_scaling_factor=2.5)
    x, bias = _inputs(T, E, kw, 7, adversarial=True)
    x.requires_grad_(True)
    w_c, i_c = _call(x, bias, 8, ops.custom_scoring(torch.sigmoid), kw)
    w_s, i_s = _call(x, bias, 8, "sigmoid", kw)
    assert torch.equal(i_c, i_s)
    assert torch.equal(w_c.nan_to_num(7.0), w_s.nan_to_num(7.0))
    if T:
        gw = torch.randn(T, 8)
        (g_c,) = torch.autograd.grad(w_c, x, gw)
        (g_s,) = torch.autograd.grad(w_s, x, gw)
        torch.testing.assert_close(g_c, g_s, atol=1e-6, rtol=1e-5, equal_nan=True)


@needs_kernels
def test_two_custom_scores_are_two_kernels():
    """The kernel key holds the region text: a second score in the same process is not the first one's kernel."""
    x = torch.randn(9, 32)
    w1, _ = _call(x, None, 4, ops.custom_scoring(sqrtsoftplus), {})
    w2, i2 = _call(x, None, 4, ops.custom_scoring(xtanh2), {})
    torch.testing.assert_close(w2.double(), _weights64(xtanh2, x, i2, {}), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(w1, w2)


def test_tracer_rejects_a_function_without_region_ops():
    with pytest.raises(ValueError, match="no score region op for aten.sin"):
        ops.custom_scoring(torch.sin)


def test_route_rejects_an_op_outside_the_region_list():
    body = "^bb0(%x: f32): %0 = math.sin %x : f32 moe.yield %0 : f32"
    with pytest.raises(ValueError, match="'math.sin' is not allowed in the 'score' region"):
        torch.ops.moe.route(torch.randn(4, 8), None, 2, "custom:" + body)


def test_route_rejects_a_region_without_yield():
    with pytest.raises(ValueError, match="must end in moe.yield"):
        torch.ops.moe.route(torch.randn(4, 8), None, 2, "custom:^bb0(%x: f32): %0 = math.exp %x : f32")


@needs_kernels
def test_step_function_scores_but_has_no_gradient():
    body = "^bb0(%x: f32): %0 = math.floor %x : f32 %1 = math.exp %0 : f32 moe.yield %1 : f32"
    x = torch.randn(5, 8)
    w, idx = torch.ops.moe.route(x, None, 2, "custom:" + body)
    torch.testing.assert_close(w, torch.exp(torch.floor(torch.gather(x, 1, idx.long()))))
    with pytest.raises(ValueError, match="cannot differentiate 'math.floor'"):
        torch.ops.moe.route(x.requires_grad_(True), None, 2, "custom:" + body)[0].sum().backward()


class _V4Router(torch.nn.Module):
    """DeepSeek-V4's gate after its linear, as one torch.ops.moe.route with the sqrtsoftplus score."""

    def __init__(self):
        super().__init__()
        self.scoring = ops.custom_scoring(sqrtsoftplus)
        self.register_buffer("bias", torch.zeros(16))

    def forward(self, logits):
        return torch.ops.moe.route(logits, self.bias, 4, self.scoring, "score_then_topk", 1, 1, "top2_sum", True, 2.5)


def test_importer_prints_the_score_region(moe_opt):
    """The whole-graph importer prints the route's region in the generic form; moe-opt parses and verifies it, and
    prints it back as scoring(custom) with the traced ops."""
    from conftest import assert_verifies
    from moe_mlir.mlir.importer import import_model

    text = import_model(_V4Router(), (torch.randn(3, 16),))
    assert "#moe<scoring custom>" in text and "math.log1p" in text
    out = assert_verifies(moe_opt, text)
    assert "scoring(custom)" in out and "score {" in out and "math.sqrt" in out and "moe.yield" in out


#: One function per differentiation rule the two scores above leave out (each also a tracer expansion).
RULES = {
    "cmpf_select": lambda x: torch.where(x > 0, x, 0.1 * x),
    "clamp_min_max": lambda x: torch.clamp(x, -1.0, 2.0) * x,
    "exp2": lambda x: torch.exp2(0.5 * x),
    "log_subf": lambda x: torch.log(1 + x * x) - 0.25 * x,
    "rsqrt": lambda x: torch.rsqrt(1 + x * x),
    "powf_constant": lambda x: torch.pow(x * x + 1, 0.75),
    "erf": lambda x: torch.erf(x) + 1.5,
    "softsign_divf": lambda x: 3 - x / (1 + x.abs()),
    "silu": F.silu,
    "square_reciprocal": lambda x: torch.reciprocal(torch.square(x) + 2),
}


@needs_kernels
@pytest.mark.parametrize("name", sorted(RULES))
def test_each_differentiation_rule_against_float64_autograd(name):
    """Forward and backward of a score built around one rule (no renormalization: these scores may be negative,
    and a sum near 0 is ill-conditioned), against float64 PyTorch."""
    fn, E, k, kw = RULES[name], 32, 4, dict(routed_scaling_factor=1.5)
    scoring = ops.custom_scoring(fn)
    x = 2 * torch.randn(33, E, generator=torch.Generator().manual_seed(11))
    x.requires_grad_(True)
    w, idx = _call(x, None, k, scoring, kw)
    _, idx_ref = RR.route(x.detach(), None, k, scoring, routed_scaling_factor=1.5)
    assert torch.equal(idx, idx_ref)
    x64 = x.detach().double().requires_grad_(True)
    w64 = _weights64(fn, x64, idx, kw)
    torch.testing.assert_close(w.double(), w64, atol=1e-5, rtol=1e-5)
    gw = torch.randn(33, k, generator=torch.Generator().manual_seed(12))
    (g,) = torch.autograd.grad(w, x, gw)
    (g64,) = torch.autograd.grad(w64, x64, gw.double())
    torch.testing.assert_close(g.double(), g64, atol=2e-5, rtol=1e-4)


@needs_kernels
def test_torch_compile_inductor_keeps_the_custom_route():
    """Under torch.compile (inductor, fullgraph) the route with a custom score is one opaque op whose fake kernel
    validates the region; forward and backward match eager's."""
    scoring = ops.custom_scoring(sqrtsoftplus)

    def loss(x, b):
        w, _ = torch.ops.moe.route(x, b, 4, scoring, "score_then_topk", 1, 1, "top2_sum", True, 2.5)
        return (w * w).sum()

    x = torch.randn(17, 32, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    b = 0.1 * torch.randn(32, generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    compiled = torch.compile(loss, backend="inductor", fullgraph=True)
    l_c = compiled(x, b)
    (g_c,) = torch.autograd.grad(l_c, x)
    l_e = loss(x, b)
    (g_e,) = torch.autograd.grad(l_e, x)
    # Inductor's fused (w * w).sum() may add in another order: a few ulp.
    torch.testing.assert_close(l_c, l_e, atol=0, rtol=1e-6)
    torch.testing.assert_close(g_c, g_e, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("body,message", [
    ("^bb0(%x: f32): %0 = arith.cmpf ogt, %x, %x : f32 moe.yield %0 : f32",
     "moe.yield takes the f32 score, but %0 is i1"),
    ("^bb0(%x: f32): %0 = arith.cmpf ogt, %x, %x : f32 %1 = arith.addf %0, %x : f32 moe.yield %1 : f32",
     "'arith.addf' in the 'score' region has an operand of type i1"),
    ("^bb0(%x: f32): %0 = arith.select %x, %x, %x : f32 moe.yield %0 : f32",
     "'arith.select' in the 'score' region has an operand of type f32"),
    ("^bb0(%x: f32): %0 = math.exp %y : f32 moe.yield %0 : f32", "'math.exp' uses undefined value %y"),
    ("^bb0(%x: f32): %0 = arith.constant 1 : i32 moe.yield %x : f32", "has type 'i32'"),
    ("^bb0(%x: f32): %0 = arith.constant one : f32 moe.yield %0 : f32", "cannot read the f32 value 'one'"),
    ("^bb0(%x: f64): moe.yield %x : f32", "one f32 argument (the logit), but it has type f64"),
    ("garbage", "must start with one f32 block argument"),
], ids=["yield_i1", "i1_operand", "f32_condition", "undefined", "i32_constant", "bad_constant", "f64_argument",
        "garbage"])
def test_region_text_errors_name_the_rule(body, message):
    """Region text written by hand is checked before any kernel is built, with the verifier's rules."""
    with pytest.raises(ValueError, match=re.escape(message)):
        torch.ops.moe.route(torch.randn(4, 8), None, 2, "custom:" + body)


@needs_kernels
def test_region_text_with_a_key_separator_is_refused():
    with pytest.raises(ValueError, match=re.escape("the 'score' region text must not contain '|'")):
        torch.ops.moe.route(torch.randn(4, 8), None, 2, "custom:^bb0(%x: f32): moe.yield %x : f32 |")


@needs_kernels
def test_transformers_deepseek_v4_router():
    """HF's DeepseekV4TopKRouter (scores ACT2FN["sqrtsoftplus"], a selection bias, weights over sum + 1e-20, scaled)
    against one torch.ops.moe.route whose score is that very ACT2FN module traced by custom_scoring: the same experts,
    weights within f32 rounding, and the same gradient to the router's weight through the logits (HF: autograd;
    ours: moe.route_grad). HF's top-k is unsorted: both sides are compared sorted by expert."""
    hf = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    from transformers.activations import ACT2FN
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    cfg = DeepseekV4Config(hidden_size=64, num_local_experts=32, num_experts_per_tok=4, routed_scaling_factor=1.5)
    router = hf.DeepseekV4TopKRouter(cfg)
    g = torch.Generator().manual_seed(21)
    with torch.no_grad():
        router.weight.copy_(0.2 * torch.randn(32, 64, generator=g))
        router.e_score_correction_bias.copy_(0.1 * torch.randn(32, generator=g))
    h = torch.randn(2, 37, 64, generator=g)
    c = torch.randn(74, 4, generator=g)

    logits, w_hf, i_hf = router(h)
    (gw_hf,) = torch.autograd.grad((w_hf * c.gather(1, torch.argsort(torch.argsort(i_hf, 1), 1))).sum(),
                                   router.weight)
    scoring = ops.custom_scoring(ACT2FN[cfg.scoring_func])
    ours_logits = F.linear(h.reshape(-1, 64), router.weight)
    w, i = torch.ops.moe.route(ours_logits, router.e_score_correction_bias, 4, scoring, "score_then_topk", 1, 1,
                               "top2_sum", True, cfg.routed_scaling_factor)
    (gw,) = torch.autograd.grad((w * c.gather(1, torch.argsort(torch.argsort(i.long(), 1), 1))).sum(),
                                router.weight)

    o_hf, o = torch.argsort(i_hf, 1), torch.argsort(i.long(), 1)
    assert torch.equal(i.long().gather(1, o), i_hf.gather(1, o_hf))
    torch.testing.assert_close(w.gather(1, o), w_hf.gather(1, o_hf), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(gw, gw_hf, atol=1e-5, rtol=1e-4)


def _region_with(op: str, n: int) -> str:
    """A route whose score region applies ``op`` (``n`` operands) to the logit."""
    if op == "arith.constant":
        body, out = "%r = arith.constant 1.5 : f32", "%r"
    elif op == "arith.cmpf":
        body, out = "%c = arith.cmpf ogt, %x, %x : f32\n    %r = arith.select %c, %x, %x : f32", "%r"
    elif op == "arith.select":
        body, out = "%c = arith.cmpf olt, %x, %x : f32\n    %r = arith.select %c, %x, %x : f32", "%r"
    else:
        body, out = f"%r = {op} {', '.join(['%x'] * n)} : f32", "%r"
    return (f"func.func @f(%l: tensor<?x8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>) {{\n"
            f"  %w, %i = moe.route %l k(2) scoring(custom) score {{\n  ^bb0(%x: f32):\n    {body}\n"
            f"    moe.yield {out} : f32\n  }} : tensor<?x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>\n"
            f"  return %w, %i : tensor<?x2xf32>, tensor<?x2xi32>\n}}\n")


def test_python_and_the_verifier_accept_the_same_region_ops(moe_opt):
    """The region's ops are listed twice, in C++ (include/MoE/IR/ScoreRegion.h, the verifier and the kernels) and in
    Python (reference.score_region.SCORE_OPS, which checks a region before any kernel is built and evaluates the
    eager fallback): every op of the Python list verifies, and ops just outside it (math.sin, math.cos, arith.remf,
    math.atan) are refused by both, so the two lists cannot drift apart unnoticed."""
    from conftest import run_moe_opt
    from moe_mlir.reference.score_region import SCORE_OPS, parse_score_region

    for op, n in SCORE_OPS.items():
        text = _region_with(op, n)
        proc = run_moe_opt(moe_opt, text)
        assert proc.returncode == 0, f"{op}: in SCORE_OPS but refused by the verifier:\n{proc.stderr[:2000]}"
    for op, n in (("math.sin", 1), ("math.cos", 1), ("arith.remf", 2), ("math.atan", 1)):
        proc = run_moe_opt(moe_opt, _region_with(op, n))
        assert proc.returncode != 0 and "score" in proc.stderr, f"{op}: the verifier accepts it:\n{proc.stderr}"
        region = _region_with(op, n).split("^bb0", 1)[1].split("}", 1)[0]
        with pytest.raises(ValueError):
            parse_score_region("^bb0" + region)
