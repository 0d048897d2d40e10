"""The f32 mixing kernel on tensor cores by 3xTF32 (FlashTf32.cpp, flash-mma-tf32) as moe-opt emits it, run without
a GPU by simt.py (all 128 threads of a block in lockstep; mma.sync m16n8k8 tf32 with the operands' low 13 mantissa
bits dropped, as the tensor cores read them): similarity_inform, its training forward (the lse) and ws's projected
query against float64 (run_gpu_tests' references), at f32's accuracy (rtol 2e-5: the split's three products leave
about 2^-20 of a product). The cases take the kernel's paths: partial key tiles (64 keys) and row tiles (64 rows, 16
a warp), D not a multiple of 8 (padded features) and not of 4 with a misaligned base (the element staging), K not a
multiple of 8 and K = 64, a causal mask, key masks with a fully masked batch element (zeros) and a masked key whose
values are NaN (staged as zeros), dynamic shapes. Without the option, or with the fused top-k, the kernel is not
used. Needs moe-opt ($MOE_OPT, else build/bin/moe-opt): skipped without it.
"""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import simt  # noqa: E402

torch = pytest.importorskip("torch")
MOE_OPT = simt.find_moe_opt() or pytest.skip("no moe-opt ($MOE_OPT, build/bin)", allow_module_level=True)
import run_gpu_tests as R  # noqa: E402

OPTIONS = "flash-mma-tf32=true"
TOL = dict(rtol=2e-5, atol=2e-6)


def t(*shape, elt="f32"):
    return "tensor<" + "x".join(map(str, shape)) + f"x{elt}>"


workgroup = simt.workgroup_buffers


