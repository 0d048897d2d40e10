"""Acceptance on code no one here wrote: HF ``transformers`` sparse-MoE blocks and routers (tiny configs, random
weights, nothing downloaded), and the five seed blocks, through both entry points of the default path:
``torch.compile(m, backend="moe")`` (torch.compile's defaults: automatic dynamic shapes, graph breaks at the
data-dependent expert loop) and ``moe_mlir.compile(m)``. Each equals eager at three token counts, and the routers'
softmax→topk→renorm / topk→softmax are asserted raised to ``torch.ops.moe.topk_renorm`` in the graphs the backend
compiled.

Where an HF router and the moe op differ, what is true is tested: ties (torch's top-k order is unspecified, the moe
op takes the lowest index), a bf16 softmax (not raised: the op computes in f32), DeepSeek-V3's sigmoid + group-limited
routing (raised to ``moe.route``), ``topk(sorted=False)`` (compared as sets).

Test time: inductor's C++ compile of every graph (a data-dependent expert loop gives several) costs seconds each on
a 2-core machine, so the routers, the Qwen3-MoE block and the training test go through inductor (the default), and
the other blocks through ``dense="eager"`` (the same raising, fake kernels, dynamic shapes and graph breaks, with
AOTAutograd running the raised graph uncompiled).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (DeepseekV3Config, GptOssConfig, MixtralConfig, OlmoeConfig,  # noqa: E402
                          Qwen3MoeConfig)
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss  # noqa: E402
from transformers.models.mixtral import modeling_mixtral as mixtral  # noqa: E402
from transformers.models.olmoe import modeling_olmoe as olmoe  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3  # noqa: E402

import moe_mlir  # noqa: E402
from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402
from moe_mlir.models import acmoe, attention_inform, hyper_router, similarity_inform, symphony  # noqa: E402

H, E, K, I = 32, 8, 2, 16
#: Where the ``*_matches_eager`` tests run the models (the GPU check runs them with ``cuda``).
DEV = os.environ.get("MOE_TEST_DEVICE", "cpu")
TOKENS = (5, 1, 12)  # the first compile is static, the second recompiles with a symbolic token count


def _init(m: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m.eval()


def _configs():
    common = dict(hidden_size=H, num_experts_per_tok=K)
    return {
        "mixtral": (mixtral.MixtralSparseMoeBlock, mixtral.MixtralTopKRouter,
                    MixtralConfig(intermediate_size=I, num_local_experts=E, **common)),
        "qwen3_moe": (qwen3.Qwen3MoeSparseMoeBlock, qwen3.Qwen3MoeTopKRouter,
                      Qwen3MoeConfig(moe_intermediate_size=I, num_experts=E, norm_topk_prob=True, **common)),
        "olmoe": (olmoe.OlmoeSparseMoeBlock, olmoe.OlmoeTopKRouter,
                  OlmoeConfig(intermediate_size=I, num_experts=E, norm_topk_prob=False, **common)),
        "gpt_oss": (gpt_oss.GptOssMLP, gpt_oss.GptOssTopKRouter,
                    GptOssConfig(intermediate_size=I, num_local_experts=E, **common)),
        "deepseek_v3": (deepseek.DeepseekV3MoE, deepseek.DeepseekV3TopkRouter,
                        DeepseekV3Config(moe_intermediate_size=I, n_routed_experts=E, n_group=4, topk_group=2,
                                         n_shared_experts=1, norm_topk_prob=True, **common)),
    }


CONFIGS = _configs()
#: The idiom each router is raised from (None: not raised, see the module doc).
RAISED = {"mixtral": "softmax->topk->renorm", "qwen3_moe": "softmax->topk->renorm", "olmoe": "softmax->topk",
          "gpt_oss": "topk->softmax", "deepseek_v3": "sigmoid+bias->group mask->topk->gather->renorm->scale"}
#: The op each router is raised to (test_routing_raising.py tests DeepSeek-V3's moe.route further).
RAISED_OP = {"deepseek_v3": "route"}


#: Blocks whose dense code goes through inductor in these tests (see the module doc).
INDUCTOR_BLOCKS = {"qwen3_moe"}


def _entry_points(m: torch.nn.Module, dense: str = "inductor"):
    return {"torch.compile": torch.compile(m, backend="moe", options={"dense": dense}),
            "moe_mlir.compile": moe_mlir.compile(m, dense=dense)}


def _compare(model, dense, tokens, make_x, check) -> list:
    """Both entry points at each token count: ``check(entry, t, compiled(x), model(x))``; returns the graphs the
    backend compiled."""
    torch._dynamo.reset()
    model = model.to(DEV)
    with capture_graphs() as log:
        for entry, c in _entry_points(model, dense).items():
            for t in tokens:
                x = make_x(t).to(DEV)
                with torch.no_grad():
                    check(entry, t, c(x), model(x))
    return log


def _check_outputs(entry, t, got, want) -> None:
    got, want = _flat(got), _flat(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4, msg=lambda m: f"{entry}, T={t}: {m}")


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _sorted_by_index(w: torch.Tensor, i: torch.Tensor):
    order = i.argsort(dim=-1)
    return w.gather(-1, order), i.gather(-1, order)


def _check_router(name: str, got, want) -> None:
    logits, w, i = got
    logits_e, w_e, i_e = want
    torch.testing.assert_close(logits, logits_e)
    assert w.dtype == w_e.dtype and i.dtype == i_e.dtype == torch.int64
    if name == "deepseek_v3":  # topk(sorted=False): any order; compare as sets
        w, i = _sorted_by_index(w, i)
        w_e, i_e = _sorted_by_index(w_e, i_e)
    assert torch.equal(i, i_e)
    torch.testing.assert_close(w, w_e, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_router_matches_eager_and_is_raised(name):
    _, router_cls, cfg = CONFIGS[name]
    router = _init(router_cls(cfg), seed=1)
    log = _compare(router, "inductor", TOKENS, lambda t: torch.randn(t, H),
                   lambda entry, t, got, want: _check_router(name, got, want))
    raised = [op for g in log for op in g.moe_ops()]
    assert log and all(g.fallback is None for g in log)
    if RAISED[name] is None:
        assert raised == []
    else:  # every graph (static, then symbolic token count; both entry points) has the router raised
        op = RAISED_OP.get(name, "topk_renorm")
        assert raised == [op] * len(log), [g.graph_module.code for g in log]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hf_sparse_moe_block_matches_eager(name):
    block_cls, _, cfg = CONFIGS[name]
    block = _init(block_cls(cfg), seed=2)
    log = _compare(block, "inductor" if name in INDUCTOR_BLOCKS else "eager", TOKENS, lambda t: torch.randn(2, t, H),
                   _check_outputs)
    assert all(g.fallback is None for g in log)
    n_raised = sum(g.counts.get(RAISED_OP.get(name, "topk_renorm"), 0) for g in log)
    assert (n_raised > 0) == (RAISED[name] is not None)


def test_hf_block_backward_through_the_raised_router():
    """Training: the raised topk_renorm's recompute backward gives the router weight the same gradient as eager."""
    torch._dynamo.reset()
    block_cls, _, cfg = CONFIGS["qwen3_moe"]
    block = _init(block_cls(cfg), seed=3).train()
    ref = _init(block_cls(cfg), seed=3).train()
    x = torch.randn(1, 6, H, generator=torch.Generator().manual_seed(3))
    with capture_graphs() as log:
        torch.compile(block, backend="moe")(x).square().sum().backward()
    ref(x).square().sum().backward()
    assert any("topk_renorm" in g.moe_ops() for g in log)
    # The op's backward differentiates its own f32 formula (softmax over the k selected logits), eager the chain
    # softmax -> topk -> divide: equal maths, different f32 rounding (absolute differences up to 2e-5 seen).
    for (n, p), (_, q) in zip(block.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=lambda m: f"{n}: {m}")


