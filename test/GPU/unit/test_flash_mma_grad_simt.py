"""similarity_inform_grad's tensor-core passes (FlashMmaGrad.cpp, flash-mma-grad) as moe-opt emits them, run without
a GPU by simt.py in the host's order: the stats kernel (lse', and dp rounded to the operand type with delta of it, from
the saved p and lse and dp), the query-major pass
(dq into du) and the key-major pass (de, and dk added to du). Against float64 autograd of the reference mixing on the
operands' rounded values: causal and key masks (a query with no key, a fully masked batch element), D and K that are
not multiples of 16 (the padded fragments), D = 128 with K = 64, D past 128 (dq's and du's features split over the
grid's z: D = 256 with K = 64, D = 200), f16 and bf16, N = 1,
a misaligned u (the element staging), and a NaN in a masked key's e, which must stay out of every gradient.
The MMA sums are float64 and ex2.approx exact f32 here: the rounding of P, dX and dp to the operand type is what the
tolerance covers. Needs moe-opt ($MOE_OPT, else build/bin/moe-opt): skipped without it.
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

workgroup = simt.workgroup_buffers


# The NaN fill of the workgroup buffers (a read of what the kernel did not write shows) casts to 0 in the bf16 tiles'
# uint16 arrays: only the f32 column terms carry it.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")

BLOCK = 128
OPTIONS = "flash-mma-grad=true"


def lower(B, N, D, K, tau, causal, masked, dtype, options=OPTIONS):
    t = lambda *s: "tensor<" + "x".join(map(str, s)) + ">"  # noqa: E731
    u, e, dp = t(B, N, D, dtype), t(B, N, K, dtype), t(B, N, K, "f32")
    p, lse, m = t(B, N, K, "f32"), t(B, N, "f32"), t(B, N, "i1")
    du, de = t(B, N, D, "f32"), t(B, N, K, "f32")
    mask = f" key_mask(%m : {m})" if masked else ""
    text = (f"func.func @g(%u: {u}, %e: {e}, %dp: {dp}, %m: {m}, %p: {p}, %lse: {lse}) -> ({du}, {de}) {{\n"
            f"  %du, %de = moe.similarity_inform_grad %u, %e{mask} dp(%dp : {dp}) saved(%p, %lse : {p}, {lse}) "
            f"tau({tau:e}) causal({'true' if causal else 'false'}) : {u}, {e} -> {du}, {de}\n"
            f"  return %du, %de : {du}, {de}\n}}\n")
    return simt.lower(MOE_OPT, text, options)


def bits(x, dtype):
    return simt._f32_to_bits(np.asarray(x, np.float32), dtype)


def values(b, dtype):
    return simt._bits_to_f32(b, dtype).astype(np.float64)


def reference(u, e, dp, tau, causal, mask):
    """p, lse and float64 autograd's du, de of the reference mixing."""
    ut = torch.from_numpy(u).requires_grad_()
    et = torch.from_numpy(e).requires_grad_()
    km = torch.from_numpy(mask) if mask is not None else None
    logits = R.similarity_logits(ut, tau, causal, None, km)
    p = R.masked_softmax_mix(logits, et)
    lse = torch.logsumexp(logits, -1)
    p.backward(torch.from_numpy(dp.astype(np.float64)))
    return p.detach().numpy(), lse.detach().numpy(), ut.grad.numpy(), et.grad.numpy()


