"""torch.ops.moe.route and torch.ops.moe.dispatch_plan: the compiled CPU kernels against the references
(moe_mlir/reference/routing.py), the references against HF's DeepseekV3TopkRouter and plain PyTorch, and the ops'
validation, autograd, fake kernels and torch.compile.

Adversarial inputs: ties (the lowest index wins), -inf and NaN logits, fully -inf rows, a bias that flips the choice,
groups with equal scores, k = E, E not a power of two (160, 384), zero tokens, several token counts (one kernel for
every T: the compile counter does not move).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from moe_mlir import ops  # noqa: E402
from moe_mlir.reference import routing as RR  # noqa: E402
from moe_mlir.runtime import cache  # noqa: E402

NAN, INF = float("nan"), float("inf")
TOKENS = (0, 1, 5, 33, 130)

needs_kernels = pytest.mark.skipif(
    not ops.kernels_available(),
    reason=f"compiled kernels unavailable: {ops._KERNELS_UNAVAILABLE} (build the project: cmake --build build)")

#: name -> (E, route kwargs)
CONFIGS = {
    "deepseek_v3": (256, dict(k=8, scoring="sigmoid", bias=True, n_group=8, topk_group=4, renormalize=True,
                              routed_scaling_factor=2.5)),
    "kimi_k2": (384, dict(k=8, scoring="sigmoid", bias=True, renormalize=True, routed_scaling_factor=2.827)),
    "glm_4_5": (160, dict(k=8, scoring="sigmoid", bias=True, renormalize=True, routed_scaling_factor=2.5)),
    "deepseek_v2": (160, dict(k=6, n_group=8, topk_group=3, group_score="max", routed_scaling_factor=16.0)),
    "mixtral": (8, dict(k=2, renormalize=True)),
    "qwen3_dense_softmax": (128, dict(k=8)),
    "gpt_oss": (32, dict(k=4, order="topk_then_score")),
    "llama4": (16, dict(k=1, scoring="sigmoid", order="topk_then_score")),
    "sigmoid_k_eq_e": (12, dict(k=12, scoring="sigmoid", renormalize=True)),
    # raw scores (renormalizing raw logits whose sum is near 0 is ill-conditioned: not a useful comparison)
    "none_scoring": (12, dict(k=5, scoring="none", routed_scaling_factor=0.5)),
    "sigmoid_topk_then_score_bias": (24, dict(k=3, scoring="sigmoid", order="topk_then_score", bias=True)),
}


def _on(dev: str, *ts):
    return [None if t is None else t.to(dev) for t in ts]


def _args(E: int, kw: dict, seed: int = 0):
    kw = dict(kw)
    g = torch.Generator().manual_seed(seed)
    bias = (0.1 * torch.randn(E, generator=g)) if kw.pop("bias", False) else None
    k = kw.pop("k")
    return bias, k, kw


def _call(fn, logits, bias, k, kw):
    return fn(logits, bias, k, kw.get("scoring", "softmax"), kw.get("order", "score_then_topk"),
              kw.get("n_group", 1), kw.get("topk_group", 1), kw.get("group_score", "top2_sum"),
              kw.get("renormalize", False), kw.get("routed_scaling_factor", 1.0),
              **({"replay": kw["replay"]} if "replay" in kw else {}))


def _same_route(got, want, atol=2e-6, rtol=2e-5, dev="cpu"):
    (w, i), (w_r, i_r) = got, want
    if dev == "cuda":
        # The GPU sums a selection by warp butterflies, not in pick order.
        w, i, atol, rtol = w.cpu(), i.cpu(), 1e-5, 1e-4
    assert w.dtype == torch.float32 and i.dtype == torch.int32
    assert w.shape == w_r.shape and i.shape == i_r.shape
    assert torch.equal(i, i_r), (i, i_r)
    torch.testing.assert_close(w, w_r, atol=atol, rtol=rtol, equal_nan=True)


# ----------------------------------------------------------------------------------------------------------------
# The references against HF and plain torch
# ----------------------------------------------------------------------------------------------------------------


def test_reference_matches_hf_deepseek_v3_router():
    """HF's DeepseekV3TopkRouter (E = 64, 8 groups, top-3 groups, k = 6, random weights and bias) against
    moe.route on its logits: the same experts and weights (HF's topk(sorted=False) order: compared as sets)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    E, H = 64, 32
    cfg = DeepseekV3Config(hidden_size=H, n_routed_experts=E, num_experts_per_tok=6, n_group=8, topk_group=3,
                           norm_topk_prob=True, routed_scaling_factor=2.5)
    router = DeepseekV3TopkRouter(cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, H, generator=g) * 0.3)
        router.e_score_correction_bias.copy_(torch.randn(E, generator=g) * 0.1)
        x = torch.randn(50, H, generator=g)
        logits, w_hf, i_hf = router(x)
    w, i = RR.route(logits, router.e_score_correction_bias, 6, "sigmoid", n_group=8, topk_group=3, renormalize=True,
                    routed_scaling_factor=2.5)
    order_hf, order = i_hf.argsort(-1), i.long().argsort(-1)
    assert torch.equal(i_hf.gather(-1, order_hf), i.long().gather(-1, order))
    torch.testing.assert_close(w.gather(-1, order), w_hf.gather(-1, order_hf), atol=1e-6, rtol=1e-5)


