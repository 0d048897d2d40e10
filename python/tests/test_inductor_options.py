"""What ``backend="moe"`` hands inductor with a graph holding moe ops (moe_mlir.backends.inductor_options): the
backwards of ``topk_renorm`` and of the load-balancing loss as aten ops inductor fuses (no extern call splitting the
backward graph), equal to the ops' kernels;
and our ops' version in inductor's and AOTAutograd's cache keys (a changed autograd is never served stale); and,
where nothing is raised, exactly inductor's code."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import moe_mlir  # noqa: F401
from moe_mlir.backends import inductor_options
from moe_mlir.backends.dynamo import capture_graphs
from moe_mlir.ops.topk import topk_renorm_backward_decomposition


class RoutedMixture(nn.Module):
    """A router and k gathered experts; ``idiom`` picks HF's router form: OLMoE's softmax -> topk with the values
    used raw (``norm_topk_prob=False``), Qwen3-MoE's in-place renormalization, Mixtral/gpt-oss' topk -> softmax.
    The router logits also feed the loss (as the load-balancing loss reads them): their gradient adds up."""

    def __init__(self, idiom: str, d: int = 32, e: int = 16, k: int = 4) -> None:
        super().__init__()
        self.gate = nn.Linear(d, e, bias=False)
        self.experts = nn.Parameter(torch.randn(e, d, d) * d ** -0.5)
        self.idiom, self.k = idiom, k

    def forward(self, x):
        logits = self.gate(x)
        if self.idiom == "topk_softmax":
            v, i = torch.topk(logits, self.k, dim=-1)
            w = F.softmax(v, dim=-1, dtype=torch.float)
        else:
            w, i = torch.topk(F.softmax(logits, dim=-1, dtype=torch.float), self.k, dim=-1)
            if self.idiom == "renorm":
                w /= w.sum(dim=-1, keepdim=True)
        y = torch.einsum("td,tkde->tke", x, self.experts[i])
        return (w.unsqueeze(-1) * y).sum(1), logits


def _train_codes(backend: str, idiom: str):
    """(the generated code of every graph inductor compiled for one training step, the input gradients)."""
    from torch._inductor.utils import fresh_cache, run_and_get_code

    torch.manual_seed(0)
    m = RoutedMixture(idiom)
    x = torch.randn(64, 32, requires_grad=True)
    c = torch.compile(m, backend=backend)

    def step():
        y, logits = c(x)
        (y.square().mean() + 1e-2 * logits.square().mean()).backward()

    with fresh_cache(), capture_graphs() as log:
        _, codes = run_and_get_code(step)
    grads = [x.grad] + [p.grad for p in m.parameters()]
    return codes, grads, log


def _kernels(codes) -> int:
    return sum(len(re.findall(r"= async_compile\.cpp_pybinding\(", c)) for c in codes)


@pytest.mark.parametrize("idiom", ["raw", "renorm", "topk_softmax"])
def test_topk_renorm_backward_is_fused_not_an_extern_call(idiom):
    """The backward inductor compiles holds no ``topk_renorm_backward`` call (it used to: one extern call per
    router, and the scatter, softmax and gradient add around it as kernels of their own) and no more kernels than
    inductor builds for the same step from the model itself; the forward keeps the raised op; gradients as eager."""
    codes, grads, log = _train_codes("moe", idiom)
    assert [g.moe_ops() for g in log] == [["topk_renorm"]], log
    assert any("torch.ops.moe.topk_renorm.default(" in c for c in codes)
    assert not any("topk_renorm_backward" in c and "torch.ops.moe.topk_renorm_backward" in c for c in codes)
    ind_codes, ind_grads, _ = _train_codes("inductor", idiom)
    assert _kernels(codes) <= _kernels(ind_codes), (_kernels(codes), _kernels(ind_codes))
    for got, want in zip(grads, ind_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_load_balancing_loss_backward_is_fused_not_an_extern_call():
    """A model calling ``torch.ops.moe.load_balancing_loss`` itself (nothing to raise): the backward inductor
    compiles holds no ``router_stats_backward`` call (the loss' gradient, a row softmax times the cotangent, fuses
    into one kernel); the forward keeps the op's kernel; the gradient as the op's own backward eagerly."""
    from torch._inductor.utils import fresh_cache, run_and_get_code

    torch.manual_seed(0)
    gate = nn.Linear(32, 16, bias=False)
    x = torch.randn(64, 32)

    def loss(h):
        return torch.ops.moe.load_balancing_loss(gate(h), 4) + 1e-2 * gate(h).square().mean()

    want = torch.autograd.grad(loss(x), gate.weight)[0]
    torch._dynamo.reset()
    c = torch.compile(loss, backend="moe")
    with fresh_cache():
        (got,), codes = run_and_get_code(lambda: torch.autograd.grad(c(x), gate.weight))
    assert any("torch.ops.moe.router_stats_fwd" in c or "torch.ops.moe.load_balancing_loss" in c for c in codes)
    assert not any("torch.ops.moe.router_stats_backward" in c for c in codes)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("mode,renormalize", [("logits", True), ("logits", False), ("probs", True),
                                              ("probs", False)])
def test_decomposition_equals_the_kernel(mode, renormalize):
    """Every mode, with the degenerate rows the dialect defines: a fully -inf logit row, a zero probs row."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 24, generator=g)
    if mode == "probs":
        x = x.softmax(-1)
        x[3] = 0.0
    else:
        x[3] = float("-inf")
    w, idx = torch.ops.moe.topk_renorm(x, 5, mode, renormalize)
    gw = torch.randn(w.shape, generator=g)
    want = torch.ops.moe.topk_renorm_backward(gw, x, idx, mode, renormalize)
    got = topk_renorm_backward_decomposition(gw, x, idx, mode, renormalize)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if mode == "logits" or renormalize:  # raw probs: w = the selected values, whose gradient is g even at 0
        assert torch.all(got[3] == 0)


