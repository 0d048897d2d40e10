"""Raising production routers from real code to ``torch.ops.moe.route``: HF transformers' DeepseekV3TopkRouter and
DeepseekV3MoE block (sigmoid + correction bias + group-limited top-k + renormalize + scaling; also with one group,
the Kimi-K2 shape), Llama-4's router and MoE block (top-1 then sigmoid, a dense [T, E] gate). Tiny configs, random
weights, nothing downloaded. Each compiled module equals eager at several token counts (the first compile static,
then a symbolic token count) and the graph the backend compiled contains the raised op.

gpt-oss (topk -> softmax), Qwen3-MoE and Mixtral (softmax -> topk -> renorm) raise to ``moe.topk_renorm``, the
k/renormalize subset of ``moe.route`` that has its own kernels (test_hf_models.py asserts it).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402

from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402
from torch_checks import init_hf_module, same_expert_sets  # noqa: E402

H = 32
TOKENS = (5, 1, 12)


_init = init_hf_module


def _deepseek_config(E: int, n_group: int, topk_group: int, k: int) -> DeepseekV3Config:
    return DeepseekV3Config(hidden_size=H, moe_intermediate_size=16, n_routed_experts=E, num_experts_per_tok=k,
                            n_group=n_group, topk_group=topk_group, n_shared_experts=1, norm_topk_prob=True,
                            routed_scaling_factor=2.5)


def _run(model, make_x, dense="eager"):
    torch._dynamo.reset()
    c = torch.compile(model, backend="moe", options={"dense": dense})
    outs = []
    with capture_graphs() as log, torch.no_grad():
        for t in TOKENS:
            x = make_x(t)
            outs.append((c(x), model(x)))
    return log, outs


@pytest.mark.parametrize("E,n_group,topk_group,k", [(16, 4, 2, 4), (24, 1, 1, 4), (40, 8, 3, 6)])
def test_deepseek_v3_router_is_raised_to_route(E, n_group, topk_group, k):
    router = _init(deepseek.DeepseekV3TopkRouter(_deepseek_config(E, n_group, topk_group, k)), seed=1)
    log, outs = _run(router, lambda t: torch.randn(t, H))
    assert log and all(g.fallback is None for g in log)
    assert all(g.moe_ops() == ["route"] for g in log), [g.graph_module.code for g in log]
    # the whole chain is gone: no top-k, no scatter of the group mask, no masked_fill, no sigmoid left
    left = {str(n.target) for g in log for n in g.graph_module.graph.nodes if n.op == "call_function"}
    assert not {t for t in left if any(w in t for w in ("topk", "scatter", "masked_fill", "sigmoid", "gather"))}, left
    for (logits, w, i), (logits_e, w_e, i_e) in outs:
        torch.testing.assert_close(logits, logits_e)
        assert i.dtype == i_e.dtype == torch.int64 and w.dtype == w_e.dtype
        same_expert_sets(w, i, w_e, i_e)


def test_deepseek_v3_moe_block_is_raised_and_matches_eager():
    block = _init(deepseek.DeepseekV3MoE(_deepseek_config(16, 4, 2, 4)), seed=2)
    log, outs = _run(block, lambda t: torch.randn(1, t, H))
    assert any("route" in g.moe_ops() for g in log), [g.graph_module.code for g in log]
    for got, want in outs:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_deepseek_v3_router_through_inductor():
    router = _init(deepseek.DeepseekV3TopkRouter(_deepseek_config(16, 4, 2, 4)), seed=3)
    log, outs = _run(router, lambda t: torch.randn(t, H), dense="inductor")
    assert log and all(g.moe_ops() == ["route"] for g in log)
    for (_, w, i), (_, w_e, i_e) in outs:
        same_expert_sets(w, i, w_e, i_e)


def test_deepseek_v3_router_training_gradient():
    """The raised route's recompute backward gives the router weight eager's gradient (through the unbiased
    sigmoid scores)."""
    cfg = _deepseek_config(16, 4, 2, 4)
    _check_training_gradient(lambda: _init(deepseek.DeepseekV3TopkRouter(cfg), seed=4))


def _check_training_gradient(make_router) -> None:
    """Two routers from ``make_router()`` (same weights), one compiled: a raised route, and the router weight's
    gradient equal to eager's for a cotangent on the weights sorted by expert (the slot order is not the
    contract)."""
    router, ref = make_router().train(), make_router().train()
    torch._dynamo.reset()
    c = torch.compile(router, backend="moe", options={"dense": "eager"})
    x = torch.randn(9, H)
    cot = torch.randn(9, 4)
    with capture_graphs() as log:
        _, w, i = c(x)
    _, w_e, i_e = ref(x)
    o, o_e = i.argsort(-1), i_e.argsort(-1)
    (w.gather(-1, o) * cot).sum().backward()
    (w_e.gather(-1, o_e) * cot).sum().backward()
    assert any("route" in g.moe_ops() for g in log)
    torch.testing.assert_close(router.weight.grad, ref.weight.grad, atol=1e-5, rtol=1e-4)


def _llama4():
    from transformers import Llama4TextConfig
    from transformers.models.llama4 import modeling_llama4 as llama4

    cfg = Llama4TextConfig(hidden_size=H, intermediate_size=16, intermediate_size_mlp=16, num_local_experts=8,
                           num_experts_per_tok=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    return llama4, cfg


def test_llama4_router_is_raised_to_route():
    llama4, cfg = _llama4()
    router = _init(llama4.Llama4Router(cfg), seed=5)
    log, outs = _run(router, lambda t: torch.randn(t, H))
    assert log and all(g.moe_ops() == ["route"] for g in log), [g.graph_module.code for g in log]
    for (scores, logits), (scores_e, logits_e) in outs:
        torch.testing.assert_close(logits, logits_e)
        torch.testing.assert_close(scores, scores_e, atol=1e-6, rtol=1e-5)
        assert ((scores > 0).sum(-1) == 1).all()


def test_llama4_moe_block_is_raised_and_matches_eager():
    llama4, cfg = _llama4()
    block = _init(llama4.Llama4TextMoe(cfg), seed=6)
    log, outs = _run(block, lambda t: torch.randn(t, H))
    assert any("route" in g.moe_ops() for g in log), [g.graph_module.code for g in log]
    for (out, logits), (out_e, logits_e) in outs:
        torch.testing.assert_close(logits, logits_e)
        torch.testing.assert_close(out, out_e, atol=1e-5, rtol=1e-4)


def _kolibri1(norm: bool):
    from transformers import Kolibri1Config
    from transformers.models.kolibri1 import modeling_kolibri1 as kolibri1

    cfg = Kolibri1Config(hidden_size=H, num_experts=12, num_experts_per_tok=3, norm_topk_prob=norm)
    return kolibri1, cfg


@pytest.mark.parametrize("norm", [True, False])
def test_kolibri1_router_is_raised_to_topk_then_score(norm):
    """Kolibri-1: ``sigmoid(gather(logits, topk(logits + bias).indices))`` [renormalized]: chosen on the biased raw
    logits, each selected logit scored alone (``order(topk_then_score)``); equal indices and weights, forward and
    backward (the router weight's gradient through the selected sigmoids)."""
    kolibri1, cfg = _kolibri1(norm)
    router = _init(kolibri1.Kolibri1TopKRouter(cfg), seed=7)
    with torch.no_grad():
        router.e_score_correction_bias.copy_(torch.linspace(-0.5, 0.5, 12))  # a bias that moves the choice
    log, outs = _run(router, lambda t: torch.randn(t, H))
    assert log and all(g.moe_ops() == ["route"] for g in log), [g.graph_module.code for g in log]
    for (logits, w, i), (logits_e, w_e, i_e) in outs:
        torch.testing.assert_close(logits, logits_e)
        assert torch.equal(i, i_e)
        torch.testing.assert_close(w, w_e, atol=1e-6, rtol=1e-5)
    ref = _init(kolibri1.Kolibri1TopKRouter(cfg), seed=7)
    ref.load_state_dict(router.state_dict())
    x, cot = torch.randn(9, H), torch.randn(9, 3)
    _, w, _ = torch.compile(router, backend="moe", options={"dense": "eager"})(x)
    (w * cot).sum().backward()
    (ref(x)[1] * cot).sum().backward()
    torch.testing.assert_close(router.weight.grad, ref.weight.grad, atol=1e-5, rtol=1e-4)


def _check_route_sets(log, outs) -> None:
    """Every graph raised to one route; logits equal, the experts and weights equal as sets (topk(sorted=False))."""
    assert log and all(g.moe_ops() == ["route"] for g in log), [g.graph_module.code for g in log]
    for (logits, w, i), (logits_e, w_e, i_e) in outs:
        torch.testing.assert_close(logits, logits_e)
        same_expert_sets(w, i, w_e, i_e)


def test_longcat_flash_router_is_raised_with_a_broadcast_bias():
    """LongCat-Flash chooses on ``scores.view(-1, E) + bias.unsqueeze(0)`` (a same-shape view and a [1, E] bias)
    and weighs the unnormalized softmax scores times its scaling factor: ``moe.route`` (softmax, bias, scale)."""
    from transformers import LongcatFlashConfig
    from transformers.models.longcat_flash import modeling_longcat_flash as longcat

    cfg = LongcatFlashConfig(hidden_size=H, n_routed_experts=8, zero_expert_num=2, num_experts_per_tok=3,
                             routed_scaling_factor=6.0)
    router = _init(longcat.LongcatFlashTopkRouter(cfg), seed=8)
    with torch.no_grad():
        router.e_score_correction_bias.copy_(torch.linspace(0.3, -0.3, router.e_score_correction_bias.numel()))
    log, outs = _run(router, lambda t: torch.randn(t, H))
    _check_route_sets(log, outs)


def test_mistral4_router_with_zero_filled_groups_is_raised():
    """Mistral-4: softmax scores, DeepSeek-style groups whose excluded experts are filled with 0.0 (not -inf), no
    bias: scores are >= 0, so the 0.0 fill selects as the op's exclusion does (a tie with a kept score of exactly
    0 names an expert of weight 0). Raised to ``moe.route`` (softmax, groups), equal sets and weights."""
    from transformers import Mistral4Config
    from transformers.models.mistral4 import modeling_mistral4 as mistral4

    cfg = Mistral4Config(hidden_size=H, num_local_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2,
                         norm_topk_prob=True, routed_scaling_factor=1.5)
    router = _init(mistral4.Mistral4TopkRouter(cfg), seed=9)
    log, outs = _run(router, lambda t: torch.randn(t, H))
    _check_route_sets(log, outs)


def test_zero_filled_groups_with_a_bias_are_not_raised():
    """AXK2: the same 0.0 fill after a selection bias: a kept biased score can be negative and rank after the
    excluded zeros, which the op's exclusion never does: left to inductor, equal to eager. Its weights are a gather
    at indices made from the same logits, which a replaying moe.route alone would slow down (inductor fuses the
    gather into its choice): not raised either."""
    from transformers.models.axk2 import modeling_axk2 as axk2
    from transformers.models.axk2.configuration_axk2 import AXK2Config

    cfg = AXK2Config(hidden_size=H, num_local_experts=16, num_experts_per_tok=3, n_group=4, topk_group=2)
    router = _init(axk2.AXK2TopkRouter(cfg), seed=10)
    log, outs = _run(router, lambda t: torch.randn(t, H))
    assert log and all(g.moe_ops() == [] for g in log)
    for (logits, w, i), (logits_e, w_e, i_e) in outs:
        assert torch.equal(i, i_e)
        torch.testing.assert_close(w, w_e)


def test_longcat_flash_router_gradient_through_a_no_grad_choice():
    """LongCat-Flash takes its top-k under ``torch.no_grad()`` and gathers the weights outside it: the raised
    route goes where the weights are gathered (in grad mode), so the classifier weight gets eager's gradient
    (placed at the top-k, the route's weights had none)."""
    from transformers import LongcatFlashConfig
    from transformers.models.longcat_flash import modeling_longcat_flash as longcat

    cfg = LongcatFlashConfig(hidden_size=H, n_routed_experts=8, zero_expert_num=2, num_experts_per_tok=3,
                             routed_scaling_factor=6.0)
    router = _init(longcat.LongcatFlashTopkRouter(cfg), seed=11)
    ref = _init(longcat.LongcatFlashTopkRouter(cfg), seed=11)
    torch._dynamo.reset()
    x = torch.randn(9, H)
    with capture_graphs() as log:
        _, w, i = torch.compile(router, backend="moe", options={"dense": "eager"})(x)
    _, w_e, i_e = ref(x)
    assert any("route" in g.moe_ops() for g in log)
    cot = torch.randn(10)  # a cotangent per expert, so the comparison does not depend on the pick order
    (w * cot[i]).sum().backward()
    (w_e * cot[i_e]).sum().backward()
    torch.testing.assert_close(router.classifier.weight.grad, ref.classifier.weight.grad, atol=1e-5, rtol=1e-4)


def _zaya_router(layer_idx: int, seed: int):
    """transformers' ZayaRouter: a softmax over E + 1 classes of [B, T, E + 1] logits (the last a skip expert that
    computes nothing), chosen on the detached probabilities plus a balancing bias (the skip class's -1), the
    chosen probability gathered, and a pick of the skip expert masked to weight 0 and index 0 after the top-k."""
    from transformers.models.zaya import modeling_zaya as zaya
    from transformers.models.zaya.configuration_zaya import ZayaConfig

    cfg = ZayaConfig(hidden_size=H, num_experts=8, num_experts_per_tok=1, router_hidden_size=16)
    router = _init(zaya.ZayaRouter(cfg, layer_idx=layer_idx), seed=seed)
    with torch.no_grad():  # biases varied; the skip class's (Zaya's -1) raised so that some rows pick it
        router.balancing_biases.copy_(torch.cat([0.2 * torch.randn(8, generator=torch.Generator().manual_seed(seed)),
                                                 torch.tensor([0.15])]))
    return router


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_zaya_router_with_a_skip_expert_is_raised(layer_idx):
    """The [B, T, E + 1] logits are routed as [-1, E + 1] rows by one moe.route and its results viewed back; the
    skip expert is a class like any other to the op, and the masking after the top-k stays: outputs equal eager's
    (the skip expert is picked in some rows), and so is the router's gradient."""
    router = _zaya_router(layer_idx, seed=17)
    log, outs = _run(router, lambda t: torch.randn(2, t, H))
    assert log and all(g.moe_ops() == ["route"] for g in log), [g.graph_module.code for g in log]
    skipped = 0
    for got, want in outs:
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        skipped += int((got[2] == 0).logical_and(got[1] == 0).sum())
    assert skipped > 0, "no row picked the skip expert: the masking is not exercised"
    ref = _zaya_router(layer_idx, seed=17).train()
    router.train()
    torch._dynamo.reset()
    x = torch.randn(2, 9, H)
    _, w, i, _ = torch.compile(router, backend="moe", options={"dense": "eager"})(x)
    _, w_e, i_e, _ = ref(x)
    assert torch.equal(i, i_e)
    cot = torch.randn(w.shape)
    (w * cot).sum().backward()
    (w_e * cot).sum().backward()
    for (name, p), p_e in zip(router.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, p_e.grad, atol=1e-5, rtol=1e-4, msg=name)


def _deepseek_v4_router(seed: int):
    """transformers' DeepseekV4TopKRouter: ACT2FN["sqrtsoftplus"] scores, a selection bias, weights over
    sum + 1e-20, scaled; a score the dialect has no preset for."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    cfg = DeepseekV4Config(hidden_size=H, num_local_experts=24, num_experts_per_tok=4, routed_scaling_factor=1.5)
    router = _init(v4.DeepseekV4TopKRouter(cfg), seed=seed)
    with torch.no_grad():
        router.e_score_correction_bias.copy_(0.1 * torch.randn(24, generator=torch.Generator().manual_seed(seed)))
    return router


def test_deepseek_v4_router_is_raised_to_route_with_a_custom_score():
    """The elementwise score between the logits and the top-k (softplus, then sqrt) becomes the route's score
    region (ops.custom_scoring of the replayed chain): one moe.route, no softplus, sqrt, top-k or gather left."""
    log, outs = _run(_deepseek_v4_router(seed=5), lambda t: torch.randn(t, H))
    assert log and all(g.fallback is None for g in log)
    assert all(g.moe_ops() == ["route"] for g in log), [g.graph_module.code for g in log]
    routes = [n for g in log for n in g.graph_module.graph.nodes if n.target == torch.ops.moe.route.default]
    assert all(n.args[3].startswith("custom:") and "math.log1p" in n.args[3] and "math.sqrt" in n.args[3]
               for n in routes)
    left = {str(n.target) for g in log for n in g.graph_module.graph.nodes if n.op == "call_function"}
    assert not {t for t in left if any(w in t for w in ("topk", "softplus", "sqrt", "gather"))}, left
    for (logits, w, i), (logits_e, w_e, i_e) in outs:
        torch.testing.assert_close(logits, logits_e)
        assert i.dtype == i_e.dtype == torch.int64 and w.dtype == w_e.dtype
        same_expert_sets(w, i, w_e, i_e)


def test_deepseek_v4_router_training_gradient():
    """The raised route's backward (moe.route_grad, the region's symbolic derivative) gives the router weight
    eager's gradient."""
    _check_training_gradient(lambda: _deepseek_v4_router(seed=6))