def test_reference_plain_torch_forms():
    """Mixtral (softmax -> topk -> renorm), gpt-oss (topk -> softmax), Llama-4 (topk -> sigmoid) written in torch."""
    x = torch.randn(20, 16, generator=torch.Generator().manual_seed(1))
    p = torch.softmax(x, -1)
    v, i = p.topk(2)
    w, idx = RR.route(x, None, 2, renormalize=True)
    assert torch.equal(idx.long(), i)
    torch.testing.assert_close(w, v / v.sum(-1, keepdim=True))
    v, i = x.topk(4)
    w, idx = RR.route(x, None, 4, order="topk_then_score")
    assert torch.equal(idx.long(), i)
    torch.testing.assert_close(w, torch.softmax(v, -1))
    v, i = x.topk(1)
    w, idx = RR.route(x, None, 1, scoring="sigmoid", order="topk_then_score")
    assert torch.equal(idx.long(), i)
    torch.testing.assert_close(w, torch.sigmoid(v))


def test_reference_adversarial_rules():
    # ties -> lowest index; a NaN logit makes the row's softmax NaN (all tie: 0, 1); a fully -inf row gives zero
    # weights and indices 0..k-1; with sigmoid only the NaN expert's score is NaN, and it ranks first
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [NAN, 1.0, NAN, 5.0], [-INF] * 4, [-INF, 0.0, -INF, 1.0]])
    w, i = RR.route(x, None, 2, renormalize=True)
    assert i.tolist() == [[1, 2], [0, 1], [0, 1], [3, 1]]
    _, i = RR.route(x, None, 2, "sigmoid")
    assert i[1].tolist() == [0, 2]
    assert torch.equal(w[2], torch.zeros(2))
    assert torch.isnan(w[1]).all()
    # the bias flips the choice, not the weights
    x = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    w, i = RR.route(x, torch.tensor([0.0, 0.0, 0.9, 0.0]), 2, scoring="sigmoid")
    assert i.tolist() == [[2, 0]]
    torch.testing.assert_close(w, torch.sigmoid(torch.tensor([[0.5, 2.0]])))
    # equal group scores: the lower group is kept
    x = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]])
    _, i = RR.route(x, None, 2, scoring="none", n_group=4, topk_group=1)
    assert i.tolist() == [[0, 1]]


def test_dispatch_plan_reference_by_hand():
    idx = torch.tensor([[2, 0], [0, 2], [2, 1], [3, 0]])
    c, o, order, inv, padded, blocks, num = RR.dispatch_plan(idx, 5, 2)
    assert c.tolist() == [3, 1, 3, 1, 0]
    assert o.tolist() == [0, 3, 4, 7, 8, 8]
    assert order.tolist() == [1, 2, 7, 5, 0, 3, 4, 6]
    assert inv[order.long()].tolist() == list(range(8))
    assert padded.tolist()[:12] == [1, 2, 7, 8, 5, 8, 0, 3, 4, 8, 6, 8]
    assert blocks.tolist()[:6] == [0, 0, 1, 2, 2, 3] and num.tolist() == [12]


# ----------------------------------------------------------------------------------------------------------------
# The compiled kernels against the references
# ----------------------------------------------------------------------------------------------------------------


