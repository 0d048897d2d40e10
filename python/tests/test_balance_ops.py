"""torch.ops.moe load-balancing ops (load_balancing_loss, router_z_loss, router_stats, sequence_balance_loss): the
compiled CPU kernels against plain-PyTorch references (moe_mlir/reference/balance.py and, for the Switch loss,
transformers' load_balancing_loss_func written out), their autograd against PyTorch's autograd of the reference
(f32, rtol 1e-5) and against finite differences (f64 reference), and same bits at 1 and 2 threads.

Adversarial inputs: ties (the lowest index is selected), NaN and +-inf logits, rows of -inf, all-masked tokens,
T = 1, k = E, E = 1, zero tokens, several token counts (one kernel for every T).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from moe_mlir import ops
from moe_mlir.reference import balance as RB
from torch_checks import ran_kernel

NAN, INF = float("nan"), float("inf")
PACKAGE_ROOT = os.path.join(os.path.dirname(__file__), "..")

needs_kernels = pytest.mark.skipif(
    not ops.kernels_available(),
    reason=f"compiled kernels unavailable: {ops._KERNELS_UNAVAILABLE} (build the project: cmake --build build)")

pytestmark = needs_kernels

# f32 sums in a different order than PyTorch's: relative 1e-5 (a few ulp of a sum of up to ~1000 terms).
RTOL, ATOL = 1e-5, 1e-6


def transformers_switch_loss(logits: torch.Tensor, top_k: int, mask=None) -> torch.Tensor:
    """transformers' load_balancing_loss_func (mixtral), written out on one concatenated [T, E] tensor."""
    E = logits.shape[-1]
    routing_weights = torch.nn.functional.softmax(logits.float(), dim=-1)
    _, selected = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected, E)
    if mask is None:
        tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
        router_prob_per_expert = torch.mean(routing_weights, dim=0)
    else:
        m = mask.float()
        tokens_per_expert = (expert_mask.float() * m[:, None, None]).sum(0) / m[:, None, None].expand(
            -1, top_k, E).sum(0)
        router_prob_per_expert = (routing_weights * m[:, None]).sum(0) / m[:, None].expand(-1, E).sum(0)
    return torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * E


def _logits(T, E, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(T, E, generator=g)).to(dtype)


def _close(a, b, rtol=RTOL, atol=ATOL):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)


# ----------------------------------------------------------------------------------------------------------------
# Forward against the references
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T,E,k", [(1, 8, 2), (33, 8, 2), (130, 64, 8), (517, 60, 4), (40, 5, 5), (9, 1, 1)])
def test_router_stats_and_losses_match_reference(T, E, k):
    x = _logits(T, E, seed=T + E)
    mask = (torch.rand(T, generator=torch.Generator().manual_seed(1)) > 0.3).to(torch.int64)
    for m in (None, mask):
        c, p, w = torch.ops.moe.router_stats_fwd(x, k, m)
        rc, rp, rw = RB.router_stats_full(x, k, m)
        assert torch.equal(c, rc) and float(w) == float(rw)
        _close(p, rp)
        _close(torch.ops.moe.load_balancing_loss(x, k, m), RB.load_balancing_loss(x, k, m))
        _close(torch.ops.moe.load_balancing_loss(x, k, m), transformers_switch_loss(x, k, m))
        c2, p2 = torch.ops.moe.router_stats(x, k, m)
        assert torch.equal(c2, c) and torch.equal(p2, p)
    _close(torch.ops.moe.router_z_loss(x), RB.router_z_loss(x))


def test_low_precision_and_f64_logits():
    x = _logits(70, 16, seed=3)
    for dt in (torch.bfloat16, torch.float16, torch.float64):
        xd = x.to(dt)
        ref = RB.load_balancing_loss(xd.float(), 2)
        _close(torch.ops.moe.load_balancing_loss(xd, 2), ref)
        _close(torch.ops.moe.router_z_loss(xd), RB.router_z_loss(xd.float()))