def test_ops_version_is_in_the_cache_key(monkeypatch, tmp_path):
    """A warm cache serves a raised graph again only while our ops' version is unchanged: the version (what
    AOTAutograd traces for ``torch.ops.moe.*``) is part of inductor's FX-graph and AOTAutograd cache keys."""
    from torch._dynamo.utils import counters
    from torch._inductor import config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = RoutedMixture("renorm")
    x = torch.randn(16, 32, requires_grad=True)

    def compile_once() -> tuple[int, int]:
        torch._dynamo.reset()
        counters.clear()
        with capture_graphs() as log, config.patch(fx_graph_cache=True), \
                torch._functorch.config.patch(enable_autograd_cache=True):
            y, _ = torch.compile(m, backend="moe")(x)
            y.sum().backward()
        assert log and log[0].moe_ops() == ["topk_renorm"]
        return counters["aot_autograd"]["autograd_cache_hit"], counters["aot_autograd"]["autograd_cache_miss"]

    compile_once()
    assert compile_once() == (1, 0)  # warm: the forward/backward pair served from the cache
    monkeypatch.setattr(inductor_options, "ops_version", lambda: "another version of the ops")
    # The same graph, another version of the ops: traced afresh (the backward then comes from what their autograd
    # is now; inductor's FX-graph cache may still serve a compiled graph equal to a former one: it is keyed by it).
    assert compile_once() == (0, 1)


def _generated_code(fn, *args) -> list[str]:
    """The code inductor generated for one call of ``fn`` (every graph, forward and backward), paths and hashes
    masked."""
    from torch._inductor.utils import run_and_get_code

    _, code = run_and_get_code(fn, *args)
    return [re.sub(r"/tmp/\S+|[0-9a-f]{20,}", "X", c) for c in code]


