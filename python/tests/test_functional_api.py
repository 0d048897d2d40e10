"""The Pythonic API (moe_mlir/functional.py, issue 83 item 3): ``moe_mlir.route``, ``moe_mlir.topk_renorm``,
``moe_mlir.dispatch_plan``... against ``torch.ops.moe.*`` (the same op: equal bits) and against a plain PyTorch
spelling of each (softmax/sigmoid, a stable descending sort for the top-k so that ties go to the lowest index as the
ops' do, gather, renormalize), on random inputs, ties, one token, k = E and zero tokens; callables as scores;
gradients; index dtypes; the error types and their messages; keyword-only options; ``help()``; torch.compile.

Gradients are compared with eager PyTorch in f32, not with gradcheck: the ops compute in f32 whatever the input
(route and topk_renorm reject f64 logits, the losses compute f64 logits in f32), so a float64 finite difference
would measure f32 rounding.
"""

from __future__ import annotations

import importlib
import inspect
import pydoc
import re
import types
import typing
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import moe_mlir
from moe_mlir import functional as MF
from moe_mlir import ops
from moe_mlir.ops import loading

SR = importlib.import_module("moe_mlir.ops.score_region")  # the module (moe_mlir.ops.score_region is its function)

#: f32 tolerances against the plain spelling: the kernels sum and exponentiate in another order (a few ulps).
ATOL, RTOL = 2e-6, 2e-5
INF = float("inf")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sqrtsoftplus(x: Tensor) -> Tensor:
    return torch.sqrt(F.softplus(x))


def xtanh2(x: Tensor) -> Tensor:
    return x * torch.tanh(x) + 2


