"""The causal order of the flash kernels' blocks (flash-causal-balance, FlashTile.h's FlashBlockOrder), without a GPU.

Under a causal mask a row tile's work grows with its index (by query) or shrinks (by key), and the blocks a
multiprocessor holds at once should carry about equal work. With the option (on by default) a block takes its tile
and batch element from its position p = y * tiles + x, the multiprocessor count S (%nsmid) and the first wave
W = min(blocks, 2S): work item S + W - 1 - p for p in [S, W), p elsewhere, item i being the (i / B)-th heaviest
tile of batch element i % B. Checked here:

* the order is a permutation of the blocks for every grid and S (the model below, the kernels' formula), and under
  the model of the hardware's dealing (the first wave one block a multiprocessor, then a second round in the same
  order) it halves the busiest multiprocessor's work at the GPU benchmark's causal shape (B = 4, N = 4096, 64-row
  tiles, 132 multiprocessors): the figure the comment in FlashTile.h gives;
* the kernels as moe-opt emits them, run by simt.py with %nsmid from 1 to past the grid: the tensor-core forward
  (the 64-row kernel, the 128-row one with the lazy rescale and three stages, and the split-key kernel, whose
  (element, split) pairs are a tile's lanes, with its combine), the scalar f32 forward, the tensor-core backward's two passes and
  the scalar backward's give the same bits as in the grid's order (flash-causal-balance=false), and every output
  row is written (the outputs start as NaN).

The benefit itself (kernel time) is the GPU run's to measure: bench/gpu's causal case, with and without the option.
Needs moe-opt ($MOE_OPT, else build/bin/moe-opt): the kernel tests are skipped without it.
"""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import simt  # noqa: E402

# The NaN fill of the backward's buffers casts to 0 in bf16 tiles' uint16 arrays (test_flash_mma_grad_simt.py).
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")

SMS = [1, 2, 3, 5, 64]


def item(p, blocks, sms):
    """The work item of the block at position p (FlashTile.cpp's flashBlockPlace)."""
    wave = min(blocks, 2 * sms)
    return sms + wave - 1 - p if sms <= p < wave else p


def place(p, tiles, batch, sms, by_key=False):
    """(tile, batch element) of the block at position p."""
    i = item(p, tiles * batch, sms)
    rank, b = divmod(i, batch)
    return (rank if by_key else tiles - 1 - rank), b


@pytest.mark.parametrize("tiles,batch", [(1, 1), (1, 5), (7, 1), (5, 3), (64, 4), (33, 9)])
@pytest.mark.parametrize("sms", [1, 2, 3, 7, 132, 1000])
@pytest.mark.parametrize("by_key", [False, True])
def test_the_order_is_a_permutation_of_the_blocks(tiles, batch, sms, by_key):
    places = [place(p, tiles, batch, sms, by_key) for p in range(tiles * batch)]
    assert sorted(places) == [(t, b) for t in range(tiles) for b in range(batch)]


def busiest_multiprocessor(tiles, batch, sms, balanced):
    """The largest sum of tile work (t + 1 key tiles for query tile t) of the two blocks a multiprocessor gets when
    the whole grid fits two blocks a multiprocessor, dealt p mod sms."""
    assert tiles * batch <= 2 * sms
    work = [0] * sms
    for p in range(tiles * batch):
        t = place(p, tiles, batch, sms)[0] if balanced else p % tiles
        work[p % sms] += t + 1
    return max(work)


def test_the_first_wave_pairs_heavy_tiles_with_light_ones():
    """B = 4, N = 4096, 64-row tiles on 132 multiprocessors (an H100's or H200's): 256 blocks, 8,320 tile pairs,
    63 a multiprocessor on average. In the grid's order a multiprocessor gets blocks p and p + 132, tiles t and
    t + 4 of like weight: the busiest computes 124. Balanced: at most 66."""
    assert busiest_multiprocessor(64, 4, 132, balanced=False) == 124
    assert busiest_multiprocessor(64, 4, 132, balanced=True) <= 66