@needs_kernels
@pytest.mark.parametrize("name", list(CONFIGS))
def test_route_kernel_matches_reference(name, dev):
    E, kw = CONFIGS[name]
    bias, k, kw = _args(E, kw)
    before = cache.stats.compiles + cache.stats.disk_loads
    for T in TOKENS:
        x = torch.randn(T, E, generator=torch.Generator().manual_seed(T))
        _same_route(_call(torch.ops.moe.route, *_on(dev, x, bias), k, kw), _call(RR.route, x, bias, k, kw), dev=dev)
    # one kernel for every token count
    assert cache.stats.compiles + cache.stats.disk_loads - before <= 1


@needs_kernels
@pytest.mark.parametrize("name", ["deepseek_v3", "kimi_k2", "deepseek_v2", "mixtral", "gpt_oss", "llama4"])
def test_route_kernel_adversarial(name, dev):
    """Integer-valued logits (many exact ties, equal group scores), -inf, NaN and fully -inf rows."""
    E, kw = CONFIGS[name]
    bias, k, kw = _args(E, kw)
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-2, 3, (40, E), generator=g).float()
    x[3] = -INF
    x[5, ::3] = -INF
    x[7, 1] = NAN
    x[9] = 0.0
    if bias is not None:
        bias = torch.randint(-1, 2, (E,), generator=g).float() * 0.5
    _same_route(_call(torch.ops.moe.route, *_on(dev, x, bias), k, kw), _call(RR.route, x, bias, k, kw), dev=dev)


@needs_kernels
def test_route_kernel_bias_flips_selection(dev):
    x, bias = _on(dev, torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, 1.5]] * 3),
                  torch.tensor([0.0, 0.0, 0.9, 0.0, 0.0, -0.5]))
    w, i = torch.ops.moe.route(x, bias, 2, "sigmoid", renormalize=True, routed_scaling_factor=2.5)
    w0, i0 = torch.ops.moe.route(x, None, 2, "sigmoid", renormalize=True, routed_scaling_factor=2.5)
    assert i[0].tolist() == [2, 0] and i0[0].tolist() == [0, 5]
    s = torch.sigmoid(torch.tensor([0.5, 2.0]))
    torch.testing.assert_close(w[0].cpu(), 2.5 * s / s.sum())


@needs_kernels
def test_route_kernel_bf16_and_noncontiguous(dev):
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(2))
    bias = 0.1 * torch.randn(24, generator=torch.Generator().manual_seed(3))
    xb = x.to(torch.bfloat16)
    _same_route(torch.ops.moe.route(xb.to(dev), None, 4, "softmax", renormalize=True),
                RR.route(xb, None, 4, renormalize=True), dev=dev)
    xt = torch.randn(24, 70).t()  # [70, 24], not contiguous
    _same_route(torch.ops.moe.route(xt.to(dev), bias.to(dev), 3, "sigmoid", n_group=4, topk_group=2),
                RR.route(xt, bias, 3, "sigmoid", n_group=4, topk_group=2), dev=dev)


@needs_kernels
@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2", "gpt_oss", "llama4"])
def test_route_replay_kernel(name, dev):
    """A given choice (routing replay; python/tests/test_route_replay.py covers it on the CPU): the weights of
    those experts, i32 and i64 indices, a repeated expert, and the router's own choice replayed bit for bit."""
    E, kw = CONFIGS[name]
    bias, k, kw = _args(E, kw)
    g = torch.Generator().manual_seed(12)
    for T in TOKENS:
        x = torch.randn(T, E, generator=g)
        for dtype in (torch.int32, torch.int64):
            given = torch.randint(0, E, (T, k), generator=g, dtype=dtype)
            if T:
                given[0] = given[0, 0]
            got = _call(torch.ops.moe.route, *_on(dev, x, bias), k, dict(kw, replay=given.to(dev)))
            _same_route(got, _call(RR.route, x, bias, k, dict(kw, replay=given)), dev=dev)
        w, i = _call(torch.ops.moe.route, *_on(dev, x, bias), k, kw)
        w2, i2 = _call(torch.ops.moe.route, *_on(dev, x, bias), k, dict(kw, replay=i))
        assert torch.equal(i2, i) and torch.equal(w2, w)


