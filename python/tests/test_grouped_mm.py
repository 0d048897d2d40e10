"""``moe_mlir::grouped_mm``'s two paths (:mod:`moe_mlir.experts`): the per-expert loop (one ``mm`` per expert with
rows) and the padded batched GEMM (rows scattered into a zero ``[E, C, K]`` buffer, one ``bmm``: O(1) kernel
launches, taken on CUDA while ``E * C <= 4 * S``). Both are run here on the CPU by forcing the path
(``experts.gemm._FORCE_PATH``) and compared with each other and with a float64 per-expert reference; the dispatch rule is
checked on ``torch.device`` objects (no GPU needed).

Tolerances: the two paths compute each output element as the same K-term dot product, but ``bmm`` and ``mm`` may
block (and so sum) differently: f32 results agree to a few ulps (atol/rtol 1e-5 at K <= 24, magnitudes ~5); f16
and bf16 to their own rounding (1e-2 / 5e-2 relative, against the float64 reference too).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from moe_mlir import experts as X  # noqa: E402
from moe_mlir.experts import common as XC, gemm as XG, hf as XH  # noqa: E402

F32_TOL = dict(atol=1e-5, rtol=1e-5)
LOW_TOL = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


@pytest.fixture
def force(monkeypatch):
    def set_path(path):
        monkeypatch.setattr(XG, "_FORCE_PATH", path)
    return set_path


def _offsets(counts) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(counts, dtype=torch.long).cumsum(0)])


def _ref(x, w, offsets):
    """float64 per-expert matmul (rows of experts without rows: none)."""
    o = offsets.tolist()
    out = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float64)
    for e in range(w.shape[0]):
        out[o[e]:o[e + 1]] = x[o[e]:o[e + 1]].double() @ w[e].double()
    return out


def _ref_backward(grad, x, w, offsets):
    """float64 grad_x and grad_w ([E, K, N]) of the per-expert matmul (an expert without rows: zeros)."""
    o = offsets.tolist()
    gx = torch.zeros(x.shape, dtype=torch.float64)
    gw = torch.zeros(w.shape, dtype=torch.float64)
    for e in range(w.shape[0]):
        a, b = o[e], o[e + 1]
        gx[a:b] = grad[a:b].double() @ w[e].double().T
        gw[e] = x[a:b].double().T @ grad[a:b].double()
    return gx, gw


def _inputs(counts, k=7, n=5, dtype=torch.float32, seed=0, transposed=True):
    g = torch.Generator().manual_seed(seed)
    offsets = _offsets(counts)
    x = torch.randn(int(offsets[-1]), k, generator=g).to(dtype)
    E = len(counts)
    # HF passes nn.Linear-layout weights transposed: a non-contiguous [E, K, N] view
    w = (torch.randn(E, n, k, generator=g).to(dtype).transpose(1, 2) if transposed
         else torch.randn(E, k, n, generator=g).to(dtype))
    return x, w, offsets


def _both(x, w, offsets, force):
    force("loop")
    loop = torch.ops.moe_mlir.grouped_mm(x, w, offsets)
    force("padded")
    padded = torch.ops.moe_mlir.grouped_mm(x, w, offsets)
    return loop, padded


COUNTS = {
    "random": None,  # drawn in the test
    "empty experts": [3, 0, 5, 0, 0, 2, 0],
    "empty first and last": [0, 4, 1, 0],
    "one expert holds all rows": [0, 0, 11, 0],
    "one expert, E = 1": [6],
    "k = E (every token on every expert)": [9] * 5,
}


@pytest.mark.parametrize("case", list(COUNTS))
@pytest.mark.parametrize("transposed", [True, False])
def test_padded_equals_loop_equals_float64(case, transposed, force):
    counts = COUNTS[case]
    if counts is None:
        counts = torch.randint(0, 9, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    x, w, offsets = _inputs(counts, transposed=transposed)
    loop, padded = _both(x, w, offsets, force)
    assert loop.shape == padded.shape == (x.shape[0], w.shape[2]) and padded.is_contiguous()
    torch.testing.assert_close(padded, loop, **F32_TOL)
    torch.testing.assert_close(padded.double(), _ref(x, w, offsets), **F32_TOL)
    torch.testing.assert_close(XG._grouped_mm_padded(x, w, offsets), loop, **F32_TOL)  # the function itself


def test_int32_offsets_and_the_public_wrapper(force):
    x, w, offsets = _inputs([2, 0, 4])
    force("padded")
    torch.testing.assert_close(X.grouped_mm(x, w, offsets.int()), _ref(x, w, offsets).float(), **F32_TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype, force):
    """f16 / bf16 through the op (on CUDA bf16 takes ``F.grouped_mm`` where torch has it; f16 always the op)."""
    x, w, offsets = _inputs([5, 0, 8, 3], k=16, n=6, dtype=dtype)
    loop, padded = _both(x, w, offsets, force)
    assert padded.dtype == loop.dtype == dtype
    torch.testing.assert_close(padded, loop, **LOW_TOL[dtype])
    torch.testing.assert_close(padded.double(), _ref(x, w, offsets), **LOW_TOL[dtype])


def test_zero_rows(force):
    x, w, offsets = _inputs([0, 0, 0])
    for path in ("loop", "padded"):
        force(path)
        assert torch.ops.moe_mlir.grouped_mm(x, w, offsets).shape == (0, 5)
        gx, gw = torch.ops.moe_mlir.grouped_mm_backward(torch.zeros(0, 5), x, w, offsets)
        assert gx.shape == (0, 7) and torch.equal(gw, torch.zeros_like(w))
    assert XG._grouped_mm_padded(x, w, offsets).shape == (0, 5)


def test_offsets_must_end_at_the_row_count_on_both_paths(force):
    x, w, _ = _inputs([2, 2])
    for path in ("loop", "padded"):
        force(path)
        with pytest.raises(ValueError, match="number of rows"):
            X.grouped_mm(x, w, torch.tensor([0, 1, 3]))


def test_the_dispatch_rule(force):
    """CUDA takes the padded path while E * C <= 4 * S; skew, decode-sized S and the CPU keep the loop."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    balanced = _offsets([64] * 64).tolist()  # S = 4096, E = 64, C = 64
    assert XG._grouped_mm_path(cuda, balanced) == "padded"
    assert XG._grouped_mm_path(cpu, balanced) == "loop"  # measured slower on this project's CPU
    # random top-8 routing at the H100 benchmark's prefill (512 tokens): C = 82 here, E*C = 1.3 S
    idx = torch.stack([torch.randperm(64, generator=torch.Generator().manual_seed(t))[:8] for t in range(512)])
    assert XG._grouped_mm_path(cuda, _offsets(torch.bincount(idx.reshape(-1), minlength=64).tolist()).tolist()) \
        == "padded"
    # the bound itself: C = 4 S / E is in, one more row is out
    assert XG._grouped_mm_path(cuda, _offsets([16] + [0] * 3).tolist()) == "padded"  # E*C = 64 = 4*16
    assert XG._grouped_mm_path(cuda, _offsets([13, 0, 0, 0, 0]).tolist()) == "loop"  # 5*13 = 65 > 52
    # one expert holding all rows: E*C = E*S
    assert XG._grouped_mm_path(cuda, _offsets([0] * 10 + [4096] + [0] * 53).tolist()) == "loop"
    # decode: S = 8 rows over 64 experts would read all 64 experts' weights for 8 rows
    assert XG._grouped_mm_path(cuda, _offsets([1] * 8 + [0] * 56).tolist()) == "loop"
    # offsets the padded layout cannot express keep the loop even when forced
    force("padded")
    assert XG._grouped_mm_path(cpu, [1, 3, 4]) == "loop"
    assert XG._grouped_mm_path(cpu, [0, 3, 2]) == "loop"
    assert XG._grouped_mm_path(cpu, [0, 3, 4]) == "padded"