# Scores the dialect has no preset for: the elementwise chain from the logits to the scores becomes moe.route's
# score region (frontend/raising.py's _custom_score, ops/score_region.py's writer).

def _route_scorings(log) -> list[str]:
    return [n.args[3] for g in log for n in g.graph_module.graph.nodes
            if n.op == "call_function" and "moe.route" in str(n.target) and "backward" not in str(n.target)]


def _deepseek_v4_config(**kw):
    from transformers import DeepseekV4Config

    return DeepseekV4Config(hidden_size=H, num_local_experts=16, num_experts_per_tok=4, scoring_func="sqrtsoftplus",
                            routed_scaling_factor=2.5, vocab_size=64, **kw)


class _NewScoreRouter(torch.nn.Module):
    """A router a researcher writes today: a score no model or kernel has (a tanh-sigmoid mix with a clamp), a
    selection bias, renormalized and scaled weights. ``temperature`` (per expert) enters the score when given."""

    def __init__(self, E=24, k=5, per_expert_temperature=False):
        super().__init__()
        self.k = k
        self.proj = torch.nn.Linear(H, E, bias=False)
        self.register_buffer("bias", torch.linspace(-0.2, 0.2, E))
        self.temperature = torch.nn.Parameter(torch.rand(E) + 0.5) if per_expert_temperature else None

    def forward(self, x):
        logits = self.proj(x)
        z = logits * self.temperature if self.temperature is not None else logits
        scores = torch.clamp(0.5 * torch.tanh(z) + torch.sigmoid(2.0 * z) ** 2, min=0.05)
        idx = torch.topk(scores + self.bias, self.k, dim=-1).indices
        w = scores.gather(1, idx)
        return w / w.sum(-1, keepdim=True) * 1.7, idx


