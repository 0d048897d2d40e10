"""moe.hyper_router_grad's CPU kernel (lib/Conversion/MoEToCPU/HyperRouterGrad.cpp) against the closed form in float64.

The kernel recomputes h = relu(w1·emb + b1) with the forward's GEMV, then makes one pass over the rows of w2 (d_w2 =
dout ⊗ h and dh = w2ᵀ·dout from per-block partials summed in block order) and one over w1 (d_w1 = da ⊗ emb, d_emb =
w1ᵀ·da). Which path runs depends on the shape (a matrix of at most 2^18 elements: at most 4 row blocks on the
calling thread; else up to 64 blocks of >= 64 rows over the workers) and on the target's vector width (the column
tail: Dh, De not multiples of 8 or 16), so every case runs compiled for x86-64-v3 (AVX2, 8 lanes) and x86-64-v4
(AVX-512, 16 lanes), on one worker and on two. Inputs: random, the ReLU's edge (a = 0 exactly, a < 0, a NaN),
D = 1, E = 1, f16/bf16 operands; and the results on one and two workers are bit-identical (the partials' order is
fixed by the shape).

Tolerance: the two transposed matrix-vector products sum E·(D+1) and Dh terms in f32 in another order than the
float64 reference; close() scales atol with the longest sum. Outer products and d_b2 are single roundings.
"""

from __future__ import annotations

import pytest
import torch

from moe_mlir import reference as R
from moe_mlir.runtime import cache, extension
from torch_checks import gen, needs_cpu_kernels, use_cpu_target

pytestmark = needs_cpu_kernels

NAN = float("nan")


@pytest.fixture(params=[("x86-64-v3", 2), ("x86-64-v4", 2), ("x86-64-v4", 1)], ids=lambda p: f"{p[0]}-t{p[1]}")
def target(request, monkeypatch):
    use_cpu_target(monkeypatch, *request.param)
    yield request.param
    extension.clear_kernels()


def _case(De, Dh, E, D, seed=0, dtype=torch.float32):
    g = gen(seed)
    t = [torch.randn(De, generator=g), torch.randn(Dh, De, generator=g) / De ** 0.5, torch.randn(Dh, generator=g),
         torch.randn(E * (D + 1), Dh, generator=g) / Dh ** 0.5, torch.randn(E * (D + 1), generator=g)]
    return [x.to(dtype) for x in t], torch.randn(E, D, generator=g), torch.randn(E, generator=g)


def _run(operands, gw, gb, E):
    """The op once, on fresh kernel tables (the target fixture): the compiled kernel is loaded for this call."""
    before = len(cache.stats.keys)
    out = torch.ops.moe.hyper_router_backward(gw, gb, *operands, E)
    assert any(k.startswith("hyper_router_backward|") for k in cache.stats.keys[before:]), "no kernel was loaded"
    return out


def _check(operands, gw, gb, E):
    """The kernel's five gradients equal the float64 closed form (of the operands as given, widened)."""
    ours = _run(operands, gw, gb, E)
    ref = R._hyper_router_backward_ref(gw.double(), gb.double(), *[t.double() for t in operands], E)
    n = max(gw.numel() + gb.numel(), operands[1].shape[0])
    atol = 2e-5 * max(1.0, n / 32)
    for name, o, r, t in zip(("d_emb", "d_w1", "d_b1", "d_w2", "d_b2"), ours, ref, operands):
        assert o.dtype == torch.float32 and o.shape == t.shape, name
        torch.testing.assert_close(o.double(), r, atol=atol, rtol=1e-4, equal_nan=True, msg=lambda m: f"{name}: {m}")
    return ours, ref


