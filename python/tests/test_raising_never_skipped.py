"""Raising is never skipped on transformers' MoE models (issue 35, item 1).

``torch.compile(..., dynamic=True)`` (and automatic dynamic, once a float changes) keeps a module's Python floats
dynamic: DeepseekV3TopkRouter's ``routed_scaling_factor``, every RMSNorm's ``variance_epsilon``, the rotary
``attention_scaling``... become 0-d tensor inputs of the Dynamo graph read by ``.item()``. The backend re-traces the
graph to aten with ``make_fx``, whose fresh fakes had lost the backed SymFloat Dynamo memoized for that ``.item()``,
so the trace hit ``aten._local_scalar_dense`` (DataDependentOutputException) and the whole graph was compiled without
raising (a MoERaisingWarning). Then AOTAutograd's ``TensorifyScalarRestartAnalysis`` (a float it cannot keep as a
tensor, e.g. attention's ``scale``) was taken for a compile failure of the raised graph, with the same result.

Checked here, on transformers' own classes (tiny configs, random weights, nothing downloaded):

* DeepseekV3TopkRouter with n_group 1 (Kimi-K2's E = 384, topk_group 1, k = 8), 4 and 8, under ``dynamic=True``:
  the router is one ``moe.route``, no MoERaisingWarning, outputs equal eager's;
* MixtralForCausalLM, Qwen3MoeForCausalLM and OlmoeForCausalLM with ``output_router_logits=True`` (so the graph also
  holds the load-balancing loss), under ``dynamic=True`` and under torch.compile's default (automatic dynamic, two
  sequence lengths): every layer's router is raised to ``moe.topk_renorm``, no MoERaisingWarning, and the logits,
  router logits and aux loss equal eager's; DeepseekV3ForCausalLM under ``dynamic=True``: both routers ``moe.route``;
  a training step of Qwen3MoeForCausalLM under ``dynamic=True``: routers raised, loss and gradients equal eager's;
* graphs that do hold data-dependent ops (Dynamo's ``capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops``
  with HF's eager expert loop: ``nonzero``, ``.item()`` in the graph) are traced through, the routers raised.

Dense code runs through ``dense="eager"`` (AOTAutograd without a compiler: the same raising, fake kernels and
dynamic-float handling, without inductor's C++ compile per graph) except for one router under inductor.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import DeepseekV3Config, MixtralConfig  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402

from moe_mlir.backends.dynamo import MoERaisingWarning, capture_graphs  # noqa: E402
from torch_checks import init_hf_module, same_expert_sets, tiny_moe_causal_lm  # noqa: E402

H = 32
#: The moe ops of a causal LM's graphs (in order, across the graphs: Dynamo may put the loss in a graph of its
#: own) with labels and ``output_router_logits=True``: both layers' routers, then the load-balancing loss (raised
#: since issue #32, once its op is registered).
ROUTERS_AND_LOSS = ["topk_renorm", "topk_renorm"] + (
    ["load_balancing_loss"] if hasattr(torch.ops.moe, "load_balancing_loss") else [])


def _raised(log) -> list[str]:
    return [op for g in log for op in g.moe_ops()]


_init = init_hf_module


def _no_raising_warning(record) -> None:
    skipped = [str(w.message) for w in record if issubclass(w.category, MoERaisingWarning)]
    assert not skipped, skipped


@pytest.mark.parametrize("E,n_group,topk_group,dense", [
    (384, 1, 1, "inductor"),  # Kimi-K2's routing
    (384, 1, 1, "eager"),
    (64, 4, 2, "eager"),
    (256, 8, 4, "eager"),  # DeepSeek-V3's routing
])
def test_deepseek_v3_router_with_dynamic_floats_is_raised(E, n_group, topk_group, dense):
    cfg = DeepseekV3Config(hidden_size=H, moe_intermediate_size=16, n_routed_experts=E, num_experts_per_tok=8,
                           n_group=n_group, topk_group=topk_group, n_shared_experts=1, norm_topk_prob=True,
                           routed_scaling_factor=2.827)
    router = _init(deepseek.DeepseekV3TopkRouter(cfg), seed=E + n_group)
    torch._dynamo.reset()
    c = torch.compile(router, backend="moe", dynamic=True, options={"dense": dense})
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True) as record, capture_graphs() as log, torch.no_grad():
        warnings.simplefilter("always")
        for t in (64, 7):
            x = torch.randn(t, H, generator=g)
            (logits, w, i), (logits_e, w_e, i_e) = c(x), router(x)
            torch.testing.assert_close(logits, logits_e)
            assert i.dtype == i_e.dtype == torch.int64 and w.dtype == w_e.dtype
            same_expert_sets(w, i, w_e, i_e)
    _no_raising_warning(record)
    # dynamic=True: one graph for both token counts, its routed_scaling_factor a graph input
    assert len(log) == 1 and log[0].fallback is None, [g.fallback for g in log]
    assert log[0].moe_ops() == ["route"], log[0].graph_module.code
    left = {str(n.target) for n in log[0].graph_module.graph.nodes if n.op == "call_function"}
    assert not {t for t in left if any(w in t for w in ("topk", "scatter", "masked_fill", "gather"))}, left


def _causal_lm(name: str) -> torch.nn.Module:
    return tiny_moe_causal_lm(name, H, vocab_size=64)


def _check_lm(model: torch.nn.Module, dynamic, lengths, experts: str = "grouped_mm") -> list:
    """Runs ``model`` compiled against eager at each sequence length (labels given: the aux loss is computed);
    returns the backend's log, after checking that nothing was skipped and that the outputs match."""
    model.config._experts_implementation = experts
    torch._dynamo.reset()
    c = torch.compile(model, backend="moe", dynamic=dynamic, options={"dense": "eager"})
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings(record=True) as record, capture_graphs() as log, torch.no_grad():
        warnings.simplefilter("always")
        for t in lengths:
            ids = torch.randint(0, 64, (2, t), generator=g)
            mask = torch.ones_like(ids)
            out, ref = c(input_ids=ids, attention_mask=mask, labels=ids), model(input_ids=ids, attention_mask=mask,
                                                                               labels=ids)
            torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-4)
            assert len(out.router_logits) == len(ref.router_logits) == 2
            for r, r_e in zip(out.router_logits, ref.router_logits):
                torch.testing.assert_close(r, r_e, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.aux_loss, ref.aux_loss, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-4)
    _no_raising_warning(record)
    assert log and all(g.fallback is None for g in log), [g.fallback for g in log]
    return log


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "olmoe"])
def test_causal_lm_with_router_logits_under_dynamic_true_is_raised(name):
    log = _check_lm(_causal_lm(name), True, (9, 5))
    # One graph serves both lengths; it holds both layers' routers, each raised (and the loss).
    routed = [g for g in log if "topk_renorm" in g.moe_ops()]
    assert len(routed) == 1 and _raised(log) == ROUTERS_AND_LOSS, [g.moe_ops() for g in log]
    left = {str(n.target) for n in routed[0].graph_module.graph.nodes if n.op == "call_function"}
    assert "aten.item.default" in left or "aten._local_scalar_dense.default" in left  # the dynamic floats stayed


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_causal_lm_with_router_logits_under_automatic_dynamic_is_raised(name):
    log = _check_lm(_causal_lm(name), None, (9, 5, 12))
    # A static graph for the first length, a symbolic one for the others: both layers raised in each.
    assert _raised(log) == ROUTERS_AND_LOSS * 2, [g.moe_ops() for g in log]