def test_the_op_takes_the_path_the_rule_picks(force, monkeypatch):
    """The op calls the padded function exactly when the rule says so (CUDA simulated by patching the rule)."""
    calls = []
    real = XG._grouped_mm_padded
    monkeypatch.setattr(XG, "_grouped_mm_padded", lambda *a: calls.append(1) or real(*a))
    cuda_rule = XG._grouped_mm_path
    monkeypatch.setattr(XG, "_grouped_mm_path", lambda device, o: cuda_rule(torch.device("cuda"), o))
    x, w, offsets = _inputs([3, 4, 2, 3])
    torch.ops.moe_mlir.grouped_mm(x, w, offsets)
    assert calls == [1]
    x, w, offsets = _inputs([0, 12, 0, 0, 0])  # skewed, E*C = 60 > 4*12: the loop
    torch.ops.moe_mlir.grouped_mm(x, w, offsets)
    assert calls == [1]


@pytest.mark.parametrize("counts", [[3, 0, 5, 2], [0, 7, 0], [4, 4, 4]])
def test_padded_backward_equals_loop_and_float64(counts, force):
    x, w, offsets = _inputs(counts, k=6, n=4, seed=3)
    grad = torch.randn(x.shape[0], 4, generator=torch.Generator().manual_seed(4))
    force("loop")
    gx_loop, gw_loop = torch.ops.moe_mlir.grouped_mm_backward(grad, x, w, offsets)
    force("padded")
    gx, gw = torch.ops.moe_mlir.grouped_mm_backward(grad, x, w, offsets)
    # the layouts the fake implementation promises (empty_like): w is a transposed view
    assert gx.stride() == x.stride() and gw.stride() == w.stride()
    torch.testing.assert_close(gx, gx_loop, **F32_TOL)
    torch.testing.assert_close(gw, gw_loop, **F32_TOL)
    want_x, want_w = _ref_backward(grad, x, w, offsets)
    torch.testing.assert_close(gx.double(), want_x, **F32_TOL)
    torch.testing.assert_close(gw.double(), want_w, **F32_TOL)
    for e, c in enumerate(counts):
        if c == 0:
            assert torch.equal(gw[e], torch.zeros_like(gw[e]))  # exactly zero, as the loop's


