"""attention_posterior's head-means kernel (AttentionPosterior.cpp, `attention_head_means`) as moe-opt emits it, run
without a GPU by simt.py: m[b, j, :] = head_scale · v[b, h*, j, :] · wo[:, h*·Dh:(h*+1)·Dh]^T and bias[b, j] =
-‖m_j‖² / (2 sigma²), against float64. A block takes 16 keys and stages wo's slice transposed through shared memory,
32 of the head's columns and 128 features a step: the cases put a partial step in every dimension (Nk, Dh and D
not multiples of 16, 32 and 128), a head other than 0, and the means in f32 (the scalar mixing's keys) and in f16 /
bf16 (the tensor-core kernel's, each f32 mean rounded once). The shared buffers start as NaN in every block, so
a column, key or feature the kernel does not stage (or zero) shows. Needs moe-opt ($MOE_OPT, else build/bin/moe-opt):
skipped without it.
"""
import os
import re
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import simt  # noqa: E402

MOE_OPT = simt.find_moe_opt() or pytest.skip("no moe-opt ($MOE_OPT, build/bin)", allow_module_level=True)

KERNEL = "attention_head_means_0"
WORKGROUP = re.compile(r"memref<([\dx]+)xf32, #gpu.address_space<workgroup>>")


def lower(B, H, N, Nk, D, Dh, K, sigma, dtype, head_scale=None, dynamic=False):
    """The lowered module of one attention_posterior (u and e in `dtype`; f16/bf16 take the tensor-core mixing,
    whose means are in that type)."""
    n, nk = ("?", "?") if dynamic else (N, Nk)
    ts = [f"tensor<{B}x{H}x{n}x{nk}xf32>", f"tensor<{B}x{n}x{D}x{dtype}>", f"tensor<{B}x{H}x{nk}x{Dh}xf32>",
          f"tensor<{D}x{H * Dh}xf32>", f"tensor<{B}x{nk}x{K}x{dtype}>"]
    res = f"tensor<{B}x{n}x{K}xf32>, tensor<{B}xi32>"
    hs = f" head_scale({head_scale:e})" if head_scale is not None else ""
    text = (f"func.func @f(%s: {ts[0]}, %u: {ts[1]}, %v: {ts[2]}, %wo: {ts[3]}, %e: {ts[4]}) -> ({res}) {{\n"
            f"  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma({sigma:e}){hs} : {', '.join(ts)} -> {res}\n"
            f"  return %p, %h : {res}\n}}\n")
    return simt.lower(MOE_OPT, text, "flash-mma-posterior=true")


def workgroup(text):
    """The kernel's workgroup buffers (all f32) as its entry block declares them."""
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if '"gpu.func"' in line and f'sym_name = "{KERNEL}"' in next(x for x in lines[n:] if 'sym_name = "' in x):
            head = next(x for x in lines[n:] if "^bb0(" in x)
            return [(tuple(int(d) for d in dims.split("x")), np.float32) for dims in WORKGROUP.findall(head)]
    raise KeyError(KERNEL)


def run(text, v, wo, head, means_dtype):
    B, H, Nk, Dh = v.shape
    D = wo.shape[0]
    store = np.uint16 if means_dtype in ("f16", "bf16") else np.float32
    means = np.full((B, Nk, D), 0x7FC0 if store is np.uint16 else np.nan, store)
    bias = np.full((B, Nk), np.nan, np.float32)
    mem = simt.Memory()
    for a in (v, wo, head, means, bias):
        mem.add(a, None)
    with np.errstate(invalid="ignore"):  # 0 · inf in the lanes past D (never stored) of the inf case
        simt.run_kernel(simt.parse(text, KERNEL), [v, wo, head, means, bias], 128, (-(-Nk // 16), B), mem,
                        workgroup=workgroup(text), warp_threads=True, workgroup_fill=np.nan)
    if store is np.uint16:
        means = simt._bits_to_f32(means, means_dtype)
    return means.astype(np.float64), bias.astype(np.float64)


def reference(v, wo, head, scale, sigma):
    B, H, Nk, Dh = v.shape
    m = np.stack([scale * v[b, head[b]].astype(np.float64) @ wo[:, head[b] * Dh:(head[b] + 1) * Dh].T.astype(np.float64)
                  for b in range(B)])
    return m, -(m * m).sum(-1) / (2 * sigma ** 2)


CASES = [
    # B, H, Nk, D, Dh, means' type, head_scale, dynamic N/Nk
    pytest.param(2, 3, 37, 200, 40, "f32", None, False, id="f32-ragged-every-dim"),
    pytest.param(2, 3, 37, 200, 40, "f32", "inf", False, id="f32-inf-where-the-bounds-clamp-to"),
    pytest.param(2, 4, 70, 64, 16, "f16", None, False, id="f16-mma-means"),
    pytest.param(1, 2, 16, 48, 72, "bf16", 0.5, True, id="bf16-head-scale-dynamic-Nk"),
    pytest.param(3, 1, 5, 130, 33, "f32", None, True, id="f32-one-head-few-keys"),
]


@pytest.mark.parametrize("B,H,Nk,D,Dh,mdt,head_scale,dynamic", CASES)
def test_head_means_equal_float64(B, H, Nk, D, Dh, mdt, head_scale, dynamic):
    rng = np.random.default_rng(B * 1000 + Nk)
    v = (rng.standard_normal((B, H, Nk, Dh)) * 0.3).astype(np.float32)
    wo = (rng.standard_normal((D, H * Dh)) / np.sqrt(H * Dh)).astype(np.float32)
    head = np.array([(H - 1 - b) % H for b in range(B)], np.int32)   # not always head 0
    if head_scale == "inf":
        # The loads past a bound read element 0 (clamped indices): an inf there must not reach the sums (0 · inf).
        # Key 0's means are then inf (its first column), the other keys' finite; wo[0, 0] is head 0's (not chosen).
        head_scale = None
        v[:, :, 0, 0] = np.inf
        wo[0, 0] = np.inf
    sigma = 1.5
    text = lower(B, H, 9, Nk, D, Dh, 16, sigma, mdt, head_scale, dynamic)
    m, bias = run(text, v, wo, head, mdt)
    with np.errstate(invalid="ignore"):
        rm, rbias = reference(v, wo, head, float(H) if head_scale is None else head_scale, sigma)
    if mdt == "f32":
        np.testing.assert_allclose(m, rm, rtol=1e-5, atol=1e-6)
    else:  # each f32 mean rounded once to the 16-bit type: within its half ulp (plus the f32 sum's error)
        np.testing.assert_allclose(m, rm, rtol=2 ** -8 if mdt == "bf16" else 2 ** -11, atol=1e-6)
    np.testing.assert_allclose(bias, rbias, rtol=1e-5, atol=1e-6)