def run(text, kernel, args, N, B, misalign=None):
    mem = simt.Memory()
    for a in args:
        mem.add(a, None, misalign_bytes=4 if a is misalign else 0)
    wg = workgroup(text, kernel)
    assert len(wg) == 4, f"{kernel} is not the 3xTF32 kernel (keys and values, big and small): {wg}"
    simt.run_kernel(simt.parse(text, kernel), args, 128, (-(-N // 64), B), mem, workgroup=wg, lockstep=True,
                    workgroup_fill=np.nan)


def similarity(B, N, D, K, tau=0.5, causal=False, masked=False, training=False, k=None, ws=False, dynamic=False,
               options=OPTIONS):
    """The op (similarity_inform, its training forward or fused top-k) lowered with `options`."""
    n = "?" if dynamic else N
    marg = f", %m: {t(B, n, elt='i1')}" if masked else ""
    attrs = (f" key_mask(%m : {t(B, n, elt='i1')})" if masked else "") + (" ws(%ws : " + t(D, D) + ")" if ws else "")
    wsarg = f", %ws: {t(D, D)}" if ws else ""
    tail = f" tau({tau:e})" + (" causal(true)" if causal else "")
    ins = f"{t(B, n, D)}, {t(B, n, K)}"
    if k is not None:
        res, outs, op = f"{t(B, n, k)}, {t(B, n, k, elt='i32')}", "%w, %i", f"similarity_inform_topk %u, %e{attrs} k({k})"
    elif training:
        res, outs, op = f"{t(B, n, K)}, {t(B, n)}", "%p, %lse", f"similarity_inform_fwd %u, %e{attrs}"
    else:
        res, outs, op = t(B, n, K), "%p", f"similarity_inform %u, %e{attrs}"
    text = (f"func.func @f(%u: {t(B, n, D)}, %e: {t(B, n, K)}{marg}{wsarg}) -> ({res}) {{\n"
            f"  {outs} = moe.{op}{tail} : {ins} -> {res}\n  return {outs} : {res}\n}}\n")
    return simt.lower(MOE_OPT, text, options)


def inputs(seed, B, N, D, K, scale=0.4):
    rng = np.random.default_rng(seed)
    u = (rng.standard_normal((B, N, D)) * scale).astype(np.float32)
    e = rng.random((B, N, K)).astype(np.float32)
    return u, (e / e.sum(-1, keepdims=True)).astype(np.float32)


def reference(u, e, tau, causal=False, mask=None, ws=None):
    return R.ref_similarity(torch.from_numpy(u), torch.from_numpy(e), tau=tau, causal=causal,
                            ws=torch.from_numpy(ws) if ws is not None else None,
                            key_mask=torch.from_numpy(mask) if mask is not None else None).numpy()


def check_causal_p_and_lse(p, lse, u, e, tau):
    """A causal training forward's p and row log-sum-exp against float64."""
    np.testing.assert_allclose(p, reference(u, e, tau, True), **TOL)
    logits = R.similarity_logits(torch.from_numpy(u).double(), tau, True, None, None)
    np.testing.assert_allclose(lse, torch.logsumexp(logits, -1).numpy(), rtol=2e-6, atol=2e-6)


#: Partial tiles, padded and misaligned features, K = 1, 12, 20 and 64 (at D = 64: 32-key tiles), causal, masks,
#: N = 1 and a causal row alone.
CASES = {
    # name: B, N, D, K, causal, masked, misaligned u
    "partial_tiles": (2, 70, 40, 12, False, False, False),
    "k64_two_chunks": (1, 90, 64, 64, False, False, False),
    "k1": (1, 33, 8, 1, False, False, False),
    "n1": (2, 1, 16, 8, False, False, False),
    "d37_elements": (2, 50, 37, 16, False, False, False),
    "misaligned_u": (1, 40, 32, 16, False, False, True),
    "causal": (2, 150, 64, 16, True, False, False),
    "masked": (3, 80, 24, 8, False, True, False),
    "causal_masked_k20": (2, 100, 48, 20, True, True, False),
    "d64_k64": (1, 130, 64, 64, False, False, False),
    "n1_causal": (2, 1, 16, 8, True, False, False),
}


def case(name, seed, cases=CASES):
    """(B, N, D, K, causal, masked, misaligned, u, e, mask) of case `name`: with a key mask, the last batch element
    without keys (its rows: zeros) and the masked keys' values NaN (they must reach no row)."""
    B, N, D, K, causal, masked, misaligned = cases[name]
    u, e = inputs(seed, B, N, D, K)
    mask = None
    if masked:
        mask = np.random.default_rng(seed + 1).random((B, N)) > 0.3
        mask[-1] = False
        e[~mask] = np.nan
    return B, N, D, K, causal, masked, misaligned, u, e, mask



@pytest.mark.parametrize("name", list(CASES))
def test_tf32_kernel_equals_float64(name):
    B, N, D, K, causal, masked, misaligned, u, e, mask = case(name, 11)
    text = similarity(B, N, D, K, causal=causal, masked=masked, options=OPTIONS)
    p = np.full((B, N, K), np.nan, np.float32)
    args = [u, u, e] + ([mask] if masked else []) + [p]
    run(text, "similarity_inform_tf32_0", args, N, B, misalign=u if misaligned else None)
    ref = reference(u, np.nan_to_num(e, nan=0.0), 0.5, causal, mask)
    np.testing.assert_allclose(p, ref, **TOL)
    if masked:
        assert (p[-1] == 0).all()


def test_training_forward_lse():
    B, N, D, K, tau = 2, 75, 32, 16, 0.7
    u, e = inputs(13, B, N, D, K)
    text = similarity(B, N, D, K, tau=tau, causal=True, training=True, options=OPTIONS)
    p = np.full((B, N, K), np.nan, np.float32)
    lse = np.full((B, N), np.nan, np.float32)
    run(text, "similarity_inform_fwd_tf32_0", [u, u, e, p, lse], N, B)
    check_causal_p_and_lse(p, lse, u, e, tau)


def test_dynamic_shapes_and_ws():
    B, N, D, K = 1, 45, 16, 16
    u, e = inputs(14, B, N, D, K)
    text = similarity(B, N, D, K, causal=True, dynamic=True, options=OPTIONS)
    p = np.full((B, N, K), np.nan, np.float32)
    run(text, "similarity_inform_tf32_0", [u, u, e, p], N, B)
    np.testing.assert_allclose(p, reference(u, e, 0.5, True), **TOL)
    # ws: q = u . ws (f32) first, then the kernel on q and u.
    ws = (np.random.default_rng(15).standard_normal((D, D)) * 0.3).astype(np.float32)
    text = similarity(B, N, D, K, ws=True, options=OPTIONS)
    q = np.full((B, N, D), np.nan, np.float32)
    p = np.full((B, N, K), np.nan, np.float32)
    mem = simt.Memory()
    for a in (u, ws, q, e, p):
        mem.add(a, None)
    simt.run_kernel(simt.parse(text, "similarity_project_0"), [u, ws, q], 128, (1, B * N), mem)
    simt.run_kernel(simt.parse(text, "similarity_inform_tf32_0"), [q, u, e, p], 128, (1, B), mem,
                    workgroup=workgroup(text, "similarity_inform_tf32_0"), lockstep=True)
    np.testing.assert_allclose(p, reference(u, e, 0.5, ws=ws), **TOL)


def test_applies_only_where_it_should():
    """Not without the option, not for the fused top-k, not past 64 features."""
    assert '"nvvm.mma.sync"' not in similarity(1, 40, 32, 16, options="")
    assert '"nvvm.mma.sync"' not in similarity(1, 40, 32, 16, k=2, options=OPTIONS)
    text = similarity(1, 40, 72, 16, options=OPTIONS)
    assert "similarity_inform_tf32" not in text and "similarity_inform_0" in text


def test_backward_recomputes_the_forward_on_it():
    """similarity_inform_grad without saved p and lse recomputes them (its forward with the lse) on this kernel
    under the option: that kernel alone, its p and lse against float64."""
    B, N, D, K, tau = 2, 70, 32, 16, 0.5
    u, e = inputs(16, B, N, D, K)
    t = lambda *s: "tensor<" + "x".join(map(str, s)) + ">"  # noqa: E731
    us, es, du = t(B, N, D, "f32"), t(B, N, K, "f32"), t(B, N, D, "f32")
    src = (f"func.func @g(%u: {us}, %e: {es}, %dp: {es}) -> ({du}, {es}) {{\n"
           f"  %du, %de = moe.similarity_inform_grad %u, %e dp(%dp : {es}) tau({tau:e}) causal(true) : {us}, {es}"
           f" -> {du}, {es}\n  return %du, %de : {du}, {es}\n}}\n")
    text = simt.lower(MOE_OPT, src, OPTIONS)
    assert "similarity_inform_grad_mix_0" not in text
    p = np.full((B, N, K), np.nan, np.float32)
    lse = np.full((B, N), np.nan, np.float32)
    run(text, "similarity_inform_grad_mix_tf32_0", [u, u, e, p, lse], N, B)
    check_causal_p_and_lse(p, lse, u, e, tau)
