"""The f32 flash mixing kernel's wide form (FlashMixWide.cpp, flash-mix-wide) as moe-opt emits it, run without a GPU
by simt.py: similarity_inform, its training forward (the lse), the fused top-k, ws's projected query, dynamic shapes
and attention_posterior's mixing (bias and added scores), against float64 (run_gpu_tests' references). The cases
take every path of the kernel: partial key tiles (64 keys) and row tiles (16 rows), D past one 32-feature chunk and
not a multiple of it, D not a multiple of 4 and a misaligned base (the element staging's key loop), K not a
multiple of 8 (padded columns), K = 1 and K = 64 (the lane's 64 sums), a causal mask (the diagonal tile's skipped
keys), key masks with a fully masked batch element (zeros), and non-finite values of keys a row does not see (a
masked key's NaN, a causal later key's inf: they must reach no row that does not see them). Each lane's softmax
state and sums are merged over the row's 8 lanes at the end; the sums are in another order than the plain kernel's,
so the bound is f32 rounding (rtol 2e-5). ex2.approx is exact f32 here: the SFU's ulps are the GPU run's.
Needs moe-opt ($MOE_OPT, else build/bin/moe-opt): skipped without it.
"""
import os
import re
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

OPTIONS = "flash-mix-wide=true"
TOL = dict(rtol=2e-5, atol=2e-6)
WORKGROUP = re.compile(r"memref<([\dx]+)xf32, #gpu.address_space<workgroup>>")


def t(*shape, elt="f32"):
    return "tensor<" + "x".join(map(str, shape)) + f"x{elt}>"


def workgroup(text, kernel):
    """The kernel's workgroup buffers [(shape, dtype)]; the wide form's key tile is [64 x 36]."""
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if '"gpu.func"' in line:
            name = next(x for x in lines[n:] if 'sym_name = "' in x)
            if f'sym_name = "{kernel}"' in name:
                head = next(x for x in lines[n:] if "^bb0(" in x)
                return [(tuple(int(d) for d in dims.split("x")), np.float32) for dims in WORKGROUP.findall(head)]
    raise KeyError(kernel)