# (De, Dh, E, D): the decode size (w2 [520, 256], 4 blocks on the calling thread); w2 above 2^18 elements with a
# column tail on both targets (26 blocks over the workers); 64 blocks (w2 [5184, 72]); D = 1; E = 1; tiny.
SHAPES = [(256, 256, 8, 64), (40, 250, 16, 100), (300, 72, 64, 80), (3, 9, 5, 1), (33, 17, 1, 40), (7, 5, 1, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(target, shape):
    De, Dh, E, D = shape
    operands, gw, gb = _case(De, Dh, E, D, seed=De + Dh)
    _check(operands, gw, gb, E)


def test_relu_edge(target):
    """a = 0 exactly and a < 0 pass no gradient (d_b1, d_w1 rows and d_w2 columns exactly 0); a NaN `a` passes
    dh (threshold_backward) and makes its d_w2 column NaN; the other units are unaffected. Large enough for the
    blocked path (w2 [1616, 250])."""
    operands, gw, gb = _case(40, 250, 16, 100, seed=7)
    emb, w1, b1, w2, b2 = operands
    w1[0] = 0.0
    b1[0] = 0.0                                              # a_0 = 0 exactly
    b1[1] = -(w1[1].abs().sum() * emb.abs().max()) - 1.0     # a_1 < 0
    b1[249] = NAN                                            # a_249 NaN (the last column: the tail)
    ours, ref = _check([emb, w1, b1, w2, b2], gw, gb, 16)
    demb, dw1, db1, dw2, db2 = ours
    assert torch.equal(db1[:2], torch.zeros(2)) and torch.equal(dw1[:2], torch.zeros(2, 40))
    assert torch.equal(dw2[:, :2], torch.zeros(1616, 2))
    assert torch.isfinite(db1[249]) and db1[249] != 0 and torch.isnan(dw2[:, 249]).all()
    assert torch.isfinite(dw2[:, :249]).all() and torch.isfinite(demb).all() and torch.isfinite(dw1).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_operands(target, dtype):
    """f16/bf16 operands are read widened: the gradients are those of the rounded operands, in f32."""
    operands, gw, gb = _case(40, 250, 16, 100, seed=3, dtype=dtype)
    _check(operands, gw, gb, 16)


def test_thread_count_does_not_change_bits(monkeypatch):
    """The partials are summed in an order fixed by the shape: 1 and 2 workers give the same bits (64 blocks)."""
    operands, gw, gb = _case(300, 72, 64, 80, seed=11)
    results = []
    for threads in (1, 2):
        use_cpu_target(monkeypatch, "native", threads)
        results.append(_run(operands, gw, gb, 64))
    extension.clear_kernels()
    for name, a, b in zip(("d_emb", "d_w1", "d_b1", "d_w2", "d_b2"), *results):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("shape", [(256, 256, 8, 64), (40, 250, 16, 100), (7, 5, 1, 1)], ids=lambda s: "x".join(map(str, s)))
def test_without_weight_grads(target, shape):
    """weight_grads=False (a frozen hypernetwork): d_w1 and d_w2 come back empty, the other three are the same bits
    as with them (the same kernel minus the two outer products, a separate compiled kernel)."""
    De, Dh, E, D = shape
    operands, gw, gb = _case(De, Dh, E, D, seed=De + Dh)
    full = _run(operands, gw, gb, E)
    before = len(cache.stats.keys)
    part = torch.ops.moe.hyper_router_backward(gw, gb, *operands, E, False)
    assert any("|weight_grads=0|" in k for k in cache.stats.keys[before:]), "no weight_grads=0 kernel was loaded"
    assert part[1].shape == (0,) and part[3].shape == (0,)
    for i in (0, 2, 4):
        assert torch.equal(part[i], full[i]), i


def test_frozen_hypernetwork_skips_the_weight_gradients():
    """Through autograd: with w1..b2 frozen, the backward asks for no weight gradients (the weight_grads=0 kernel)
    and emb's gradient equals eager's."""
    operands, gw, gb = _case(64, 48, 4, 12, seed=5)
    emb = operands[0].clone().requires_grad_()
    before = len(cache.stats.keys)
    w, b = torch.ops.moe.hyper_router(emb, *operands[1:], 4)
    ((w * gw).sum() + (b * gb).sum()).backward()
    assert any(k.startswith("hyper_router_backward|") and "|weight_grads=0|" in k for k in cache.stats.keys[before:])
    ref = operands[0].clone().requires_grad_()
    w1, b1, w2, b2 = operands[1:]
    v = (w2 @ torch.relu(w1 @ ref + b1) + b2).view(4, -1)
    ((v[:, :-1] * gw).sum() + (v[:, -1] * gb).sum()).backward()
    torch.testing.assert_close(emb.grad, ref.grad, atol=1e-5, rtol=1e-4)
