"""HF transformers' experts modules through ``moe.dispatch_plan`` (:mod:`moe_mlir.experts`): HF's own Qwen3-MoE,
Mixtral, OLMoE, DeepSeek-V3 (routed experts + shared experts) and gpt-oss blocks (tiny configs, random weights,
nothing downloaded) with the experts implementation ``"moe"`` equal HF's eager loop — outputs and the gradients of
the input, every parameter and the routing weights — at several token counts (T = 1 included) and on adversarial
routings (an expert no token hits, every token on one expert, k = E); and the entry points select it.

Tolerance: both dispatch paths compute each row with the same operations as HF's loop, but the grouped path runs
one ``mm`` per expert slice over a different number of rows than eager's ``linear`` on its gathered rows (BLAS
blocking depends on the row count) and the k-way sum as one reduction rather than successive ``index_add_`` s, and
the fused loop (``expert_mlp``) orders an expert's rows by token rather than by slot: f32 rounding differences of a
few ulps (seen: <= 1e-6 absolute on outputs of magnitude ~1), hence atol 1e-5, rtol 1e-5 (1e-4 for gradients
summed over many rows; the backward recomputes the forward and sums in another order).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config, GptOssConfig, MixtralConfig, OlmoeConfig, Qwen3MoeConfig  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss  # noqa: E402
from transformers.models.mixtral import modeling_mixtral as mixtral  # noqa: E402
from transformers.models.olmoe import modeling_olmoe as olmoe  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3  # noqa: E402

import moe_mlir  # noqa: E402
from moe_mlir import experts as X  # noqa: E402
from moe_mlir.experts import common as XC, hf as XH  # noqa: E402
from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402

H, E, K, I = 32, 8, 2, 16
TOKENS = (1, 5, 37)
ATOL, RTOL = 1e-5, 1e-5
GRAD_TOL = dict(atol=1e-4, rtol=1e-4)


def _configs(e: int = E, k: int = K):
    common = dict(hidden_size=H, num_experts_per_tok=k)
    return {
        "qwen3_moe": (qwen3.Qwen3MoeSparseMoeBlock,
                      Qwen3MoeConfig(moe_intermediate_size=I, num_experts=e, norm_topk_prob=True, **common)),
        "mixtral": (mixtral.MixtralSparseMoeBlock, MixtralConfig(intermediate_size=I, num_local_experts=e, **common)),
        "olmoe": (olmoe.OlmoeSparseMoeBlock,
                  OlmoeConfig(intermediate_size=I, num_experts=e, norm_topk_prob=False, **common)),
        # n_group=1: k may be anything up to E (the group-limited routing is tested in test_hf_models.py)
        "deepseek_v3": (deepseek.DeepseekV3MoE,
                        DeepseekV3Config(moe_intermediate_size=I, n_routed_experts=e, n_group=1, topk_group=1,
                                         n_shared_experts=1, norm_topk_prob=True, **common)),
        # gpt-oss: experts stored transposed ([E, D, 2I], [E, I, D]), with biases and an interleaved, clamped GLU
        # (its own _apply_gate): the same [T, D] / [T, k] interface, handled by the same path.
        "gpt_oss": (gpt_oss.GptOssMLP, GptOssConfig(intermediate_size=I, num_local_experts=e, **common)),
    }


NAMES = list(_configs())


def _block(name: str, seed: int, e: int = E, k: int = K) -> torch.nn.Module:
    cls, cfg = _configs(e, k)[name]
    m = cls(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def _experts(m: torch.nn.Module) -> torch.nn.Module:
    (ex,) = X.hf_experts_modules(m)
    return ex


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _run(m, x, moe: bool):
    if moe:
        with X.use_moe_experts(m) as switched:
            assert switched == [_experts(m)]
            return _flat(m(x))
    return _flat(m(x))


def test_the_models_have_hf_experts_modules():
    for name in NAMES:
        m = _block(name, 0)
        ex = _experts(m)
        assert ex.config._experts_implementation is None  # a standalone block: HF's default, the eager loop
        assert (ex.is_transposed, ex.has_bias) == ((True, True) if name == "gpt_oss" else (False, False))


@pytest.mark.parametrize("name", NAMES)
def test_block_output_and_gradients_equal_eager(name):
    m = _block(name, 1)
    for t in TOKENS:
        x = torch.randn(2, t, H, generator=torch.Generator().manual_seed(t))
        outs, grads = [], []
        for moe in (False, True):
            m.zero_grad()
            xi = x.clone().requires_grad_(True)
            out = _run(m, xi, moe)
            sum((o.float() * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in out).backward()
            outs.append([o.detach() for o in out])
            grads.append([xi.grad] + [p.grad.clone() for p in m.parameters()])
        for a, b in zip(*outs):
            torch.testing.assert_close(b, a, atol=ATOL, rtol=RTOL, msg=lambda s: f"{name} T={t}: {s}")
        names = ["input"] + [n for n, _ in m.named_parameters()]
        for n, a, b in zip(names, *grads):
            torch.testing.assert_close(b, a, **GRAD_TOL, msg=lambda s: f"{name} T={t} grad {n}: {s}")
        assert _experts(m).config._experts_implementation is None  # restored


def _direct(ex, x, idx, w, moe: bool):
    if moe:
        return X.hf_experts_forward(ex, x, idx, w)
    return type(ex).forward.__wrapped__(ex, x, idx, w)  # HF's eager loop (the undecorated forward)


ROUTINGS = {
    "expert 3 hit by no token": lambda t, e, k: torch.stack(
        [torch.tensor([j for j in range(e) if j != 3])[torch.randperm(e - 1)[:k]] for _ in range(t)]),
    "every token on expert 5 (and k-1 others)": lambda t, e, k: torch.stack(
        [torch.cat([torch.tensor([5]), torch.tensor([j for j in range(e) if j != 5])[torch.randperm(e - 1)[:k - 1]]])
         for _ in range(t)]),
    "k = E": lambda t, e, k: torch.stack([torch.randperm(e) for _ in range(t)]),
    "random": lambda t, e, k: torch.stack([torch.randperm(e)[:k] for _ in range(t)]),
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_experts_on_adversarial_routings(name, routing):
    """The experts module called directly with given indices and weights: output and gradients of the hidden
    states, the expert weights and the routing weights equal HF's loop."""
    k = E if routing == "k = E" else 3
    ex = _experts(_block(name, 2, k=k))
    torch.manual_seed(7)
    for t in TOKENS:
        idx = ROUTINGS[routing](t, E, k)
        w0 = torch.rand(t, k)
        x0 = torch.randn(t, H)
        res = []
        for moe in (False, True):
            ex.zero_grad()
            x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
            out = _direct(ex, x, idx, w, moe)
            (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
            res.append([out.detach(), x.grad, w.grad] + [p.grad.clone() for p in ex.parameters()])
        labels = ["output", "grad hidden", "grad weights"] + [f"grad {n}" for n, _ in ex.named_parameters()]
        for lab, a, b in zip(labels, *res):
            tol = dict(atol=ATOL, rtol=RTOL) if lab == "output" else GRAD_TOL
            torch.testing.assert_close(b, a, **tol, msg=lambda s: f"{name} {routing} T={t} {lab}: {s}")
        if routing.startswith("expert 3"):  # no row reached expert 3: its weights get an exact zero gradient
            assert all(p.grad[3].abs().max() == 0 for p in ex.parameters())


def test_all_tokens_to_one_expert_k1():
    """k = 1, every token on the same expert: one GEMM over all rows, the other experts skipped."""
    ex = _experts(_block("qwen3_moe", 3, k=1))
    x = torch.randn(9, H)
    idx = torch.full((9, 1), 6)
    w = torch.rand(9, 1)
    torch.testing.assert_close(_direct(ex, x, idx, w, True), _direct(ex, x, idx, w, False), atol=ATOL, rtol=RTOL)


def test_zero_tokens():
    ex = _experts(_block("mixtral", 4))
    out = X.hf_experts_forward(ex, torch.randn(0, H), torch.zeros(0, K, dtype=torch.long), torch.zeros(0, K))
    assert out.shape == (0, H)


def test_out_of_range_index_is_an_error():
    ex = _experts(_block("qwen3_moe", 5))
    idx = torch.tensor([[0, E]])
    with pytest.raises(ValueError, match="outside"):
        X.hf_experts_forward(ex, torch.randn(1, H), idx, torch.rand(1, K))


def test_bad_shapes_are_errors():
    with pytest.raises(ValueError, match="top_k_index"):
        X.dispatch_experts(torch.randn(4, H), torch.zeros(4, 2, dtype=torch.long), torch.zeros(4, 3),
                           torch.randn(E, 2 * I, H), torch.randn(E, H, I), torch.relu)
    with pytest.raises(ValueError, match="K = "):
        X.grouped_mm(torch.randn(4, 5), torch.randn(2, 6, 3), torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="offsets"):
        X.grouped_mm(torch.randn(4, 5), torch.randn(2, 5, 3), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="number of rows"):
        X.grouped_mm(torch.randn(4, 5), torch.randn(2, 5, 3), torch.tensor([0, 1, 3]))


def test_bad_dtypes_are_type_errors():
    with pytest.raises(TypeError, match="x is torch.float32 but w is torch.float64"):
        X.grouped_mm(torch.randn(4, 5), torch.randn(2, 5, 3, dtype=torch.float64), torch.tensor([0, 2, 4]))
    with pytest.raises(TypeError, match="offsets must be int32 or int64, got torch.float32"):
        X.grouped_mm(torch.randn(4, 5), torch.randn(2, 5, 3), torch.tensor([0.0, 2.0, 4.0]))


def test_grouped_mm_matches_per_expert_matmul_and_opcheck():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(10, 5, generator=g, dtype=torch.float64)
    w = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    offsets = torch.tensor([0, 3, 3, 10, 10], dtype=torch.int32)  # experts 1 and 3 get no rows
    want = torch.cat([x[0:3] @ w[0], x[3:10] @ w[2]])
    torch.testing.assert_close(X.grouped_mm(x, w, offsets), want)
    x.requires_grad_(True)
    w.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: X.grouped_mm(a, b, offsets), (x, w))
    torch.library.opcheck(torch.ops.moe_mlir.grouped_mm.default, (x, w, offsets))


