"""The symmetric similarity kernels (FlashSymmetric.cpp, flash-mma-symmetric) as moe-opt emits them, run without a GPU
by simt.py in the order the host launches them: norms (h_j and the blocks' partial stats), values (the element's
guard, V', zeroed accumulators), pairs (each unordered pair of key tiles once: the block's rows from A V'_J in
registers, the key tile's rows from A^T V'_I through shared memory and f32 atomics), rows (normalized, lse, the redo
flag), then the exact kernel gated by the stats (the split kernel and its combine: what the host launches for these
small grids). Against the GPU harness's float64 reference within MMA_TOL. The symmetric result is checked on its own
(before the exact kernel, which must then leave it as it is), and the guard's refusals (a spread past 60, a non-finite
value, fewer than 256 rows) and the redo flag (a masked row far from every key) must hand the element to the exact
kernel, whose result is then the reference's. The atomics land in lane order here (a GPU's order is its own: the
last bits vary), ex2.approx is exact f32, the MMA sums are float64: races and the SFU's ulps are the GPU run's.
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

BLOCK = 128
OPTIONS = "flash-mma-symmetric=true"
WORKGROUP = re.compile(r"memref<([\dx]+)x(bf16|f16|f32), #gpu.address_space<workgroup>>")
DTYPES = {"bf16": np.uint16, "f16": np.uint16, "f32": np.float32}


def workgroup(text, kernel):
    """The workgroup buffers of `kernel` as its signature declares them: [(shape, dtype)]."""
    lines = text.splitlines()
    for n, line in enumerate(lines):
        if '"gpu.func"' in line:
            name = next(x for x in lines[n:] if 'sym_name = "' in x)
            if f'sym_name = "{kernel}"' in name:
                head = next(x for x in lines[n:] if "^bb0(" in x)
                return [(tuple(int(d) for d in dims.split("x")), DTYPES[t]) for dims, t in WORKGROUP.findall(head)]
    raise KeyError(kernel)


def lower(B, N, D, K, tau, masked, training=False, dynamic=False):
    n = "?" if dynamic else N
    op = "similarity_inform_fwd" if training else "similarity_inform"
    mask = f" key_mask(%m : tensor<{B}x{n}xi1>)" if masked else ""
    marg = f", %m: tensor<{B}x{n}xi1>" if masked else ""
    res = f"tensor<{B}x{n}x{K}xf32>" + (f", tensor<{B}x{n}xf32>" if training else "")
    outs = "%p, %lse" if training else "%p"
    text = (f"func.func @f(%u: tensor<{B}x{n}x{D}xbf16>, %e: tensor<{B}x{n}x{K}xbf16>{marg}) -> ({res}) {{\n"
            f"  {outs} = moe.{op} %u, %e{mask} tau({tau:e}) : tensor<{B}x{n}x{D}xbf16>, "
            f"tensor<{B}x{n}x{K}xbf16> -> {res}\n  return {outs} : {res}\n}}\n")
    return simt.lower(MOE_OPT, text, OPTIONS), op


def bits(x):
    return simt._f32_to_bits(np.asarray(x, np.float32), "bf16")


def values(b):
    return simt._bits_to_f32(b, "bf16").astype(np.float64)


def splits_of(tb, wave=264, most=4):
    """The host's splits of the pairs' walks: 1 from a wave of blocks on, else the count of 1..most whose grid
    fills its last wave best (the fewest on a tie)."""
    if tb >= wave:
        return 1
    return max(range(1, most + 1), key=lambda s: (s / -(-tb * s // wave), -s))


def test_splits_fill_the_last_wave():
    assert [splits_of(t) for t in (1, 3, 100, 128, 200, 263, 264, 1000)] == [4, 4, 2, 2, 1, 1, 1, 1]


def run(text, op, u, e, mask, K, with_lse=False, misalign=False):
    """The host's launches in order: (p, lse, stats, p after the symmetric kernels). `misalign`: u one element
    into its buffer (the keys' element staging)."""
    B, N, D = u.shape
    W = -(-(K + 1) // 8) * 8
    blocks = -(-N // BLOCK)
    T = -(-N // 128)
    S = splits_of(T * B)
    half = np.full((B, N), np.nan, np.float32)
    part = np.full((B, blocks, 4), np.nan, np.float32)
    stats = np.full((B, 4), np.nan, np.float32)
    vp = np.zeros((B, N, W), np.uint16)
    acc = np.full((B, N, K + 1), np.nan, np.float32)     # the values kernel zeroes the rows it uses
    p = np.full((B, N, K), np.nan, np.float32)
    lse = np.full((B, N), np.nan, np.float32)
    outs = [p] + ([lse] if with_lse else [])
    mk = [mask] if mask is not None else []
    mem = simt.Memory()
    for a in [u, e] + mk + outs + [half, part, stats, vp, acc]:
        mem.add(a, None, misalign_bytes=2 if (misalign and a is u) else 0)
    name = f"{op}_mma"
    simt.run_kernel(simt.parse(text, f"{name}_norms_0"), [u, e] + mk + [half, part], BLOCK, (blocks, B), mem,
                    workgroup=workgroup(text, f"{name}_norms_0"), lockstep=True)
    simt.run_kernel(simt.parse(text, f"{name}_values_0"), [e] + mk + [half, part, stats, vp, acc], BLOCK,
                    (blocks, B), mem, workgroup=workgroup(text, f"{name}_values_0"), lockstep=True)
    simt.run_kernel(simt.parse(text, f"{name}_pairs_0"), [u, half, stats, vp, acc], BLOCK, (T * S, B), mem,
                    workgroup=workgroup(text, f"{name}_pairs_0"), lockstep=True)
    simt.run_kernel(simt.parse(text, f"{name}_rows_0"), [half, stats, acc] + outs, BLOCK, -(-(B * N) // BLOCK), mem)
    symmetric = p.copy()
    # The exact kernel behind it: the split pair (4 splits at most, as the host picks for these grids).
    splits = max(1, min(4, -(-264 // (T * B)), -(-N // 64)))
    ws = np.full((splits, B, N, K + 2), np.nan, np.float32)
    mem.add(ws, None)
    args = [u, u, e] + mk + outs
    wg = workgroup(text, f"{name}_1")
    dyn = 0
    if not wg:
        launch = re.search(rf'"gpu.launch_func"\(([^)]*)\) <{{kernel = @\w+::@{name}_1, '
                           r"operandSegmentSizes = array<i32: ([\d, ]+)>", text)
        seg = [int(x) for x in launch.group(2).split(",")]
        operand = [x.strip() for x in launch.group(1).split(",")][sum(seg[:10])]
        dyn = int(re.search(rf'{operand} = "arith.constant"\(\) <{{value = (\d+) : i32}}>', text).group(1))
    simt.run_kernel(simt.parse(text, f"{name}_1"), args + [ws, stats], BLOCK, (T, B, splits), mem, workgroup=wg,
                    lockstep=False, warp_threads=True, dynamic_smem=dyn)
    simt.run_kernel(simt.parse(text, f"{name}_combine_0"), [ws] + outs + [stats], BLOCK, -(-(B * N) // BLOCK), mem)
    return p, lse, stats, symmetric


def inputs(seed, B, N, D, K, scale=0.3):
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((B, N, D)).astype(np.float32) * scale
    e = rng.random((B, N, K)).astype(np.float32)
    e /= e.sum(-1, keepdims=True)
    return u, e


def reference(u, e, tau, mask):
    return R.ref_similarity(torch.from_numpy(values(u)), torch.from_numpy(values(e)), tau=tau,
                            key_mask=torch.from_numpy(mask) if mask is not None else None).numpy()


@pytest.mark.parametrize("B,N,D,K,tau,masked", [
    (1, 300, 64, 16, 1.0, False),     # 3 row tiles (odd T: every block m = 1), 4 splits of 4 steps
    (2, 400, 64, 16, 0.5, True),      # 4 tiles (even T: blocks 0-1 take J = I + 2), a partial last tile
    (1, 260, 40, 12, 1.0, False),     # D and K + 1 not multiples of 16: padding columns, V' of 16
    (1, 513, 32, 31, 2.0, True),      # K + 1 = 32 (the widest V'), 5 tiles, one row in the last
])
def test_symmetric_matches_reference(B, N, D, K, tau, masked):
    u, e = inputs(B * N + D, B, N, D, K)
    mask = None
    if masked:
        mask = np.random.default_rng(1).random((B, N)) > 0.3
        if B > 1:
            mask[1] = False                                # every key masked: zeros
    u, e = bits(u), bits(e)
    text, op = lower(B, N, D, K, tau, masked)
    p, _, stats, symmetric = run(text, op, u, e, mask, K)
    ref = reference(u, e, tau, mask)
    assert np.all(stats[:, 1] == 1.0) and np.all(stats[:, 3] == 0.0), stats   # the symmetric path ran ...
    np.testing.assert_allclose(symmetric, ref, **R.MMA_TOL)
    np.testing.assert_array_equal(p, symmetric)                                 # ... and the exact one did not
    if masked and B > 1:
        assert np.all(p[1] == 0.0)


def test_misaligned_keys_take_the_element_staging():
    """u one bf16 element into its buffer: the pairs kernel stages its keys element by element (the 16-byte loads
    need an aligned base), V' (its own buffer) 16 bytes at a time; the result is the same."""
    B, N, D, K, tau = 1, 300, 64, 16, 1.0
    u, e = inputs(12, B, N, D, K)
    u, e = bits(u), bits(e)
    text, op = lower(B, N, D, K, tau, False)
    p, _, stats, symmetric = run(text, op, u, e, None, K, misalign=True)
    assert stats[0, 1] == 1.0 and stats[0, 3] == 0.0, stats
    np.testing.assert_allclose(symmetric, reference(u, e, tau, None), **R.MMA_TOL)


def test_training_forward_lse():
    B, N, D, K, tau = 1, 300, 64, 16, 0.5
    u, e = inputs(9, B, N, D, K)
    mask = np.random.default_rng(2).random((B, N)) > 0.2
    u, e = bits(u), bits(e)
    text, op = lower(B, N, D, K, tau, True, training=True)
    p, lse, stats, _ = run(text, op, u, e, mask, K, with_lse=True)
    assert stats[0, 1] == 1.0 and stats[0, 3] == 0.0, stats
    np.testing.assert_allclose(p, reference(u, e, tau, mask), **R.MMA_TOL)
    uu = torch.from_numpy(values(u))
    ref_lse = torch.logsumexp(R.similarity_logits(uu, tau, False, None, torch.from_numpy(mask)), -1).numpy()
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-2)


def declined(u, e, mask, tau, K, **lower_args):
    B, N, D = u.shape
    text, op = lower(B, N, D, K, tau, mask is not None, **lower_args)
    return run(text, op, u, e, mask, K)


def test_spread_past_the_guard_runs_the_exact_kernel():
    """One key with |u|^2/(2 tau) 70 above the others: the guard's spread (60) fails, and the exact kernel's result
    (the reference's, the outlier key taking its own row) replaces everything."""
    B, N, D, K, tau = 1, 300, 64, 16, 1.0
    u, e = inputs(4, B, N, D, K)
    u[0, 7, :] = 0.0
    u[0, 7, 0] = 12.0                                      # 144 / 2 = 72
    u, e = bits(u), bits(e)
    p, _, stats, _ = declined(u, e, None, tau, K)
    assert stats[0, 1] == 0.0, stats
    np.testing.assert_allclose(p, reference(u, e, tau, None), **R.MMA_TOL)


def test_non_finite_value_runs_the_exact_kernel():
    """A NaN in e: the guard fails (the symmetric sums would spread it to every row that sees the key with a
    weight, as the exact kernel does, but the guard does not reason about it) and the exact kernel's result is
    the reference's: NaN in every row that gives the key a weight."""
    B, N, D, K, tau = 1, 300, 64, 16, 1.0
    u, e = inputs(5, B, N, D, K)
    e[0, 11, 3] = np.nan
    u, e = bits(u), bits(e)
    p, _, stats, _ = declined(u, e, None, tau, K)
    assert stats[0, 1] == 0.0, stats
    ref = reference(u, e, tau, None)
    np.testing.assert_array_equal(np.isnan(p), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(p[ok], ref[ok], **R.MMA_TOL)


def test_masked_row_far_from_every_key_redoes_exactly():
    """A masked row (a query, not a key) 15 away from every valid key: its weights are below e^-100, its sum
    underflows, the rows kernel sets the redo flag and the exact kernel (online max: the row's own scale) gives
    the reference's row."""
    B, N, D, K, tau = 1, 300, 64, 16, 1.0
    u, e = inputs(6, B, N, D, K)
    mask = np.ones((B, N), bool)
    mask[0, 20] = False
    u[0, 20, :] = 0.0
    u[0, 20, 1] = 15.0
    u, e = bits(u), bits(e)
    p, _, stats, symmetric = declined(u, e, mask, tau, K)
    assert stats[0, 1] == 1.0 and stats[0, 3] == 1.0, stats
    np.testing.assert_allclose(p, reference(u, e, tau, mask), **R.MMA_TOL)


def test_fewer_rows_than_the_pairs_need_runs_the_exact_kernel():
    """A dynamic N of 200 (below 256 at run time): the guard fails and the exact kernel runs."""
    B, N, D, K, tau = 1, 200, 64, 16, 1.0
    u, e = inputs(8, B, N, D, K)
    u, e = bits(u), bits(e)
    p, _, stats, _ = declined(u, e, None, tau, K, dynamic=True)
    assert stats[0, 1] == 0.0, stats
    np.testing.assert_allclose(p, reference(u, e, tau, None), **R.MMA_TOL)