def run(text, ub, eb, dp, mask, p, lse, misalign=False):
    B, N, D = ub.shape
    K = eb.shape[2]
    lse_out = np.full((B, N), np.nan, np.float32)
    delta = np.full((B, N), np.nan, np.float32)
    du = np.full((B, N, D), np.nan, np.float32)    # the query-major pass stores every element of it
    de = np.full((B, N, K), np.nan, np.float32)
    # dp rounded to the operand type by the stats kernel, rows padded to a multiple of 8 (NaN until written)
    dpr = np.full((B, N, -(-K // 8) * 8), 0x7FC0, np.uint16)
    mk = [mask] if mask is not None else []
    mem = simt.Memory()
    for a in [ub, eb, dp, p, lse, lse_out, delta, du, de, dpr] + mk:
        mem.add(a, None, misalign_bytes=2 if (misalign and a is ub) else 0)
    simt.run_kernel(simt.parse(text, "flash_grad_stats_0"), [lse, p, dp, delta, lse_out, dpr], BLOCK,
                    (-(-N // BLOCK), B), mem)
    # Past 128 padded features the passes split dq's and du's features over the grid's z (FlashMmaGrad.cpp's
    # featureSplitsFor): 128 a block.
    grid = (-(-N // 64), B, -(-(-(-D // 16) * 16) // 128))
    for name, outs in (("similarity_inform_grad_dq_mma_0", [du]), ("similarity_inform_grad_dk_mma_0", [de, du])):
        # Past 128 features the column tiles come by cp.async, two buffers a pass: each copy lands only at the
        # wait that completes its group (a tile read before its wait reads the other tile's data, or NaN).
        simt.run_kernel(simt.parse(text, name), [ub, eb, dpr, lse_out, delta] + mk + outs, BLOCK, grid, mem,
                        workgroup=workgroup(text, name), lockstep=True, workgroup_fill=np.nan, async_copies="wait")
    return du, de


def case(seed, B, N, D, K, tau, causal, masked, dtype="bf16", misalign=False, poison=False):
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((B, N, D)).astype(np.float32) * 0.4
    e = rng.random((B, N, K)).astype(np.float32)
    e /= e.sum(-1, keepdims=True)
    dp = rng.standard_normal((B, N, K)).astype(np.float32)
    mask = None
    if masked:
        mask = rng.random((B, N)) > 0.3
        mask[0, 0] = False                     # under causal, query 0 has no key
        if B > 1:
            mask[1] = False                    # every key masked: no gradient at all
    ub, eb = bits(u, dtype), bits(e, dtype)
    uv, ev = values(ub, dtype), values(eb, dtype)
    p, lse, du_ref, de_ref = reference(uv, ev, dp, tau, causal, mask)
    if poison:
        # A masked key's e NaN: the kernels stage it as zeros and take the key's rows as zeros, so every gradient
        # is the reference's on the clean operands, the key's own too (torch's would be NaN: 0 * NaN). Its u is a
        # query's as well, whose NaN would reach every row.
        j = int(np.flatnonzero(~mask[0])[1])
        eb[0, j, :] = bits(np.full(K, np.nan), dtype)
    text = lower(B, N, D, K, tau, causal, masked, dtype)
    du, de = run(text, ub, eb, dp, mask, p.astype(np.float32), lse.astype(np.float32), misalign)
    return du, de, du_ref, de_ref


def close(got, ref):
    """Within the rounding of P, dX and dp to bf16 (8 bits): 3% of each result's largest magnitude."""
    scale = np.nanmax(np.abs(ref))
    np.testing.assert_allclose(got, ref, rtol=3e-2, atol=3e-2 * scale + 1e-6, equal_nan=True)


@pytest.mark.parametrize("B,N,D,K,tau,causal,masked,dtype", [
    (1, 100, 64, 16, 0.5, True, True, "bf16"),      # causal + key mask, 2 row blocks, a partial last column tile
    (2, 70, 40, 12, 1.0, False, True, "f16"),       # D, K not multiples of 16; a fully masked batch element
    (1, 75, 128, 64, 2.0, True, False, "bf16"),     # the widest without feature splits
    (1, 1, 16, 4, 1.0, False, False, "bf16"),       # N = 1
    # Past 128 features: dq's and du's features split over two blocks (the grid's z), each with the logits in
    # full, 16-key tiles by cp.async into two buffers; de written by the first split.
    (1, 90, 256, 64, 2.0, True, True, "bf16"),      # the widest the kernel takes: causal + key mask
    (2, 70, 200, 12, 1.0, False, True, "f16"),      # D = 200: two splits of 104 features (13 blocks: one unpaired)
])
def test_grad_matches_autograd(B, N, D, K, tau, causal, masked, dtype):
    du, de, du_ref, de_ref = case(B * N + D + K, B, N, D, K, tau, causal, masked, dtype)
    assert np.all(np.isfinite(du)) and np.all(np.isfinite(de))
    close(du, du_ref)
    close(de, de_ref)
    if masked and B > 1:
        assert np.all(du[1] == 0.0) and np.all(de[1] == 0.0)


def test_misaligned_u_takes_the_element_staging():
    du, de, du_ref, de_ref = case(5, 1, 90, 64, 16, 1.0, False, True, misalign=True)
    close(du, du_ref)
    close(de, de_ref)


def test_nan_in_a_masked_keys_values_stays_out():
    du, de, du_ref, de_ref = case(6, 1, 80, 32, 8, 1.0, False, True, poison=True)
    assert np.all(np.isfinite(du)) and np.all(np.isfinite(de))
    close(du, du_ref)
    close(de, de_ref)


def test_causal_bounds_over_three_row_blocks():
    """Under causal the passes' loops are bounded by the row block (keys up to min(N, rowBase + 64) by query, queries
    from rowBase by key): three row blocks, the last partial."""
    du, de, du_ref, de_ref = case(7, 1, 130, 32, 8, 1.0, True, False)
    close(du, du_ref)
    close(de, de_ref)