def test_a_graph_with_nothing_to_raise_compiles_to_inductors_code():
    """Issue #51: where backend "moe" raises nothing (a dense transformers decoder layer: attention, RMSNorm, the
    SwiGLU MLP), it hands inductor the graph inductor would get, so the generated code is inductor's, forward and
    backward, byte for byte (paths and hashes aside): no cost added around inductor where nothing of ours runs."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=1, attn_implementation="sdpa")
    layer, rope = LlamaDecoderLayer(cfg, 0), LlamaRotaryEmbedding(cfg)
    x = torch.randn(1, 16, 64, requires_grad=True)
    pe = rope(x, torch.arange(16)[None])

    def step(x):
        y = layer(x, position_embeddings=pe)
        y = y[0] if isinstance(y, tuple) else y
        y.square().sum().backward()
        return y

    codes = {}
    for backend in ("inductor", "moe"):
        torch._dynamo.reset()
        with capture_graphs() as log:
            codes[backend] = _generated_code(torch.compile(step, backend=backend), x)
        if backend == "moe":
            assert log and all(g.raised == 0 and g.fallback is None for g in log)
    assert len(codes["moe"]) == len(codes["inductor"]) >= 2  # the forward and the backward at least
    for ours, theirs in zip(codes["moe"], codes["inductor"]):
        assert ours == theirs


def test_positional_arguments_leave_out_trailing_defaults():
    """The fallback's call form: schema order, positional, trailing defaults dropped; a value of another type than
    its default, a tensor-like value or a keyword the schema does not name keeps the call as it was."""
    route = torch.ops.moe.route.default._schema
    pos = inductor_options.positional_arguments
    kw = dict(order="score_then_topk", n_group=1, topk_group=1, group_score="top2_sum", renormalize=False,
              routed_scaling_factor=1.0, replay=None)
    assert pos(route, ("x", None, 1, "sigmoid"), kw) == (("x", None, 1, "sigmoid"), {})
    # A non-default in the middle keeps everything before it; only the defaults after the last one go.
    assert pos(route, ("x", "b", 8, "sigmoid"), {**kw, "n_group": 8, "topk_group": 4, "renormalize": True}) == \
        (("x", "b", 8, "sigmoid", "score_then_topk", 8, 4, "top2_sum", True), {})
    # 2 is not the default 1.0 (and 1 would not be either: an int where the schema says float).
    assert pos(route, ("x", None, 2), {**kw, "routed_scaling_factor": 2.5}) == \
        (("x", None, 2, "softmax", "score_then_topk", 1, 1, "top2_sum", False, 2.5), {})
    assert pos(route, ("x", None, 2), {**kw, "routed_scaling_factor": 1}) == \
        (("x", None, 2, "softmax", "score_then_topk", 1, 1, "top2_sum", False, 1), {})
    replay = object()  # stands for an IR node: never a default
    assert pos(route, ("x", None, 2), {**kw, "replay": replay})[0][-1] is replay
    assert pos(route, ("x",), {"k": 2, "bogus": 1}) == (("x",), {"k": 2, "bogus": 1})
    assert pos(route, ("x",), {}) == (("x",), {})  # k missing: not ours to complete


def test_compiled_wrapper_calls_moe_ops_positionally():
    """Inductor's Python wrapper calls a raised router's op with its non-default arguments only, positional (the
    argument parser's keyword path cost a top-1 router at decode its lead over inductor's fused kernel), forward
    and backward, and the results stay eager's."""
    from torch._inductor.utils import fresh_cache, run_and_get_code

    def top1(x):
        v, i = x.max(dim=-1, keepdim=True)
        return torch.sigmoid(v), i.to(torch.int32)

    c = torch.compile(top1, backend="moe", dynamic=True)
    x = torch.randn(33, 16, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)

    def step():
        w, i = c(x)
        w.sum().backward()
        return w, i

    with fresh_cache(), capture_graphs() as log:
        (w, i), codes = run_and_get_code(step)
    assert {op for g in log for op in g.moe_ops()} == {"route"}
    calls = [m.group(1) for code in codes for m in re.finditer(r"= (torch\.ops\.moe\.\w+\.default\(.*\))$", code,
                                                                 re.M)]
    assert len(calls) == 2, calls
    # An unbiased sigmoid is raised to order topk_then_score (one sigmoid a token, not E): still positional.
    assert re.fullmatch(r"torch\.ops\.moe\.route\.default\(\w+, None, 1, 'sigmoid', 'topk_then_score'\)",
                        calls[0]), calls
    assert re.fullmatch(r"torch\.ops\.moe\.route_backward\.default\(\w+, \w+, \w+, 'sigmoid'\)", calls[1]), calls
    w_ref, i_ref = top1(x_ref)
    w_ref.sum().backward()
    torch.testing.assert_close(w, w_ref)
    assert torch.equal(i, i_ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
