"""torch.ops.moe.* on CUDA tensors: our GPU kernels (lib/Runtime/Torch/TorchCudaOps.cpp, the CUDA kernels of
moe_mlir.runtime.cache) against moe_mlir.reference (computed on CPU copies).

Covers: every op and fused form (random and adversarial inputs: ties, NaN, -inf rows, masks, N = 1, k = K, zero
tokens, f16/bf16; head_select='all', which has no GPU kernel, runs the reference), several token counts served by one
kernel, non-contiguous inputs, a side stream, a call captured
in a CUDA graph (no host synchronization, no allocation of the outputs by the kernel), index errors read after a
synchronization (moe_mlir.runtime.cuda.check_errors), gradients, and that the kernels (not the references) ran.

Skipped, with the reason, without a CUDA device or without the CUDA kernels (an extension built without the CUDA
runtime, no moe-opt and no $MOE_KERNEL_PREBUILT). scripts/gpu-check.sh runs it on a lent GPU (step torch-ops), after
running it here with MOE_TEST_DEVICE=cpu (the same calls on the CPU kernels, the CUDA-only tests skipped) under
$MOE_KERNEL_RECORD to learn which kernels to build ahead of time for the GPU machine, which has no LLVM.
"""

from __future__ import annotations

import os

import pytest
import torch

from moe_mlir import ops  # noqa: F401  (loads the extension, registers the CUDA kernels when usable)
from moe_mlir import reference as R
from moe_mlir.runtime import cache, extension
from moe_mlir.runtime import cuda as moe_cuda

NAN, INF = float("nan"), float("inf")

#: "cuda", or "cpu" to record the kernels the CUDA run needs (scripts/gpu-check.sh).
DEV = os.environ.get("MOE_TEST_DEVICE", "cuda")

if DEV == "cuda":
    pytestmark = pytest.mark.skipif(
        extension.cuda_unavailable is not None,
        reason=f"the CUDA kernels of torch.ops.moe.* are unavailable: {extension.cuda_unavailable}",
    )
else:
    pytestmark = pytest.mark.skipif(not ops.kernels_available(),
                                    reason=f"compiled kernels unavailable: {ops._KERNELS_UNAVAILABLE}")

#: What only the CUDA path has (streams, graphs, deferred index errors, the missing all-heads kernel).
cuda_only = pytest.mark.skipif(DEV != "cuda", reason="CUDA behaviour (MOE_TEST_DEVICE=cpu records kernels only)")