@needs_kernels
@pytest.mark.parametrize("scoring", ["sigmoid", "none", "sqrtsoftplus"])
@pytest.mark.parametrize("renormalize", [False, True])
def test_route_backward_kernel(scoring, renormalize, dev):
    """moe.route_grad (the fused backward of an elementwise score) against autograd of the reference: T = 0..130,
    E = 256 (DeepSeek-V3's groups) and E = 40, k = 8 and k = 20 (the GPU and CPU scalar loops), a repeated expert
    (the replayed choice of row 0), bf16 logits."""
    from moe_mlir.ops import custom_scoring

    score = custom_scoring(lambda x: torch.sqrt(torch.nn.functional.softplus(x))) if scoring == "sqrtsoftplus" \
        else scoring
    g = torch.Generator().manual_seed(13)
    for E, k, dtype in ((256, 8, torch.float32), (40, 20, torch.bfloat16)):
        for T in TOKENS:
            x = torch.randn(T, E, generator=g).to(dtype)
            idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).int() if T else \
                torch.zeros(0, k, dtype=torch.int32)
            if T:
                idx[0, 1] = idx[0, 0]
            dw = torch.randn(T, k, generator=g)
            got = torch.ops.moe.route_backward(dw.to(dev), x.to(dev), idx.to(dev), score, renormalize, 2.5)
            assert got.dtype == torch.float32 and got.shape == (T, E) and got.device.type == dev
            xr = x.float().requires_grad_(True)
            w = RR.route_weights(xr, idx, score, "score_then_topk", renormalize, 2.5)
            (want,) = torch.autograd.grad(w, xr, dw) if T else (torch.zeros(0, E),)
            torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-4)


@needs_kernels
def test_route_replay_two_tokens_of_eight(dev):
    """The configuration of the CUDA index-error test below (E = 8, k = 2, sigmoid, i64 indices) with valid
    indices: on the CPU it records that kernel's key for the GPU machine's prebuild (scripts/gpu-check.sh), which
    the CUDA-only test alone would not."""
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(3))
    given = torch.tensor([[0, 7], [3, 3]], dtype=torch.int64)
    w, i = torch.ops.moe.route(x.to(dev), None, 2, "sigmoid", replay=given.to(dev))
    assert torch.equal(i.cpu().long(), given)
    torch.testing.assert_close(w.cpu(), torch.sigmoid(x).gather(1, given), atol=1e-6, rtol=1e-5)


def test_route_replay_index_error_is_read_after_a_sync(cuda):
    from moe_mlir.runtime import cuda as moe_cuda

    given = torch.tensor([[0, 9], [3, 0]], dtype=torch.int64)
    w, i = torch.ops.moe.route(torch.zeros(2, 8, device=cuda), None, 2, "sigmoid", replay=given.to(cuda))
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"moe.route: 'replay' holds 9, outside \[0, 8\)"):
        moe_cuda.check_errors()
    assert i.cpu().tolist() == [[0, 0], [3, 0]]  # read as expert 0, never out of bounds