def plain_route(logits, bias, k, score, n_group=1, topk_group=1, renormalize=False, scale=1.0):
    """The gate in plain PyTorch (DeepSeek-V3's HF router generalised): ties go to the lowest index (stable sort)."""
    s = score(logits.float())
    choice = s if bias is None else s + bias.float()
    T, E = choice.shape
    if n_group > 1:
        groups = choice.view(T, n_group, E // n_group).topk(2, dim=-1).values.sum(-1)
        best = torch.sort(groups, dim=-1, descending=True, stable=True).indices[:, :topk_group]
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter(1, best, True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // n_group, dim=1), -INF)
    idx = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :k]
    w = s.gather(1, idx)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w * scale, idx


def logits_of(kind: str, T: int, E: int, seed: int = 0) -> Tensor:
    if kind == "random":
        return torch.randn(T, E, generator=gen(seed))
    # ties: three values a row, so most picks tie with another expert
    return torch.randint(0, 3, (T, E), generator=gen(seed)).float()


ROUTERS = {
    # name: (E, route keywords, the plain spelling's score)
    "mixtral_softmax": (8, dict(k=2), lambda x: torch.softmax(x, -1)),
    "qwen_renormalized": (16, dict(k=4, renormalize=True), lambda x: torch.softmax(x, -1)),
    "deepseek_v3": (32, dict(k=4, scoring="sigmoid", n_group=4, topk_group=2, renormalize=True,
                             routed_scaling_factor=2.5), torch.sigmoid),
    "deepseek_v4_named": (16, dict(k=3, scoring="sqrtsoftplus", renormalize=True), sqrtsoftplus),
    "deepseek_v4_callable": (16, dict(k=3, scoring=sqrtsoftplus, renormalize=True), sqrtsoftplus),
    "custom_xtanh2": (12, dict(k=3, scoring=xtanh2), xtanh2),
}


def _plain_kwargs(kw: dict) -> dict:
    return dict(n_group=kw.get("n_group", 1), topk_group=kw.get("topk_group", 1),
                renormalize=kw.get("renormalize", False), scale=kw.get("routed_scaling_factor", 1.0))


def _op_scoring(scoring) -> str:
    return MF._scoring(scoring)


@pytest.mark.parametrize("kind", ["random", "ties"])
@pytest.mark.parametrize("T", [37, 1, 0])
@pytest.mark.parametrize("name", list(ROUTERS))
def test_route_matches_the_torch_op_and_plain_pytorch(name, T, kind, dev):
    E, kw, score = ROUTERS[name]
    logits = logits_of(kind, T, E)
    bias = torch.randn(E, generator=gen(1)) * 0.1 if kw.get("scoring") not in (None, "softmax") else None
    w, idx = moe_mlir.route(logits.to(dev), None if bias is None else bias.to(dev), **kw)
    assert w.shape == idx.shape == (T, kw["k"]) and idx.dtype == torch.int64 and w.dtype == torch.float32
    op = torch.ops.moe.route(logits.to(dev), None if bias is None else bias.to(dev), kw["k"],
                             _op_scoring(kw.get("scoring", "softmax")), "score_then_topk", kw.get("n_group", 1),
                             kw.get("topk_group", 1), "top2_sum", kw.get("renormalize", False),
                             kw.get("routed_scaling_factor", 1.0))
    assert torch.equal(w, op[0]) and torch.equal(idx, op[1].long())
    pw, pidx = plain_route(logits, bias, kw["k"], score, **_plain_kwargs(kw))
    assert torch.equal(idx.cpu(), pidx)
    torch.testing.assert_close(w.cpu(), pw, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kind", ["random", "ties"])
def test_route_k_equal_to_the_experts(kind, dev):
    E = 8
    logits = logits_of(kind, 5, E, seed=3)
    w, idx = moe_mlir.route(logits.to(dev), k=E, scoring="sigmoid", renormalize=True)
    pw, pidx = plain_route(logits, None, E, torch.sigmoid, renormalize=True)
    assert torch.equal(idx.cpu(), pidx) and torch.equal(idx.cpu().sort(-1).values, torch.arange(E).expand(5, E))
    torch.testing.assert_close(w.cpu(), pw, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("T", [29, 1, 0])
@pytest.mark.parametrize("mode,renormalize", [("logits", True), ("logits", False), ("probs", True), ("probs", False)])
def test_topk_renorm_matches_the_torch_op_and_plain_pytorch(mode, renormalize, T, dev):
    E, k = 12, 4
    x = logits_of("ties" if T == 29 else "random", T, E, seed=5)
    scores = torch.softmax(x, -1) if mode == "probs" else x
    w, idx = moe_mlir.topk_renorm(scores.to(dev), k=k, mode=mode, renormalize=renormalize)
    ow, oidx = torch.ops.moe.topk_renorm(scores.to(dev), k, mode, renormalize)
    assert torch.equal(w, ow) and torch.equal(idx, oidx.long()) and idx.dtype == torch.int64
    pidx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
    picked = scores.gather(1, pidx)
    if mode == "logits":
        pw = torch.softmax(picked, -1) if renormalize else torch.softmax(scores, -1).gather(1, pidx)
    else:
        pw = picked / picked.sum(-1, keepdim=True) if renormalize else picked
    assert torch.equal(idx.cpu(), pidx)
    torch.testing.assert_close(w.cpu(), pw, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("T", [23, 1, 0])
def test_dispatch_plan_matches_the_torch_op_and_plain_pytorch(T, dev):
    E, k = 6, 2
    indices = torch.sort(torch.rand(T, E, generator=gen(7)), dim=-1).indices[:, :k]
    plan = moe_mlir.dispatch_plan(indices.to(dev), num_experts=E)
    assert isinstance(plan, moe_mlir.DispatchPlan) and all(t.dtype == torch.int64 for t in plan)
    op = torch.ops.moe.dispatch_plan(indices.to(dev), E, 1)
    assert all(torch.equal(a, b.long()) for a, b in zip(plan, op))
    flat = indices.reshape(-1)
    counts = torch.bincount(flat, minlength=E)
    order = torch.sort(flat, stable=True).indices
    assert torch.equal(plan.counts.cpu(), counts)
    assert torch.equal(plan.offsets.cpu(), torch.cat([counts.new_zeros(1), counts.cumsum(0)]))
    assert torch.equal(plan.order.cpu(), order)
    assert torch.equal(plan.inverse.cpu(), torch.argsort(order))
    assert torch.equal(plan.padded_order.cpu(), order) and torch.equal(plan.block_experts.cpu(), flat[order])
    assert plan.num_padded.tolist() == [T * k]
    blocked = moe_mlir.dispatch_plan(indices.to(dev), num_experts=E, block_size=4, indices_dtype=torch.int32)
    assert all(torch.equal(a, b) for a, b in zip(blocked, torch.ops.moe.dispatch_plan(indices.to(dev), E, 4)))


def test_callable_scores_are_the_scores_they_spell():
    logits = torch.randn(41, 16, generator=gen(11))
    bias = torch.randn(16, generator=gen(12)) * 0.1
    named = moe_mlir.route(logits, bias, k=4, scoring="sqrtsoftplus", renormalize=True, routed_scaling_factor=1.5)
    spelled = moe_mlir.route(logits, bias, k=4, scoring=lambda x: torch.sqrt(F.softplus(x)), renormalize=True,
                             routed_scaling_factor=1.5)
    assert torch.equal(named.weights, spelled.weights) and torch.equal(named.indices, spelled.indices)
    # A callable spelling a preset computes the same score through a region (not the preset's code): equal choice,
    # weights within f32 rounding.
    preset = moe_mlir.route(logits, bias, k=4, scoring="sigmoid")
    region = moe_mlir.route(logits, bias, k=4, scoring=torch.sigmoid)
    assert torch.equal(preset.indices, region.indices)
    torch.testing.assert_close(preset.weights, region.weights, atol=ATOL, rtol=RTOL)


def test_a_callable_is_traced_once():
    logits = torch.randn(9, 8, generator=gen(13))
    SR._REGIONS.clear()
    for scale in (1.0, 1.0, 2.0):
        moe_mlir.route(logits, k=2, scoring=lambda x: torch.tanh(x) * scale)  # a new lambda each time
    assert len(SR._REGIONS) == 2  # one region per distinct closure value


def _loss_of_weights(w: Tensor) -> Tensor:
    return (w * torch.linspace(0.5, 2.0, w.shape[-1])).sum()


@pytest.mark.parametrize("name", ["mixtral_softmax", "qwen_renormalized", "deepseek_v3", "deepseek_v4_callable",
                                  "custom_xtanh2"])
def test_route_gradient_matches_eager(name):
    E, kw, score = ROUTERS[name]
    logits = torch.randn(19, E, generator=gen(17))
    bias = torch.randn(E, generator=gen(18)) * 0.1 if kw.get("scoring") not in (None, "softmax") else None
    x = logits.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(_loss_of_weights(moe_mlir.route(x, bias, **kw).weights), x)
    xe = logits.clone().requires_grad_(True)
    (ge,) = torch.autograd.grad(_loss_of_weights(plain_route(xe, bias, kw["k"], score, **_plain_kwargs(kw))[0]), xe)
    torch.testing.assert_close(g, ge, atol=1e-5, rtol=1e-4)


def test_topk_renorm_and_loss_gradients_match_eager():
    x = torch.randn(13, 8, generator=gen(19))
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (ga,) = torch.autograd.grad(_loss_of_weights(moe_mlir.topk_renorm(a, k=3).weights), a)
    idx = torch.sort(b, dim=-1, descending=True, stable=True).indices[:, :3]
    (gb,) = torch.autograd.grad(_loss_of_weights(torch.softmax(b.gather(1, idx), -1)), b)
    torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-4)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (ga,) = torch.autograd.grad(moe_mlir.router_z_loss(a), a)
    (gb,) = torch.autograd.grad(torch.logsumexp(b, -1).square().mean(), b)
    torch.testing.assert_close(ga, gb, atol=1e-6, rtol=1e-5)


def test_index_dtypes():
    x = torch.randn(6, 8, generator=gen(23))
    i64, i32 = torch.int64, torch.int32
    assert moe_mlir.route(x, k=2).indices.dtype == i64
    assert moe_mlir.route(x, k=2, indices_dtype=i32).indices.dtype == i32
    assert moe_mlir.topk_renorm(x, k=2).indices.dtype == i64
    assert moe_mlir.topk_renorm(x, k=2, indices_dtype=i32).indices.dtype == i32
    idx = moe_mlir.topk_renorm(x, k=2).indices
    assert {t.dtype for t in moe_mlir.dispatch_plan(idx, num_experts=8, indices_dtype=i32)} == {i32}
    u, e = torch.randn(1, 6, 4, generator=gen(1)), torch.softmax(torch.randn(1, 6, 8, generator=gen(2)), -1)
    assert moe_mlir.similarity_inform_topk(u, e, k=2).indices.dtype == i64
    assert moe_mlir.similarity_inform_topk(u, e, k=2, indices_dtype=i32).indices.dtype == i32


def test_the_other_ops_are_their_torch_ops():
    g = gen(29)
    T, E, k = 10, 6, 2
    logits = torch.randn(T, E, generator=g)
    idx = torch.sort(torch.rand(T, E, generator=g), -1).indices[:, :k]
    w = torch.rand(T, k, generator=g)
    mask = (torch.rand(T, generator=g) > 0.3).float()
    pairs = [
        (moe_mlir.apply_capacity(idx, w, num_experts=E, capacity=3, drop="probability"),
         torch.ops.moe.apply_capacity(idx, w, E, 3, "probability")),
        (moe_mlir.bias_update(torch.zeros(E), torch.arange(E), rate=0.01),
         torch.ops.moe.bias_update(torch.zeros(E), torch.arange(E), 0.01)),
        (moe_mlir.load_balancing_loss(logits, mask, k=k), torch.ops.moe.load_balancing_loss(logits, k, mask)),
        (moe_mlir.router_z_loss(logits), torch.ops.moe.router_z_loss(logits)),
        (moe_mlir.router_stats(logits, k=k), torch.ops.moe.router_stats(logits, k)),
        (moe_mlir.sequence_balance_loss(torch.sigmoid(logits).view(2, 5, E), idx.view(2, 5, k)),
         torch.ops.moe.sequence_balance_loss(torch.sigmoid(logits).view(2, 5, E), idx.view(2, 5, k), k)),
    ]
    u, e = torch.randn(2, 5, 4, generator=g), torch.softmax(torch.randn(2, 5, E, generator=g), -1)
    pairs += [
        (moe_mlir.similarity_inform(u, e, tau=0.5, causal=True), torch.ops.moe.similarity_inform(u, e, None, None,
                                                                                                 0.5, True)),
        (moe_mlir.similarity_inform_topk(u, e, k=k), torch.ops.moe.similarity_inform_topk(u, e, k)),
    ]
    H, Dh = 2, 3
    scores, v = torch.randn(2, H, 5, 5, generator=g), torch.randn(2, H, 5, Dh, generator=g)
    wo = torch.randn(4, H * Dh, generator=g)
    pairs += [
        (moe_mlir.attention_posterior(scores, u, v, wo, e), torch.ops.moe.attention_posterior(scores, u, v, wo, e)),
        (moe_mlir.attention_posterior_topk(scores, u, v, wo, e, k=k),
         torch.ops.moe.attention_posterior_topk(scores, u, v, wo, e, k)),
        (moe_mlir.mad_dispersion(u.view(10, 4), idx[:, 0], num_experts=E, measure="variance"),
         torch.ops.moe.mad_dispersion(u.view(10, 4), idx[:, 0], E, 1e-4, 10.0, "feature", "variance")),
        (moe_mlir.adjacency_update(torch.eye(E), idx, beta=0.5, norm="col"),
         torch.ops.moe.adjacency_update(torch.eye(E), idx, 0.5, "col")),
    ]
    emb, w1, b1 = torch.randn(3, generator=g), torch.randn(5, 3, generator=g), torch.randn(5, generator=g)
    w2, b2 = torch.randn(E * 5, 5, generator=g), torch.randn(E * 5, generator=g)
    pairs.append((moe_mlir.hyper_router(emb, w1, b1, w2, b2, num_experts=E),
                  torch.ops.moe.hyper_router(emb, w1, b1, w2, b2, E)))
    for ours, op in pairs:
        ours, op = (ours, op) if isinstance(op, tuple) else ((ours,), (op,))
        assert type(ours) is not tuple or len(ours) == 1  # every tuple result is a NamedTuple
        assert len(ours) == len(op)
        for a, b in zip(ours, op):
            assert torch.equal(a, b.to(a.dtype)), (a, b)
    assert moe_mlir.capacity_of(1024, 1, 64, 1.25) == 20


# ----------------------------------------------------------------------------------------------------------------
# Options: Literal types (one definition each, the op verifier's), errors, keyword-only
# ----------------------------------------------------------------------------------------------------------------

#: (torch op call with the option set to a value no op takes, the option, its Literal alias)
_SMALL = torch.randn(4, 8)
LITERALS = [
    (lambda v: torch.ops.moe.route(_SMALL, None, 2, v), "scoring", ops.routing.RouteScoring),
    (lambda v: torch.ops.moe.route(_SMALL, None, 2, order=v), "order", ops.routing.RouteOrder),
    (lambda v: torch.ops.moe.route(_SMALL, None, 2, group_score=v), "group_score", ops.routing.GroupScore),
    (lambda v: torch.ops.moe.topk_renorm(_SMALL, 2, v), "mode", ops.topk.TopkMode),
    (lambda v: torch.ops.moe.apply_capacity(torch.zeros(4, 2, dtype=torch.long), torch.rand(4, 2), 8, 2, v),
     "drop", ops.capacity.CapacityDrop),
    (lambda v: torch.ops.moe.mad_dispersion(_SMALL, torch.zeros(4, dtype=torch.long), 2, normalize=v),
     "normalize", ops.seed_routers.DispersionNormalize),
    (lambda v: torch.ops.moe.mad_dispersion(_SMALL, torch.zeros(4, dtype=torch.long), 2, measure=v),
     "measure", ops.seed_routers.DispersionMeasure),
    (lambda v: torch.ops.moe.mad_dispersion(_SMALL, torch.zeros(4, dtype=torch.long), 2, empty=v),
     "empty", ops.seed_routers.EmptyCluster),
    (lambda v: torch.ops.moe.adjacency_update(torch.eye(8), torch.zeros(4, 2, dtype=torch.long), norm=v),
     "norm", ops.seed_routers.AdjacencyNorm),
    (lambda v: torch.ops.moe.attention_posterior(torch.randn(1, 2, 3, 3), torch.randn(1, 3, 4),
                                                 torch.randn(1, 2, 3, 2), torch.randn(4, 4),
                                                 torch.softmax(torch.randn(1, 3, 5), -1), head_select=v),
     "head_select", ops.mixing.HeadSelect),
]


@pytest.mark.parametrize("call,name,alias", LITERALS, ids=[name for _, name, _ in LITERALS])
def test_each_literal_is_the_op_verifiers_enum(call, name, alias):
    """The Python definition of an option's values agrees with the ODS enum its torch op is verified against."""
    with pytest.raises(ValueError) as err:
        call("no such value")
    listed = re.search(rf"'{name}' must be one of (.*), got", str(err.value)).group(1)
    values = tuple(v.strip("'") for v in listed.split(", "))
    extra = ("custom",) if name == "scoring" else ()  # the enum's region case: "custom:<region>" or a callable
    assert values == typing.get_args(alias) + extra


BAD_OPTIONS = [
    (lambda: moe_mlir.route(_SMALL, k=2, scoring="softplus"),
     "'scoring' must be one of 'softmax', 'sigmoid', 'none', 'sqrtsoftplus' or a callable, got 'softplus'"),
    (lambda: moe_mlir.route(_SMALL, k=2, order="topk"),
     "'order' must be one of 'score_then_topk', 'topk_then_score', got 'topk'"),
    (lambda: moe_mlir.route(_SMALL, k=2, group_score="sum"), "'group_score' must be one of 'top2_sum', 'max'"),
    (lambda: moe_mlir.topk_renorm(_SMALL, k=2, mode="prob"), "'mode' must be one of 'logits', 'probs', got 'prob'"),
    (lambda: moe_mlir.apply_capacity(torch.zeros(4, 2, dtype=torch.long), torch.rand(4, 2), num_experts=8,
                                     capacity=2, drop="random"), "'drop' must be one of 'position', 'probability'"),
    (lambda: moe_mlir.mad_dispersion(_SMALL, torch.zeros(4, dtype=torch.long), num_experts=2, measure="std"),
     "'measure' must be one of 'mad', 'variance'"),
    (lambda: moe_mlir.adjacency_update(torch.eye(8), torch.zeros(4, 2, dtype=torch.long), norm="sym"),
     "'norm' must be one of 'row', 'col', 'none'"),
    (lambda: moe_mlir.route(_SMALL, k=2, scoring="custom:^bb0(%x: f32): moe.yield %x : f32"),
     "takes a Python callable for a custom score, not IR text"),
    (lambda: moe_mlir.route(_SMALL, k=2, indices_dtype=torch.int16),
     "'indices_dtype' must be torch.int64 or torch.int32, got torch.int16"),
    (lambda: moe_mlir.route(_SMALL, k=9), r"'k' \(9\) must be in \[1, 8\]"),
    (lambda: moe_mlir.topk_renorm(_SMALL, k=0), r"'k' \(0\) must be in \[1, 8\]"),
    (lambda: moe_mlir.route(_SMALL[0], k=2), "rank"),
    (lambda: moe_mlir.route(_SMALL, k=2, replay=torch.full((4, 2), 8)), "'replay' holds 8, outside"),
    (lambda: moe_mlir.dispatch_plan(torch.full((4, 2), 5), num_experts=4), "'indices' holds 5, outside"),
    # callables that are not elementwise scores
    (lambda: moe_mlir.route(_SMALL, k=2, scoring=lambda x: x - x.mean()), "aten.mean"),
    (lambda: moe_mlir.route(_SMALL, k=2, scoring=lambda x: x if x.sum() > 0 else -x), "not an elementwise function"),
    (lambda: moe_mlir.route(_SMALL, k=2, scoring=lambda x: x * x.numel()), "not elementwise: on a vector"),
    (lambda: moe_mlir.route(_SMALL, k=2, scoring=lambda x: 1.0), "must return one tensor"),
]


@pytest.mark.parametrize("call,msg", BAD_OPTIONS)
def test_values_and_shapes_are_value_errors(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


BAD_TYPES = [
    (lambda: moe_mlir.route(_SMALL.double(), k=2), "'logits' must be f32, f16 or bf16, got torch.float64"),
    (lambda: moe_mlir.topk_renorm(_SMALL.long(), k=2), "'scores' must be f32, f16 or bf16, got torch.int64"),
    (lambda: moe_mlir.dispatch_plan(_SMALL, num_experts=8), "'indices' must be i32 or i64, got torch.float32"),
    (lambda: moe_mlir.load_balancing_loss(_SMALL.long(), k=2), "'logits' must be f32, f16, bf16 or f64"),
    (lambda: moe_mlir.route(_SMALL.tolist(), k=2), "'logits' must be a Tensor, got list"),
    (lambda: moe_mlir.route(_SMALL, k=2.0), "'k' must be an int, got float"),
    (lambda: moe_mlir.route(_SMALL, k=True), "'k' must be an int, got bool"),
    (lambda: moe_mlir.route(_SMALL, k=2, renormalize="yes"), "'renormalize' must be a bool, got str"),
    (lambda: moe_mlir.route(_SMALL, k=2, routed_scaling_factor="2"), "'routed_scaling_factor' must be a float"),
    (lambda: moe_mlir.route(_SMALL, [0.0] * 8, k=2), "'bias' must be a Tensor or None, got list"),
]


@pytest.mark.parametrize("call,msg", BAD_TYPES)
def test_dtypes_and_argument_types_are_type_errors(call, msg):
    with pytest.raises(TypeError, match=re.escape(msg)):
        call()


def test_devices_are_runtime_errors():
    with pytest.raises(RuntimeError, match="'bias' is on meta but 'logits' is on cpu"):
        moe_mlir.route(_SMALL, torch.zeros(8, device="meta"), k=2)
    with pytest.raises(RuntimeError, match="'weights' is on meta but 'indices' is on cpu"):
        moe_mlir.apply_capacity(torch.zeros(4, 2, dtype=torch.long), torch.rand(4, 2, device="meta"),
                                num_experts=8, capacity=2)


def test_a_device_without_kernels_warns_once_and_runs_the_references(monkeypatch):
    """MPS, XPU...: the ops run the eager references there (torch ops on that device) after one warning per device
    type. No such device here: the eager kernel's note is called with a tensor-like on one."""
    monkeypatch.setattr(loading, "_DEVICES_WARNED", set())
    on_mps = types.SimpleNamespace(device=torch.device("mps"))
    with pytest.warns(RuntimeWarning, match="no compiled kernels for mps tensors; torch.ops.moe.* run the eager "
                                            "references"):
        loading._note_fallback(on_mps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loading._note_fallback(on_mps)  # once per device type
        loading._note_fallback(types.SimpleNamespace(device=torch.device("meta")))  # fake kernels: no warning


def _tensor_parameter(annotation) -> bool:
    return annotation is Tensor or Tensor in typing.get_args(annotation)


@pytest.mark.parametrize("name", [n for n in MF.__all__ if isinstance(getattr(MF, n), types.FunctionType)
                                  and n != "capacity_of"])
def test_tensors_are_positional_and_options_keyword_only(name):
    fn = getattr(MF, name)
    hints = typing.get_type_hints(fn)
    params = list(inspect.signature(fn).parameters.values())
    for p in params:
        if _tensor_parameter(hints[p.name]) and p.name != "replay":
            assert p.kind is p.POSITIONAL_OR_KEYWORD, f"{name}: tensor '{p.name}' is not positional"
        else:
            assert p.kind is p.KEYWORD_ONLY, f"{name}: option '{p.name}' is not keyword-only"
    assert fn.__doc__ and "Returns" in fn.__doc__ or name in ("bias_update", "router_z_loss"), name
    # an option passed by position is refused
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    with pytest.raises(TypeError, match="positional argument"):
        fn(*([None] * (len(positional) + 1)))


def test_the_package_exports_the_layer():
    for name in MF.__all__:
        assert getattr(moe_mlir, name) is getattr(MF, name) and name in moe_mlir.__all__
    namespace: dict = {}
    exec("from moe_mlir import *", namespace)
    assert namespace["compile"] is moe_mlir.api.compile and namespace["route"] is MF.route


def test_route_options_are_typed_literals():
    hints = typing.get_type_hints(MF.route)
    assert typing.get_args(typing.get_args(hints["scoring"])[0]) == ("softmax", "sigmoid", "none", "sqrtsoftplus")
    assert typing.get_args(hints["order"]) == ops.ROUTE_ORDERS
    assert hints["k"] is int


# ----------------------------------------------------------------------------------------------------------------
# help()
# ----------------------------------------------------------------------------------------------------------------


def test_help_of_the_pythonic_functions():
    text = pydoc.render_doc(moe_mlir.route, renderer=pydoc.plaintext)
    for phrase in ("route(logits: 'Tensor', bias: 'Optional[Tensor]' = None, *, k: 'int'", "Args:", "scoring:",
                   "sqrtsoftplus", "a callable", "indices_dtype:", "Returns:", "RouteResult", "Raises:", "Example"):
        assert phrase in text, phrase
    assert "counts" in pydoc.render_doc(moe_mlir.DispatchPlan, renderer=pydoc.plaintext)


def test_help_of_the_torch_ops():
    text = pydoc.render_doc(torch.ops.moe.route, renderer=pydoc.plaintext)
    for phrase in ("torch.ops.moe.route(Tensor logits, Tensor? bias, SymInt k, str scoring=\"softmax\"",
                   "A production MoE gate", "Args:", "replay:", "The Pythonic form", "moe_mlir.route(...)"):
        assert phrase in text, phrase
    assert torch.ops.moe.route.default.__doc__ == torch.ops.moe.route.__doc__ == ops.route.__doc__
    for name in dir(torch.ops.moe):
        packet = getattr(torch.ops.moe, name)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            assert packet.__doc__ and packet.__doc__.startswith(f"torch.ops.moe.{name}("), name


# ----------------------------------------------------------------------------------------------------------------
# torch.compile
# ----------------------------------------------------------------------------------------------------------------


def _router(x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    w, idx = moe_mlir.route(x, bias, k=3, scoring=lambda t: torch.sqrt(F.softplus(t)), renormalize=True,
                            routed_scaling_factor=2.0)
    return w * 2, idx


def _scored(x: Tensor, score) -> Tensor:
    return moe_mlir.route(x, k=2, scoring=score).weights


def test_under_torch_compile_backend_moe():
    torch._dynamo.reset()
    compiled = torch.compile(_router, backend="moe", fullgraph=True)
    bias = torch.randn(16, generator=gen(31)) * 0.1
    for T in (5, 33):
        x = torch.randn(T, 16, generator=gen(T))
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        w, idx = compiled(a, bias)
        we, idxe = _router(b, bias)
        assert idx.dtype == torch.int64 and torch.equal(idx, idxe)
        torch.testing.assert_close(w, we, atol=ATOL, rtol=RTOL)
        (g,), (ge,) = torch.autograd.grad(w.sum(), a), torch.autograd.grad(we.sum(), b)
        torch.testing.assert_close(g, ge, atol=1e-5, rtol=1e-4)
    # a callable passed in: the graph is guarded on it
    scored = torch.compile(_scored, backend="moe", fullgraph=True)
    x = torch.randn(7, 16, generator=gen(37))
    torch.testing.assert_close(scored(x, torch.sigmoid), _scored(x, torch.sigmoid))
    torch.testing.assert_close(scored(x, xtanh2), _scored(x, xtanh2))