def test_ties_select_the_lowest_index():
    # Every row equal: the k lowest experts are selected, as moe.topk_renorm's indices.
    x = torch.zeros(6, 8)
    x[:, 5] = 1.0
    c, p = torch.ops.moe.router_stats(x, 3)
    assert c.tolist() == [6, 6, 0, 0, 0, 6, 0, 0]
    _, idx = torch.ops.moe.topk_renorm(x, 3)
    assert torch.equal(c, torch.bincount(idx.flatten().long(), minlength=8).float())


def test_non_finite_rows():
    x = _logits(6, 8, seed=5)
    x[1, 3] = NAN            # NaN row: p NaN, its NaN entry selected first
    x[2] = -INF              # all -inf: p = 0, experts 0..k-1 selected
    x[3, 2] = INF            # +inf: p NaN
    x[4, :4] = -INF          # partly masked
    c, p, w = torch.ops.moe.router_stats_fwd(x, 2)
    rc, rp, rw = RB.router_stats_full(x, 2)
    assert torch.equal(c, rc) and float(w) == 6
    assert torch.isnan(p).all() and torch.isnan(rp).all()
    # Without the NaN/+inf rows the probabilities stay finite; the -inf row adds nothing to P.
    keep = torch.tensor([0, 2, 4, 5])
    c, p, _ = torch.ops.moe.router_stats_fwd(x[keep], 2)
    rc, rp, _ = RB.router_stats_full(x[keep], 2)
    assert torch.equal(c, rc) and c[:2].tolist() >= [1, 1]
    _close(p, rp)
    assert float(p.sum()) == pytest.approx(3 / 4, rel=1e-6)
    # z-loss: a -inf row gives +inf, NaN propagates.
    assert torch.ops.moe.router_z_loss(x[keep]).item() == INF
    assert torch.isnan(torch.ops.moe.router_z_loss(x))


def test_masks_all_masked_and_zero_tokens():
    x = _logits(10, 6, seed=7)
    zero = torch.zeros(10)
    c, p, w = torch.ops.moe.router_stats_fwd(x, 2, zero)
    assert c.eq(0).all() and float(w) == 0 and torch.isnan(p).all()
    assert torch.isnan(torch.ops.moe.load_balancing_loss(x, 2, zero))
    assert torch.isnan(transformers_switch_loss(x, 2, zero))
    empty = torch.empty(0, 6)
    c, p, w = torch.ops.moe.router_stats_fwd(empty, 2)
    assert c.eq(0).all() and float(w) == 0 and torch.isnan(p).all()
    assert torch.isnan(torch.ops.moe.load_balancing_loss(empty, 2))
    assert torch.isnan(torch.ops.moe.router_z_loss(empty))
    # Fractional and bool masks multiply, as transformers' attention mask.
    wts = torch.linspace(0, 1, 10)
    _close(torch.ops.moe.load_balancing_loss(x, 2, wts), RB.load_balancing_loss(x, 2, wts))
    _close(torch.ops.moe.load_balancing_loss(x, 2, wts > 0.5), RB.load_balancing_loss(x, 2, wts > 0.5))


@pytest.mark.parametrize("B,S,E,k", [(2, 7, 8, 2), (3, 1, 16, 4), (1, 40, 6, 6), (2, 5, 1, 1)])
def test_sequence_balance_loss_matches_reference(B, S, E, k):
    g = torch.Generator().manual_seed(B * S + E)
    s = torch.sigmoid(torch.randn(B, S, E, generator=g))
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(B * S)]).reshape(B, S, k)
    for ix in (idx, idx.int()):
        _close(torch.ops.moe.sequence_balance_loss(s, ix, k), RB.sequence_balance_loss(s, ix, k))
    assert torch.isnan(torch.ops.moe.sequence_balance_loss(torch.empty(0, S, E), torch.empty(0, S, k,
                                                                                         dtype=torch.int64), k))


