"""Raising by meaning over the corpus of routing programs (routing_corpus.py): every program, in every spelling,
compiled once under ``torch.compile(backend="moe")`` and called at 1, 33, 64 and 4096 tokens (the first call
compiles static, the second recompiles with a symbolic token count, the others reuse it), is raised to the
expected ``torch.ops.moe`` op in every graph (no ``aten.topk`` left) and equals eager: forward (weights and
experts, as sets per row where the program does not sort) and backward (the logits' gradient).

The raised form is checked against each region before it is used (routing_region.check); these tests are the
end-to-end half: what a user's program computes after the rewrite."""

from __future__ import annotations

import pytest
import torch

from moe_mlir.backends.dynamo import capture_graphs
from routing_corpus import CORPUS, Program
from torch_checks import same_expert_sets

TOKENS = (1, 33, 64, 4096)


def _inputs(p: Program, T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, p.E, generator=g) * 2
    b = torch.randn(p.E, generator=g) * 0.3
    return x, b


def _graph_ops(log):
    return [[str(n.target) for n in g.graph_module.graph.nodes if n.op == "call_function"] for g in log]


#: One program of each router (its first spelling) under the other ways of asking for dynamic shapes.
FIRSTS = [p for j, p in enumerate(CORPUS) if all(q.name.split("/")[0] != p.name.split("/")[0] for q in CORPUS[:j])]
#: Spellings that reach the top-k through another op (sort/argsort sliced to k, max/argmax): rewritten to a top-k
#: first, where dynamic=True makes the experts' number symbolic too.
REWRITTEN = [p for p in CORPUS if p not in FIRSTS and any(w in p.name for w in ("sort", "max"))]
CASES = [pytest.param(p, "automatic", id=p.name) for p in CORPUS] + [
    pytest.param(p, mode, id=f"{p.name}-{mode}") for p in FIRSTS for mode in ("dynamic=True", "mark_dynamic")] + [
    pytest.param(p, "dynamic=True", id=f"{p.name}-dynamic=True") for p in REWRITTEN]


@pytest.mark.parametrize("p,mode", CASES)
def test_program_is_raised_at_every_token_count(p: Program, mode: str):
    """``automatic``: torch.compile's default (static, then symbolic at the second token count); ``dynamic=True``
    (every size symbolic, the experts' number and k included: raising specializes those); ``mark_dynamic`` on the
    token dim from the first call."""
    torch._dynamo.reset()
    compiled = torch.compile(p.fn, backend="moe", options={"dense": "eager"},
                             **({"dynamic": True} if mode == "dynamic=True" else {}))
    with capture_graphs() as log:
        for T in TOKENS:
            x, b = _inputs(p, T, seed=T)
            xr, xe = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
            if mode == "mark_dynamic" and T > 1:
                torch._dynamo.mark_dynamic(xr, 0)
            w, i = compiled(xr, b)
            w_e, i_e = p.fn(xe, b)
            assert i.dtype == i_e.dtype and w.dtype == w_e.dtype and w.shape == w_e.shape
            same_expert_sets(w.detach(), i.long(), w_e.detach(), i_e.long())
            cot = torch.randn(w.shape, generator=torch.Generator().manual_seed(1))
            # the cotangent follows the expert, not the slot: the slot order is free where the program sets it free
            cot_e = torch.zeros(T, p.E).scatter(1, i.long(), cot).gather(1, i_e.long())
            (w * cot).sum().backward()
            (w_e * cot_e).sum().backward()
            torch.testing.assert_close(xr.grad, xe.grad, atol=1e-5, rtol=1e-4)
    assert len(log) >= 2 or mode == "mark_dynamic", "the second token count did not recompile with a symbolic size"
    for ops, g in zip(_graph_ops(log), log):
        assert g.fallback is None, g.fallback
        assert any(f"moe.{p.op}" in o for o in ops), (p.name, g.misses, g.graph_module.code)
        assert not any("aten.topk" in o or "aten.sort" in o for o in ops), (p.name, g.misses, g.graph_module.code)


# Programs that look like routers but are none of the canonical forms: the check must refuse each (a rewrite that
# fired here would change the answer), the graph keeps its top-k and says why, and the result is eager's. (A
# renormalization by a large epsilon is not among them: the softmax top-k before it is raised, with its first
# weights, and the division stays the graph's.)
def _weights_of_the_biased_scores(x, b, k=4):
    c = x.sigmoid() + b
    i = c.topk(k).indices
    return c.gather(1, i), i


def _zero_fill_after_a_bias(x, b, G=4, keep=2, k=4):
    s = x.sigmoid()
    c = s + b
    n = x.shape[0]
    gs = c.view(n, G, -1).topk(2, dim=-1)[0].sum(-1)
    gm = torch.zeros_like(gs).scatter_(1, gs.topk(keep, dim=-1)[1], 1)
    mask = gm.unsqueeze(-1).expand(n, G, x.shape[-1] // G).reshape(n, -1)
    i = torch.topk(c.masked_fill(~mask.bool(), 0.0), k, dim=-1)[1]
    return s.gather(1, i), i


def _detached_weights(x, b, k=4):
    s = x.softmax(-1)
    i = s.topk(k).indices
    return s.detach().gather(1, i), i


def _per_expert_temperature(x, b, k=4):
    s = torch.softmax(x / (b.abs() + 0.5), -1)
    w, i = s.topk(k)
    return w, i


NEAR_MISSES = [_weights_of_the_biased_scores, _zero_fill_after_a_bias, _detached_weights, _per_expert_temperature]


@pytest.mark.parametrize("fn", NEAR_MISSES, ids=[f.__name__.strip("_") for f in NEAR_MISSES])
def test_a_region_no_canonical_form_equals_is_not_raised(fn):
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="moe", options={"dense": "eager"})
    with capture_graphs() as log:
        for T in (5, 33):
            g = torch.Generator().manual_seed(T)
            x, b = torch.randn(T, 16, generator=g) * 2, -torch.rand(16, generator=g) * 1.5
            (w, i), (w_e, i_e) = compiled(x, b), fn(x, b)
            torch.testing.assert_close(w, w_e)
            assert torch.equal(i, i_e)
    for g in log:
        assert g.moe_ops() == [], g.graph_module.code
        assert any("is not raised" in m for m in g.misses), g.misses