def test_gradcheck_and_opcheck_through_the_padded_path(force, monkeypatch):
    calls = []
    real = XG._grouped_mm_padded_backward
    monkeypatch.setattr(XG, "_grouped_mm_padded_backward", lambda *a: calls.append(1) or real(*a))
    force("padded")
    x, w, offsets = _inputs([3, 0, 4, 1], k=5, n=3, dtype=torch.float64, seed=5)
    x.requires_grad_(True)
    w.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: X.grouped_mm(a, b, offsets), (x, w))
    assert calls  # the backward did run the padded path
    torch.library.opcheck(torch.ops.moe_mlir.grouped_mm.default, (x, w, offsets))
    torch.library.opcheck(torch.ops.moe_mlir.grouped_mm_backward.default,
                          (torch.randn(8, 3, dtype=torch.float64), x.detach(), w.detach(), offsets))


def test_a_compiled_block_through_grouped_mm_equals_eager_on_both_paths(force, monkeypatch):
    """A Mixtral block with a GELU gate (not one of the fused loop's gates: on CPU it reaches grouped_mm, like
    Nemotron-H's ungated experts and post-norm experts; on CUDA every model does) compiled with backend="moe",
    each path forced: output and gradients equal HF's eager loop."""
    from transformers import MixtralConfig
    from transformers.models.mixtral import modeling_mixtral as mixtral

    from moe_mlir.backends.dynamo import capture_graphs

    calls = []
    real = XG._grouped_mm_padded
    monkeypatch.setattr(XG, "_grouped_mm_padded", lambda *a: calls.append(1) or real(*a))
    cfg = MixtralConfig(hidden_size=32, num_experts_per_tok=2, intermediate_size=16, num_local_experts=8,
                        hidden_act="gelu")
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 9, 32, generator=g)

    def block():
        m = mixtral.MixtralSparseMoeBlock(cfg)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(7)) * 0.3)
        return m

    def first(out):  # the block returns (hidden, router logits) or hidden alone, by transformers version
        return out[0] if isinstance(out, tuple) else out

    ref = block()
    first(ref(x)).square().sum().backward()
    for path in ("loop", "padded"):
        force(path)
        calls.clear()
        torch._dynamo.reset()
        m = block()
        assert XH._known_gate(X.hf_experts_modules(m)[0]) is None
        with capture_graphs() as log, X.use_moe_experts(m):
            out = first(torch.compile(m, backend="moe")(x))
        out.square().sum().backward()
        assert len(log) == 1 and "moe_mlir.grouped_mm" in log[0].graph_module.code
        assert bool(calls) == (path == "padded")
        torch.testing.assert_close(out, first(ref(x)), atol=1e-5, rtol=1e-5)
        for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=lambda s: f"{path} {n}: {s}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_cuda_takes_the_padded_path_and_equals_the_loop(dtype, force, monkeypatch):
    calls = []
    real = XG._grouped_mm_padded
    monkeypatch.setattr(XG, "_grouped_mm_padded", lambda *a: calls.append(1) or real(*a))
    counts = torch.bincount(torch.randint(0, 16, (512,), generator=torch.Generator().manual_seed(8)),
                            minlength=16).tolist()
    x, w, offsets = (t.cuda() for t in _inputs(counts, k=64, n=32, dtype=dtype))
    padded = X.grouped_mm(x, w, offsets)
    assert calls == [1]
    force("loop")
    loop = X.grouped_mm(x, w, offsets)
    tol = F32_TOL if dtype == torch.float32 else LOW_TOL[dtype]
    # cuBLAS may use TF32 for f32 only when allowed (off by default for matmul)
    torch.testing.assert_close(padded, loop, **tol)
    torch.testing.assert_close(padded.double().cpu(), _ref(x.cpu(), w.cpu(), offsets.cpu()), **tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tail", [0, 5])
def test_cuda_grouped_mm_ends_takes_the_padded_path_and_equals_transformers(tail, monkeypatch):
    """moe_mlir::grouped_mm_ends called directly on CUDA tensors (backend "moe" does not raise transformers'
    fallback there) at a prefill size takes the padded batched GEMM and equals transformers' op forward and
    backward, rows past the last end (expert-parallel sentinels) included; nn.Linear-layout weights."""
    pytest.importorskip("transformers.integrations.moe")
    calls = []
    real = XG._grouped_mm_padded
    monkeypatch.setattr(XG, "_grouped_mm_padded", lambda *a: calls.append(1) or real(*a))
    g = torch.Generator().manual_seed(9)
    counts = torch.bincount(torch.randint(0, 16, (512,), generator=g), minlength=16)
    offs, S = counts.cumsum(0).to(torch.int32).cuda(), 512 + tail
    x = torch.randn(S, 64, generator=g).cuda().requires_grad_(True)
    w = torch.randn(16, 32, 64, generator=g).cuda().requires_grad_(True)  # [E, N, K]
    grad = torch.randn(S, 32, generator=g).cuda()
    out = torch.ops.moe_mlir.grouped_mm_ends(x, w, offs, True)
    assert calls == [1]
    out.backward(grad)
    xr, wr = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    want = torch.ops.transformers.grouped_mm_fallback(xr, wr.transpose(1, 2), offs)
    want.backward(grad)
    torch.testing.assert_close(out, want, **F32_TOL)
    torch.testing.assert_close(x.grad, xr.grad, **F32_TOL)
    torch.testing.assert_close(w.grad, wr.grad, atol=1e-4, rtol=1e-5)
    assert torch.equal(out[512:], torch.zeros_like(out[512:]))


# ----------------------------------------------------------------------------------------------------------------
# The extension's kernel (lib/Runtime/Torch/ExpertOps.cpp: grouped_mm_cpu, grouped_mm_backward_cpu)
# ----------------------------------------------------------------------------------------------------------------

NATIVE = pytest.mark.skipif(not XC._native_mlp(torch.zeros(1)), reason="the torch extension is not built")


@NATIVE
@pytest.mark.parametrize("case", [c for c in COUNTS if COUNTS[c] is not None])
@pytest.mark.parametrize("transposed", [True, False])
def test_native_loop_equals_the_python_loop(case, transposed, force, monkeypatch):
    """The CPU loop of moe_mlir::grouped_mm on the extension's kernel (f32: experts over torch's threads, BLAS on
    the weight slices) equals the op's Python loop: output, grad_x and grad_w (in w's strides, as the fake says)."""
    force("loop")
    x, w, offsets = _inputs(COUNTS[case], transposed=transposed)
    runs = []
    for native in (True, False):
        monkeypatch.setattr(XC, "NATIVE_MLP", native)
        xr, wr = x.clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
        out = X.grouped_mm(xr, wr, offsets)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        runs.append((out.detach(), xr.grad, wr.grad))
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, **F32_TOL)
    assert runs[0][2].stride() == w.stride()


