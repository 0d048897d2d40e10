"""HF transformers' experts modules through ``moe.dispatch_plan`` (:mod:`moe_mlir.experts`): HF's own Qwen3-MoE,
Mixtral, OLMoE, DeepSeek-V3 (routed experts + shared experts) and gpt-oss blocks (tiny configs, random weights,
nothing downloaded) with the experts implementation ``"moe"`` equal HF's eager loop — outputs and the gradients of
the input, every parameter and the routing weights — at several token counts (T = 1 included) and on adversarial
routings (an expert no token hits, every token on one expert, k = E); and the entry points select it.

Tolerance: the dispatch path computes each row with the same operations as HF's loop, but one ``mm`` per expert
slice over a different number of rows than eager's ``linear`` on its gathered rows (BLAS blocking depends on the
row count) and the k-way sum as one reduction rather than successive ``index_add_`` s: f32 rounding differences
of a few ulps (seen: <= 1e-6 absolute on outputs of magnitude ~1), hence atol 1e-5, rtol 1e-5 (1e-4 for gradients
summed over many rows).
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
    assert len(log) == 1 and "dispatch_plan" in log[0].moe_ops()
    torch.testing.assert_close(out[0], ref(x)[0], atol=ATOL, rtol=RTOL)
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, **GRAD_TOL, msg=lambda s: f"{n}: {s}")
