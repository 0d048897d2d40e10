"""Hash routing raised (issue #79): the weights of experts a table gives (``idx = table[input_ids]``, DeepSeek-V4's
hash layers), renormalised scores gathered at them, become ``moe.route(..., replay=idx)``
(python/moe_mlir/frontend/raising_replay.py). A renormalised softmax needs no normaliser there (it cancels): the
kernel weighs the k given logits against the row's max (lib/Conversion/MoEToCPU/Route.cpp).

Each router is compiled once and called at 1, 7, 33 and 4096 tokens (the first compile static, then a symbolic
token count); every graph the backend compiled holds the route with its replay and neither the softmax nor the
gather, and the weights and the logits' gradient equal eager's. Degenerate rows follow the dialect where eager
divides 0 by 0 (every given expert's score 0: zero weights, zero gradient, instead of NaN).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typing import Callable  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402
from moe_mlir.ops import routing as R  # noqa: E402
from torch_checks import needs_cpu_kernels  # noqa: E402

pytestmark = needs_cpu_kernels

E, K, VOCAB = 64, 6, 500
TOKENS = (1, 7, 33, 4096)
#: f32: the kernel divides exp(x - m) by the picks' sum once, eager divides the softmax's quotients again.
ATOL, RTOL = 1e-6, 1e-5


def _table(seed: int = 0, experts: int = E, k: int = K) -> torch.Tensor:
    """A [VOCAB, k] token-to-experts table (int64, as a registered buffer holds it); row 0 repeats an expert."""
    g = torch.Generator().manual_seed(seed)
    table = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(VOCAB)])
    table[0, 1] = table[0, 0]
    return table


def softmax_index(logits, table, ids):
    """The plain spelling: softmax, ``table[ids]``, gather, renormalise."""
    scores = logits.softmax(-1)
    idx = table[ids]
    w = scores.gather(1, idx)
    return w / w.sum(-1, keepdim=True), idx


def softmax_embedding_scaled(logits, table, ids):
    """``F.embedding`` as the lookup, ``F.softmax(..., dtype=torch.float)``, an in-place renormalisation, a scale."""
    scores = F.softmax(logits, dim=-1, dtype=torch.float)
    idx = F.embedding(ids, table)
    w = torch.gather(scores, -1, idx)
    w /= w.sum(dim=-1, keepdim=True)
    return w * 2.5, idx


def softmax_index_select_eps(logits, table, ids):
    """``index_select`` as the lookup, an epsilon in the denominator (DeepSeek's 1e-20), int32 indices."""
    scores = torch.softmax(logits, dim=1)
    idx = table.index_select(0, ids).int()
    w = scores.gather(1, idx.long())
    return w / (w.sum(-1, keepdim=True) + 1e-20), idx


SPELLINGS: dict[str, Callable] = {f.__name__: f for f in (softmax_index, softmax_embedding_scaled,
                                                           softmax_index_select_eps)}


def _logits(T: int, seed: int, requires_grad: bool = True) -> torch.Tensor:
    x = torch.randn(T, E, generator=torch.Generator().manual_seed(seed)) * 2
    return x.requires_grad_(requires_grad)


def _ids(T: int, seed: int) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (T,), generator=torch.Generator().manual_seed(seed + 1))
    ids[0] = 0  # the table row with a repeated expert
    return ids


def _graph_ops(log) -> set[str]:
    return {str(n.target) for g in log for n in g.graph_module.graph.nodes if n.op == "call_function"}


def _assert_raised(log) -> None:
    """Every compiled graph has the route, given its indices (the replay operand), and no softmax or gather."""
    assert log and all(g.fallback is None for g in log), [g.fallback for g in log]
    for g in log:
        assert g.moe_ops() == ["route"], g.graph_module.code
        (route,) = [n for n in g.graph_module.graph.nodes if n.op == "call_function" and "moe.route" in str(n.target)]
        replay = route.args[10] if len(route.args) > 10 else route.kwargs.get("replay")
        assert isinstance(replay, torch.fx.Node), route.format_node()
    left = {t for t in _graph_ops(log) if "softmax" in t or "gather" in t}
    assert not left, left