def test_hf_router_ties_take_the_lowest_index():
    """All-equal logits (a zero router weight): torch's top-k order on ties is unspecified; the raised op takes
    experts 0..k-1. The weights agree (all 1/k), the indices are the op's rule."""
    torch._dynamo.reset()
    _, router_cls, cfg = CONFIGS["qwen3_moe"]
    router = router_cls(cfg).eval()  # weight is zeros
    c = torch.compile(router, backend="moe")
    x = torch.randn(7, H)
    with torch.no_grad():
        _, w, i = c(x)
        _, w_e, _ = router(x)
    assert torch.equal(i, torch.arange(K).expand(7, K))
    torch.testing.assert_close(w, w_e)


def test_hf_bf16_router():
    """Qwen3-MoE in bf16: ``softmax(logits, dtype=float)`` is raised (the op computes in f32 too) and the weights
    are cast back to bf16 as HF does. gpt-oss in bf16 takes ``softmax(top_values, dtype=bf16)``: raised too, its
    check (routing_region) comparing in bf16's precision: torch's bf16 softmax accumulates in f32 and rounds once,
    as the op's f32 weights cast to bf16 do; the choice is made on the same bf16 logits."""
    for name, raised in (("qwen3_moe", ["topk_renorm"]), ("gpt_oss", ["topk_renorm"])):
        torch._dynamo.reset()
        _, router_cls, cfg = CONFIGS[name]
        router = _init(router_cls(cfg), seed=4).to(torch.bfloat16)
        x = torch.randn(9, H, dtype=torch.bfloat16)
        with capture_graphs() as log, torch.no_grad():
            logits, w, i = torch.compile(router, backend="moe")(x)
            logits_e, w_e, i_e = router(x)
        assert [op for g in log for op in g.moe_ops()] == raised
        assert w.dtype == w_e.dtype == torch.bfloat16
        torch.testing.assert_close(logits, logits_e)
        assert torch.equal(i, i_e)
        torch.testing.assert_close(w, w_e)