MOE_OPT = simt.find_moe_opt()
needs_moe_opt = pytest.mark.skipif(MOE_OPT is None, reason="no moe-opt ($MOE_OPT, build/bin)")
B, N, D, K, TAU = 3, 200, 32, 8, 0.5   # 64-row tiles: 4 x 3 blocks; 128-row: 2 x 3
NS = 40   # the scalar kernels' N (16-row tiles: 3 x 3 blocks; the interpreter runs them a warp at a time)


def operands(N=N):
    rng = np.random.default_rng(11)
    u = rng.standard_normal((B, N, D)).astype(np.float32) * 0.5
    e = rng.random((B, N, K)).astype(np.float32)
    dp = rng.standard_normal((B, N, K)).astype(np.float32)
    return u, e, dp


def with_sms(sms, fn, *args, **kw):
    """fn(...) with %nsmid = sms for every kernel it runs."""
    old, simt.SMS = simt.SMS, sms
    try:
        return fn(*args, **kw)
    finally:
        simt.SMS = old


def tensor_core_forward(options, sms):
    """The tensor-core kernel's output: test_flash_mma_simt's options (BASE64 and `options`)."""
    pytest.importorskip("torch")
    import test_flash_mma_simt as F
    u, e, _ = operands()
    text = F.lower(B, N, D, K, "bf16", TAU, True, False, options)
    return with_sms(sms, F.run, text, F.bits(u, "bf16"), F.bits(e, "bf16"), None, K, False,
                    threads=F.warp_threads(text))