def test_a_new_score_written_in_pytorch_is_raised_with_its_gradient():
    torch.manual_seed(14)
    router = _NewScoreRouter()
    ref = _NewScoreRouter()
    ref.load_state_dict(router.state_dict())
    log, outs = _run(router, lambda t: torch.randn(t, H))
    assert log and all(g.moe_ops() == ["route"] for g in log), [g.graph_module.code for g in log]
    assert all(s.startswith("custom:") and "math.tanh" in s for s in _route_scorings(log))
    for (w, i), (w_e, i_e) in outs:
        same_expert_sets(w, i, w_e, i_e)
    torch._dynamo.reset()
    x = torch.randn(13, H)
    w, i = torch.compile(router, backend="moe", options={"dense": "eager"})(x)
    w_e, i_e = ref(x)
    cot = torch.randn(24)
    (w * cot[i]).sum().backward()
    (w_e * cot[i_e]).sum().backward()
    torch.testing.assert_close(router.proj.weight.grad, ref.proj.weight.grad, atol=1e-5, rtol=1e-4)


def test_a_score_with_a_tensor_operand_is_not_raised():
    """A per-expert temperature inside the score is an [E] operand, not an elementwise function of the logit
    alone: no region can hold it, so the router is left to inductor (equal to eager)."""
    torch.manual_seed(15)
    router = _NewScoreRouter(per_expert_temperature=True)
    log, outs = _run(router, lambda t: torch.randn(t, H))
    assert log and all(g.moe_ops() == [] for g in log)
    for (w, i), (w_e, i_e) in outs:
        assert torch.equal(i, i_e)
        torch.testing.assert_close(w, w_e)