def same(ours, ref, atol=2e-6, rtol=2e-5):
    """``ours`` (CUDA) equals ``ref`` (CPU); f32 tolerances of the CPU tests unless given."""
    ours = ours if isinstance(ours, tuple) else (ours,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(ours) == len(ref)
    if DEV == "cuda":
        torch.cuda.synchronize()
        moe_cuda.check_errors()
    for o, r in zip(ours, ref):
        assert o.device.type == DEV, o.device
        o = o.cpu()
        assert o.shape == r.shape, (o.shape, r.shape)
        assert o.dtype == r.dtype, (o.dtype, r.dtype)
        if o.is_floating_point():
            torch.testing.assert_close(o, r, atol=atol, rtol=rtol, equal_nan=True)
        else:
            assert torch.equal(o, r), (o, r)


def cu(*ts):
    return tuple(None if t is None else t.to(DEV) for t in ts)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def ran_kernel(op: str) -> bool:
    """Our kernel of ``op`` ran on DEV (the references leave no key)."""
    on = (lambda k: "|device=cuda:" in k) if DEV == "cuda" else (lambda k: "|device=" not in k)
    return any(k.startswith(op + "|") and on(k) for k in cache.stats.keys)


# ================================================================================================================
# Numerics
# ================================================================================================================


@pytest.mark.parametrize("mode", ["logits", "probs"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_topk_renorm_random(mode, renormalize, dtype):
    x = torch.randn(3, 5, 16, generator=gen())
    if mode == "probs":
        x = torch.softmax(x, -1)
    x = x.to(dtype)
    for k in (1, 3, 16):
        same(torch.ops.moe.topk_renorm(x.to(DEV), k, mode, renormalize), R.topk_renorm(x, k, mode, renormalize),
             atol=1e-5, rtol=1e-5)
    assert ran_kernel("topk_renorm")


def test_topk_renorm_adversarial():
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
                same(torch.ops.moe.topk_renorm(x.to(DEV), k, mode, renormalize), R.topk_renorm(x, k, mode, renormalize))
    big = torch.randn(2, 1500, generator=gen(1))  # K > 1024: the block-per-token kernel
    big[0, 7] = big[0, 900] = 50.0                 # a tie across the block
    same(torch.ops.moe.topk_renorm(big.to(DEV), 4), R.topk_renorm(big, 4, "logits", True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_ws", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_similarity_inform(causal, with_ws, with_mask):
    g = gen(1)
    B, N, D, K = 2, 9, 8, 6
    u = torch.randn(B, N, D, generator=g)
    e = torch.softmax(torch.randn(B, N, K, generator=g), -1)
    ws = torch.randn(D, D, generator=g) * 0.3 if with_ws else None
    m = None
    if with_mask:
        m = torch.rand(B, N, generator=g) > 0.4
        m[1] = False  # a sequence with every key masked: zero rows
    same(torch.ops.moe.similarity_inform(*cu(u, e, ws, m), 0.7, causal), R.similarity_inform(u, e, ws, m, 0.7, causal),
         atol=1e-5, rtol=1e-4)
    for k in (1, K):
        same(torch.ops.moe.similarity_inform_topk(*cu(u, e), k, *cu(ws, m), 0.7, causal, True),
             R.similarity_inform_topk(u, e, ws, m, k, True, 0.7, causal), atol=1e-5, rtol=1e-4)
    assert ran_kernel("similarity_inform") and ran_kernel("similarity_inform_topk")


def test_similarity_inform_single_token_and_nan():
    g = gen(2)
    u, e = torch.randn(1, 1, 4, generator=g), torch.softmax(torch.randn(1, 1, 3, generator=g), -1)
    same(torch.ops.moe.similarity_inform(*cu(u, e)), R.similarity_inform(u, e, None, None, 1.0, False))
    u, e = torch.randn(2, 5, 4, generator=g), torch.softmax(torch.randn(2, 5, 3, generator=g), -1)
    e[0, 2, 1] = NAN
    same(torch.ops.moe.similarity_inform(*cu(u, e), None, None, 1.0, True),
         R.similarity_inform(u, e, None, None, 1.0, True), atol=1e-5, rtol=1e-4)


def _attention_inputs(g, B=2, H=3, N=5, Nk=7, D=8, Dh=4, K=6):
    s = torch.randn(B, H, N, Nk, generator=g) * torch.linspace(0.5, 3.0, H)[None, :, None, None]
    u = torch.randn(B, N, D, generator=g) * 0.5
    v = torch.randn(B, H, Nk, Dh, generator=g) * 0.2
    wo = torch.randn(D, H * Dh, generator=g) * 0.2
    e = torch.softmax(torch.randn(B, Nk, K, generator=g), -1)
    return s, u, v, wo, e


@pytest.mark.parametrize("head_scale", [None, 1.0])
def test_attention_posterior(head_scale):
    s, u, v, wo, e = _attention_inputs(gen(3))
    s[0, :, 1, :] = -INF  # a fully masked query row in every head
    s[1, 0, :, 2] = -INF  # a key masked in one head
    same(torch.ops.moe.attention_posterior(*cu(s, u, v, wo, e), 0.8, "min_entropy", head_scale),
         R.attention_posterior(s, u, v, wo, e, 0.8, "min_entropy", head_scale), atol=1e-5, rtol=1e-4)
    for k in (1, e.shape[2]):
        same(torch.ops.moe.attention_posterior_topk(*cu(s, u, v, wo, e), k, 0.8, "min_entropy", head_scale, True),
             R.attention_posterior_topk(s, u, v, wo, e, k, True, 0.8, "min_entropy", head_scale),
             atol=1e-5, rtol=1e-4)


@cuda_only
def test_attention_posterior_all_heads_runs_the_reference():
    """head_select='all' has no GPU kernel: the CUDA call runs the eager reference (on the device), no kernel."""
    s, u, v, wo, e = _attention_inputs(gen(3))
    keys = len(cache.stats.keys)
    same(torch.ops.moe.attention_posterior(*cu(s, u, v, wo, e), 0.8, "all", None),
         R.attention_posterior(s, u, v, wo, e, 0.8, "all", None), atol=1e-5, rtol=1e-4)
    same(torch.ops.moe.attention_posterior_topk(*cu(s, u, v, wo, e), 2, 0.8, "all", None, True),
         R.attention_posterior_topk(s, u, v, wo, e, 2, True, 0.8, "all", None), atol=1e-5, rtol=1e-4)
    assert len(cache.stats.keys) == keys


@pytest.mark.parametrize("normalize", ["feature", "expert", "global"])
@pytest.mark.parametrize("measure", ["mad", "variance"])
@pytest.mark.parametrize("empty", ["identity", "raw"])
def test_mad_dispersion(normalize, measure, empty):
    g = gen(4)
    x = torch.randn(40, 12, generator=g)
    a = torch.randint(0, 5, (40,), generator=g)
    a[a == 3] = 0  # an empty cluster
    a[a == 4] = 2
    a[0] = 4       # a singleton cluster
    for clip in (0.0, 2.0):
        same(torch.ops.moe.mad_dispersion(*cu(x, a), 5, 1e-3, clip, normalize, measure, empty),
             R.mad_dispersion(x, a, 5, 1e-3, clip, normalize, measure, empty), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("norm", ["row", "col", "none"])
@pytest.mark.parametrize("include_self", [True, False])
def test_adjacency_update(norm, include_self):
    g = gen(5)
    a = torch.rand(6, 6, generator=g)
    idx = torch.randint(0, 6, (30, 3), generator=g, dtype=torch.int32)
    idx[0] = torch.tensor([1, 1, 1], dtype=torch.int32)  # repeated index counts once
    same(torch.ops.moe.adjacency_update(*cu(a, idx), 0.8, norm, include_self),
         R.adjacency_update(a, idx, 0.8, norm, include_self))


def test_hyper_router():
    g = gen(6)
    emb, w1, b1 = torch.randn(8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
    w2, b2 = torch.randn(3 * 7, 5, generator=g), torch.randn(21, generator=g)
    same(torch.ops.moe.hyper_router(*cu(emb, w1, b1, w2, b2), 3), R.hyper_router(emb, w1, b1, w2, b2, 3),
         atol=1e-5, rtol=1e-5)


def test_zero_tokens():
    x = torch.randn(0, 8)
    same(torch.ops.moe.topk_renorm(x.to(DEV), 2), R.topk_renorm(x, 2, "logits", True))
    t, a = torch.randn(0, 4), torch.zeros(0, dtype=torch.int64)
    same(torch.ops.moe.mad_dispersion(*cu(t, a), 3), R.mad_dispersion(t, a, 3, 1e-4, 10.0, "feature", "mad", "identity"))
    A, idx = torch.rand(4, 4), torch.zeros(0, 2, dtype=torch.int64)
    same(torch.ops.moe.adjacency_update(*cu(A, idx)), R.adjacency_update(A, idx, 0.9, "row", True))


# ================================================================================================================
# One kernel for every token count; streams, CUDA graphs, errors, autograd
# ================================================================================================================


def test_token_counts_share_one_kernel():
    g = gen(7)
    torch.ops.moe.topk_renorm(torch.randn(3, 24, generator=g).to(DEV), 5, "logits", False)
    before = (cache.stats.compiles, cache.stats.disk_loads)
    for T in (1, 2, 17, 64, 257, 1000):
        x = torch.randn(T, 24, generator=g)
        same(torch.ops.moe.topk_renorm(x.to(DEV), 5, "logits", False), R.topk_renorm(x, 5, "logits", False))
    assert (cache.stats.compiles, cache.stats.disk_loads) == before


def test_non_contiguous_inputs():
    g = gen(8)
    x = torch.randn(16, 10, generator=g).t()
    same(torch.ops.moe.topk_renorm(x.to(DEV), 2), R.topk_renorm(x, 2, "logits", True))
    u = torch.randn(2, 8, 12, generator=g)
    e = torch.softmax(torch.randn(2, 4, 8, generator=g), -1)
    ud, ed = u.to(DEV)[:, :, ::2], e.to(DEV).transpose(1, 2)
    same(torch.ops.moe.similarity_inform(ud, ed), R.similarity_inform(u[:, :, ::2], e.transpose(1, 2), None, None,
                                                                       1.0, False), atol=1e-5, rtol=1e-4)


def _cuda_only_calls(dev):
    """The op calls of the CUDA-only tests below, with their shapes and dtypes (so their kernels' keys), each
    checked against the reference: on the CPU they record those kernels for the GPU check to prebuild."""
    g = gen(13)
    for K in (64, 32):
        x = torch.randn(16, K, generator=g)
        same(torch.ops.moe.topk_renorm(x.to(dev), 4), R.topk_renorm(x, 4, "logits", True), atol=1e-5, rtol=1e-5)
    a, idx = torch.rand(3, 3, generator=g), torch.tensor([[0, 1], [1, 2]])
    same(torch.ops.moe.adjacency_update(a.to(dev), idx.to(dev)), R.adjacency_update(a, idx, 0.9, "row", True))
    t, asg = torch.randn(5, 3, generator=g), torch.tensor([0, 1, 3, 2, 3])
    same(torch.ops.moe.mad_dispersion(t.to(dev), asg.to(dev), 4),
         R.mad_dispersion(t, asg, 4, 1e-4, 10.0, "feature", "mad", "identity"), atol=1e-5, rtol=1e-4)


def test_kernels_of_the_cuda_only_tests():
    _cuda_only_calls(DEV)


@cuda_only
def test_side_stream_orders_after_its_producers():
    """Inputs written on a side stream just before the call: the kernel runs on that (current) stream after them."""
    x = torch.randn(4096, 64, generator=gen(9))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        xd = torch.zeros(4096, 64, device=DEV)
        xd.copy_(x.to(DEV, non_blocking=True) * 2.0)
        w, i = torch.ops.moe.topk_renorm(xd, 4)
    side.synchronize()
    same((w, i), R.topk_renorm(x * 2.0, 4, "logits", True), atol=1e-5, rtol=1e-5)


@cuda_only
def test_call_is_captured_in_a_cuda_graph():
    """No host synchronization and no allocation of the outputs in the kernel: the call can be captured."""
    x = torch.randn(64, 32, generator=gen(10)).to(DEV)
    torch.ops.moe.topk_renorm(x, 4)  # loads the kernel before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w, i = torch.ops.moe.topk_renorm(x, 4)
    fresh = torch.randn(64, 32, generator=gen(11))
    x.copy_(fresh.to(DEV))
    graph.replay()
    same((w, i), R.topk_renorm(fresh, 4, "logits", True), atol=1e-5, rtol=1e-5)


@cuda_only
def test_index_errors_are_read_after_a_sync():
    a, idx = torch.rand(3, 3), torch.tensor([[0, 1], [-1, 2]])
    out = torch.ops.moe.adjacency_update(*cu(a, idx))  # returns without waiting; the kernel records the error
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"moe.adjacency_update: 'idx' holds -1, outside \[0, 3\)"):
        moe_cuda.check_errors()
    moe_cuda.check_errors()  # read once: cleared
    assert out.shape == (3, 3)
    t, asg = torch.randn(5, 3), torch.tensor([0, 1, 7, 2, 3])
    torch.ops.moe.mad_dispersion(*cu(t, asg), 4)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"'assign' holds 7, outside \[0, 4\)"):
        moe_cuda.check_errors()


def test_gradients_through_the_kernels():
    x = torch.randn(6, 8, generator=gen(12))
    xd = x.clone().to(DEV).requires_grad_()
    w, _ = torch.ops.moe.topk_renorm(xd, 3)
    w.sum().backward()
    xr = x.clone().requires_grad_()
    wr, _ = R.topk_renorm(xr, 3, "logits", True)
    wr.sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xr.grad, atol=1e-5, rtol=1e-5)


@cuda_only
def test_every_op_has_a_cuda_kernel():
    for name in ops.OP_NAMES + ops.FUSED_OP_NAMES:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"moe::{name}", "CUDA"), name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"moe::{name}", "AutogradCUDA"), name
