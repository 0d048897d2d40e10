"""attention_posterior's kernels before the mixing (AttentionPosterior.cpp) as moe-opt emits them, run without a GPU
by simt.py against float64:

* `attention_entropy`: a warp a row, one pass over its scores with the lanes' online (max, Σ e^(s - m),
  Σ e^(s - m)(s - m)) merged by a butterfly; each block's partial sum of row entropies and count of rows with an
  unmasked key, per (b, h). Then `attention_head_select`: the head of least mean entropy (the lowest on ties, a NaN
  mean first). Cases: Nk under a warp, not a multiple of the 128 scores a step, masked rows and keys, a NaN, a
  row whose max grows step after step, scores large enough that a missed rescale overflows.
* `attention_head_means`: m[b, j, :] = head_scale · v[b, h*, j, :] · wo[:, h*·Dh:(h*+1)·Dh]^T and bias[b, j] =
  -‖m_j‖² / (2 sigma²). A block takes 8 keys and stages wo's slice transposed through shared memory, 32 of the
  head's columns and 128 features a step: the cases put a partial step in every dimension (Nk, Dh and D not
  multiples of 8, 32 and 128), a head other than 0, and the means in f32 (the scalar mixing's keys) and in f16 /
  bf16 (the tensor-core kernel's, each f32 mean rounded once). The shared buffers start as NaN in every block, so
  a column, key or feature the kernel does not stage (or zero) shows.

Needs moe-opt ($MOE_OPT, else build/bin/moe-opt): skipped without it.
"""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import simt  # noqa: E402

MOE_OPT = simt.find_moe_opt() or pytest.skip("no moe-opt ($MOE_OPT, build/bin)", allow_module_level=True)

KERNEL = "attention_head_means_0"
ROWS_PER_BLOCK = 16   # the entropy kernel's rows a block (4 warps x 4 rows)


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
    return simt.lower(MOE_OPT, text)


def workgroup(text, kernel=KERNEL):
    return simt.workgroup_buffers(text, kernel)


def run(text, v, wo, head, means_dtype):
    B, H, Nk, Dh = v.shape
    D = wo.shape[0]
    store = np.uint16 if means_dtype in ("f16", "bf16") else np.float32
    means = np.full((B, Nk, D), 0x7FC0 if store is np.uint16 else np.nan, store)
    bias = np.full((B, Nk), np.nan, np.float32)
    mem = simt.Memory()
    for a in (v, wo, head, means, bias):
        mem.add(a, None)
    simt.run_kernel(simt.parse(text, KERNEL), [v, wo, head, means, bias], 128, (-(-Nk // 8), B), mem,
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


# 0 · inf in the lanes past D (never stored) of the inf case; the warps run in threads of their own, where
# np.errstate (thread-local) does not reach.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
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


def entropy_reference(s):
    """(sums, counts) [B, H, blocks] of the row entropies (float64) and of the rows with an unmasked key."""
    B, H, N, Nk = s.shape
    x = s.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = x.max(-1, keepdims=True)
        valid = ~np.isneginf(m[..., 0])
        e = np.exp(x - np.where(np.isneginf(m), 0.0, m))
        p = e / e.sum(-1, keepdims=True)
        plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), np.where(np.isnan(p), np.nan, 0.0))
        ent = -plogp.sum(-1)
    blocks = -(-N // ROWS_PER_BLOCK)
    sums = np.zeros((B, H, blocks))
    counts = np.zeros((B, H, blocks))
    for c in range(blocks):
        rows = slice(c * ROWS_PER_BLOCK, (c + 1) * ROWS_PER_BLOCK)
        sums[:, :, c] = np.where(valid[:, :, rows], ent[:, :, rows], 0.0).sum(-1)
        counts[:, :, c] = valid[:, :, rows].sum(-1)
    return sums, counts


def head_reference(sums, counts):
    """argmin over the heads of the mean entropy, the lowest head on ties, a NaN mean the minimum."""
    out = []
    for b in range(sums.shape[0]):
        tot, cnt = sums[b].sum(-1), counts[b].sum(-1)
        mean = np.where(cnt > 0, tot / np.maximum(cnt, 1), 0.0)
        nan = np.flatnonzero(np.isnan(mean))
        out.append(int(nan[0]) if nan.size else int(np.argmin(mean)))
    return np.array(out, np.int32)


def entropy_inputs(seed, B, H, N, Nk, kind):
    rng = np.random.default_rng(seed)
    s = (rng.standard_normal((B, H, N, Nk)) * np.linspace(0.5, 3.0, H)[None, :, None, None]).astype(np.float32)
    if kind == "adversarial":
        s[0, 0, 3, :] = -np.inf                                    # a fully masked row: left out of the mean
        s[0, 1, 5, : Nk // 2] = -np.inf                            # masked keys
        s[1 % B, 2 % H, 7, :] = np.arange(Nk, dtype=np.float32)    # the max grows every step
        s[0, 2 % H, 9, :] *= 60.0                                  # exp of an unshifted step would overflow
        s[0, 2 % H, 11, Nk - 1] = 80.0                             # the max in the last, partial step
    if kind == "nan":
        s[0, 1, 2, Nk // 3] = np.nan                               # head 1's mean is NaN: it is chosen
    return s


ENTROPY_CASES = [
    pytest.param(2, 3, 37, 300, "adversarial", id="partial-steps-masked-rows-growing-max"),
    pytest.param(1, 4, 20, 5, "adversarial", id="fewer-keys-than-lanes"),
    pytest.param(2, 3, 16, 128, "nan", id="nan-score-picks-its-head"),
    pytest.param(1, 2, 33, 129, "random", id="one-past-a-step"),
]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("B,H,N,Nk,kind", ENTROPY_CASES)
def test_entropy_partials_and_head_equal_float64(B, H, N, Nk, kind):
    text = lower(B, H, N, Nk, 32, 8, 16, 2.0, "f32")
    s = entropy_inputs(B * 100 + Nk, B, H, N, Nk, kind)
    blocks = -(-N // ROWS_PER_BLOCK)
    sums = np.full((B, H, blocks), np.nan, np.float32)
    counts = np.full((B, H, blocks), np.nan, np.float32)
    head = np.full((B,), -7, np.int32)
    mem = simt.Memory()
    for a in (s, sums, counts, head):
        mem.add(a, None)
    simt.run_kernel(simt.parse(text, "attention_entropy_0"), [s, sums, counts], 128, (blocks, H, B), mem,
                    workgroup=workgroup(text, "attention_entropy_0"), warp_threads=True, workgroup_fill=np.nan)
    simt.run_kernel(simt.parse(text, "attention_head_select_0"), [sums, counts, head], 32, 1, mem)
    rs, rc = entropy_reference(s)
    np.testing.assert_array_equal(counts, rc)
    np.testing.assert_allclose(sums, rs, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(head, head_reference(rs, rc))
    if kind == "nan":
        assert list(head) == [1] + [head_reference(rs, rc)[1]] * (B - 1)