def _raised_call(fn, x, table, ids):
    """``fn`` compiled afresh under backend "moe" and called once: its (weights, indices), the routing raised."""
    torch._dynamo.reset()
    with capture_graphs() as log:
        out = torch.compile(fn, backend="moe")(x, table, ids)
    _assert_raised(log)
    return out


@pytest.fixture
def kernels_only(monkeypatch):
    """The CPU kernel serves every call of the op (the eager reference would mask a raising that changed nothing)."""
    def fail(*a, **kw):
        raise AssertionError("the eager reference of moe.route ran")
    monkeypatch.setattr(R, "_route_ref", fail)


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_hash_router_is_raised_and_equals_eager(spelling, kernels_only):
    fn = SPELLINGS[spelling]
    table = _table()
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="moe")
    with capture_graphs() as log:
        for T in TOKENS:
            x, ids = _logits(T, seed=T), _ids(T, seed=T)
            cot = torch.randn(T, K, generator=torch.Generator().manual_seed(T + 2))
            w, idx = compiled(x, table, ids)
            w_e, idx_e = fn(x, table, ids)
            assert torch.equal(idx, idx_e)
            torch.testing.assert_close(w, w_e, atol=ATOL, rtol=RTOL)
            (g,) = torch.autograd.grad(w, x, cot)
            (g_e,) = torch.autograd.grad(w_e, x, cot)
            torch.testing.assert_close(g, g_e, atol=ATOL, rtol=RTOL)
    _assert_raised(log)


def test_rows_with_minus_inf_logits(kernels_only):
    """-inf logits score 0: among the given experts they weigh 0, elsewhere they change nothing. A row whose given
    experts are all -inf has a zero sum: zero weights and gradient (eager: 0/0, NaN); so has a row of -inf."""
    table = _table(seed=3)
    T = 8
    x = _logits(T, seed=5, requires_grad=False)
    ids = _ids(T, seed=5)
    given = table[ids]
    x[1, given[1, :2]] = float("-inf")  # two given experts masked
    x[2, :10] = float("-inf")  # masked experts wherever the table put them
    x[3, given[3]] = float("-inf")  # every given expert masked
    x[4] = float("-inf")  # the whole row
    x.requires_grad_(True)
    cot = torch.randn(T, K, generator=torch.Generator().manual_seed(6))
    w, _ = _raised_call(softmax_index, x, table, ids)
    w_e, _ = softmax_index(x, table, ids)
    finite = [0, 1, 2, 5, 6, 7]
    torch.testing.assert_close(w[finite], w_e[finite], atol=ATOL, rtol=RTOL)
    assert torch.all(w[1, :2] == 0) and torch.all(w[3:5] == 0)
    assert torch.isnan(w_e[3:5]).all()
    (g,) = torch.autograd.grad(w, x, cot)
    (g_e,) = torch.autograd.grad(w_e[finite], x, cot[finite])
    torch.testing.assert_close(g[finite], g_e[finite], atol=ATOL, rtol=RTOL)
    assert torch.all(g[3:5] == 0)


