"""similarity_inform_topk on the tensor-core flash kernel (FlashMma.cpp), run without a GPU: the
fused top-k in the epilogue of the 64-row kernel and of the 128-row kernel (two row tiles a warp: each thread's
four rows selected one after another), and with flash-mma-key-splits the split kernel's partial rows merged by the
top-k combine (a quad of lanes a row, the epilogue's C-fragment layout). Each case is lowered with moe-opt and
executed by simt.py (test_flash_mma_simt.py's harness).

The oracle: the same options' unfused kernel (moe.similarity_inform, whose mixing test_flash_mma_simt.py checks
against float64) run on the same inputs, then the top-k of its rows in float64 (run_gpu_tests.ref_topk: a stable
sort, ties to the lowest index). The fused kernel's selection must equal it exactly (both kernels compute the same
rows with the same code and tiles); its weights within f32 rounding of the renormalization; and both within the
harness's MMA_TOL of the float64 mixing. Cases: ragged N (rows past N in the last block), a causal f16 case with a
key mask, a fully masked batch element and k = K without renormalization (zeros, indices 0..K-1), tied experts
(equal columns of e: equal mixed probabilities, the lowest index first), k = 1, and several key tiles split 1, 3
and the host's count of ways.
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
from test_flash_mma_simt import (BASE64, BLOCK, SPLIT, bits, block_rows, shared_memory, values,  # noqa: E402
                                 warp_threads)

# On top of BASE64 (the 64-row kernel without split keys), as in test_flash_mma_simt.py; SPLIT (imported): the
# default kernel pair, the 128-row kernel with its keys split 4 ways at most and the top-k combine.
VARIANTS = {
    # The 64-row kernel: one 16-row MMA tile a warp (the fused top-k's only form before).
    "rows64": "",
    # The 128-row kernel without split keys (what a grid of 264 blocks or more runs): the lazy rescale, 3 stages.
    "rows128": "flash-mma-block-rows=128",
}


def case(name):
    """(B, N, D, K, k, renormalize, type, tau, causal, u bits, e bits, mask) of a named case."""
    rng = np.random.default_rng(sum(map(ord, name)))
    mask = None
    if name == "ragged_bf16":
        B, N, D, K, k, renorm, t, tau, causal = 2, 150, 64, 16, 2, True, "bf16", 1.0, False
    elif name == "masked_kK_f16":
        B, N, D, K, k, renorm, t, tau, causal = 2, 70, 40, 12, 12, False, "f16", 0.5, True
        mask = rng.random((B, N)) > 0.3
        mask[1] = False                                   # every key masked: rows of zeros
    elif name == "ties_bf16":
        B, N, D, K, k, renorm, t, tau, causal = 1, 140, 32, 16, 3, True, "bf16", 0.5, False
    elif name == "k1_bf16":
        B, N, D, K, k, renorm, t, tau, causal = 1, 130, 64, 8, 1, True, "bf16", 0.25, False
    elif name == "tiles_causal_bf16":
        B, N, D, K, k, renorm, t, tau, causal = 2, 300, 64, 16, 4, True, "bf16", 0.5, True
    elif name == "d256_k64_f16":
        # One row tile a warp, k = 8 of 64.
        B, N, D, K, k, renorm, t, tau, causal = 1, 200, 256, 64, 8, True, "f16", 0.25, False
    else:
        raise KeyError(name)
    u = rng.standard_normal((B, N, D)).astype(np.float32) * (0.1 if D == 256 else 0.3)
    e = rng.random((B, N, K)).astype(np.float32)
    if name == "ties_bf16":
        # Experts 2, 5 and 9 carry equal and the largest mass: their mixed probabilities are equal in every row
        # (the same sums of the same products), so the top 3 are always 2, 5, 9 in that order.
        e *= 0.1
        e[..., [2, 5, 9]] = 0.5
        e[..., 12] = 0.45                                  # the runner-up: a 4th that must not win
    e /= e.sum(-1, keepdims=True)
    return B, N, D, K, k, renorm, t, tau, causal, bits(u, t), bits(e, t), mask


def module(op, B, N, D, K, k, renorm, t, tau, causal, masked):
    marg = f", %m: tensor<{B}x{N}xi1>" if masked else ""
    attrs = (f" key_mask(%m : tensor<{B}x{N}xi1>)" if masked else "")
    args = f"tensor<{B}x{N}x{D}x{t}>, tensor<{B}x{N}x{K}x{t}>"
    tail = f" tau({tau:e})" + (" causal(true)" if causal else "")
    if op == "topk":
        res = f"tensor<{B}x{N}x{k}xf32>, tensor<{B}x{N}x{k}xi32>"
        renorm_attr = "" if renorm else " renormalize(false)"
        body = (f"  %w, %i = moe.similarity_inform_topk %u, %e{attrs} k({k}){renorm_attr}{tail} : {args} -> {res}\n"
                f"  return %w, %i : {res}\n")
    else:
        res = f"tensor<{B}x{N}x{K}xf32>"
        body = f"  %p = moe.similarity_inform %u, %e{attrs}{tail} : {args} -> {res}\n  return %p : {res}\n"
    return (f"func.func @f(%u: tensor<{B}x{N}x{D}x{t}>, %e: tensor<{B}x{N}x{K}x{t}>{marg}) -> ({res}) {{\n"
            + body + "}\n")


def run_direct(text, kernel, args, N, B, threads):
    mem = simt.Memory()
    for a in args:
        mem.add(a, None)
    body = simt.parse(text, kernel)
    wg, dyn = shared_memory(text, kernel)
    simt.run_kernel(body, args, BLOCK, (-(-N // block_rows(text)), B), mem, workgroup=wg, lockstep=not threads,
                    dynamic_smem=dyn, async_copies="wait", warp_threads=threads)


def unfused_rows(c, options):
    """The unfused kernel's mixed rows [B, N, K] under the same options (the oracle's input)."""
    B, N, D, K, k, renorm, t, tau, causal, u, e, mask = c
    text = simt.lower(MOE_OPT, module("p", B, N, D, K, k, renorm, t, tau, causal, mask is not None),
                      f"{BASE64} {options}")
    p = np.full((B, N, K), np.nan, np.float32)
    args = [u, u, e] + ([mask] if mask is not None else []) + [p]
    run_direct(text, "similarity_inform_mma_0", args, N, B, warp_threads(text))
    return p


def check(c, p, w, idx):
    B, N, D, K, k, renorm, t, tau, causal, u, e, mask = c
    assert not np.isnan(p).any(), "the unfused kernel left a row unwritten"
    rw, ri = R.ref_topk(torch.from_numpy(p), k, "probs", renorm)
    np.testing.assert_array_equal(idx, ri.numpy())
    np.testing.assert_allclose(w, rw.numpy(), rtol=2e-6, atol=1e-7)
    # And against the float64 mixing: the chosen experts' weights.
    ref_p = R.ref_similarity(torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t)), tau=tau, causal=causal,
                             key_mask=torch.from_numpy(mask) if mask is not None else None)
    ref_w = ref_p.gather(-1, torch.from_numpy(idx).long())
    if renorm:
        s = ref_w.sum(-1, keepdim=True)
        ref_w = torch.where(s == 0, torch.zeros_like(ref_w), ref_w / s)
    np.testing.assert_allclose(w, ref_w.numpy(), **R.MMA_TOL)


NAMES = ["ragged_bf16", "masked_kK_f16", "ties_bf16", "k1_bf16", "tiles_causal_bf16", "d256_k64_f16"]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", NAMES)
def test_fused_topk_epilogue(variant, name):
    c = case(name)
    B, N, D, K, k, renorm, t, tau, causal, u, e, mask = c
    options = VARIANTS[variant]
    text = simt.lower(MOE_OPT, module("topk", B, N, D, K, k, renorm, t, tau, causal, mask is not None),
                      f"{BASE64} {options}")
    assert block_rows(text) == (64 if variant == "rows64" or D == 256 else 128)
    w = np.full((B, N, k), np.nan, np.float32)
    idx = np.full((B, N, k), -7, np.int32)
    args = [u, u, e] + ([mask] if mask is not None else []) + [w, idx]
    run_direct(text, "similarity_inform_topk_mma_0", args, N, B, warp_threads(text))
    check(c, unfused_rows(c, options), w, idx)
    if name == "masked_kK_f16":
        assert np.all(w[1] == 0.0) and np.all(idx[1] == np.arange(k)), "a fully masked element: zeros, 0..k-1"
    if name == "ties_bf16":
        assert np.all(idx == [2, 5, 9]), "tied experts: the lowest index first"


def host_splits(N, B, Nk, cols=64, most=4):
    """launchSplitFlashMixMma's choice: min(most, ceil(264 / blocks), key tiles), at least 1."""
    blocks = -(-N // 128) * B
    return max(1, min(most, -(-264 // blocks), max(1, -(-Nk // cols))))


@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("name", ["tiles_causal_bf16", "masked_kK_f16", "ties_bf16"])
def test_split_keys_topk_combine(name, splits):
    """The default kernel pair: the split kernel writes partial rows (the fused op's epilogue is not reached),
    the top-k combine merges them in split order and selects; splits 1, 3 (uneven shares, causal blocks with
    empty ones) and the host's count. The selection must equal the unfused split pair's rows' top k."""
    c = case(name)
    B, N, D, K, k, renorm, t, tau, causal, u, e, mask = c
    masked = mask is not None
    text = simt.lower(MOE_OPT, module("topk", B, N, D, K, k, renorm, t, tau, causal, masked), f"{BASE64} {SPLIT}")
    ptext = simt.lower(MOE_OPT, module("p", B, N, D, K, k, renorm, t, tau, causal, masked), f"{BASE64} {SPLIT}")
    S = splits or host_splits(N, B, N)
    extra = [mask] if masked else []

    def split_pair(text, op, outs, combine_grid):
        ws = np.full((S, B, N, K + 2), np.nan, np.float32)
        mem = simt.Memory()
        args = [u, u, e] + extra + outs + [ws]
        for a in args:
            mem.add(a, None)
        kernel = f"{op}_mma_1"
        wg, dyn = shared_memory(text, kernel)
        simt.run_kernel(simt.parse(text, kernel), args, BLOCK, (-(-N // 128), B, S), mem, workgroup=wg,
                        lockstep=False, dynamic_smem=dyn, async_copies="wait", warp_threads=True)
        assert not np.isnan(ws).any(), "a split left a row of the workspace unwritten"
        simt.run_kernel(simt.parse(text, f"{op}_mma_combine_0"), [ws] + outs, BLOCK, combine_grid, mem)

    p = np.full((B, N, K), np.nan, np.float32)
    split_pair(ptext, "similarity_inform", [p], -(-(B * N) // BLOCK))
    w = np.full((B, N, k), np.nan, np.float32)
    idx = np.full((B, N, k), -7, np.int32)
    split_pair(text, "similarity_inform_topk", [w, idx], -(-(B * N) // (BLOCK // 4)))
    check(c, p, w, idx)