@needs_kernels
@pytest.mark.parametrize("E,B", [(8, 1), (160, 16), (384, 64), (5, 4)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_dispatch_plan_kernel_matches_reference(E, B, dtype, dev):
    k = min(8, E)
    for T in TOKENS + (1000,):
        g = torch.Generator().manual_seed(T + E)
        idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T else torch.zeros(0, k)
        idx = idx.to(dtype)
        got = torch.ops.moe.dispatch_plan(idx.to(dev), E, B)
        want = RR.dispatch_plan(idx, E, B)
        for name, a, b in zip(("counts", "offsets", "order", "inverse", "padded", "blocks", "num"), got, want):
            assert a.dtype == torch.int32 and a.device.type == dev and torch.equal(a.cpu(), b), (name, T, a, b)


@needs_kernels
def test_dispatch_plan_skewed_and_repeated(dev):
    """Every token to the same two experts (one expert's run crosses every item and, on the GPU, every chunk of
    1024 assignments: the per-item cursors and chunk bases)."""
    idx = torch.tensor([[3, 1]] * 1500, dtype=torch.int32)
    got = torch.ops.moe.dispatch_plan(idx.to(dev), 4, 8)
    for a, b in zip(got, RR.dispatch_plan(idx, 4, 8)):
        assert torch.equal(a.cpu(), b)


@needs_kernels
def test_dispatch_plan_out_of_range_is_a_value_error():
    with pytest.raises(ValueError, match=r"'indices' holds 7, outside \[0, 4\)"):
        torch.ops.moe.dispatch_plan(torch.tensor([[0, 7], [3, 0]], dtype=torch.int32), 4, 2)
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
        torch.ops.moe.dispatch_plan(torch.tensor([[0, -1]]), 4)


@needs_kernels
def test_dispatch_plan_two_tokens_blocks_of_two(dev):
    """The configuration of test_dispatch_plan_index_error_is_read_after_a_sync with every index in range: the
    same kernel, and a device test, so that scripts/gpu-check.sh (which records kernels by running the device tests
    on the CPU, where that CUDA-only test is skipped) prebuilds its kernel for the GPU run."""
    idx = torch.tensor([[0, 1], [3, 0]], dtype=torch.int32)
    for a, b in zip(torch.ops.moe.dispatch_plan(idx.to(dev), 4, 2), RR.dispatch_plan(idx, 4, 2)):
        assert torch.equal(a.cpu(), b)


def test_dispatch_plan_index_error_is_read_after_a_sync(cuda):
    from moe_mlir.runtime import cuda as moe_cuda

    idx = torch.tensor([[0, 7], [3, 0]], dtype=torch.int32)
    got = torch.ops.moe.dispatch_plan(idx.to(cuda), 4, 2)  # returns without waiting; the kernel records the error
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"moe.dispatch_plan: 'indices' holds 7, outside \[0, 4\)"):
        moe_cuda.check_errors()
    # The bad assignment (element 1) is left out of every result.
    assert got[0].cpu().tolist() == [2, 0, 0, 1]
    assert got[2].cpu().tolist() == [0, 3, 2, -1] and got[3].cpu().tolist() == [0, -1, 2, 1]


# ----------------------------------------------------------------------------------------------------------------
# Validation, autograd, fake kernels, torch.compile
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call,msg", [
    (lambda: torch.ops.moe.route(torch.randn(4, 8), None, 9), r"'k' \(9\) must be in \[1, 8\]"),
    (lambda: torch.ops.moe.route(torch.randn(4, 8), None, 2, n_group=3), r"'n_group' \(3\) must divide"),
    (lambda: torch.ops.moe.route(torch.randn(4, 8), None, 2, n_group=4, topk_group=5), r"'topk_group' \(5\)"),
    (lambda: torch.ops.moe.route(torch.randn(4, 8), None, 5, n_group=4, topk_group=2), r"must be <= topk_group"),
    (lambda: torch.ops.moe.route(torch.randn(4, 8), None, 2, n_group=8, topk_group=2), r"top2_sum needs groups"),
    (lambda: torch.ops.moe.route(torch.randn(4, 8), torch.zeros(7), 2), r"dimension 0 of 'bias' \(E = 7\)"),
    (lambda: torch.ops.moe.route(torch.randn(4, 8), None, 2, "tanh"), r"'scoring' must be one of"),
    (lambda: torch.ops.moe.route(torch.randn(4, 8), None, 2, routed_scaling_factor=0.0), r"finite and > 0"),
    (lambda: torch.ops.moe.route(torch.randn(2, 4, 8), None, 2), r"'logits' must have rank 2"),
    (lambda: torch.ops.moe.dispatch_plan(torch.zeros(4, 2, dtype=torch.int32), 0), r"'num_experts' \(0\)"),
    (lambda: torch.ops.moe.dispatch_plan(torch.zeros(4, 2, dtype=torch.int32), 4, 0), r"'block_size' \(0\)"),
])
def test_bad_calls_raise_value_errors(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_bad_dtypes_raise_type_errors():
    with pytest.raises(TypeError, match="'logits' must be f32, f16 or bf16"):
        torch.ops.moe.route(torch.zeros(4, 8, dtype=torch.int32), None, 2)
    with pytest.raises(TypeError, match="'indices' must be i32 or i64"):
        torch.ops.moe.dispatch_plan(torch.zeros(4, 2), 4)


@pytest.mark.parametrize("name", ["deepseek_v3", "mixtral", "gpt_oss", "llama4"])
def test_route_gradient_matches_reference(name):
    """The weights are differentiable w.r.t. the logits (through the unbiased scores); the bias gets none."""
    E, kw = CONFIGS[name]
    bias, k, kw = _args(E, kw)
    x = torch.randn(9, E, generator=torch.Generator().manual_seed(5))
    cot = torch.randn(9, k, generator=torch.Generator().manual_seed(6))
    xa = x.clone().requires_grad_(True)
    w, _ = _call(torch.ops.moe.route, xa, bias, k, kw)
    (w * cot).sum().backward()
    xb = x.clone().requires_grad_(True)
    w_r, _ = _call(RR.route, xb, bias, k, kw)
    (w_r * cot).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-6, rtol=1e-5)
    assert xa.grad.abs().sum() > 0