#: What the seed blocks in plain torch raise to. SymphonySMoE's gate, a top-k of ``softmax(logits) · Aᵀ`` with the
#: raw values as weights, is the probs-mode ``topk_renorm`` without renormalization.
SEEDS = {similarity_inform: {"similarity_inform", "topk_renorm"}, attention_inform: {"topk_renorm"},
         hyper_router: {"topk_renorm"}, acmoe: {"topk_renorm"}, symphony: {"topk_renorm"}}


@pytest.mark.parametrize("mod", list(SEEDS), ids=lambda m: m.__name__.split(".")[-1])
def test_seed_block_matches_eager(mod):
    """The seed SMoE blocks written in plain torch: routing raised, equal to eager at three token counts."""
    model, (x0,) = mod.example(use_custom_ops=False)
    log = _compare(model, "eager", (x0.shape[1], 3, 11), lambda t: torch.randn(x0.shape[0], t, x0.shape[2]),
                   _check_outputs)
    assert all(g.fallback is None for g in log)
    assert {op for g in log for op in g.moe_ops()} == SEEDS[mod]


def test_hf_causal_lm_experts_through_the_dispatch_plan():
    """A whole tiny ``Qwen3MoeForCausalLM`` (2 layers; HF picks ``"grouped_mm"`` experts for a PreTrainedModel)
    through ``moe_mlir.compile``: every layer's experts run ``moe.dispatch_plan`` (moe_mlir.experts) during the
    calls, the logits equal eager's at three token counts, and the model's config is HF's choice again after each
    call (moe_mlir.experts' tests compare the experts and their gradients against HF's loop in detail)."""
    from moe_mlir.experts import SelectedExperts, hf_experts_modules

    torch._dynamo.reset()
    cfg = Qwen3MoeConfig(hidden_size=H, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=I,
                         intermediate_size=2 * H, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, vocab_size=64, norm_topk_prob=True)
    model = _init(qwen3.Qwen3MoeForCausalLM(cfg), seed=5)
    assert model.config._experts_implementation == "grouped_mm" and len(hf_experts_modules(model)) == 2
    c = moe_mlir.compile(model, dense="eager")
    assert isinstance(c, SelectedExperts)
    g = torch.Generator().manual_seed(5)
    with capture_graphs() as log, torch.no_grad():
        for t in TOKENS:
            ids = torch.randint(0, 64, (1, t), generator=g)
            torch.testing.assert_close(c(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-4,
                                       msg=lambda m: f"T={t}: {m}")
            assert model.config._experts_implementation == "grouped_mm"
    assert all(g.fallback is None for g in log)
    assert sum(g.moe_ops().count("dispatch_plan") for g in log) == 2 * len(TOKENS)  # both layers, each count


def test_gemma4_causal_lm_matches_eager():
    """Issue #48's report, as filed: transformers' ``Gemma4ForCausalLM`` (GELU-tanh experts, a per-expert scale
    after the renormalization, the MoE block beside a dense MLP, sliding and full attention) under
    ``torch.compile(backend="moe")`` with the default dense backend (inductor) returned logits 0.046 from eager's.
    Its routing must be raised (softmax -> top-k -> renormalize to ``moe.topk_renorm`` in both layers), the graphs
    must compile without a fallback, and the logits equal eager's at the reported [2, 32] and at another length
    (a second call with a new shape: dynamic shapes), with eager's own f32 noise as the bar (inductor: 1.3e-5)."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = Gemma4TextConfig(vocab_size=512, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size_per_layer_input=512,
                           hidden_size_per_layer_input=64, sliding_window=16,
                           layer_types=["sliding_attention", "full_attention"], enable_moe_block=True, num_experts=32,
                           top_k_experts=4, moe_intermediate_size=128)
    model = Gemma4ForCausalLM(cfg).eval()
    with torch.no_grad():  # the per-expert scales away from one, so that a scale applied twice or not at all shows
        for layer in model.model.layers:
            layer.router.per_expert_scale.uniform_(0.5, 1.5)
    model = model.to(DEV)
    compiled = torch.compile(model, backend="moe")
    g = torch.Generator().manual_seed(0)
    with capture_graphs() as log, torch.no_grad():
        for shape in ((2, 32), (1, 13)):
            ids = torch.randint(0, 512, shape, generator=g).to(DEV)
            torch.testing.assert_close(compiled(ids).logits, model(ids).logits, atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"input_ids {list(shape)}: {m}")
    assert all(gr.fallback is None for gr in log)
    assert sum(gr.moe_ops().count("topk_renorm") for gr in log) >= 2
