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
CASES = [pytest.param(p, "automatic", id=p.name) for p in CORPUS] + [
    pytest.param(p, mode, id=f"{p.name}-{mode}") for p in FIRSTS for mode in ("dynamic=True", "mark_dynamic")]


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