def test_expert_parallel_modules_run_hf_eager():
    """Expert parallelism (sentinel index E) is not handled by the dispatch path: HF's own loop runs."""
    ex = _experts(_block("qwen3_moe", 6))
    ex._is_expert_parallel = True
    x, w = torch.randn(3, H), torch.rand(3, K)
    idx = torch.tensor([[0, E], [1, 2], [E, 3]])
    torch.testing.assert_close(X.hf_experts_forward(ex, x, idx, w), _direct(ex, x, idx, w, False))


def test_use_moe_experts_keeps_an_explicit_choice_and_restores():
    m = _block("qwen3_moe", 7)
    ex = _experts(m)
    ex.config._experts_implementation = "batched_mm"
    with X.use_moe_experts(m) as switched:
        assert switched == [] and ex.config._experts_implementation == "batched_mm"
    ex.config._experts_implementation = "eager"
    with X.use_moe_experts(m) as switched:
        assert switched == [ex] and ex.config._experts_implementation == "moe"
    assert ex.config._experts_implementation == "eager"


def test_registered_as_a_transformers_implementation():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert X.register()
    assert ALL_EXPERTS_FUNCTIONS["moe"] is X.hf_experts_forward
    m = _block("mixtral", 8)
    x = torch.randn(1, 6, H)
    want = _flat(m(x))[0]
    _experts(m).config._experts_implementation = "moe"  # HF's own switch
    torch.testing.assert_close(_flat(m(x))[0], want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["qwen3_moe", "gpt_oss", "deepseek_v3"])