def test_opcheck():
    x = torch.randn(6, 16)
    torch.library.opcheck(torch.ops.moe.route.default, (x, 0.1 * torch.randn(16), 4, "sigmoid", "score_then_topk",
                                                        4, 2, "top2_sum", True, 2.5))
    torch.library.opcheck(torch.ops.moe.dispatch_plan.default, (torch.randint(0, 16, (6, 4)), 16, 4))


def test_compile_dynamic_tokens():
    """torch.compile(fullgraph, dynamic): the fake kernels give symbolic sizes; route then the plan."""
    def f(x, b):
        w, i = torch.ops.moe.route(x, b, 8, "sigmoid", "score_then_topk", 8, 4, "top2_sum", True, 2.5)
        plan = torch.ops.moe.dispatch_plan(i, 256, 16)
        return w, i, plan

    c = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    b = 0.1 * torch.randn(256)
    for T in (3, 17):
        x = torch.randn(T, 256)
        got, want = c(x, b), f(x, b)
        _same_route(got[:2], want[:2])
        for a, r in zip(got[2], want[2]):
            assert torch.equal(a, r)


# ----------------------------------------------------------------------------------------------------------------
# Shapes without caps (issue #48 item 4): the serving peers' kernels cap E (power of two, <= 512) and group sizes
# ----------------------------------------------------------------------------------------------------------------

#: (E, k, n_group, topk_group): up to 4096 experts, not powers of two, k up to 64, groups of any size.
UNCAPPED = [(4096, 64, 64, 8), (4096, 8, 32, 4), (4095, 64, 1, 1), (3000, 17, 1, 1), (896, 16, 8, 4),
            (288, 32, 1, 1), (160, 64, 1, 1), (100, 64, 5, 5), (96, 12, 12, 3)]


@needs_kernels
@pytest.mark.parametrize("E,k,n_group,topk_group", UNCAPPED)
def test_route_shapes_without_caps(E, k, n_group, topk_group):
    """DeepSeek-style sigmoid routing with a bias at E up to 4096 on the CPU kernels: random rows and integer-valued
    rows (exact ties within and between groups), equal to the reference; bf16 logits too."""
    g = torch.Generator().manual_seed(E + k)
    bias = 0.1 * torch.randn(E, generator=g)
    kw = dict(k=k, scoring="sigmoid", n_group=n_group, topk_group=topk_group, renormalize=True,
              routed_scaling_factor=2.5)
    k = kw.pop("k")
    x = torch.randn(37, E, generator=g)
    x[::5] = torch.randint(-2, 3, (8, E), generator=g).float()
    _same_route(_call(torch.ops.moe.route, x, bias, k, kw), _call(RR.route, x, bias, k, kw))
    xb = x.to(torch.bfloat16)
    _same_route(_call(torch.ops.moe.route, xb, bias, k, kw), _call(RR.route, xb, bias, k, kw))


@needs_kernels
@pytest.mark.parametrize("K,k", [(4096, 64), (5000, 64), (4095, 33), (2048, 32)])
def test_topk_renorm_shapes_without_caps(K, k):
    from moe_mlir import reference as R

    g = torch.Generator().manual_seed(K + k)
    x = torch.randn(21, K, generator=g)
    x[::4] = torch.randint(-3, 4, (6, K), generator=g).float()  # ties
    w, i = torch.ops.moe.topk_renorm(x, k, "logits", True)
    w_r, i_r = R.topk_renorm(x, k, "logits", True)
    assert torch.equal(i, i_r)
    torch.testing.assert_close(w, w_r, atol=2e-6, rtol=2e-5)