def test_deepseek_v4_hash_router_is_raised():
    """DeepSeek-V4's hash layers take the experts from a frozen token-id table: only the weights of those experts
    are computed (sqrtsoftplus scores gathered, over sum + 1e-20, scaled), raised to moe.route with the table's
    indices as its replay operand (frontend/raising_replay.py), whose kernel scores the k given logits alone.
    Forward and backward at more token counts, and softmax hash routers: test_hash_routing.py."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

    router = _init(v4.DeepseekV4HashRouter(_deepseek_v4_config()), seed=16)
    with torch.no_grad():
        router.tid2eid.copy_(torch.randint(0, 16, router.tid2eid.shape, generator=torch.Generator().manual_seed(0)))
    torch._dynamo.reset()
    c = torch.compile(router, backend="moe", options={"dense": "eager"})
    with capture_graphs() as log, torch.no_grad():
        for t in TOKENS:
            x, ids = torch.randn(t, H), torch.randint(0, 64, (t,))
            for got, want in zip(c(x, ids), router(x, ids)):
                torch.testing.assert_close(got, want)
    assert log and all(g.moe_ops() == ["route"] for g in log), [g.graph_module.code for g in log]


def test_your_router_example():
    """docs/YourRouter.md's router (examples/your_router.py, sections 1-3: no timing): raised to one moe.route
    with its score as a region, equal to eager forward and backward (the example asserts both)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "your_router.py"
    spec = importlib.util.spec_from_file_location("your_router_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch._dynamo.reset()
    module = example.main(["--check"])
    assert "moe.route" in module and "scoring(custom)" in module and "math.tanh" in module, module