def test_moe_mlir_compile_uses_the_dispatch_plan(name):
    """``moe_mlir.compile``: one graph per token-count regime (no graph break at the expert loop), the experts
    dispatched through ``moe.dispatch_plan``, equal to eager; the model's config untouched between calls."""
    torch._dynamo.reset()
    m = _block(name, 9).eval()
    c = moe_mlir.compile(m, dense="eager")
    assert isinstance(c, X.SelectedExperts) and c._orig_mod is m
    with capture_graphs() as log, torch.no_grad():
        for t in (5, 1, 12):
            x = torch.randn(2, t, H)
            for a, b in zip(_flat(c(x)), _flat(m(x))):
                torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL, msg=lambda s: f"T={t}: {s}")
            assert _experts(m).config._experts_implementation is None
    assert len(log) == 3 and all(g.fallback is None for g in log)  # T=5 static, T=1 specialized, T=12 dynamic
    assert all("dispatch_plan" in g.moe_ops() for g in log), [g.graph_module.code for g in log]
    assert all("moe_mlir.expert_mlp" in g.graph_module.code for g in log)  # the fused loop, one opaque op


def test_torch_compile_with_use_moe_experts_and_training():
    """``torch.compile(m, backend="moe")`` inside :func:`use_moe_experts`: a single graph with the dispatch plan,
    and a backward through inductor equal to eager's."""
    torch._dynamo.reset()
    m = _block("qwen3_moe", 10)
    ref = _block("qwen3_moe", 10)
    x = torch.randn(1, 7, H, generator=torch.Generator().manual_seed(10))
    with capture_graphs() as log, X.use_moe_experts(m):
        out = torch.compile(m, backend="moe")(x)
    out[0].square().sum().backward()
    ref(x)[0].square().sum().backward()
    assert len(log) == 1 and "dispatch_plan" in log[0].moe_ops() and "moe_mlir.expert_mlp" in log[0].graph_module.code
    torch.testing.assert_close(out[0], ref(x)[0], atol=ATOL, rtol=RTOL)
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, **GRAD_TOL, msg=lambda s: f"{n}: {s}")