def test_sequence_balance_loss_literal_deepseek():
    """The DeepSeek-V3 formula written out: f_i = E/(K'T) Σ_t 1(s_it in TopK), P_i = 1/T Σ_t s'_it."""
    B, S, E, k = 2, 6, 8, 2
    s = torch.rand(B, S, E) + 0.01
    idx = torch.topk(s, k, dim=-1).indices
    total = 0.0
    for b in range(B):
        f = torch.zeros(E)
        for t in range(S):
            for j in range(k):
                f[idx[b, t, j]] += E / (k * S)
        P = (s[b] / s[b].sum(-1, keepdim=True)).mean(0)
        total += float((f * P).sum())
    assert torch.ops.moe.sequence_balance_loss(s, idx, k).item() == pytest.approx(total / B, rel=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------------------------


def _grad(fn, x, *args):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x, *args)
    (g,) = torch.autograd.grad(out, x)
    return out.detach(), g


@pytest.mark.parametrize("T,E,k", [(1, 8, 2), (37, 16, 4), (300, 64, 8), (20, 6, 6)])
def test_gradients_match_pytorch_autograd_of_the_reference(T, E, k):
    x = _logits(T, E, seed=11 + T)
    mask = (torch.arange(T) % 3 != 0).float()
    for m in (None, mask):
        o, g = _grad(torch.ops.moe.load_balancing_loss, x, k, m)
        ro, rg = _grad(RB.load_balancing_loss, x, k, m)
        _close(o, ro)
        _close(g, rg)
        _, tg = _grad(transformers_switch_loss, x, k, m)
        _close(g, tg)
    o, g = _grad(torch.ops.moe.router_z_loss, x)
    ro, rg = _grad(RB.router_z_loss, x)
    _close(o, ro)
    _close(g, rg)
    # router_stats: gradient through mean_probs with a random cotangent.
    cot = torch.randn(E)
    xs = x.clone().requires_grad_(True)
    (gs,) = torch.autograd.grad(torch.ops.moe.router_stats(xs, k)[1], xs, cot)
    xr = x.clone().requires_grad_(True)
    (gr,) = torch.autograd.grad(RB.router_stats(xr, k)[1], xr, cot)
    _close(gs, gr)


