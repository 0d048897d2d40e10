"""Every torch.ops.moe.* op, and a transformers MoE block under backend "moe", captured in a CUDA graph and replayed.

A serving engine captures its decode step in a CUDA graph; a training loop may capture forward and backward. An op
can be captured when a call neither waits for the device nor allocates outside PyTorch's allocator and works on the
current stream (python/tests/test_cuda_host_calls.py checks those rules against a fake driver, with no GPU). Here,
on a device (test_torch_ops_cuda.py collects these tests; scripts/gpu-check.sh runs them at a GPU lease): each op's
call, and its backward where it has one, is captured on static inputs, fresh inputs are copied in, the graph is
replayed, and the outputs (and gradients) must equal the references on the fresh inputs. On the CPU (``dev`` = cpu,
the test command, and the GPU check's key recording) the same calls are checked against the references without a
graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from moe_mlir import reference as R
from moe_mlir.reference import routing as RR
from torch_checks import gen, same


@dataclass(frozen=True)
class Case:
    make: Callable[[torch.Generator], list[torch.Tensor]]   # the inputs (CPU)
    call: Callable[..., object]                               # torch.ops.moe.<op> on them
    ref: Callable[..., object]                                # the reference on CPU copies
    grad: tuple[int, ...] = ()                                # inputs differentiated through (backward captured)
    tol: float = 1e-5


def _softmax_rows(g, *shape):
    return torch.softmax(torch.randn(*shape, generator=g), -1)


def _attention_inputs(g):
    # test_torch_ops.py's shapes (one kernel for both files): scores [B, H, N, Nk], u [B, N, D], v [B, H, Nk, Dh],
    # wo [D, H*Dh], e [B, Nk, K].
    B, H, N, Nk, D, Dh, K = 2, 3, 5, 7, 8, 4, 6
    return [torch.randn(B, H, N, Nk, generator=g), torch.randn(B, N, D, generator=g) * 0.5,
            torch.randn(B, H, Nk, Dh, generator=g) * 0.2, torch.randn(D, H * Dh, generator=g) * 0.2,
            _softmax_rows(g, B, Nk, K)]


_DSV3 = dict(k=4, scoring="sigmoid", order="score_then_topk", n_group=4, topk_group=2, group_score="top2_sum",
             renormalize=True, routed_scaling_factor=2.5)

CASES = {
    "topk_renorm": Case(lambda g: [torch.randn(37, 16, generator=g)],
                        lambda x: torch.ops.moe.topk_renorm(x, 4, "logits", True),
                        lambda x: R.topk_renorm(x, 4, "logits", True), grad=(0,)),
    "route_grouped": Case(lambda g: [torch.randn(37, 16, generator=g), torch.randn(16, generator=g) * 0.1],
                          lambda x, b: torch.ops.moe.route(x, b, *_DSV3.values()),
                          lambda x, b: RR.route(x, b, **_DSV3), grad=(0,)),
    "dispatch_plan": Case(lambda g: [torch.randint(0, 16, (37, 4), generator=g, dtype=torch.int32)],
                          lambda i: torch.ops.moe.dispatch_plan(i, 16, 4),
                          lambda i: RR.dispatch_plan(i, 16, 4)),
    "similarity_inform": Case(lambda g: [torch.randn(2, 9, 8, generator=g), _softmax_rows(g, 2, 9, 6)],
                              lambda u, e: torch.ops.moe.similarity_inform(u, e, None, None, 0.7, False),
                              lambda u, e: R.similarity_inform(u, e, None, None, 0.7, False), grad=(0, 1),
                              tol=1e-4),
    "similarity_inform_topk": Case(lambda g: [torch.randn(2, 9, 8, generator=g), _softmax_rows(g, 2, 9, 6)],
                                   lambda u, e: torch.ops.moe.similarity_inform_topk(u, e, 2, None, None, 0.7, True,
                                                                                     True),
                                   lambda u, e: R.similarity_inform_topk(u, e, None, None, 2, True, 0.7, True),
                                   tol=1e-4),
    "attention_posterior": Case(_attention_inputs,
                                lambda s, u, v, wo, e: torch.ops.moe.attention_posterior(s, u, v, wo, e, 0.8,
                                                                                         "min_entropy", None),
                                lambda s, u, v, wo, e: R.attention_posterior(s, u, v, wo, e, 0.8, "min_entropy",
                                                                             None), tol=1e-4),
    "mad_dispersion": Case(lambda g: [torch.randn(40, 12, generator=g), torch.randint(0, 5, (40,), generator=g)],
                           lambda x, a: torch.ops.moe.mad_dispersion(x, a, 5, 1e-3, 2.0, "feature", "mad", "identity"),
                           lambda x, a: R.mad_dispersion(x, a, 5, 1e-3, 2.0, "feature", "mad", "identity"), tol=1e-4),
    "adjacency_update": Case(lambda g: [torch.rand(6, 6, generator=g),
                                        torch.randint(0, 6, (30, 3), generator=g, dtype=torch.int32)],
                             lambda a, i: torch.ops.moe.adjacency_update(a, i, 0.8, "row", True),
                             lambda a, i: R.adjacency_update(a, i, 0.8, "row", True)),
    "hyper_router": Case(lambda g: [torch.randn(8, generator=g), torch.randn(5, 8, generator=g),
                                    torch.randn(5, generator=g), torch.randn(21, 5, generator=g),
                                    torch.randn(21, generator=g)],
                         lambda *a: torch.ops.moe.hyper_router(*a, 3), lambda *a: R.hyper_router(*a, 3),
                         grad=(0, 1, 3)),
}


def _outputs(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _loss(outs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """A scalar of the differentiable outputs with uneven weights (a plain sum has zero gradient through a
    renormalization)."""
    fl = [o for o in outs if o.is_floating_point()]
    return sum((o * torch.linspace(0.5, 1.5, o.numel(), device=o.device).view_as(o)).sum() for o in fl)


def _reference_grads(case: Case, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    xs = [x.clone().requires_grad_(i in case.grad) for i, x in enumerate(xs)]
    _loss(_outputs(case.ref(*xs))).backward()
    return [xs[i].grad for i in case.grad]


@pytest.mark.parametrize("name", list(CASES))
def test_op_replays_in_a_cuda_graph(dev, name):
    case = CASES[name]
    first, fresh = case.make(gen(40)), case.make(gen(41))
    static = [x.to(dev).requires_grad_(i in case.grad) for i, x in enumerate(first)]

    def step():
        outs = _outputs(case.call(*static))
        if case.grad:
            for x in static:
                x.grad = None
            _loss(outs).backward()
        return outs

    if dev == "cuda":
        # Warm-up on a side stream (kernels loaded, autograd's buffers allocated), as torch.cuda.graph asks.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = step()
        grads = [static[i].grad for i in case.grad]
        with torch.no_grad():
            for x, f in zip(static, fresh):
                x.copy_(f)
        graph.replay()
    else:
        with torch.no_grad():
            for x, f in zip(static, fresh):
                x.copy_(f)
        outs = step()
        grads = [static[i].grad for i in case.grad]
    same(tuple(o.detach() for o in outs), _outputs(case.ref(*fresh)), atol=case.tol, rtol=case.tol, device=dev)
    if case.grad:
        same(tuple(grads), tuple(_reference_grads(case, fresh)), atol=10 * case.tol, rtol=10 * case.tol, device=dev)


def test_hf_moe_block_under_backend_moe_replays_forward_and_backward(dev):
    """transformers' Qwen3-MoE sparse block compiled under backend "moe" (its router raised to torch.ops.moe),
    forward and backward captured as a whole-step graph: replayed on fresh tokens it gives eager's outputs and
    gradients.

    The experts run transformers' ``batched_mm``: a standalone block leaves ``_experts_implementation`` unset, and
    transformers then runs the ``eager`` loop, whose ``nonzero`` (a data-dependent shape, a host sync) breaks the
    graph and cannot be captured by any backend (the H200 run of 2026-11-27). That the block is one graph with the
    router raised is asserted on every device, so the CPU run of this test checks what capture needs too."""
    import copy

    from moe_mlir.backends.dynamo import capture_graphs
    from test_hf_models import CONFIGS, H, _init

    torch._dynamo.reset()
    block_cls, _, cfg = CONFIGS["qwen3_moe"]
    cfg = copy.deepcopy(cfg)
    cfg._experts_implementation = "batched_mm"
    block = _init(block_cls(cfg), seed=4).train().to(dev)
    ref = _init(block_cls(cfg), seed=4).train()
    compiled = torch.compile(block, backend="moe", dynamic=False)
    with capture_graphs() as log:
        compiled(torch.randn(1, 8, H, generator=gen(41)).to(dev))
    assert len(log) == 1 and log[0].fallback is None, [g.graph_module.code for g in log]
    assert "topk_renorm" in log[0].moe_ops(), log[0].graph_module.code
    x = torch.randn(1, 8, H, generator=gen(42)).to(dev).requires_grad_(True)
    fresh = torch.randn(1, 8, H, generator=gen(43))

    def step():
        block.zero_grad(set_to_none=False)
        x.grad = None
        y = compiled(x)
        _loss((y,)).backward()
        return y

    if dev == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = step()
        with torch.no_grad():
            x.copy_(fresh)
        graph.replay()
    else:
        with torch.no_grad():
            x.copy_(fresh)
        y = step()
    xr = fresh.clone().requires_grad_(True)
    _loss((ref(xr),)).backward()
    same(y.detach(), ref(fresh).detach(), atol=1e-4, rtol=1e-4, device=dev)
    same(x.grad, xr.grad, atol=1e-4, rtol=1e-4, device=dev)
    for (n, p), (_, q) in zip(block.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-4, rtol=1e-4, msg=lambda m: f"{n}: {m}")