# ----------------------------------------------------------------------------------------------------------------
# moe_mlir::expert_mlp: the fused per-expert loop behind the known gates
# ----------------------------------------------------------------------------------------------------------------


def _gate_ref(h, gate, alpha, limit):
    if gate == "silu_glu":
        g, u = h.chunk(2, dim=-1)
        return torch.nn.functional.silu(g) * u
    g, u = h[..., 0::2].clamp(max=limit), h[..., 1::2].clamp(min=-limit, max=limit)  # gpt-oss's _apply_gate
    return (u + 1) * (g * torch.sigmoid(g * alpha))


def _mlp_ref(x, token, offsets, rw, w1, w2, gate, b1=None, b2=None, alpha=1.0, limit=float("inf")):
    """Row by row: out[token[r]] += rw[r] * expert_e(x[token[r]]), in increasing row order."""
    out = [torch.zeros(w2.shape[1], dtype=x.dtype) for _ in range(x.shape[0])]
    o = offsets.tolist()
    for e in range(w1.shape[0]):
        for r in range(o[e], o[e + 1]):
            t = int(token[r])
            h = w1[e] @ x[t] + (0 if b1 is None else b1[e])
            y = w2[e] @ _gate_ref(h, gate, alpha, limit) + (0 if b2 is None else b2[e])
            out[t] = out[t] + rw[r] * y
    return torch.stack(out) if out else torch.zeros(0, w2.shape[1], dtype=x.dtype)


def _mlp_inputs(gate, bias, t=6, e=4, d=5, i=3, n=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=g, dtype=dtype)
    token = torch.tensor([0, 3, 5, 1, 2, 3, 4, 0, 5], dtype=torch.long)[: min(9, 2 * t)] % max(t, 1)
    offsets = torch.tensor([0, 3, 3, 7, token.numel()])  # expert 1 gets no rows
    rw = torch.rand(token.numel(), generator=g, dtype=dtype)
    w1 = torch.randn(e, 2 * i, d, generator=g, dtype=dtype)
    w2 = torch.randn(e, n, i, generator=g, dtype=dtype)
    b1 = torch.randn(e, 2 * i, generator=g, dtype=dtype) if bias else None
    b2 = torch.randn(e, n, generator=g, dtype=dtype) if bias else None
    kw = dict(alpha=1.702, limit=0.8) if gate == "clamped_glu" else {}
    return (x, token, offsets, rw, w1, w2, gate), dict(b1=b1, b2=b2, **kw)


@pytest.mark.parametrize("gate", X.GATES)
@pytest.mark.parametrize("bias", [False, True])
def test_expert_mlp_equals_the_row_by_row_reference_gradcheck_and_opcheck(gate, bias):
    args, kw = _mlp_inputs(gate, bias)
    torch.testing.assert_close(X.expert_mlp(*args, **kw), _mlp_ref(*args, **kw))
    x, token, offsets, rw, w1, w2, _ = args
    diff = [x, rw, w1, w2] + [b for b in (kw["b1"], kw["b2"]) if b is not None]
    for tensor in diff:
        tensor.requires_grad_(True)

    def f(x, rw, w1, w2, *b):
        kw2 = dict(kw, b1=b[0] if b else None, b2=b[1] if b else None)
        return X.expert_mlp(x, token, offsets, rw, w1, w2, gate, **kw2)

    assert torch.autograd.gradcheck(f, tuple(diff))
    torch.library.opcheck(torch.ops.moe_mlir.expert_mlp.default,
                          (x, token, offsets, rw, w1, kw["b1"], w2, kw["b2"], gate, kw.get("alpha", 1.0),
                           kw.get("limit", float("inf"))))