def split_forward(options, sms, S=3):
    """The split-key kernel over S splits (the grid's z) and its combine: test_flash_mma_simt's split options."""
    pytest.importorskip("torch")
    import test_flash_mma_simt as F
    u, e, _ = operands()
    ub, eb = F.bits(u, "bf16"), F.bits(e, "bf16")
    text = F.lower(B, N, D, K, "bf16", TAU, True, False, f"{F.SPLIT} {options}")
    kernel = "similarity_inform_mma_1"
    p = np.full((B, N, K), np.nan, np.float32)
    ws = np.full((S, B, N, K + 2), np.nan, np.float32)
    mem = simt.Memory()
    for a in (ub, eb, p, ws):
        mem.add(a, None)
    wg, dyn = F.shared_memory(text, kernel)
    threads = F.warp_threads(text)   # the lazy rescale's warps leave its hot loop at tiles of their own
    simt.run_kernel(simt.parse(text, kernel), [ub, ub, eb, p, ws], 128, (-(-N // 128), B, S), mem, workgroup=wg,
                    lockstep=not threads, dynamic_smem=dyn, sms=sms, warp_threads=threads)
    assert not np.isnan(ws).any(), "a split left a row of the workspace unwritten"
    simt.run_kernel(simt.parse(text, "similarity_inform_mma_combine_0"), [ws, p], 128, -(-(B * N) // 128), mem)
    return p


def scalar_forward(options, sms):
    """The f32 flash kernel's output (FlashMix.cpp: 16-row tiles)."""
    from test_flash_mma_grad_simt import workgroup
    N = NS
    u, e, _ = operands(N)
    t = lambda *s: "tensor<" + "x".join(map(str, s)) + ">"  # noqa: E731
    src = (f"func.func @f(%u: {t(B, N, D, 'f32')}, %e: {t(B, N, K, 'f32')}) -> {t(B, N, K, 'f32')} {{\n"
           f"  %p = moe.similarity_inform %u, %e tau({TAU:e}) causal(true) : {t(B, N, D, 'f32')}, "
           f"{t(B, N, K, 'f32')} -> {t(B, N, K, 'f32')}\n  return %p : {t(B, N, K, 'f32')}\n}}\n")
    text = simt.lower(MOE_OPT, src, options)
    out = np.full((B, N, K), np.nan, np.float32)
    mem = simt.Memory()
    for a in (u, e, out):
        mem.add(a, None)
    kernel = "similarity_inform_0"
    simt.run_kernel(simt.parse(text, kernel), [u, u, e, out], 128, (-(-N // 16), B), mem,
                    workgroup=workgroup(text, kernel), sms=sms)
    return out


def tensor_core_backward(options, sms):
    """du, de of the tensor-core passes (flash-mma-grad) from saved statistics."""
    pytest.importorskip("torch")
    import test_flash_mma_grad_simt as G
    u, e, dp = operands()
    ub, eb = G.bits(u, "bf16"), G.bits(e, "bf16")
    p, lse, _, _ = G.reference(G.values(ub, "bf16"), G.values(eb, "bf16"), dp, TAU, True, None)
    text = G.lower(B, N, D, K, TAU, True, False, "bf16", options=f"{G.OPTIONS} {options}")
    return with_sms(sms, G.run, text, ub, eb, dp, None, p.astype(np.float32), lse.astype(np.float32))


def scalar_backward(options, sms):
    """du, de of the scalar passes (FlashGrad.cpp: 16-row tiles, by query then by key) from saved statistics."""
    from test_flash_mma_grad_simt import workgroup
    pytest.importorskip("torch")
    import test_flash_mma_grad_simt as G
    N = NS
    u, e, dp = operands(N)
    p, lse, _, _ = G.reference(u.astype(np.float64), e.astype(np.float64), dp, TAU, True, None)
    p, lse = p.astype(np.float32), lse.astype(np.float32)
    text = G.lower(B, N, D, K, TAU, True, False, "f32", options=options)
    lse_out = np.full((B, N), np.nan, np.float32)
    delta = np.full((B, N), np.nan, np.float32)
    du = np.full((B, N, D), np.nan, np.float32)
    de = np.full((B, N, K), np.nan, np.float32)
    mem = simt.Memory()
    for a in (u, e, dp, p, lse, lse_out, delta, du, de):
        mem.add(a, None)
    simt.run_kernel(simt.parse(text, "flash_grad_stats_0"), [lse, p, dp, delta, lse_out], 128, (-(-N // 128), B),
                    mem)
    grid = (-(-N // 16), B)
    for name, args in (("similarity_inform_grad_dq_0", [u, u, dp, e, lse_out, delta, u, du]),
                       ("similarity_inform_grad_dk_0", [u, u, e, dp, lse_out, delta, dp, de, u, du])):
        simt.run_kernel(simt.parse(text, name), args, 128, grid, mem, workgroup=workgroup(text, name), sms=sms)
    return du, de


FORWARDS = {
    "mma_rows64": (tensor_core_forward, ""),
    "mma_rows128": (tensor_core_forward, "flash-mma-block-rows=128"),
    "mma_split_keys": (split_forward, ""),
    "scalar_f32": (scalar_forward, ""),
}


@needs_moe_opt
@pytest.mark.parametrize("kernel", list(FORWARDS))
def test_forward_same_bits_in_the_causal_order(kernel):
    fn, options = FORWARDS[kernel]
    grid = fn(f"{options} flash-causal-balance=false", 1)
    assert np.all(np.isfinite(grid))
    for sms in SMS:
        got = fn(f"{options} flash-causal-balance=true", sms)
        np.testing.assert_array_equal(got, grid, err_msg=f"%nsmid = {sms}")


BACKWARDS = {"mma": tensor_core_backward, "scalar_f32": scalar_backward}


@needs_moe_opt
@pytest.mark.parametrize("kernel", list(BACKWARDS))
def test_backward_same_bits_in_the_causal_order(kernel):
    fn = BACKWARDS[kernel]
    du0, de0 = fn("flash-causal-balance=false", 1)
    assert np.all(np.isfinite(du0)) and np.all(np.isfinite(de0))
    for sms in SMS:
        du, de = fn("flash-causal-balance=true", sms)
        np.testing.assert_array_equal(du, du0, err_msg=f"%nsmid = {sms}")
        np.testing.assert_array_equal(de, de0, err_msg=f"%nsmid = {sms}")