# The device suite: test_torch_ops_cuda.py runs the test below on a GPU (scripts/gpu-check.sh): the extension's CUDA
# kernels of the router losses.
@pytest.mark.parametrize("T,E,k", [(1, 8, 2), (0, 8, 2), (130, 64, 8), (517, 256, 8), (40, 5, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_router_losses_on_the_device(dev, T, E, k, dtype):
    """router_stats_fwd, router_stats, load_balancing_loss and router_z_loss on the device's kernels against the
    references on the CPU (in f32 of the same values): tied rows (the lowest index), a row half -inf, with and
    without a token mask, k = E, one and zero tokens, E = 256; the f32 gradients of both losses and of
    router_stats' mean_probs against autograd of the references."""
    tol = dict(rtol=1e-4, atol=1e-6) if dev == "cuda" else {}
    x = _logits(T, E, seed=T + E, dtype=dtype)
    if T >= 3:
        x[1] = 0.0
        x[2, :E // 2] = -INF
    ref_x = x.float()
    mask = (torch.rand(T, generator=torch.Generator().manual_seed(2)) > 0.3).float()
    cot = torch.randn(E, generator=torch.Generator().manual_seed(3))
    for m in (None, mask):
        xd, md = x.to(dev), None if m is None else m.to(dev)
        c, p, w = torch.ops.moe.router_stats_fwd(xd, k, md)
        rc, rp, rw = RB.router_stats_full(ref_x, k, m)
        assert c.device.type == dev and torch.equal(c.cpu(), rc) and float(w) == float(rw)
        _close(p.cpu(), rp, **tol)
        _close(torch.ops.moe.load_balancing_loss(xd, k, md).cpu(), RB.load_balancing_loss(ref_x, k, m), **tol)
        c2, p2 = torch.ops.moe.router_stats(xd, k, md)
        assert torch.equal(c2, c) and torch.equal(p2, p) if T else torch.isnan(p2).all()
        if dtype != torch.float32 or T == 0:
            continue
        leaf = lambda t: t.detach().clone().requires_grad_(True)  # noqa: E731
        xg, xr = leaf(xd), leaf(x)
        (torch.ops.moe.load_balancing_loss(xg, k, md) + torch.ops.moe.router_z_loss(xg)).backward()
        (RB.load_balancing_loss(xr, k, m) + RB.router_z_loss(xr)).backward()
        _close(xg.grad.cpu(), xr.grad, **tol)
        xg, xr = leaf(xd), leaf(x)
        (gs,) = torch.autograd.grad(torch.ops.moe.router_stats(xg, k, md)[1], xg, cot.to(dev))
        (gr,) = torch.autograd.grad(RB.router_stats(xr, k, m)[1], xr, cot)
        _close(gs.cpu(), gr, **tol)
    _close(torch.ops.moe.router_z_loss(x.to(dev)).cpu(), RB.router_z_loss(ref_x), **tol)
    if T:
        assert ran_kernel("router_stats_fwd", dev) and ran_kernel("router_z_loss", dev)


def test_sequence_balance_loss_gradient():
    B, S, E, k = 2, 9, 12, 3
    s = torch.sigmoid(torch.randn(B, S, E))
    idx = torch.topk(s, k, dim=-1).indices
    o, g = _grad(torch.ops.moe.sequence_balance_loss, s, idx, k)
    ro, rg = _grad(RB.sequence_balance_loss, s, idx, k)
    _close(o, ro)
    _close(g, rg)


def test_gradients_against_finite_differences():
    """Central differences of the f64 references (the selection fixed: no logit within h of a tie) against the
    kernels' gradients (f32: atol 1e-5)."""
    x = _logits(5, 6, seed=2).double()
    h = 1e-6

    def fd(f):
        g = torch.zeros_like(x)
        for i in range(x.numel()):
            e = torch.zeros_like(x).flatten()
            e[i] = h
            e = e.view_as(x)
            g.view(-1)[i] = (f(x + e) - f(x - e)) / (2 * h)
        return g

    _, g = _grad(torch.ops.moe.load_balancing_loss, x, 2)
    assert g.dtype == torch.float64
    _close(g, fd(lambda y: RB.load_balancing_loss(y.double(), 2).double()), rtol=1e-4, atol=1e-5)
    _, g = _grad(torch.ops.moe.router_z_loss, x)
    lse = lambda y: (torch.logsumexp(y, -1) ** 2).mean()  # noqa: E731
    _close(g, fd(lse), rtol=1e-4, atol=1e-5)


def test_backward_edge_cases():
    x = _logits(4, 5, seed=9)
    x[1] = -INF
    _, g = _grad(torch.ops.moe.load_balancing_loss, x, 2)
    _, rg = _grad(RB.load_balancing_loss, x, 2)
    assert g[1].eq(0).all()
    _close(g, rg)
    # Zero tokens: an empty gradient.
    e = torch.empty(0, 5, requires_grad=True)
    torch.ops.moe.router_z_loss(e).backward()
    assert e.grad.shape == (0, 5)


# ----------------------------------------------------------------------------------------------------------------
# Determinism, validation, fake kernels
# ----------------------------------------------------------------------------------------------------------------


def test_same_bits_at_one_and_two_threads(tmp_path):
    """Fixed row blocks summed in a fixed order: the results do not depend on the thread count (1000 rows: 16
    blocks, the parallel branch)."""
    script = textwrap.dedent("""
        import sys, torch, moe_mlir
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1000, 24, generator=g).requires_grad_(True)
        m = (torch.rand(1000, generator=g) > 0.2).float()
        c, p, w = torch.ops.moe.router_stats_fwd(x.detach(), 4, m)
        l = torch.ops.moe.load_balancing_loss(x, 4, m) + torch.ops.moe.router_z_loss(x)
        l.backward()
        torch.save([c, p, w, l.detach(), x.grad], sys.argv[1])
    """)
    outs = []
    for threads in ("1", "2"):
        path = tmp_path / f"t{threads}.pt"
        env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, MOE_NUM_THREADS=threads)
        p = subprocess.run([sys.executable, "-c", script, str(path)], env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr
        outs.append(torch.load(path))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_fake_kernels_and_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 8)
        assert torch.ops.moe.load_balancing_loss(x, 2).shape == ()
        c, p = torch.ops.moe.router_stats(x, 2)
        assert c.shape == (8,) and p.dtype == torch.float32
        assert torch.ops.moe.sequence_balance_loss(torch.empty(2, 3, 8), torch.empty(2, 3, 2, dtype=torch.long),
                                                   2).shape == ()

    def f(x):
        return torch.ops.moe.load_balancing_loss(x, 2) + 0.001 * torch.ops.moe.router_z_loss(x)

    x = _logits(12, 8)
    _close(torch.compile(f, backend="eager", fullgraph=True)(x), f(x))


def test_invalid_arguments():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"'top_k' \(9\) must be in \[1, 8\]"):
        torch.ops.moe.load_balancing_loss(x, 9)
    with pytest.raises(ValueError, match=r"'logits' must have rank 2"):
        torch.ops.moe.router_z_loss(torch.randn(8))
    with pytest.raises(ValueError, match=r"dimension 0 of 'token_mask' \(3\) must equal the token count T"):
        torch.ops.moe.router_stats(x, 2, torch.ones(3))
    with pytest.raises(TypeError, match="'logits' must be f32, f16, bf16 or f64"):
        torch.ops.moe.router_z_loss(torch.ones(4, 8, dtype=torch.int32))
    s = torch.rand(1, 4, 8)
    with pytest.raises(ValueError, match=r"'indices' holds 8, outside \[0, 8\)"):
        torch.ops.moe.sequence_balance_loss(s, torch.full((1, 4, 2), 8), 2)
    with pytest.raises(ValueError, match=r"dimension 2 of 'indices' \(2\) must equal 'top_k' \(3\)"):
        torch.ops.moe.sequence_balance_loss(s, torch.zeros(1, 4, 2, dtype=torch.long), 3)


def test_whole_graph_import_and_run():
    """The importer maps the ops to the dialect (load_balancing_loss = router_stats + load_balancing_loss, an int
    mask cast to f32) and the whole-graph CPU path computes the eager values (one small module compiled)."""
    from moe_mlir.backends.whole_graph import compile_whole_graph
    from moe_mlir.mlir.importer import import_model

    class Losses(torch.nn.Module):
        def forward(self, x, m, s, i):
            return (torch.ops.moe.load_balancing_loss(x, 2, m) + torch.ops.moe.router_z_loss(x),
                    torch.ops.moe.router_stats(x, 2)[1], torch.ops.moe.sequence_balance_loss(s, i, 2))

    g = torch.Generator().manual_seed(4)
    x, s = torch.randn(6, 8, generator=g), torch.rand(2, 3, 8, generator=g)
    args = (x, torch.tensor([1, 1, 0, 1, 1, 1]), s, torch.topk(s, 2, -1).indices)
    text = import_model(Losses(), args)
    for op in ("router_stats", "load_balancing_loss", "router_z_loss", "sequence_balance_loss"):
        assert f'"moe.{op}"' in text
    for a, b in zip(compile_whole_graph(Losses(), args)(*args), Losses()(*args)):
        _close(a, b)