def test_training_step_with_router_logits_under_dynamic_true_is_raised():
    """A training step (labels, the aux loss, backward) of Qwen3MoeForCausalLM under ``dynamic=True``: both routers
    raised in the forward graph AOTAutograd differentiates, the loss and every parameter's gradient equal eager's."""
    import copy

    model = _causal_lm("qwen3_moe").train()
    model.config._experts_implementation = "grouped_mm"
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    c = torch.compile(model, backend="moe", dynamic=True, options={"dense": "eager"})
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(5))
    with warnings.catch_warnings(record=True) as record, capture_graphs() as log:
        warnings.simplefilter("always")
        loss = c(input_ids=ids, labels=ids).loss
        loss.backward()
    loss_e = ref(input_ids=ids, labels=ids).loss
    loss_e.backward()
    _no_raising_warning(record)
    assert all(g.fallback is None for g in log) and _raised(log) == ROUTERS_AND_LOSS, \
        [(g.moe_ops(), g.fallback) for g in log]
    torch.testing.assert_close(loss, loss_e, atol=1e-5, rtol=1e-4)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_deepseek_v3_causal_lm_under_dynamic_true_is_raised():
    """A whole DeepseekV3ForCausalLM (every layer MoE): its routed_scaling_factor and norms' eps are dynamic floats
    in the one graph; both layers' routers are raised to ``moe.route`` and the logits equal eager's."""
    from transformers import DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(hidden_size=H, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                           vocab_size=64, moe_intermediate_size=16, intermediate_size=64, n_routed_experts=16,
                           num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
                           first_k_dense_replace=0, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                           qk_nope_head_dim=8, v_head_dim=16)
    model = _init(DeepseekV3ForCausalLM(cfg), seed=3)
    torch._dynamo.reset()
    c = torch.compile(model, backend="moe", dynamic=True, options={"dense": "eager"})
    g = torch.Generator().manual_seed(4)
    with warnings.catch_warnings(record=True) as record, capture_graphs() as log, torch.no_grad():
        warnings.simplefilter("always")
        for t in (9, 5):
            ids = torch.randint(0, 64, (2, t), generator=g)
            torch.testing.assert_close(c(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
    _no_raising_warning(record)
    assert [(g.moe_ops(), g.fallback) for g in log] == [(["route", "route"], None)]


class _RouterThenDataDependent(torch.nn.Module):
    """HF's Mixtral router, then what an expert dispatch computes from its choice: the experts hit (``nonzero``, an
    unbacked size) and the busiest expert's load (``.item()``), in the same graph as the router."""

    def __init__(self, router: torch.nn.Module, num_experts: int) -> None:
        super().__init__()
        self.router, self.num_experts = router, num_experts

    def forward(self, x: torch.Tensor):
        logits, w, idx = self.router(x)
        load = torch.zeros(self.num_experts, dtype=torch.int64).scatter_add_(0, idx.flatten(), torch.ones_like(
            idx.flatten()))
        hit = (load > 0).nonzero().squeeze(-1)
        busiest = load.max().item()
        return logits, w * busiest, idx, hit


def test_graphs_with_data_dependent_ops_are_traced_through():
    """With Dynamo's ``capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops``, a graph holds ``nonzero``
    and ``.item()`` beside the router: they are traced (unbacked symbols), the router raised, the outputs equal."""
    import torch._dynamo.config as dynamo_config
    from transformers.models.mixtral import modeling_mixtral as mixtral

    cfg = MixtralConfig(hidden_size=H, intermediate_size=16, num_local_experts=8, num_experts_per_tok=2)
    model = _RouterThenDataDependent(_init(mixtral.MixtralTopKRouter(cfg), seed=3), 8)
    torch._dynamo.reset()
    c = torch.compile(model, backend="moe", options={"dense": "eager"})
    g = torch.Generator().manual_seed(2)
    # (config.patch, not monkeypatch: the config module's own way to set and restore its options)
    with dynamo_config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True), \
            warnings.catch_warnings(record=True) as record, capture_graphs() as log, torch.no_grad():
        warnings.simplefilter("always")
        for t in (6, 11, 3):
            x = torch.randn(t, H, generator=g)
            for a, b in zip(c(x), model(x)):
                torch.testing.assert_close(a, b)
    _no_raising_warning(record)
    assert log and all(g.fallback is None and g.moe_ops() == ["topk_renorm"] for g in log), \
        [(g.fallback, g.moe_ops()) for g in log]
    held = {str(n.target) for g in log for n in g.graph_module.graph.nodes if n.op == "call_function"}
    assert "aten.nonzero.default" in held, held
    assert held & {"aten.item.default", "aten._local_scalar_dense.default"}, held