def test_expert_mlp_clamped_glu_gradient_at_and_beyond_the_limit_is_torch_clamps():
    """Pre-activations exactly at +-limit and beyond it: the backward's masks are torch's clamp gradient (0 at the
    bounds and beyond), compared with autograd of gpt-oss's gate."""
    limit, alpha = 0.5, 1.702
    x = torch.eye(4, dtype=torch.float64)
    w1 = torch.tensor([[[0.5, -0.5, 2.0, -2.0]] * 2 + [[-0.5, 0.5, -3.0, 0.25]] * 2], dtype=torch.float64)  # [1,4,4]
    w2 = torch.tensor([[[1.0, -2.0]]], dtype=torch.float64)
    token, offsets, rw = torch.arange(4), torch.tensor([0, 4]), torch.tensor([1.0, 0.5, 2.0, 1.5], dtype=torch.float64)
    grads = []
    for fused in (True, False):
        w1_ = w1.clone().requires_grad_(True)
        x_ = x.clone().requires_grad_(True)
        if fused:
            out = X.expert_mlp(x_, token, offsets, rw, w1_, w2, "clamped_glu", alpha=alpha, limit=limit)
        else:
            out = _mlp_ref(x_, token, offsets, rw, w1_, w2, "clamped_glu", alpha=alpha, limit=limit)
        out.sum().backward()
        grads.append((out.detach(), x_.grad, w1_.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    assert (grads[0][2] == 0).any()  # some pre-activations were clamped: their gradient is exactly zero


def test_expert_mlp_non_contiguous_weights_equal_contiguous():
    """Weights as strided views (gpt-oss's transposed storage, every other expert of a larger tensor): no copy
    needed, same results as their contiguous copies, gradients land in the base tensors."""
    args, kw = _mlp_inputs("silu_glu", True, dtype=torch.float32)
    x, token, offsets, rw, w1, w2, gate = args
    w1_base = torch.randn(2 * w1.shape[0], w1.shape[2], w1.shape[1])  # [2E, D, 2I]: transposed and strided
    w1_view = w1_base[::2].transpose(1, 2)
    w2_base = torch.randn(w2.shape[0], w2.shape[2], w2.shape[1]).requires_grad_(True)
    w2_view = w2_base.transpose(1, 2)
    assert not w1_view.is_contiguous() and not w2_view.is_contiguous()
    got = X.expert_mlp(x, token, offsets, rw, w1_view, w2_view, gate, **kw)
    want = X.expert_mlp(x, token, offsets, rw, w1_view.contiguous(), w2_view.contiguous(), gate, **kw)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got, _mlp_ref(x, token, offsets, rw, w1_view, w2_view, gate, **kw),
                               atol=1e-5, rtol=1e-5)
    got.square().sum().backward()
    w2_ref = w2_view.detach().clone().requires_grad_(True)
    _mlp_ref(x, token, offsets, rw, w1_view, w2_ref, gate, **kw).square().sum().backward()
    torch.testing.assert_close(w2_base.grad.transpose(1, 2), w2_ref.grad, atol=1e-4, rtol=1e-4)


def test_expert_mlp_buffers_are_not_shared_between_calls_or_with_autograd():
    """The per-call scratch buffers: two calls' outputs do not alias, the first is unchanged by the second, and
    backward through both (interleaved with a third forward) gives each call's own gradients."""
    args, kw = _mlp_inputs("silu_glu", False, dtype=torch.float64)
    x, token, offsets, rw, w1, w2, gate = args
    xa, xb = x.clone().requires_grad_(True), (2 * x).requires_grad_(True)
    oa = X.expert_mlp(xa, token, offsets, rw, w1, w2, gate)
    oa_copy = oa.detach().clone()
    ob = X.expert_mlp(xb, token, offsets, rw, w1, w2, gate)
    assert oa.untyped_storage().data_ptr() != ob.untyped_storage().data_ptr()
    torch.testing.assert_close(oa.detach(), oa_copy, atol=0, rtol=0)
    (oa.sum() + 2 * ob.sum()).backward()
    X.expert_mlp(x, token, offsets, rw, w1, w2, gate)
    for xi, scale in ((xa, 1.0), (xb, 2.0)):
        xr = xi.detach().clone().requires_grad_(True)
        (scale * _mlp_ref(xr, token, offsets, rw, w1, w2, gate)).sum().backward()
        torch.testing.assert_close(xi.grad, xr.grad)


def test_expert_mlp_nan_stays_in_its_token_and_zero_rows():
    args, kw = _mlp_inputs("silu_glu", True, dtype=torch.float32)
    x, token, offsets, rw, w1, w2, gate = args
    x = x.clone()
    x[2, 1] = float("nan")  # token 2 is row 4 (expert 2)
    out = X.expert_mlp(x, token, offsets, rw, w1, w2, gate, **kw)
    assert out[2].isnan().all() and not out[torch.arange(6) != 2].isnan().any()
    torch.testing.assert_close(out[torch.arange(6) != 2],
                               _mlp_ref(x, token, offsets, rw, w1, w2, gate, **kw)[torch.arange(6) != 2])
    empty = X.expert_mlp(torch.randn(0, 5), torch.zeros(0, dtype=torch.long), torch.zeros(5, dtype=torch.long),
                         torch.zeros(0), w1.float(), w2.float(), gate)
    assert empty.shape == (0, w2.shape[1])


def test_expert_mlp_bad_inputs_are_errors():
    args, kw = _mlp_inputs("silu_glu", False)
    x, token, offsets, rw, w1, w2, gate = args
    with pytest.raises(ValueError, match="gate must be one of"):
        X.expert_mlp(x, token, offsets, rw, w1, w2, "gelu")
    with pytest.raises(ValueError, match="do not fit"):
        X.expert_mlp(x, token, offsets, rw, w1, w2[:, :, :2], gate)
    with pytest.raises(ValueError, match="offsets"):
        X.expert_mlp(x, token, offsets[:-1], rw, w1, w2, gate)
    with pytest.raises(ValueError, match="number of rows"):
        X.expert_mlp(x, token, torch.tensor([0, 1, 1, 2, 3]), rw, w1, w2, gate)
    with pytest.raises(ValueError, match="b1 must be"):
        X.expert_mlp(x, token, offsets, rw, w1, w2, gate, b1=torch.zeros(4, 5, dtype=x.dtype))
    with pytest.raises(TypeError, match="dtype"):
        X.expert_mlp(x.float(), token, offsets, rw, w1, w2, gate)
    with pytest.raises(TypeError, match="token must be int32 or int64, got torch.float32"):
        X.expert_mlp(x, token.float(), offsets, rw, w1, w2, gate)
    with pytest.raises(TypeError, match="offsets must be int32 or int64"):
        X.expert_mlp(x, token, offsets.float(), rw, w1, w2, gate)
    with pytest.raises(TypeError, match="row_weight must be floating-point"):
        X.expert_mlp(x, token, offsets, rw.long(), w1, w2, gate)


def _routed_mlp_inputs(t, e, k, gate, bias, seed, d=24, i=8, n=24, transposed=False):
    """A routing's expert-sorted rows (topk of random logits, several experts without rows when T * k < E)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, generator=g)
    idx = torch.randn(t, e, generator=g).topk(k, dim=-1).indices.flatten()
    order = torch.sort(idx, stable=True).indices
    token = order // k
    offsets = torch.zeros(e + 1, dtype=torch.long)
    offsets[1:] = torch.bincount(idx, minlength=e).cumsum(0)
    rw = torch.rand(t * k, generator=g)
    w1 = torch.randn(e, 2 * i, d, generator=g) / d ** 0.5
    w2 = torch.randn(e, n, i, generator=g) / i ** 0.5
    if transposed:  # gpt-oss's storage: [E, D, 2I] and [E, I, N] viewed as [E, 2I, D] and [E, N, I]
        w1, w2 = w1.transpose(1, 2).contiguous().transpose(1, 2), w2.transpose(1, 2).contiguous().transpose(1, 2)
    b1 = torch.randn(e, 2 * i, generator=g) if bias else None
    b2 = torch.randn(e, n, generator=g) if bias else None
    kw = dict(alpha=1.702, limit=0.8) if gate == "clamped_glu" else {}
    return (x, token, offsets, rw, w1, w2, gate), dict(b1=b1, b2=b2, **kw)


def _mlp_and_grads(args, kw, native):
    """expert_mlp's output and the gradients of x, row_weight, w1, w2 (and the biases) on its kernel or its loop."""
    x, token, offsets, rw, w1, w2, gate = args
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, rw, w1, w2)]
    biases = {n: (b.detach().clone().requires_grad_(True) if b is not None else None) for n, b in
              (("b1", kw["b1"]), ("b2", kw["b2"]))}
    old, XC.NATIVE_MLP = XC.NATIVE_MLP, native
    try:
        assert XC._native_mlp(x) == native
        out = X.expert_mlp(leaves[0], token, offsets, leaves[1], leaves[2], leaves[3], gate,
                           **dict(kw, **biases))
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    finally:
        XC.NATIVE_MLP = old
    return [out.detach()] + [t.grad for t in leaves] + [b.grad for b in biases.values() if b is not None]