def run(text, kernel, args, N, B, misalign=None):
    mem = simt.Memory()
    for a in args:
        mem.add(a, None, misalign_bytes=4 if a is misalign else 0)
    wg = workgroup(text, kernel)
    assert wg[1][0] == (64, 36), f"{kernel} is not the wide form: {wg}"
    simt.run_kernel(simt.parse(text, kernel), args, 128, (-(-N // 16), B), mem, workgroup=wg, lockstep=True,
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
def test_wide_kernel_equals_float64(name):
    B, N, D, K, causal, masked, misaligned, u, e, mask = case(name, 1)
    if causal:
        if masked:                                         # key N / 2 kept (finite values) where there are keys
            mask[:-1, N // 2] = True
            e[:-1, N // 2] = 1.0 / K
        e[:, N // 2, 0] = np.inf                           # rows before N / 2 do not see it
    text = similarity(B, N, D, K, causal=causal, masked=masked)
    p = np.full((B, N, K), np.nan, np.float32)
    args = [u, u, e] + ([mask] if masked else []) + [p]
    run(text, "similarity_inform_0", args, N, B, misalign=u if misaligned else None)
    finite = np.where(np.isfinite(e), e, 0.0).astype(np.float32)
    ref = reference(u, finite, 0.5, causal, mask)
    np.testing.assert_allclose(p[..., 1:], ref[..., 1:], **TOL)
    if causal:
        seen = np.arange(N) >= N // 2
        np.testing.assert_allclose(p[:, ~seen, 0], ref[:, ~seen, 0], **TOL)
        keyed = slice(0, B - 1) if masked else slice(0, B)
        assert np.isposinf(p[keyed, seen, 0]).all()
    else:
        np.testing.assert_allclose(p[..., 0], ref[..., 0], **TOL)
    if masked:
        assert (p[-1] == 0).all()


def test_training_forward_lse():
    B, N, D, K, tau = 2, 75, 32, 16, 0.7
    u, e = inputs(3, B, N, D, K)
    text = similarity(B, N, D, K, tau=tau, causal=True, training=True)
    p = np.full((B, N, K), np.nan, np.float32)
    lse = np.full((B, N), np.nan, np.float32)
    run(text, "similarity_inform_fwd_0", [u, u, e, p, lse], N, B)
    check_causal_p_and_lse(p, lse, u, e, tau)


@pytest.mark.parametrize("k,K", [(2, 16), (4, 12), (1, 1)])
def test_fused_topk(k, K):
    B, N, D = 2, 70, 40
    u, e = inputs(4, B, N, D, K)
    text = similarity(B, N, D, K, k=k)
    w = np.full((B, N, k), np.nan, np.float32)
    idx = np.full((B, N, k), -1, np.int32)
    run(text, "similarity_inform_topk_0", [u, u, e, w, idx], N, B)
    ref = torch.from_numpy(reference(u, e, 0.5))
    rw, ri = R.ref_topk(ref, k, "probs", True)
    np.testing.assert_array_equal(idx, ri.numpy())
    np.testing.assert_allclose(w, rw.numpy(), **TOL)


def test_ws_projected_query():
    B, N, D, K = 1, 60, 16, 8
    u, e = inputs(5, B, N, D, K)
    ws = (np.random.default_rng(6).standard_normal((D, D)) * 0.3).astype(np.float32)
    text = similarity(B, N, D, K, ws=True)
    q = np.full((B, N, D), np.nan, np.float32)
    p = np.full((B, N, K), np.nan, np.float32)
    mem = simt.Memory()
    for a in (u, ws, q, e, p):
        mem.add(a, None)
    simt.run_kernel(simt.parse(text, "similarity_project_0"), [u, ws, q], 128, (1, B * N), mem)
    wg = workgroup(text, "similarity_inform_0")
    simt.run_kernel(simt.parse(text, "similarity_inform_0"), [q, u, e, p], 128, (-(-N // 16), B), mem, workgroup=wg,
                    lockstep=True, workgroup_fill=np.nan)
    np.testing.assert_allclose(p, reference(u, e, 0.5, ws=ws), **TOL)


def test_dynamic_shapes():
    B, N, D, K = 1, 45, 32, 16
    u, e = inputs(7, B, N, D, K)
    text = similarity(B, N, D, K, causal=True, dynamic=True)
    p = np.full((B, N, K), np.nan, np.float32)
    run(text, "similarity_inform_0", [u, u, e, p], N, B)
    np.testing.assert_allclose(p, reference(u, e, 0.5, True), **TOL)


def test_attention_posterior_mixing():
    """The posterior's logit <u_i, m_j> / sigma^2 + bias_j + s[b, h*, i, j] with every key checked (a bias or an
    added score of -inf excludes a key for some rows only): the mixing kernel alone on head means, bias and scores
    given here; an added score of -inf in front of a key whose values are inf."""
    rng = np.random.default_rng(8)
    B, H, N, D, K, sigma = 2, 4, 70, 40, 16, 1.5
    u = (rng.standard_normal((B, N, D)) * 0.2).astype(np.float32)
    means = (rng.standard_normal((B, N, D)) * 0.2).astype(np.float32)
    e = rng.random((B, N, K)).astype(np.float32)
    e = (e / e.sum(-1, keepdims=True)).astype(np.float32)
    bias = (rng.standard_normal((B, N)) * 1.5).astype(np.float32)
    s = (rng.standard_normal((B, H, N, N)) * 2.0).astype(np.float32)
    head = np.array([1, 2], np.int32)
    s[np.arange(B), head, :10, 5] = -np.inf                # key 5 excluded for rows 0-9 only
    e[:, 5, 3] = np.inf
    ts = [t(B, H, N, N), t(B, N, D), t(B, H, N, 16), t(D, 64), t(B, N, K)]
    res = f"{t(B, N, K)}, {t(B, elt='i32')}"
    text = (f"func.func @f(%s: {ts[0]}, %u: {ts[1]}, %v: {ts[2]}, %wo: {ts[3]}, %e: {ts[4]}) -> ({res}) {{\n"
            f"  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma({sigma:e}) : {', '.join(ts)} -> {res}\n"
            f"  return %p, %h : {res}\n}}\n")
    text = simt.lower(MOE_OPT, text, OPTIONS)
    out = np.full((B, N, K), np.nan, np.float32)
    run(text, "attention_posterior_0", [u, means, e, bias, s, head, out], N, B)
    logits = np.einsum("bid,bjd->bij", u.astype(np.float64), means.astype(np.float64)) / sigma ** 2 + \
        bias[:, None, :].astype(np.float64) + s[np.arange(B), head].astype(np.float64)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    ef = np.where(np.isinf(e), 0.0, e).astype(np.float64)
    ref = np.einsum("bij,bjk->bik", w / w.sum(-1, keepdims=True), ef)
    np.testing.assert_allclose(out[:, :10], ref[:, :10], **TOL)        # rows that do not see key 5
    assert np.isinf(out[:, 10:, 3]).all()                              # rows that do
    np.testing.assert_allclose(out[:, 10:, :3], ref[:, 10:, :3], **TOL)


def test_option_off_keeps_the_plain_kernel():
    src = ("func.func @f(%u: tensor<1x40x32xf32>, %e: tensor<1x40x16xf32>) -> tensor<1x40x16xf32> {\n"
           "  %p = moe.similarity_inform %u, %e tau(5.0e-01) : tensor<1x40x32xf32>, tensor<1x40x16xf32>"
           " -> tensor<1x40x16xf32>\n  return %p : tensor<1x40x16xf32>\n}\n")
    assert workgroup(simt.lower(MOE_OPT, src, ""), "similarity_inform_0")[1][0] == (32, 33)
    assert workgroup(simt.lower(MOE_OPT, src, OPTIONS), "similarity_inform_0")[1][0] == (64, 36)
