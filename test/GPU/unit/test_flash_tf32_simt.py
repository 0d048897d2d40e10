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
import test_flash_mix_wide_simt as W  # noqa: E402

OPTIONS = "flash-mma-tf32=true"
TOL = dict(rtol=2e-5, atol=2e-6)



def run(text, kernel, args, N, B, misalign=None):
    mem = simt.Memory()
    for a in args:
        mem.add(a, None, misalign_bytes=4 if a is misalign else 0)
    wg = W.workgroup(text, kernel)
    assert len(wg) == 4, f"{kernel} is not the 3xTF32 kernel (keys and values, big and small): {wg}"
    simt.run_kernel(simt.parse(text, kernel), args, 128, (-(-N // 64), B), mem, workgroup=wg, lockstep=True,
                    workgroup_fill=np.nan)


#: The wide form's cases (partial tiles, padded and misaligned features, K = 1, 12, 20, causal, masks, N = 1) and
#: K = 64 at D = 64 (32-key tiles), a causal row alone.
CASES = {**W.CASES, "d64_k64": (1, 130, 64, 64, False, False, False), "n1_causal": (2, 1, 16, 8, True, False, False)}


@pytest.mark.parametrize("name", list(CASES))
def test_tf32_kernel_equals_float64(name):
    B, N, D, K, causal, masked, misaligned, u, e, mask = W.case(name, 11, CASES)
    text = W.similarity(B, N, D, K, causal=causal, masked=masked, options=OPTIONS)
    p = np.full((B, N, K), np.nan, np.float32)
    args = [u, u, e] + ([mask] if masked else []) + [p]
    run(text, "similarity_inform_tf32_0", args, N, B, misalign=u if misaligned else None)
    ref = W.reference(u, np.nan_to_num(e, nan=0.0), 0.5, causal, mask)
    np.testing.assert_allclose(p, ref, **TOL)
    if masked:
        assert (p[-1] == 0).all()


def test_training_forward_lse():
    B, N, D, K, tau = 2, 75, 32, 16, 0.7
    u, e = W.inputs(13, B, N, D, K)
    text = W.similarity(B, N, D, K, tau=tau, causal=True, training=True, options=OPTIONS)
    p = np.full((B, N, K), np.nan, np.float32)
    lse = np.full((B, N), np.nan, np.float32)
    run(text, "similarity_inform_fwd_tf32_0", [u, u, e, p, lse], N, B)
    W.check_causal_p_and_lse(p, lse, u, e, tau)


def test_dynamic_shapes_and_ws():
    B, N, D, K = 1, 45, 16, 16
    u, e = W.inputs(14, B, N, D, K)
    text = W.similarity(B, N, D, K, causal=True, dynamic=True, options=OPTIONS)
    p = np.full((B, N, K), np.nan, np.float32)
    run(text, "similarity_inform_tf32_0", [u, u, e, p], N, B)
    np.testing.assert_allclose(p, W.reference(u, e, 0.5, True), **TOL)
    # ws: q = u . ws (f32) first, then the kernel on q and u.
    ws = (np.random.default_rng(15).standard_normal((D, D)) * 0.3).astype(np.float32)
    text = W.similarity(B, N, D, K, ws=True, options=OPTIONS)
    q = np.full((B, N, D), np.nan, np.float32)
    p = np.full((B, N, K), np.nan, np.float32)
    mem = simt.Memory()
    for a in (u, ws, q, e, p):
        mem.add(a, None)
    simt.run_kernel(simt.parse(text, "similarity_project_0"), [u, ws, q], 128, (1, B * N), mem)
    simt.run_kernel(simt.parse(text, "similarity_inform_tf32_0"), [q, u, e, p], 128, (1, B), mem,
                    workgroup=W.workgroup(text, "similarity_inform_tf32_0"), lockstep=True)
    np.testing.assert_allclose(p, W.reference(u, e, 0.5, ws=ws), **TOL)


def test_applies_only_where_it_should():
    """Not without the option, not for the fused top-k, not past 64 features."""
    assert '"nvvm.mma.sync"' not in W.similarity(1, 40, 32, 16, options="")
    assert '"nvvm.mma.sync"' not in W.similarity(1, 40, 32, 16, k=2, options=OPTIONS)
    text = W.similarity(1, 40, 72, 16, options=OPTIONS)
    assert "similarity_inform_tf32" not in text and "similarity_inform_0" in text


def test_backward_recomputes_the_forward_on_it():
    """similarity_inform_grad without saved p and lse recomputes them (its forward with the lse) on this kernel
    under the option: that kernel alone, its p and lse against float64."""
    B, N, D, K, tau = 2, 70, 32, 16, 0.5
    u, e = W.inputs(16, B, N, D, K)
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
    W.check_causal_p_and_lse(p, lse, u, e, tau)
