"""torch.ops.moe.* on the compiled kernels against moe_mlir.reference: the CPU kernels (lib/Runtime/Torch +
moe_mlir.runtime) always, the CUDA kernels (lib/Runtime/Torch/TorchCudaOps.cpp) too when a GPU is present or
MOE_TEST_DEVICE=cuda asks for them.

The device suite (the tests that take ``dev``) runs on every device: numerics on random and adversarial inputs (ties,
NaN, -inf rows, masks, N=1, k=K, zero-sized token dimensions, f16/bf16), several token counts served by one kernel
(the compile counter does not move), non-contiguous inputs, gradients through the kernels. The tests that take
``cuda`` are CUDA behaviour (a side stream, a call captured in a CUDA graph, index errors read after a
synchronization, head_select='all' running the reference). test_torch_ops_cuda.py runs both on one device only
(scripts/gpu-check.sh and test/GPU/check run it by name). The CPU-only tests: the on-disk cache across processes, bad
inputs, index errors, opcheck, torch.compile(fullgraph=True), the eager fallback when the kernels are disabled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import moe_mlir
from moe_mlir import ops
from moe_mlir import reference as R
from moe_mlir.runtime import cache
from moe_mlir.runtime.driver import CompileError
from torch_checks import INF, NAN, gen, needs_cpu_kernels, ran_kernel, same, to

#: The package under test, for subprocesses.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])

pytestmark = needs_cpu_kernels


def cuda_tol(dev: str, atol: float, rtol: float) -> dict:
    """Looser tolerances on CUDA only: its warp and block reductions sum in another order than the CPU kernels."""
    return dict(atol=atol, rtol=rtol) if dev == "cuda" else {}


# ================================================================================================================
# Numerics (the device suite)
# ================================================================================================================


@pytest.mark.parametrize("mode", ["logits", "probs"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_topk_renorm_random(dev, mode, renormalize, dtype):
    x = torch.randn(3, 5, 16, generator=gen())
    if mode == "probs":
        x = torch.softmax(x, -1)
    x = x.to(dtype)
    for k in (1, 3, 16):
        same(torch.ops.moe.topk_renorm(x.to(dev), k, mode, renormalize), R.topk_renorm(x, k, mode, renormalize),
             device=dev, **cuda_tol(dev, 1e-5, 1e-5))
    assert ran_kernel("topk_renorm", dev)


def test_topk_renorm_adversarial(dev):
    x = torch.tensor([
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],           # all tied: lowest indices
        [0.0, NAN, 2.0, NAN, 2.0, -1.0],           # NaN first, then ties to the lowest index
        [-INF] * 6,                                # fully masked: zero weights, indices 0..k-1
        [-INF, 3.0, -INF, INF, 0.0, -INF],         # +inf and -inf
        [5.0, -INF, -INF, -INF, -INF, -INF],       # one finite entry
    ])
    for mode in ("logits", "probs"):
        for renormalize in (True, False):
            for k in (1, 2, 6):
                same(torch.ops.moe.topk_renorm(x.to(dev), k, mode, renormalize),
                     R.topk_renorm(x, k, mode, renormalize), device=dev)
    p = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.5, 0.25, 0.25, 0.0]])  # zero sum: zero weights
    same(torch.ops.moe.topk_renorm(p.to(dev), 2, "probs", True), R.topk_renorm(p, 2, "probs", True), device=dev)
    big = torch.randn(2, 1500, generator=gen(1))  # K > 1024: the block-per-token kernel on CUDA
    big[0, 7] = big[0, 900] = 50.0                 # a tie across the block
    same(torch.ops.moe.topk_renorm(big.to(dev), 4), R.topk_renorm(big, 4, "logits", True), atol=1e-5, rtol=1e-5,
         device=dev)


def test_topk_renorm_weights_underflow():
    """The top-k weights at logit gaps where exp underflows (the CPU kernels' exp, CK::exp): subnormal weights
    (gaps 87.4-103.9) come out as torch's to within two subnormal steps, a gap of 104 or more (and -inf) gives 0, and
    a normal weight keeps f32 precision."""
    gaps = torch.tensor([10.0, 87.0, 88.0, 95.0, 100.0, 103.5, 104.5, 150.0, INF])
    x = torch.stack([torch.zeros_like(gaps), -gaps], -1)          # rows [0, -gap]: w1 = exp(-gap) / (1 + exp(-gap))
    w, i = torch.ops.moe.topk_renorm(x, 2, "logits", True)
    ref = torch.softmax(x.double(), -1).float()
    assert torch.equal(i, torch.tensor([[0, 1]] * len(gaps), dtype=torch.int32))
    tiny = 1.401298464324817e-45                                   # the smallest subnormal f32
    for g, ours, r in zip(gaps.tolist(), w[:, 1].tolist(), ref[:, 1].tolist()):
        if r >= 1.1754943508222875e-38:
            assert abs(ours - r) <= 1e-6 * r, (g, ours, r)
        else:
            assert abs(ours - r) <= 2 * tiny, (g, ours, r)
    assert w[-3:, 1].eq(0).all() and w[1:, 0].eq(1).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_ws", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_similarity_inform(dev, causal, with_ws, with_mask):
    g = gen(1)
    B, N, D, K = 2, 9, 8, 6
    u = torch.randn(B, N, D, generator=g)
    e = torch.softmax(torch.randn(B, N, K, generator=g), -1)
    ws = torch.randn(D, D, generator=g) * 0.3 if with_ws else None
    m = None
    if with_mask:
        m = torch.rand(B, N, generator=g) > 0.4
        m[1] = False  # a sequence with every key masked: zero rows
    same(torch.ops.moe.similarity_inform(*to(dev, u, e, ws, m), 0.7, causal),
         R.similarity_inform(u, e, ws, m, 0.7, causal), device=dev, **cuda_tol(dev, 1e-5, 1e-4))
    for k in (1, K):
        same(torch.ops.moe.similarity_inform_topk(*to(dev, u, e), k, *to(dev, ws, m), 0.7, causal, True),
             R.similarity_inform_topk(u, e, ws, m, k, True, 0.7, causal), atol=1e-5, rtol=1e-4, device=dev)
    assert ran_kernel("similarity_inform", dev) and ran_kernel("similarity_inform_topk", dev)


def test_similarity_inform_nan_and_single_token(dev):
    g = gen(2)
    u = torch.randn(1, 1, 4, generator=g)
    e = torch.softmax(torch.randn(1, 1, 3, generator=g), -1)
    same(torch.ops.moe.similarity_inform(*to(dev, u, e)), R.similarity_inform(u, e, None, None, 1.0, False),
         device=dev)
    u = torch.randn(2, 5, 4, generator=g)
    e = torch.softmax(torch.randn(2, 5, 3, generator=g), -1)
    e[0, 2, 1] = NAN  # propagates to the rows that mix key 2
    same(torch.ops.moe.similarity_inform(*to(dev, u, e), None, None, 1.0, True),
         R.similarity_inform(u, e, None, None, 1.0, True), device=dev, **cuda_tol(dev, 1e-5, 1e-4))


def _attention_inputs(g, B=2, H=3, N=5, Nk=7, D=8, Dh=4, K=6):
    s = torch.randn(B, H, N, Nk, generator=g) * torch.linspace(0.5, 3.0, H)[None, :, None, None]
    u = torch.randn(B, N, D, generator=g) * 0.5
    v = torch.randn(B, H, Nk, Dh, generator=g) * 0.2
    wo = torch.randn(D, H * Dh, generator=g) * 0.2
    e = torch.softmax(torch.randn(B, Nk, K, generator=g), -1)
    return s, u, v, wo, e


def _check_attention_posterior(dev, head_select, head_scale):
    s, u, v, wo, e = _attention_inputs(gen(3))
    s[0, :, 1, :] = -INF  # a fully masked query row in every head
    s[1, 0, :, 2] = -INF  # a key masked in one head
    same(torch.ops.moe.attention_posterior(*to(dev, s, u, v, wo, e), 0.8, head_select, head_scale),
         R.attention_posterior(s, u, v, wo, e, 0.8, head_select, head_scale), atol=1e-5, rtol=1e-4, device=dev)
    for k in (1, e.shape[2]):
        same(torch.ops.moe.attention_posterior_topk(*to(dev, s, u, v, wo, e), k, 0.8, head_select, head_scale, True),
             R.attention_posterior_topk(s, u, v, wo, e, k, True, 0.8, head_select, head_scale), atol=1e-5,
             rtol=1e-4, device=dev)


@pytest.mark.parametrize("head_scale", [None, 1.0])
def test_attention_posterior(dev, head_scale):
    _check_attention_posterior(dev, "min_entropy", head_scale)


@needs_cpu_kernels
@pytest.mark.parametrize("head_scale", [None, 1.0])
def test_attention_posterior_all_heads(head_scale):
    """head_select='all' on the CPU kernels (CUDA has none: test_attention_posterior_all_heads_runs_the_reference)."""
    _check_attention_posterior("cpu", "all", head_scale)


def test_attention_posterior_all_heads_runs_the_reference(cuda):
    """head_select='all' has no GPU kernel: the CUDA call runs the eager reference (on the device), no kernel."""
    keys = len(cache.stats.keys)
    for head_scale in (None, 1.0):
        _check_attention_posterior(cuda, "all", head_scale)
    assert len(cache.stats.keys) == keys


@pytest.mark.parametrize("B,H,N,Nk,D,Dh,K", [
    (1, 8, 1, 1, 40, 20, 16),     # decode, one key: every stage on the calling thread
    (1, 4, 16, 33, 72, 24, 5),    # keys past one 32-key tile, D and Dh not multiples of 16
    (2, 2, 64, 70, 136, 72, 16),  # head means and mix above 2^20 multiply-adds: the parallel path
])
def test_attention_posterior_sizes(B, H, N, Nk, D, Dh, K):
    """The head means (dots along wo's rows, shuffle-tree sums, clamped past D) and the work-guarded stages at
    decode and larger sizes, against the reference (f32 sums in another order: atol 2e-5)."""
    s, u, v, wo, e = _attention_inputs(gen(5), B, H, N, Nk, D, Dh, K)
    s[0, :, 0, Nk - 1] = -INF  # the last key masked for the first row
    same(torch.ops.moe.attention_posterior(s, u, v, wo, e, 1.3, "min_entropy", None),
         R.attention_posterior(s, u, v, wo, e, 1.3, "min_entropy", None), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("normalize", ["feature", "expert", "global"])
@pytest.mark.parametrize("measure", ["mad", "variance"])
@pytest.mark.parametrize("empty", ["identity", "raw"])
def test_mad_dispersion(dev, normalize, measure, empty):
    g = gen(4)
    x = torch.randn(40, 12, generator=g)
    a = torch.randint(0, 5, (40,), generator=g)
    a[a == 3] = 0  # an empty cluster
    a[a == 4] = 2
    a[0] = 4       # a singleton cluster
    for clip in (0.0, 2.0):
        same(torch.ops.moe.mad_dispersion(*to(dev, x, a), 5, 1e-3, clip, normalize, measure, empty),
             R.mad_dispersion(x, a, 5, 1e-3, clip, normalize, measure, empty), atol=1e-5, rtol=1e-4, device=dev)


@pytest.mark.parametrize("norm", ["row", "col", "none"])
@pytest.mark.parametrize("include_self", [True, False])
def test_adjacency_update(dev, norm, include_self):
    g = gen(5)
    a = torch.rand(6, 6, generator=g)
    idx = torch.randint(0, 6, (30, 3), generator=g, dtype=torch.int32)
    idx[0] = torch.tensor([1, 1, 1], dtype=torch.int32)  # repeated index counts once
    same(torch.ops.moe.adjacency_update(*to(dev, a, idx), 0.8, norm, include_self),
         R.adjacency_update(a, idx, 0.8, norm, include_self), device=dev)


def test_hyper_router(dev):
    g = gen(6)
    emb, w1, b1 = torch.randn(8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
    w2, b2 = torch.randn(3 * 7, 5, generator=g), torch.randn(21, generator=g)
    same(torch.ops.moe.hyper_router(*to(dev, emb, w1, b1, w2, b2), 3), R.hyper_router(emb, w1, b1, w2, b2, 3),
         atol=1e-5, rtol=1e-5, device=dev)


@pytest.mark.parametrize("weight_grads", [True, False])
def test_hyper_router_backward(dev, weight_grads):
    """The backward kernel (CUDA: lib/Conversion/MoEToGPU/HyperRouterGrad.cpp) against the closed form in float64:
    Dh = 40 and E·(D+1) = 84 rows (two row blocks on the GPU, a column tail), a hidden unit at a = 0 exactly, one
    NaN and one negative; without weight_grads d_w1 and d_w2 come back empty. Then through autograd (frozen
    hypernetwork: only emb requires grad)."""
    g = gen(12)
    E, D, Dh, De = 4, 20, 40, 24
    emb, w1, b1 = torch.randn(De, generator=g), torch.randn(Dh, De, generator=g) / 5, torch.randn(Dh, generator=g)
    w1[0], b1[0], b1[1], b1[2] = 0.0, 0.0, NAN, -100.0
    w2, b2 = torch.randn(E * (D + 1), Dh, generator=g) / 6, torch.randn(E * (D + 1), generator=g)
    gw, gb = torch.randn(E, D, generator=g), torch.randn(E, generator=g)
    ins = (gw, gb, emb, w1, b1, w2, b2)
    got = torch.ops.moe.hyper_router_backward(*to(dev, *ins), E, weight_grads)
    want = tuple(t.float() for t in R.hyper_router_backward(*(t.double() for t in ins), E))
    if not weight_grads:
        assert got[1].numel() == 0 and got[3].numel() == 0
        got, want = (got[0], got[2], got[4]), (want[0], want[2], want[4])
    same(got, want, atol=1e-5, rtol=1e-5, device=dev)
    assert ran_kernel("hyper_router_backward", dev)

    x = emb.to(dev).requires_grad_()
    w, b = torch.ops.moe.hyper_router(x, *to(dev, w1, b1, w2, b2), E)
    ((w * gw.to(dev)).sum() + (b * gb.to(dev)).sum()).backward()
    same(x.grad, want[0], atol=1e-5, rtol=1e-5, device=dev)


def test_zero_sized_token_dims(dev):
    for shape in ((0, 8), (3, 0, 8)):
        x = torch.randn(shape)
        same(torch.ops.moe.topk_renorm(x.to(dev), 2), R.topk_renorm(x, 2, "logits", True), device=dev)
    x, a = torch.randn(0, 4), torch.zeros(0, dtype=torch.int64)
    same(torch.ops.moe.mad_dispersion(*to(dev, x, a), 3),
         R.mad_dispersion(x, a, 3, 1e-4, 10.0, "feature", "mad", "identity"), device=dev)
    A, idx = torch.rand(4, 4), torch.zeros(0, 2, dtype=torch.int64)
    same(torch.ops.moe.adjacency_update(*to(dev, A, idx)), R.adjacency_update(A, idx, 0.9, "row", True), device=dev)
    u, e = torch.randn(0, 4, 8), torch.randn(0, 4, 3)
    same(torch.ops.moe.similarity_inform(*to(dev, u, e)), R.similarity_inform(u, e, None, None, 1.0, False),
         device=dev)


# ================================================================================================================
# One kernel per static signature; the disk cache
# ================================================================================================================


def test_token_counts_share_one_kernel(dev):
    g = gen(7)
    x = torch.randn(3, 24, generator=g)
    torch.ops.moe.topk_renorm(x.to(dev), 5, "logits", False)  # compiled or loaded once
    u = torch.randn(1, 3, 8, generator=g)
    torch.ops.moe.similarity_inform(*to(dev, u, torch.rand(1, 3, 4, generator=g)), None, None, 0.3, True)
    before = (cache.stats.compiles, cache.stats.disk_loads)
    for T in (1, 2, 17, 64, 257, 1000):
        x = torch.randn(T, 24, generator=g)
        same(torch.ops.moe.topk_renorm(x.to(dev), 5, "logits", False), R.topk_renorm(x, 5, "logits", False),
             device=dev)
    for B, N in ((1, 1), (2, 7), (3, 40)):
        u, e = torch.randn(B, N, 8, generator=g), torch.rand(B, N, 4, generator=g)
        same(torch.ops.moe.similarity_inform(*to(dev, u, e), None, None, 0.3, True),
             R.similarity_inform(u, e, None, None, 0.3, True), atol=1e-5, rtol=1e-4, device=dev)
    assert (cache.stats.compiles, cache.stats.disk_loads) == before


def test_gradients_through_the_kernels(dev):
    x = torch.randn(6, 8, generator=gen(11)).to(dev).requires_grad_()
    w, _ = torch.ops.moe.topk_renorm(x, 3)
    (w * torch.arange(3.0, device=dev)).sum().backward()
    x2 = x.detach().cpu().clone().requires_grad_()
    w2, _ = R.topk_renorm(x2, 3, "logits", True)
    (w2 * torch.arange(3.0)).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x2.grad, **cuda_tol(dev, 1e-5, 1e-5))
    with torch.no_grad():
        w, _ = torch.ops.moe.topk_renorm(x, 3)
    assert w.grad_fn is None and not w.requires_grad
    # stop-gradient ops: outputs never require grad
    t = torch.randn(5, 3).to(dev).requires_grad_()
    w, _ = torch.ops.moe.mad_dispersion(t, torch.tensor([0, 1, 0, 1, 1], device=dev), 2)
    assert not w.requires_grad


@pytest.mark.parametrize("causal,with_ws,with_mask", [(True, False, False), (False, True, True), (True, True, True)])
def test_similarity_inform_gradients_through_the_kernels(dev, causal, with_ws, with_mask):
    """The backward kernel of similarity_inform (on CUDA the GPU lowering's query-major and key-major passes) against
    autograd of the reference (float64 leaves, f32 inside): N = 37 (not a multiple of the tiles), a fully masked row (causal query 0 whose
    only key is masked) and a fully masked sequence get zero gradient; the top-k backward kernel too."""
    g = gen(12)
    B, N, D, K = 2, 37, 12, 6
    u = torch.randn(B, N, D, generator=g) * 0.5
    e = torch.softmax(torch.randn(B, N, K, generator=g), -1)
    ws = torch.randn(D, D, generator=g) * 0.3 if with_ws else None
    mask = None
    if with_mask:
        mask = torch.rand(B, N, generator=g) > 0.3
        mask[0, 0] = False
        mask[1] = False
    dp = torch.randn(B, N, K, generator=g)
    leaves = [t for t in (u, e, ws) if t is not None]
    ours = [t.clone().to(dev).requires_grad_() for t in leaves]
    ref = [t.double().requires_grad_() for t in leaves]  # the reference computes in f32 from these

    def call(fn, ts, m):
        return fn(ts[0], ts[1], ts[2] if with_ws else None, m, 0.5, causal)

    call(torch.ops.moe.similarity_inform, ours, None if mask is None else mask.to(dev)).backward(dp.to(dev))
    call(R.similarity_inform, ref, mask).backward(dp)
    for name, a, b in zip(("du", "de", "dws"), ours, ref):
        torch.testing.assert_close(a.grad.cpu(), b.grad.float(), atol=2e-5, rtol=1e-4, msg=name)
    if with_mask:
        assert not ours[0].grad[1].any() and not ours[1].grad[1].any()
    assert ran_kernel("similarity_inform_backward", dev)

    x = torch.randn(6, 8, generator=gen(11)).to(dev).requires_grad_()
    w, _ = torch.ops.moe.topk_renorm(x, 3)
    (w * torch.arange(3.0, device=dev)).sum().backward()
    assert ran_kernel("topk_renorm_backward", dev)


@pytest.mark.parametrize("head_scale", [None, 1.5])
def test_attention_posterior_gradients_through_the_kernels(dev, head_scale):
    """The backward kernel of attention_posterior (on CUDA the GPU lowering's query-major and key-major passes at the
    forward's head h*) against autograd of the reference (float64 leaves): N = 37 and Nk = 41 (not multiples of the
    tiles), a fully masked query row gets no gradient, a masked key no score gradient, d_scores is 0 off h*."""
    s, u, v, wo, e = _attention_inputs(gen(14), N=37, Nk=41)
    s[0, :, 1, :] = -INF  # a fully masked query row in every head
    s[1, :, :, 2] = -INF  # a key masked in every head
    dp = torch.randn(2, 37, 6, generator=gen(15))
    leaves = [s, u, v, wo, e]
    ours = [t.clone().to(dev).requires_grad_() for t in leaves]
    ref = [t.double().requires_grad_() for t in leaves]
    p, head = torch.ops.moe.attention_posterior(*ours, 0.8, "min_entropy", head_scale)
    p.backward(dp.to(dev))
    rp, rhead = R.attention_posterior(*ref, 0.8, "min_entropy", head_scale)
    rp.backward(dp.to(rp.dtype))
    assert torch.equal(head.cpu().long(), rhead.long())
    for name, a, b in zip(("d_scores", "du", "dv", "dwo", "de"), ours, ref):
        torch.testing.assert_close(a.grad.cpu(), b.grad.float(), atol=2e-5, rtol=1e-4, msg=name)
    ds = ours[0].grad.cpu()
    assert not ds[0, :, 1].any() and not ds[1, :, :, 2].any() and not ours[1].grad[0, 1].any()
    for b in range(2):
        assert not torch.cat([ds[b, :int(head[b])], ds[b, int(head[b]) + 1:]]).any()
    assert ran_kernel("attention_posterior_backward", dev)


# ================================================================================================================
# CUDA behaviour: streams, CUDA graphs, deferred index errors, the dispatcher
# ================================================================================================================


def _cuda_only_calls(dev):
    """The op calls of the CUDA tests below, with their shapes and dtypes (so their kernels' keys), each checked
    against the reference: on the CPU they record those kernels for the GPU check to prebuild."""
    g = gen(13)
    for K in (64, 32):
        x = torch.randn(16, K, generator=g)
        same(torch.ops.moe.topk_renorm(x.to(dev), 4), R.topk_renorm(x, 4, "logits", True), atol=1e-5, rtol=1e-5,
             device=dev)
    a, idx = torch.rand(3, 3, generator=g), torch.tensor([[0, 1], [1, 2]])
    same(torch.ops.moe.adjacency_update(*to(dev, a, idx)), R.adjacency_update(a, idx, 0.9, "row", True), device=dev)
    t, asg = torch.randn(5, 3, generator=g), torch.tensor([0, 1, 3, 2, 3])
    same(torch.ops.moe.mad_dispersion(*to(dev, t, asg), 4),
         R.mad_dispersion(t, asg, 4, 1e-4, 10.0, "feature", "mad", "identity"), atol=1e-5, rtol=1e-4, device=dev)


def test_kernels_of_the_cuda_only_tests(dev):
    _cuda_only_calls(dev)


def test_side_stream_orders_after_its_producers(cuda):
    """Inputs written on a side stream just before the call: the kernel runs on that (current) stream after them."""
    x = torch.randn(4096, 64, generator=gen(9))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        xd = torch.zeros(4096, 64, device=cuda)
        xd.copy_(x.to(cuda, non_blocking=True) * 2.0)
        w, i = torch.ops.moe.topk_renorm(xd, 4)
    side.synchronize()
    same((w, i), R.topk_renorm(x * 2.0, 4, "logits", True), atol=1e-5, rtol=1e-5, device=cuda)


def test_call_is_captured_in_a_cuda_graph(cuda):
    """No host synchronization and no allocation of the outputs in the kernel: the call can be captured."""
    x = torch.randn(64, 32, generator=gen(10)).to(cuda)
    torch.ops.moe.topk_renorm(x, 4)  # loads the kernel before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w, i = torch.ops.moe.topk_renorm(x, 4)
    fresh = torch.randn(64, 32, generator=gen(11))
    x.copy_(fresh.to(cuda))
    graph.replay()
    same((w, i), R.topk_renorm(fresh, 4, "logits", True), atol=1e-5, rtol=1e-5, device=cuda)


def test_index_errors_are_read_after_a_sync(cuda):
    from moe_mlir.runtime import cuda as moe_cuda

    a, idx = torch.rand(3, 3), torch.tensor([[0, 1], [-1, 2]])
    out = torch.ops.moe.adjacency_update(*to(cuda, a, idx))  # returns without waiting; the kernel records the error
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"moe.adjacency_update: 'idx' holds -1, outside \[0, 3\)"):
        moe_cuda.check_errors()
    moe_cuda.check_errors()  # read once: cleared
    assert out.shape == (3, 3)
    t, asg = torch.randn(5, 3), torch.tensor([0, 1, 7, 2, 3])
    torch.ops.moe.mad_dispersion(*to(cuda, t, asg), 4)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"'assign' holds 7, outside \[0, 4\)"):
        moe_cuda.check_errors()
    # attention_posterior_backward's h* (the kernel of test_attention_posterior_gradients_through_the_kernels: same
    # shapes and attributes) is checked by the kernel, not by a .item() on the host: the call must not synchronize
    # (torch's sync debug mode turns a synchronizing call into an error; the first call loads the kernel).
    s, u, v, wo, e = _attention_inputs(gen(14), N=37, Nk=41)
    dp = torch.randn(2, 37, 6, generator=gen(15))
    args = to(cuda, dp, s, u, v, wo, e)
    bk = torch.ops.moe.attention_posterior_backward
    bk(*args, torch.tensor([2, 0], dtype=torch.int32, device=cuda), 0.8, "min_entropy", None)
    torch.cuda.synchronize()
    moe_cuda.check_errors()
    bad = torch.tensor([2, 3], dtype=torch.int32, device=cuda)
    torch.cuda.set_sync_debug_mode("error")
    try:
        grads = bk(*args, bad, 0.8, "min_entropy", None)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"^moe.attention_posterior_backward: 'head' holds 3, outside \[0, 3\): it "
                                         r"indexes no head$"):
        moe_cuda.check_errors()
    # The skipped batch element gets no gradient.
    for g in (grads[0], grads[1], grads[2], grads[4]):
        assert not g[1].any()


def _assert_every_op_has_a_kernel(key: str) -> None:
    for name in ops.OP_NAMES + ops.FUSED_OP_NAMES:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"moe::{name}", key), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"moe::{name}", "Autograd" + key), name


def test_every_op_has_a_cuda_kernel(cuda):
    _assert_every_op_has_a_kernel("CUDA")


def test_disk_cache_across_processes(tmp_path):
    script = textwrap.dedent("""
        import sys, torch
        import moe_mlir
        from moe_mlir.runtime import cache
        x = torch.randn(int(sys.argv[1]), 12)
        w, i = torch.ops.moe.topk_renorm(x, 3)
        ref = moe_mlir.reference.topk_renorm(x, 3, "logits", True)
        assert torch.equal(i, ref[1]) and torch.allclose(w, ref[0])
        print(cache.stats.compiles, cache.stats.disk_loads)
    """)
    env = dict(os.environ, MOE_KERNEL_CACHE=str(tmp_path / "kernels"), PYTHONPATH=PACKAGE_ROOT)

    def run(T):
        p = subprocess.run([sys.executable, "-c", script, str(T)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return p.stdout.split()

    assert run(5) == ["1", "0"]     # compiled
    assert run(77) == ["0", "1"]    # another token count: loaded from disk, nothing compiled
    assert len(list((tmp_path / "kernels").glob("*.so"))) == 1
    assert not list((tmp_path / "kernels").glob("*.part"))


# ================================================================================================================
# Layouts, errors
# ================================================================================================================


def test_non_contiguous_inputs(dev):
    g = gen(8)
    x = torch.randn(16, 10, generator=g).t()  # [10, 16], transposed (.to keeps the strides)
    same(torch.ops.moe.topk_renorm(x.to(dev), 2), R.topk_renorm(x, 2, "logits", True), device=dev)
    u = torch.randn(2, 8, 12, generator=g)
    e = torch.softmax(torch.randn(2, 4, 8, generator=g), -1)
    ud, ed = u.to(dev)[:, :, ::2], e.to(dev).transpose(1, 2)  # [2, 8, 6] strided, [2, 8, 4] transposed
    same(torch.ops.moe.similarity_inform(ud, ed), R.similarity_inform(u[:, :, ::2], e.transpose(1, 2), None, None,
                                                                       1.0, False), device=dev,
         **cuda_tol(dev, 1e-5, 1e-4))
    t = torch.randn(12, 30, generator=g)
    a = torch.randint(0, 3, (24,), generator=g)
    same(torch.ops.moe.mad_dispersion(t.to(dev)[:, ::3], a.to(dev)[::2], 3),
         R.mad_dispersion(t[:, ::3], a[::2], 3, 1e-4, 10.0, "feature", "mad", "identity"), device=dev)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: torch.ops.moe.topk_renorm(torch.randn(4, 8), 9), ValueError, r"'k' \(9\) must be in \[1, 8\]"),
    (lambda: torch.ops.moe.topk_renorm(torch.randn(4, 8), 2, "soft"), ValueError, r"'mode' must be one of"),
    (lambda: torch.ops.moe.topk_renorm(torch.randn(4, 8, dtype=torch.float64), 2), TypeError, r"must be f32, f16"),
    (lambda: torch.ops.moe.topk_renorm(torch.randint(0, 3, (4, 8)), 2), TypeError, r"must be f32, f16"),
    (lambda: torch.ops.moe.topk_renorm(torch.tensor(1.0), 1), ValueError, r"rank >= 1"),
    (lambda: torch.ops.moe.similarity_inform(torch.randn(2, 4, 8), torch.randn(3, 4, 2)), ValueError,
     r"dimension 0 of 'e' \(B = 3\) must equal dimension 0 of 'u' \(B = 2\)"),
    (lambda: torch.ops.moe.similarity_inform(torch.randn(2, 4, 8), torch.randn(2, 4, 2), None, None, 0.0),
     ValueError, r"'tau' \(0.0\) must be finite and > 0"),
    (lambda: torch.ops.moe.similarity_inform(torch.randn(2, 4, 8), torch.randn(2, 4, 2), None,
                                             torch.ones(2, 4)), TypeError, r"'key_mask' must be bool \(i1\), got torch.float32"),
    (lambda: torch.ops.moe.mad_dispersion(torch.randn(5, 3), torch.zeros(4, dtype=torch.int64), 2), ValueError,
     r"dimension 0 of 'assign' \(T = 4\) must equal"),
    (lambda: torch.ops.moe.mad_dispersion(torch.randn(5, 3), torch.zeros(5, dtype=torch.int64), 0), ValueError,
     r"'num_experts' \(0\) must be >= 1"),
    (lambda: torch.ops.moe.adjacency_update(torch.rand(3, 4), torch.zeros(2, 2, dtype=torch.int64)), ValueError,
     r"dimension 1 of 'a' \(E = 4\) must equal dimension 0 of 'a' \(E = 3\)"),
    (lambda: torch.ops.moe.hyper_router(torch.randn(4), torch.randn(3, 4), torch.randn(3), torch.randn(7, 3),
                                        torch.randn(7), 2), ValueError, r"num_experts \* \(D\+1\)"),
])
def test_bad_inputs_raise(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_index_errors_are_reported():
    with pytest.raises(ValueError, match=r"moe.mad_dispersion: 'assign' holds 7, outside \[0, 4\): the value indexes no expert \(element 2\)"):
        torch.ops.moe.mad_dispersion(torch.randn(5, 3), torch.tensor([0, 1, 7, 2, 3]), 4)
    with pytest.raises(ValueError, match=r"moe.adjacency_update: 'idx' holds -1, outside \[0, 3\)"):
        torch.ops.moe.adjacency_update(torch.rand(3, 3), torch.tensor([[0, 1], [-1, 2]]))
    # the error does not stick to the next (valid) call
    a = torch.tensor([0, 1, 2, 2, 3])
    x = torch.randn(5, 3)
    same(torch.ops.moe.mad_dispersion(x, a, 4), R.mad_dispersion(x, a, 4, 1e-4, 10.0, "feature", "mad", "identity"))


# ================================================================================================================
# torch integration: opcheck, torch.compile, autograd, fallback
# ================================================================================================================


def _opcheck_samples():
    g = gen(9)
    s, u, v, wo, e = _attention_inputs(g)
    su, se = torch.randn(2, 6, 8, generator=g), torch.softmax(torch.randn(2, 6, 5, generator=g), -1)
    return [
        ("topk_renorm", (torch.randn(4, 8, requires_grad=True), 2)),
        ("similarity_inform", (su.clone().requires_grad_(), se, None, torch.rand(2, 6, generator=g) > 0.2, 0.5,
                               True)),
        ("similarity_inform_topk", (su, se.clone().requires_grad_(), 2)),
        ("attention_posterior", (s.clone().requires_grad_(), u, v, wo, e)),
        ("attention_posterior_topk", (s, u, v, wo, e.clone().requires_grad_(), 2, 1.0, "all")),
        ("mad_dispersion", (torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g), 3)),
        ("adjacency_update", (torch.rand(5, 5, generator=g), torch.randint(0, 5, (7, 2), generator=g))),
        ("hyper_router", (torch.randn(3, requires_grad=True), torch.randn(4, 3), torch.randn(4),
                          torch.randn(10, 4), torch.randn(10), 2)),
    ]


@pytest.mark.parametrize("sample", _opcheck_samples(), ids=lambda s: s[0])
def test_opcheck(sample):
    name, args = sample
    result = torch.library.opcheck(getattr(torch.ops.moe, name).default, args)
    assert all(v == "SUCCESS" for v in result.values()), result


def test_every_op_has_a_cpu_kernel():
    _assert_every_op_has_a_kernel("CPU")


def test_torch_compile_fullgraph():
    def route(u, e, logits):
        p = torch.ops.moe.similarity_inform(u, e, None, None, 0.5, True)
        w, i = torch.ops.moe.topk_renorm(logits + p.log1p(), 2)
        return w * 2, i

    g = gen(10)
    u, e = torch.randn(1, 6, 8, generator=g), torch.softmax(torch.randn(1, 6, 4, generator=g), -1)
    logits = torch.randn(1, 6, 4, generator=g)
    compiled = torch.compile(route, fullgraph=True, backend="inductor")
    same(compiled(u, e, logits), route(u, e, logits))
    u2, e2, l2 = torch.randn(1, 9, 8, generator=g), torch.rand(1, 9, 4, generator=g), torch.randn(1, 9, 4, generator=g)
    same(compiled(u2, e2, l2), route(u2, e2, l2))


def test_fallback_to_references_when_disabled(tmp_path):
    script = textwrap.dedent("""
        import warnings, torch
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            import moe_mlir
            import moe_mlir.reference
            from moe_mlir import ops
            assert not ops.kernels_available()
            x = torch.randn(4, 8)
            w, i = torch.ops.moe.topk_renorm(x, 2)
            torch.ops.moe.topk_renorm(x, 2)
        msgs = [str(c.message) for c in caught if "compiled CPU kernels are unavailable" in str(c.message)]
        assert len(msgs) == 1, msgs
        assert torch.equal(i, moe_mlir.reference.topk_renorm(x, 2, "logits", True)[1])
        print("ok")
    """)
    env = dict(os.environ, MOE_TORCH_KERNELS="0", PYTHONPATH=PACKAGE_ROOT)
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_kernel_module_returns_results_for_out_params():
    """The generated entry returns its results; moe-lower-to-llvm="results-to-out-params=true" (test/Pipelines/
    results-to-out-params.mlir) makes them out-params the kernel computes in place, with no copy."""
    k = cache.parse_key("topk_renorm|k=2|mode=logits|renormalize=1|in:scores:f32:?x16")
    text = cache.kernel_module(k)
    assert ("func.func @kernel(%arg0: tensor<?x16xf32>) -> (tensor<?x2xf32>, tensor<?x2xi32>)" in text), text
    assert "return %weights, %indices : tensor<?x2xf32>, tensor<?x2xi32>" in text
    assert "materialize_in_destination" not in text


def test_kernel_module_is_built_from_the_key_by_the_ods_op():
    """The key is the compiler's input (include/MoE/IR/KernelKeys.td): the op comes from its ODS builder with inferred
    result types and passes its verifier, so a key the op rejects fails with the verifier's message, and a key with
    a name the op does not have fails naming it."""
    text = cache.kernel_module(cache.parse_key(
        "route|k=2|scoring=sigmoid|n_group=2|topk_group=1|renormalize=1|routed_scaling_factor=2.5|device=cuda:0"
        "|in:logits:bf16:?x8|in:bias:f32:8"))
    assert ("moe.route %arg0 bias(%arg1 : tensor<8xf32>) k(2) scoring(sigmoid) n_group(2) renormalize(true) "
            "routed_scaling_factor(2.500000e+00) : tensor<?x8xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>") in text, text
    with pytest.raises(CompileError, match=r"'moe.route' op 'k' \(9\) must be in \[1, 8\]"):
        cache.kernel_module(cache.parse_key("route|k=9|in:logits:f32:?x8"))
    with pytest.raises(CompileError, match="'top_k' is no attribute of moe.route"):
        cache.kernel_module(cache.parse_key("route|k=2|top_k=2|in:logits:f32:?x8"))
    with pytest.raises(CompileError, match="kernel key 'nope' names no op"):
        cache.kernel_module(cache.parse_key("nope|in:x:f32:4"))


def test_cuda_keys_name_their_device():
    """A CUDA call's key carries the device; its kernel file does not depend on the index (prebuilt kernels)."""
    k = cache.parse_key("topk_renorm|k=2|mode=logits|renormalize=1|device=cuda:1|in:scores:f32:?x16")
    assert k.device == "cuda:1" and "device" not in k.attrs
    a = cache.cuda_kernel_name("topk_renorm|k=2|device=cuda:1|in:scores:f32:?x16", "sm_90")
    assert a == cache.cuda_kernel_name("topk_renorm|k=2|device=cuda:0|in:scores:f32:?x16", "sm_90")
    assert a == cache.cuda_kernel_name("topk_renorm|k=2|in:scores:f32:?x16", "sm_90")
    assert a != cache.cuda_kernel_name("topk_renorm|k=2|in:scores:f32:?x16", "sm_80")


def _run_fresh(script: str) -> subprocess.CompletedProcess:
    """Runs ``script`` in a fresh interpreter (this pytest process may hold other tests' libraries)."""
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=600)


def test_kernels_compile_in_process_without_starting_a_process(tmp_path):
    """A kernel is compiled inside the torch process (libmoe_compiler.so: the moe pipeline, LLVM, lld), with every
    way of starting a process blocked; the compiler is loaded by the first build, not by ``import moe_mlir``, and a
    second process that finds the kernel in the cache never loads it (nor any LLVM). The kernel computes the
    reference's result."""
    script = f"""
        import os, subprocess, sys, torch, moe_mlir
        from pathlib import Path
        from moe_mlir.runtime import cache
        maps = lambda: Path("/proc/self/maps").read_text()
        assert "libmoe_compiler" not in maps() and "LLVM" not in maps(), "import moe_mlir loaded the compiler"

        def refuse(*a, **k):
            raise AssertionError(f"a process was started: {{a[:2]}}")

        subprocess.Popen.__init__ = refuse
        os.fork = os.posix_spawn = os.posix_spawnp = os.system = refuse
        os.environ["MOE_KERNEL_CACHE"] = {str(tmp_path)!r}
        x = torch.randn(5, 8)
        w, i = torch.ops.moe.topk_renorm(x, 2)
        ref = moe_mlir.reference.topk_renorm(x, 2, "logits", True)
        assert torch.equal(i, ref[1]) and torch.allclose(w, ref[0])
        warm = sys.argv[1] == "warm"
        assert (cache.stats.compiles, cache.stats.disk_loads) == ((0, 1) if warm else (1, 0)), cache.stats
        assert ("libmoe_compiler" in maps()) != warm
        assert "LLVM" not in maps() and "MLIR" not in maps()
        print("ok")
    """
    for phase in ("cold", "warm"):
        p = _run_fresh(script.replace("sys.argv[1]", repr(phase)))
        assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (phase, p.stderr)


def test_index_errors_reported_after_the_execution_api_is_loaded():
    """The execution API and the CUDA backend load libmoe_cpu_runtime.so, the one library that holds the error slot
    (the kernel runtime links it), into the global scope; kernels loaded before and after it report into that slot
    (with two copies this failed when the whole suite ran in one process). The execution API's parallel code runs on
    upstream's async runtime, loaded with local visibility: the torch ops' kernels, loaded without RTLD_DEEPBIND,
    keep binding to libmoe_kernel_runtime.so's pool."""
    p = _run_fresh("""
        import os
        os.environ["MOE_NUM_THREADS"] = "2"  # the execution API loads the async runtime
        import torch, moe_mlir
        from moe_mlir.backends.cpu import ExecutorLibrary
        def bad_call():
            x = torch.randn(6, 4)
            try:
                torch.ops.moe.mad_dispersion(x, torch.tensor([0, 1, 7, 1, 0, 2], dtype=torch.int32), 4)
            except ValueError as e:
                return str(e)
            return "no error"
        before = bad_call()
        import ctypes
        from moe_mlir.runtime.locate import find_runtime_lib
        executor = ExecutorLibrary.find()
        assert executor is not None
        executor.compile("func.func @f() { return }")
        # As the CUDA backend does (backends/cuda.py): the error slot's library in the global scope.
        ctypes.CDLL(find_runtime_lib("libmoe_cpu_runtime.so"), mode=ctypes.RTLD_GLOBAL)
        class DlInfo(ctypes.Structure):
            _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                        ("saddr", ctypes.c_void_p)]
        process = ctypes.CDLL(None)
        def defined_in(name):
            try:
                fn = getattr(process, name)
            except AttributeError:
                return "nowhere"
            info = DlInfo()
            assert process.dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info))
            return os.path.basename(info.fname.decode())
        print("global mlirAsyncRuntimeExecute:", defined_in("mlirAsyncRuntimeExecute"))
        print("global moeReportIndexError:", defined_in("moeReportIndexError"))
        torch.ops.moe.adjacency_update(torch.zeros(4, 4), torch.tensor([[0, 1]], dtype=torch.int32))
        after = bad_call()
        x = torch.randn(3, 5)
        try:
            torch.ops.moe.adjacency_update(torch.zeros(5, 5), torch.tensor([[0, 9]], dtype=torch.int32))
            fresh = "no error"
        except ValueError as e:
            fresh = str(e)
        print(before); print(after); print(fresh)
    """)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert "libmlir_async_runtime" not in "\n".join(lines), lines
    assert "global moeReportIndexError: libmoe_cpu_runtime.so" in lines, lines
    before, after, fresh = lines[-3:]
    assert "'assign' holds 7, outside [0, 4)" in before, before
    assert after == before, after
    assert "'idx' holds 9, outside [0, 5)" in fresh, fresh


def test_abi_descriptors():
    from moe_mlir.runtime import abi

    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    d = abi.describe(t)
    assert abi.descriptor_shape(d) == (2, 3, 4) and tuple(d.strides) == (12, 4, 1)
    assert d.aligned == t.data_ptr() and d.offset == 0
    flat = abi.describe(t, (6, 4))
    assert tuple(flat.sizes) == (6, 4) and tuple(flat.strides) == (4, 1)
    tt = t.transpose(1, 2)
    assert tuple(abi.describe(tt).strides) == (12, 1, 4)
    with pytest.raises(ValueError, match="contiguous"):
        abi.describe(tt, (24,))
    assert abi.tensor_type(["?", 16], "f32") == "tensor<?x16xf32>"
    assert abi.memref_type([], "i32") == "memref<i32>"
    assert abi.mlir_elem(torch.bfloat16) == "bf16" and abi.DTYPE_OF_ELEM["i1"] is torch.bool


def test_parallel_kernels_after_fork():
    """A forked child runs the parallel (pool) path of a kernel: its pool is its own, nothing hangs. In the parent
    the kernels run on torch's OpenMP team, which does not survive fork (libgomp): the child's kernels keep to the
    kernel runtime's pool; torch's own parallel ops would wait forever there, as after any torch op in the parent,
    so the child computes the reference on one thread (as DataLoader workers run)."""
    script = textwrap.dedent("""
        import os, torch
        import moe_mlir, moe_mlir.reference as R
        x = torch.randn(4096, 64)
        torch.ops.moe.topk_renorm(x, 4)           # the pool and the OpenMP team start in the parent
        pid = os.fork()
        if pid == 0:
            w, i = torch.ops.moe.topk_renorm(x, 4)  # 128 items: the parallel branch, 2 threads
            torch.set_num_threads(1)
            os._exit(0 if torch.equal(i, R.topk_renorm(x, 4, "logits", True)[1]) else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, MOE_NUM_THREADS="2")
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "0", p.stderr


def test_concurrent_processes_share_the_disk_cache(tmp_path):
    script = "import torch, moe_mlir; torch.ops.moe.topk_renorm(torch.randn(3, 20), 2)"
    env = dict(os.environ, MOE_KERNEL_CACHE=str(tmp_path), PYTHONPATH=PACKAGE_ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    assert len(list(tmp_path.glob("*.so"))) == 1 and not list(tmp_path.glob("*.part"))


def test_prebuild_cuda_builds_a_kernel_with_the_one_cuda_recipe(tmp_path, monkeypatch):
    """A torch.ops.moe CUDA kernel is prebuilt without a GPU by the one CUDA recipe (driver.build_cuda_library, in
    this process, as the whole-graph CUDA split and the kernels built at their first call: no process is started),
    with a fatbin: a shared object exporting the op's entry point with the sm_90 cubin embedded, under the name
    $MOE_KERNEL_PREBUILT looks up; a second prebuild finds it there and builds nothing."""
    from moe_mlir.runtime import driver, locate

    toolkit = Path(driver.cuda_toolkit())
    if not (toolkit / "bin" / "ptxas").is_file() or locate.find_runtime_lib("libmoe_cuda_runtime.so") is None:
        pytest.skip(f"no CUDA toolkit at {toolkit} or no libmoe_cuda_runtime.so")
    calls = []
    real = driver.run_process
    monkeypatch.setattr(driver, "run_process", lambda cmd, *a, **kw: calls.append(cmd) or real(cmd, *a, **kw))
    key = "topk_renorm|k=2|mode=logits|renormalize=1|in:scores:f32:?x16"
    built = []
    recipe = driver.build_cuda_library
    monkeypatch.setattr(driver, "build_cuda_library", lambda *a, **kw: built.append(a[3].fmt) or recipe(*a, **kw))
    assert cache.prebuild_cuda([key], tmp_path, "sm_90") == 1
    assert calls == [] and built == ["fatbin"]
    so = tmp_path / (cache.cuda_kernel_name(key, "sm_90") + ".so")
    assert [p.name for p in tmp_path.iterdir()] == [so.name]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True).stdout
    assert " T _mlir_ciface_" in syms, syms
    assert b"sm_90" in so.read_bytes()
    assert cache.prebuild_cuda([key], tmp_path, "sm_90") == 0


def test_prebuild_cuda_leaves_out_the_cpu_only_ops(tmp_path):
    """A kernel-key list recorded on the CPU (scripts/gpu-check.sh) holds keys of ops the extension registers for the
    CPU only (the sequence-level balance loss, capacity): prebuild_cuda builds none of them, and every op named in
    CPU_ONLY_OPS is a key of the kernel-key table (include/MoE/IR/KernelKeys.td). The router losses with a GPU
    lowering are CUDA ops (since the H200 check of 2026-11-27 ran their glue)."""
    from moe_mlir.runtime import cache
    from moe_mlir.runtime import keys as key_ops

    keys = ["sequence_balance_loss|top_k=2|in:logits:f32:?x?x8", "apply_capacity|in:indices:i64:?x2"]
    assert cache.prebuild_cuda(keys, tmp_path, "sm_90") == 0
    assert list(tmp_path.iterdir()) == []
    for op in cache.CPU_ONLY_OPS:  # a key of no input: the table knows the op and names what is missing
        with pytest.raises(key_ops.KeyBuildError, match="kernel key '.*': no input"):
            key_ops.kernel_module(op)
    assert not any(cache.cuda_kernel_op(op) for op in cache.CPU_ONLY_OPS) and cache.cuda_kernel_op("topk_renorm")
    # The extension registers route_backward's kernel for CUDA (RoutingOps.cpp): it must be prebuilt (the H200
    # check of 2026-11-26 found 6 tests without it while it was listed here).
    assert cache.cuda_kernel_op("route_backward")
    for op in ("router_stats_fwd", "router_stats_backward", "router_z_loss", "router_z_loss_backward"):
        assert cache.cuda_kernel_op(op), op


def test_prebuild_cuda_builds_the_router_losses(tmp_path):
    """The router losses' keys that a CPU run records (the load-balancing loss's
    statistics and their backward, the z-loss) build for sm_90 without a GPU: their GPU lowering (balance-kernels)
    takes the modules the kernel cache writes for them."""
    from moe_mlir.runtime import driver, locate

    toolkit = Path(driver.cuda_toolkit())
    if not (toolkit / "bin" / "ptxas").is_file() or locate.find_runtime_lib("libmoe_cuda_runtime.so") is None:
        pytest.skip(f"no CUDA toolkit at {toolkit} or no libmoe_cuda_runtime.so")
    # As a CPU run of load_balancing_loss(x, 8, mask) + router_z_loss(x.bfloat16()) and its backward records them.
    keys = ["router_stats_fwd|top_k=8|in:logits:f32:?x64|in:token_mask:f32:?", "router_z_loss|in:logits:bf16:?x64",
            "router_z_loss_backward|in:logits:bf16:?x64|in:grad:f32:scalar",
            "router_stats_backward|in:logits:f32:?x64|in:token_mask:f32:?|in:weight_sum:f32:scalar"
            "|in:grad_mean_probs:f32:64"]
    assert cache.prebuild_cuda(keys, tmp_path, "sm_90") == 4
    for key in keys:
        so = tmp_path / (cache.cuda_kernel_name(key, "sm_90") + ".so")
        assert so.is_file() and b"sm_90" in so.read_bytes(), key