def _ends(counts, extra_rows=0, dtype=torch.int32):
    return torch.tensor(counts, dtype=torch.long).cumsum(0).to(dtype), sum(counts) + extra_rows


ENDS = {
    "empty experts": ([3, 0, 5, 0, 0, 2, 0], 0),
    "rows past the last end (expert-parallel sentinels)": ([2, 0, 3], 4),
    "every row past the ends": ([0, 0, 0], 5),
    "no rows": ([0, 0], 0),
    "one expert holds all rows": ([0, 12, 0, 0], 0),
}


@NATIVE
@pytest.mark.parametrize("case", list(ENDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_grouped_mm_ends_equals_transformers_fallback(case, dtype):
    """moe_mlir::grouped_mm_ends (what the moe backend puts in place of transformers::grouped_mm_fallback) equals
    transformers' op, forward and backward, on its adversarial offsets: experts without rows, rows past the last
    end (zeros out, zero gradients), no rows at all; nn.Linear-layout weights viewed transposed; int32 and int64
    ends."""
    pytest.importorskip("transformers.integrations.moe")
    counts, extra = ENDS[case]
    g = torch.Generator().manual_seed(len(counts) + extra)
    for offs_dtype in (torch.int32, torch.int64):
        offs, S = _ends(counts, extra, offs_dtype)
        x = torch.randn(S, 6, generator=g, dtype=dtype)
        w = torch.randn(len(counts), 5, 6, generator=g, dtype=dtype).transpose(1, 2)  # [E, K=6, N=5]
        grad = torch.randn(S, 5, generator=g, dtype=dtype)
        got = torch.ops.moe_mlir.grouped_mm_ends(x, w, offs)
        want = torch.ops.transformers.grouped_mm_fallback(x, w, offs)
        torch.testing.assert_close(got, want, **F32_TOL)
        assert torch.equal(got[int(offs[-1]):], torch.zeros_like(got[int(offs[-1]):]))
        gx, gw = torch.ops.moe_mlir.grouped_mm_ends_backward(grad, x, w, offs)
        hx, hw = torch.ops.transformers.grouped_mm_fallback_backward(x, w, offs, grad)
        torch.testing.assert_close(gx, hx, **F32_TOL)
        torch.testing.assert_close(gw, hw, **F32_TOL)
    xd = x.double().requires_grad_(True)
    wd = w.detach().double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.moe_mlir.grouped_mm_ends(a, b, offs), (xd, wd))
    torch.library.opcheck(torch.ops.moe_mlir.grouped_mm_ends.default, (x, w, offs))


@NATIVE
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("transposed", [True, False])
def test_grouped_mm_ends_other_dtypes_equal_transformers_fallback(dtype, transposed):
    """On the CPU the op's kernels are C++ (GroupedMmEnds.cpp) for every dtype: dtypes other than f32/f64 take its
    per-expert at::mm loop, which equals transformers' op (forward, backward op, autograd) on empty experts and rows
    past the last end; with ``transposed`` the weight gradient comes in the weight's own layout."""
    pytest.importorskip("transformers.integrations.moe")
    offs, S = _ends([3, 0, 4, 0, 1], 2)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(S, 6, generator=g).to(dtype)
    w_own = torch.randn(5, 4, 6, generator=g).to(dtype) if transposed else torch.randn(5, 6, 4, generator=g).to(dtype)
    w_kn = w_own.transpose(1, 2) if transposed else w_own
    grad = torch.randn(S, 4, generator=g).to(dtype)
    got = torch.ops.moe_mlir.grouped_mm_ends(x, w_own, offs, transposed)
    want = torch.ops.transformers.grouped_mm_fallback(x, w_kn, offs)
    assert got.dtype == dtype and torch.equal(got, want)
    gx, gw = torch.ops.moe_mlir.grouped_mm_ends_backward(grad, x, w_own, offs, transposed)
    hx, hw = torch.ops.transformers.grouped_mm_fallback_backward(x, w_kn, offs, grad)
    assert torch.equal(gx, hx)
    assert gw.shape == w_own.shape and gw.is_contiguous()
    assert torch.equal(gw, hw.transpose(1, 2) if transposed else hw)
    xr, wr = x.clone().requires_grad_(True), w_own.clone().requires_grad_(True)
    torch.ops.moe_mlir.grouped_mm_ends(xr, wr, offs, transposed).backward(grad)
    assert torch.equal(xr.grad, gx) and torch.equal(wr.grad, gw)
    with pytest.raises(ValueError, match="must not decrease"):
        torch.ops.moe_mlir.grouped_mm_ends(x, w_own, torch.tensor([3, 2, 4, 6, 8]), transposed)


@NATIVE
def test_grouped_mm_ends_runs_no_python_on_the_cpu(monkeypatch):
    """A decode step calls the op twice per MoE layer: on the CPU its call reaches the kernel from the dispatcher
    (CPU and AutogradCPU kernels in C++), not through the Python custom op's wrapper and body (~13 us of a ~17 us
    call). The Python body failing shows it is not run, with and without a graph; double backward raises the C++
    autograd's clear error."""
    for key in ("CPU", "AutogradCPU"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("moe_mlir::grouped_mm_ends", key), key

    def python_body(*args, **kwargs):
        raise AssertionError("the Python body of grouped_mm_ends ran")

    monkeypatch.setattr(XG, "_native_operands", python_body)
    monkeypatch.setattr(XG, "_check_ends", python_body)
    offs, S = _ends([2, 0, 3], 1)
    x = torch.randn(S, 6, requires_grad=True)
    w = torch.randn(3, 5, 6, requires_grad=True)  # nn.Linear layout
    with torch.no_grad():
        torch.ops.moe_mlir.grouped_mm_ends(x, w, offs, True)
    out = torch.ops.moe_mlir.grouped_mm_ends(x, w, offs, True)
    gx, gw = torch.autograd.grad(out.square().sum(), (x, w), create_graph=True)
    g2 = 2 * out.detach()
    want = torch.cat([g2[0:2] @ w[0].detach(), g2[2:5] @ w[2].detach(), torch.zeros(1, 6)])
    torch.testing.assert_close(gx.detach(), want, **F32_TOL)
    with pytest.raises(RuntimeError, match=r"moe_mlir\.grouped_mm_ends: double backward is not supported"):
        gx.sum().backward()


@pytest.mark.parametrize("path", ["padded", "loop"])
@pytest.mark.parametrize("case", list(ENDS))
@pytest.mark.parametrize("transposed", [True, False])
def test_grouped_mm_ends_in_torch_equals_transformers_fallback(case, path, transposed, force):
    """grouped_mm_ends' body in torch ops (what CUDA tensors, and dtypes the kernel does not take, run) on both of
    grouped_mm's paths, the padded batched GEMM (CUDA's at prefill sizes) and the per-expert loop, equals
    transformers' op forward and backward: empty experts, rows past the last end (zeros, zero gradients), no rows;
    the gradients contiguous, grad_w in w's own layout; decreasing ends or ends past the rows raise."""
    pytest.importorskip("transformers.integrations.moe")
    force(path)
    counts, extra = ENDS[case]
    offs, S = _ends(counts, extra)
    g = torch.Generator().manual_seed(len(counts) + 3 * extra)
    E = len(counts)
    w = torch.randn((E, 5, 6) if transposed else (E, 6, 5), generator=g)  # [E, N, K] with transposed
    wk = w.transpose(1, 2) if transposed else w
    x, grad = torch.randn(S, 6, generator=g), torch.randn(S, 5, generator=g)
    got = XG._ends_in_torch(x, w, offs, transposed)
    torch.testing.assert_close(got, torch.ops.transformers.grouped_mm_fallback(x, wk, offs), **F32_TOL)
    assert torch.equal(got[int(offs[-1]):], torch.zeros_like(got[int(offs[-1]):]))
    gx, gw = XG._ends_in_torch_backward(grad, x, w, offs, transposed)
    hx, hw = torch.ops.transformers.grouped_mm_fallback_backward(x, wk, offs, grad)
    torch.testing.assert_close(gx, hx, **F32_TOL)
    torch.testing.assert_close(gw, hw.transpose(1, 2) if transposed else hw, **F32_TOL)
    assert gx.is_contiguous() and gw.is_contiguous() and gw.shape == w.shape
    past, falling = offs.clone(), offs.clone()
    past[0], falling[-1] = S + 1, -1
    for bad in (past, falling):
        with pytest.raises(ValueError, match="must not decrease and stay within"):
            XG._ends_in_torch(x, w, bad, transposed)


def test_cuda_grouped_mm_is_not_raised():
    """On CUDA tensors (fake ones: no GPU needed) transformers' grouped GEMM fallback stays transformers' (only
    f32/f64 CPU tensors become moe_mlir::grouped_mm_ends)."""
    pytest.importorskip("transformers.integrations.moe")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from moe_mlir.frontend.raising import raise_routing_idioms

    with FakeTensorMode():
        x = torch.empty(6, 4, device="cuda")
        w = torch.empty(3, 5, 4, device="cuda")  # nn.Linear layout [E, N, K]
        offs = torch.empty(3, dtype=torch.int32, device="cuda")
        gm = make_fx(lambda x, w, o: torch.ops.transformers.grouped_mm_fallback(x, w.transpose(1, 2), o),
                     tracing_mode="fake")(x, w, offs)
    counts = raise_routing_idioms(gm)
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "grouped_mm" in str(n.target)]
    assert counts["experts_gemm"] == 0 and len(calls) == 1
    assert calls[0].target is torch.ops.transformers.grouped_mm_fallback.default


@NATIVE
def test_grouped_mm_kernel_rejects_bad_offsets():
    """The kernel's own checks (the op is reachable directly): decreasing ends, ends past the rows, a first
    boundary other than 0, the wrong length or dtype: a clear error, nothing read out of bounds."""
    x, w = torch.randn(6, 4), torch.randn(3, 4, 2)
    op = torch.ops.moe_mlir.grouped_mm_cpu
    with pytest.raises(ValueError, match="must not decrease"):
        op(x, w, torch.tensor([3, 2, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="within the 6 rows"):
        op(x, w, torch.tensor([3, 4, 7]))
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0"):
        op(x, w, torch.tensor([1, 3, 4, 6]))
    with pytest.raises(ValueError, match=r"\[E\] \(ends\) or \[E\+1\]"):
        op(x, w, torch.tensor([3, 6]))
    with pytest.raises(TypeError, match="offsets must be int32 or int64"):
        op(x, w, torch.tensor([3.0, 4.0, 6.0]))
    with pytest.raises(TypeError, match="float32 or float64"):
        op(x.half(), w.half(), torch.tensor([3, 4, 6]))
    with pytest.raises(TypeError, match="offs \\(the ends\\) must be int32 or int64"):
        torch.ops.moe_mlir.grouped_mm_ends(x, w, torch.tensor([3.0, 4.0, 6.0]))


def _poison(*shapes):
    """Allocates NaN tensors of these shapes and frees them: the kernels allocate their weight gradients
    uninitialised (only experts without rows are zeroed), and the allocator hands such freed memory out again (sizes
    below malloc's mmap threshold, so not fresh zero pages)."""
    for t in [torch.full(s, float("nan")) for s in shapes]:
        del t


@NATIVE
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["contiguous", "like w", "transposed"])
def test_idle_experts_weight_gradients_are_zeros_in_reused_memory(layout, threads):
    """grouped_mm_backward_cpu writes grad_w[e] by GEMM (beta = 0) for the experts with rows and zeros the others'
    slices: on memory that held NaN, an expert without rows gets exact zeros and the busy ones equal the float64
    reference, with one thread and with the experts dealt over two (a call big enough for a team)."""
    counts = [0, 40, 0, 0, 25, 0, 0, 30]
    x, w, offsets = _inputs(counts, k=64, n=48, transposed=layout != "contiguous", seed=3)
    g = torch.Generator().manual_seed(4)
    grad = torch.randn(x.shape[0], 48, generator=g)
    _, want = _ref_backward(grad, x, w, offsets)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(3):
            _poison(w.shape, x.shape)
            if layout == "transposed":  # w given as stored, [E, N, K]; its gradient in that layout
                _, gw = torch.ops.moe_mlir.grouped_mm_backward_cpu(grad, x, w.transpose(1, 2), offsets, False,
                                                                   True)
                gw = gw.transpose(1, 2)
            else:
                _, gw = torch.ops.moe_mlir.grouped_mm_backward_cpu(grad, x, w, offsets, layout == "like w")
            assert not gw.isnan().any()
            for e, c in enumerate(counts):
                if c == 0:
                    assert torch.equal(gw[e], torch.zeros_like(gw[e]))
            torch.testing.assert_close(gw.double(), want, atol=1e-4, rtol=1e-5)
    finally:
        torch.set_num_threads(old)


@NATIVE
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("layout", ["contiguous", "like w", "transposed"])
@pytest.mark.parametrize("counts", [[71, 92, 70, 72, 215, 58, 295, 151], [0, 600, 3, 0, 0, 1], [0, 0, 0, 1],
                                    [1] + [0] * 15],
                         ids=["mixtral-skew", "one-hot", "one-row", "idle-cut"])
def test_experts_cut_between_threads_equal_the_reference(counts, layout, threads):
    """The grouped GEMM deals each expert's output columns (the backward: grad_x's columns, which are grad_w[e]'s
    rows) over the threads in shares of equal cost, cutting an expert between two threads where routing is
    skewed (CostShares.h; MoECostSharesTest checks the cuts themselves): transformers' Mixtral's first-layer
    counts, one expert with nearly every row, one row with idle experts around it, and one row before fifteen idle
    experts (the backward's share boundary falls in an idle expert's zero rows: its slice is cut too) (K = 192,
    N = 320: wide enough to cut). Output, grad_x and grad_w (idle experts' exact zeros, on memory that held NaN)
    equal the float64 reference in every layout, and the values do not depend on the thread count beyond rounding."""
    k, n = 192, 320
    x, w, offsets = _inputs(counts, k=k, n=n, transposed=layout != "contiguous", seed=21)
    grad = torch.randn(x.shape[0], n, generator=torch.Generator().manual_seed(22))
    want_y = _ref(x, w, offsets)
    want_gx, want_gw = _ref_backward(grad, x, w, offsets)
    old = torch.get_num_threads()
    got = []
    try:
        for t in (1, threads):
            torch.set_num_threads(t)
            _poison(w.shape, x.shape, grad.shape)
            if layout == "transposed":  # w given as stored, [E, N, K]; its gradient in that layout
                y = torch.ops.moe_mlir.grouped_mm_cpu(x, w.transpose(1, 2), offsets, True)
                gx, gw = torch.ops.moe_mlir.grouped_mm_backward_cpu(grad, x, w.transpose(1, 2), offsets, False, True)
                gw = gw.transpose(1, 2)
            else:
                y = torch.ops.moe_mlir.grouped_mm_cpu(x, w, offsets)
                gx, gw = torch.ops.moe_mlir.grouped_mm_backward_cpu(grad, x, w, offsets, layout == "like w")
            torch.testing.assert_close(y.double(), want_y, atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(gx.double(), want_gx, atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(gw.double(), want_gw, atol=1e-3, rtol=1e-5)
            for e, c in enumerate(counts):
                if c == 0:
                    assert torch.equal(gw[e], torch.zeros_like(gw[e]))
            got.append((y, gx, gw))
    finally:
        torch.set_num_threads(old)
    for a, b in zip(*got):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@NATIVE
def test_the_backend_runs_transformers_grouped_experts_on_the_kernel():
    """HF's default experts implementation ("grouped_mm") under torch.compile calls transformers'
    grouped_mm_fallback for f32 weights: backend "moe" raises each call to moe_mlir::grouped_mm_ends (counted as
    experts_gemm), with nothing asked of the user; output and every gradient equal eager's, and the parameters'
    gradients are contiguous (the parameters' own layout)."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3

    from moe_mlir.backends.dynamo import capture_graphs

    cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                         norm_topk_prob=True)
    cfg._experts_implementation = "grouped_mm"

    def block():
        m = qwen3.Qwen3MoeSparseMoeBlock(cfg)
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():  # HF leaves the experts' weights uninitialized (torch.empty) until post_init
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        return m

    def first(out):
        return out[0] if isinstance(out, tuple) else out

    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(4))
    ref = block()
    first(ref(x)).square().sum().backward()
    torch._dynamo.reset()
    m = block()
    with capture_graphs() as log:
        out = first(torch.compile(m, backend="moe")(x))
    out.square().sum().backward()
    assert sum(g.counts.get("experts_gemm", 0) for g in log) == 2  # the up and the down projection
    calls = [line for g in log for line in g.graph_module.code.splitlines() if "moe_mlir.grouped_mm_ends" in line]
    # HF's nn.Linear-layout weights enter as the parameters themselves (transposed=True): their gradients come in
    # the parameters' layout, no transposing copy in autograd's accumulation
    assert len(calls) == 2 and all(line.rstrip().split(";")[0].endswith("True)") for line in calls)
    # the experts' combine (weighted_out[inv_perm].view(T, k, H).sum(1)) unrolled into k adds (raising's
    # unroll_gathered_sum): no sum over the gathered view is left
    assert not any("aten.sum.dim_IntList" in g.graph_module.code for g in log)
    torch.testing.assert_close(out, first(ref(x)), atol=1e-5, rtol=1e-5)
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=lambda s: f"{n}: {s}")
        assert p.grad.is_contiguous(), n


def _combine_graph(k: int, dtype=torch.float32, device="cpu", gather=True, keepdim=False, dim=1):
    """make_fx graph of transformers' experts combine: ``(y * w[:, None])[inv].view(T, k, H).sum(dim)``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    T, H = 5, 24

    def combine(y, w, inv):
        z = y * w.unsqueeze(-1)
        z = z[inv] if gather else z
        return z.view(T, k, H).sum(dim=dim, keepdim=keepdim)

    args = (torch.randn(T * k, H).to(dtype), torch.rand(T * k).to(dtype), torch.randperm(T * k))
    if device == "cpu":
        return make_fx(combine)(*args), args, combine
    with FakeTensorMode():
        fakes = [torch.empty(a.shape, dtype=a.dtype, device=device) for a in args]
        return make_fx(combine, tracing_mode="fake")(*fakes), None, combine


def _sums(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is torch.ops.aten.sum.dim_IntList)


@pytest.mark.parametrize("k,dtype", [(2, torch.float32), (8, torch.float32), (16, torch.float64),
                                     (8, torch.bfloat16), (4, torch.float16)])
def test_experts_combine_is_unrolled_with_the_same_result(k, dtype):
    """The gathered view's sum over its small middle dim becomes k adds in order (f16/bf16: in f32, rounded once,
    as the sum accumulates): the sum's values up to rounding (ATen may add in another order), the same inf, -inf
    and NaN entries."""
    from moe_mlir.frontend.hf_rewrites import unroll_gathered_sum
    from moe_mlir.frontend.raising import _rewrite_each

    gm, args, combine = _combine_graph(k, dtype)
    y = args[0].clone()
    y[0, 0], y[1, 1], y[2, 2] = float("inf"), float("-inf"), float("nan")
    args = (y,) + args[1:]
    want = combine(*args)
    assert _rewrite_each(gm.graph, unroll_gathered_sum) == 1 and _sums(gm) == 0
    gm.recompile()
    got = gm(*args)
    assert got.dtype == want.dtype and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got[got.isinf()], want[want.isinf()])
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("case", ["no gather", "k = 17", "keepdim", "last dim", "CUDA"])
def test_experts_combine_unrolls_only_its_own_pattern(case):
    """A sum of a view that is not a gather, over a size above 16, with keepdim, over another dim, or on CUDA
    tensors (not measured there) is left to inductor."""
    from moe_mlir.frontend.hf_rewrites import unroll_gathered_sum
    from moe_mlir.frontend.raising import _rewrite_each

    kw = {"no gather": dict(gather=False), "k = 17": dict(k=17), "keepdim": dict(keepdim=True),
          "last dim": dict(dim=2), "CUDA": dict(device="cuda")}[case]
    gm, _, _ = _combine_graph(**{"k": 8, **kw})
    assert _rewrite_each(gm.graph, unroll_gathered_sum) == 0 and _sums(gm) == 1


@NATIVE
def test_the_kernels_parallel_loops_run_on_torchs_threads():
    """ExpertOps.cpp's at::parallel_for (the experts dealt over the threads) is ATen's inline OpenMP loop: built
    without OpenMP it ran every loop on the caller, so the grouped GEMMs went expert after expert, each BLAS call
    opening its own team (issue 51). The file's loops now run on torch's threads: as many as torch has."""
    old = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.ops.moe_mlir.expert_ops_team_size() == n
    finally:
        torch.set_num_threads(old)


@NATIVE
@pytest.mark.parametrize("rows", [8, 512])
def test_grouped_mm_kernel_equals_the_reference_with_experts_dealt_over_threads(rows):
    """Forward and backward of the extension's grouped GEMM at a decode size (8 experts of one row: run on the
    caller) and a prefill size (the experts dealt over a team), with 1 and 2 threads: the float64 reference, and
    the same values whichever thread ran an expert."""
    counts = [1] * 8 + [0] * 56 if rows == 8 else [8] * 64
    x, w, offsets = _inputs(counts, k=96, n=80, transposed=True, seed=11)
    grad = torch.randn(x.shape[0], 80, generator=torch.Generator().manual_seed(12))
    want = _ref(x, w, offsets)
    old = torch.get_num_threads()
    got = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            y = torch.ops.moe_mlir.grouped_mm_cpu(x, w.transpose(1, 2), offsets, True)
            gx, gw = torch.ops.moe_mlir.grouped_mm_backward_cpu(grad, x, w.transpose(1, 2), offsets, False, True)
            torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=1e-5)
            got.append((y, gx, gw))
    finally:
        torch.set_num_threads(old)
    for a, b in zip(*got):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