def test_repeated_experts_in_a_table_row(kernels_only):
    """A table row may name an expert twice: it is weighed twice (never merged), and its gradient accumulates."""
    table = _table(seed=4)
    table[7] = table[7, 0]  # one expert k times
    table[8, 3:] = table[8, :3]  # three experts twice each
    T = 9
    x = _logits(T, seed=7)
    ids = torch.arange(T)
    cot = torch.randn(T, K, generator=torch.Generator().manual_seed(8))
    w, idx = _raised_call(softmax_index, x, table, ids)
    w_e, _ = softmax_index(x, table, ids)
    torch.testing.assert_close(w, w_e, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(w[7], torch.full((K,), 1.0 / K))
    (g,) = torch.autograd.grad(w, x, cot)
    (g_e,) = torch.autograd.grad(w_e, x, cot)
    torch.testing.assert_close(g, g_e, atol=ATOL, rtol=RTOL)


def test_bf16_logits_softmax_in_f32(kernels_only):
    """``F.softmax(bf16 logits, dtype=torch.float)``: the op reads the bf16 logits in f32, as that softmax does."""
    table = _table(seed=9)
    x = _logits(33, seed=9, requires_grad=False).bfloat16().requires_grad_(True)
    ids = _ids(33, seed=9)
    w, _ = _raised_call(softmax_embedding_scaled, x, table, ids)
    w_e, _ = softmax_embedding_scaled(x, table, ids)
    torch.testing.assert_close(w, w_e, atol=ATOL, rtol=RTOL)
    cot = torch.randn(33, K, generator=torch.Generator().manual_seed(10))
    (g,), (g_e,) = torch.autograd.grad(w, x, cot), torch.autograd.grad(w_e, x, cot)
    assert g.dtype == g_e.dtype == torch.bfloat16
    torch.testing.assert_close(g, g_e)


def _not_renormalised(logits, table, ids):
    idx = table[ids]
    return logits.softmax(-1).gather(1, idx) * 2.0, idx


def _chosen_from_the_logits(logits, table, ids):
    idx = logits.detach().abs().argsort(-1, descending=True)[:, :K]
    w = logits.softmax(-1).gather(1, idx)
    return w / w.sum(-1, keepdim=True), idx


def _gathered_along_the_tokens(logits, table, ids):
    idx = table[ids][:, :1].expand(-1, E) % logits.shape[0]
    w = logits.softmax(-1).gather(0, idx)
    return w / w.sum(-1, keepdim=True), idx


@pytest.mark.parametrize("fn", [_not_renormalised, _chosen_from_the_logits, _gathered_along_the_tokens])
def test_other_gathers_are_not_replays(fn):
    """Not the hash router's chain: no renormalisation (the softmax's normaliser would be needed), indices computed
    from the logits (a choice: the routing region's business), a gather along the tokens. Left alone, and equal."""
    table = _table(seed=11)
    x, ids = _logits(7, seed=11, requires_grad=False), _ids(7, seed=11)
    torch._dynamo.reset()
    with capture_graphs() as log:
        got = torch.compile(fn, backend="moe")(x, table, ids)
    replays = [n for g in log for n in g.graph_module.graph.nodes
               if n.op == "call_function" and "moe.route" in str(n.target) and len(n.args) > 10
               and isinstance(n.args[10], torch.fx.Node)]
    assert not replays, [g.graph_module.code for g in log]
    for a, b in zip(got, fn(x, table, ids)):
        torch.testing.assert_close(a, b)


# ----------------------------------------------------------------------------------------------------------------
# transformers' DeepSeek-V4 hash router (sqrt(softplus(x)) scores, a custom score region)
# ----------------------------------------------------------------------------------------------------------------


def _deepseek_v4_hash_router() -> torch.nn.Module:
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HashRouter

    cfg = DeepseekV4Config(hidden_size=32, vocab_size=VOCAB, n_routed_experts=E, num_experts_per_tok=K)
    router = DeepseekV4HashRouter(cfg)
    g = torch.Generator().manual_seed(12)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=g))
        router.tid2eid.copy_(_table(seed=12))  # the checkpoint's table (the model initialises it to zeros)
    return router


def test_deepseek_v4_hash_router(kernels_only):
    router = _deepseek_v4_hash_router()
    torch._dynamo.reset()
    compiled = torch.compile(router, backend="moe")
    with capture_graphs() as log:
        for T in (1, 7, 33):
            h = torch.randn(1, T, 32, generator=torch.Generator().manual_seed(T)).requires_grad_(True)
            ids = _ids(T, seed=T).view(1, T)
            logits, w, idx = compiled(h, ids)
            logits_e, w_e, idx_e = router(h, ids)
            assert torch.equal(idx, idx_e)
            torch.testing.assert_close(logits, logits_e)
            torch.testing.assert_close(w, w_e, atol=ATOL, rtol=RTOL)
            cot = torch.randn(T, K, generator=torch.Generator().manual_seed(T + 1))
            grads = torch.autograd.grad(w, (h, router.weight), cot)
            grads_e = torch.autograd.grad(w_e, (h, router.weight), cot)
            for a, b in zip(grads, grads_e):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert log and all(g.moe_ops() == ["route"] for g in log), [g.graph_module.code for g in log]
    left = {t for t in _graph_ops(log) if any(w in t for w in ("gather", "softplus", "sqrt"))}
    assert not left, left