@pytest.mark.skipif(not XC._native_mlp(torch.zeros(1)), reason="the torch extension is not built")
@pytest.mark.parametrize("gate", X.GATES)
@pytest.mark.parametrize("t,e,k", [(1, 16, 4), (7, 16, 2), (64, 32, 8), (33, 4, 4), (3, 64, 1)])
def test_expert_mlp_kernel_equals_its_python_loop(gate, t, e, k):
    """lib/Runtime/Torch/ExpertOps.cpp (f32: the experts over torch's threads, BLAS on scratch) against the op's
    Python loop on real routings: decode (T = 1), experts without rows, k = E, one row per expert; with biases and
    transposed weights for gpt-oss's gate. Output and every gradient."""
    bias = gate == "clamped_glu"
    args, kw = _routed_mlp_inputs(t, e, k, gate, bias, seed=t * 100 + e, transposed=bias)
    got, want = _mlp_and_grads(args, kw, native=True), _mlp_and_grads(args, kw, native=False)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **GRAD_TOL)


@pytest.mark.skipif(not XC._native_mlp(torch.zeros(1)), reason="the torch extension is not built")
def test_expert_mlp_kernel_sums_in_expert_order_whatever_the_threads():
    """Each token's rows are summed in increasing expert order from zero (eager's index_add_ order), not in the
    order threads finish: the same bits with 1 and 2 threads and on every call, at a size that spreads the experts
    over the threads."""
    args, kw = _routed_mlp_inputs(256, 64, 8, "silu_glu", False, seed=5, d=64, i=32, n=64)
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2, 2):
            torch.set_num_threads(n)
            runs.append(_mlp_and_grads(args, kw, native=True))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


@pytest.mark.skipif(not XC._native_mlp(torch.zeros(1)), reason="the torch extension is not built")
@pytest.mark.parametrize("threads", [1, 2])
def test_expert_mlp_idle_experts_weight_gradients_are_zeros_in_reused_memory(threads):
    """The backward kernel writes w1's and w2's gradients by GEMM for the experts with rows and zeros the idle
    experts' slices (no zero fill of the whole gradient first): on memory that held NaN, the 3 tokens' 61+ idle
    experts among 64 get exact zeros and every gradient equals the Python loop's."""
    args, kw = _routed_mlp_inputs(3, 64, 2, "silu_glu", True, seed=9, d=32, i=16, n=32)
    x, token, offsets, rw, w1, w2, gate = args
    grad = torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
    want = _mlp_and_grads(args, kw, native=False)
    idle = (offsets[1:] == offsets[:-1]).nonzero().flatten().tolist()
    assert len(idle) >= 58
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(3):
            for t in [torch.full(s, float("nan")) for s in (w1.shape, w2.shape)]:
                del t
            gx, grw, gw1, gb1, gw2, gb2 = torch.ops.moe_mlir.expert_mlp_backward_cpu(
                grad, x, token, offsets, rw, w1, kw["b1"], w2, kw["b2"], gate, 1.0, float("inf"))
            for g in (gw1, gw2, gb1, gb2):
                assert not g.isnan().any()
                assert torch.equal(g[idle], torch.zeros_like(g[idle]))
    finally:
        torch.set_num_threads(old)
    # the same kernel through the op's autograd against the Python loop (all gradients)
    got = _mlp_and_grads(args, kw, native=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not XC._native_mlp(torch.zeros(1)), reason="the torch extension is not built")
def test_expert_mlp_kernel_rejects_bad_operands_before_reading_them():
    """Called directly (torch.ops.moe_mlir.expert_mlp_cpu skips the Python checks): tokens outside [0, T), offsets
    that decrease or do not end at S, other dtypes and zero-sized dimensions give the kernel's own message."""
    args, kw = _routed_mlp_inputs(5, 4, 2, "silu_glu", False, seed=1)
    x, token, offsets, rw, w1, w2, gate = args
    op = torch.ops.moe_mlir.expert_mlp_cpu

    def call(**over):
        a = dict(x=x, token=token, offsets=offsets, rw=rw, w1=w1, w2=w2, gate=gate)
        a.update(over)
        return op(a["x"], a["token"], a["offsets"], a["rw"], a["w1"], None, a["w2"], None, a["gate"], 1.0,
                  float("inf"))

    bad = token.clone()
    bad[3] = 5
    with pytest.raises(ValueError, match=r"token holds 5, outside \[0, 5\)"):
        call(token=bad)
    bad[3] = -1
    with pytest.raises(ValueError, match=r"token holds -1"):
        call(token=bad)
    with pytest.raises(ValueError, match="must not decrease"):
        call(offsets=torch.tensor([0, 6, 4, 8, 10]))
    with pytest.raises(ValueError, match="from 0 to the number of rows 10"):
        call(offsets=torch.tensor([0, 2, 4, 8, 9]))
    with pytest.raises(TypeError, match="float32 or float64"):
        call(x=x.half())
    with pytest.raises(ValueError, match="gate must be one of"):
        call(gate="relu")
    with pytest.raises(ValueError, match="do not fit"):
        call(w2=w2[:, :, :3])
    # zero-sized features: D = 0 (the hidden is the bias-free zero), N = 0
    out = call(x=x[:, :0], w1=w1[:, :, :0])
    assert out.shape == (5, w2.shape[1]) and torch.equal(out, torch.zeros_like(out))
    assert call(w2=w2[:, :0]).shape == (5, 0)


def test_the_gates_taken_by_the_fused_loop_and_the_others():
    """HF's default gate with SiLU and gpt-oss's gate run the fused loop; another activation, a subclass's own gate
    or a post-expert norm keep the generic path: all equal HF's own implementations."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert XH._known_gate(_experts(_block("mixtral", 0))) == ("silu_glu", 1.0, float("inf"))
    ex = _experts(_block("gpt_oss", 0))
    assert XH._known_gate(ex) == ("clamped_glu", ex.alpha, ex.limit)
    gelu = MixtralConfig(hidden_size=H, num_experts_per_tok=K, intermediate_size=I, num_local_experts=E,
                         hidden_act="gelu")

    class OwnGate(mixtral.MixtralExperts):
        def _apply_gate(self, gate_up):
            g, u = gate_up.chunk(2, dim=-1)
            return torch.tanh(g) * u

    for ex in (mixtral.MixtralExperts(gelu), OwnGate(_configs()["mixtral"][1])):
        with torch.no_grad():
            for p in ex.parameters():
                p.normal_(0, 0.3)
        assert XH._known_gate(ex) is None
        idx, w, x = torch.stack([torch.randperm(E)[:K] for _ in range(9)]), torch.rand(9, K), torch.randn(9, H)
        # HF's eager loop calls act_fn itself (not _apply_gate): the subclass's gate is HF's batched_mm's business
        want = (ALL_EXPERTS_FUNCTIONS["batched_mm"](ex, x, idx, w) if isinstance(ex, OwnGate)
                else _direct(ex, x, idx, w, False))
        torch.testing.assert_close(_direct(ex, x, idx, w, True), want, atol=ATOL, rtol=RTOL)
    ex = _experts(_block("qwen3_moe", 0))
    ex.has_post_expert_norm = True
    assert XH._known_gate(ex) is None
