"""The tensor-core flash mixing kernel (FlashMma.cpp) as moe-opt emits it, run without a GPU: each case is lowered
with `moe-opt --convert-moe-to-gpu="OPTIONS" --mlir-print-op-generic` and its gpu.func executed by simt.py, a
block's 128 threads in lockstep (ldmatrix, mma.sync m16n8k16 on bf16/f16 bits, cp.async, the 16-byte staging,
the quads' shuffles, the warp votes), then compared with the GPU harness's float64 reference
(run_gpu_tests.ref_similarity) within the harness's MMA_TOL (the probabilities enter P.e rounded to the operand
type). Both forms of the kernel run every case (the base-2 softmax, the row sums from the MMA against a block of
ones with the rescale only when a row max of the warp changed, 16-byte and cp.async staging: what the H200 run of
2026-11-26 made the kernel): the 64-row one (flash-mma-block-rows=64, two cp.async buffers in static shared
memory) and the 128-row one (the default: two row tiles a warp, the lazy rescale's hot loop of whole tiles against
a stale shift, whose warps leave it at tiles of their own, so each warp runs in a thread of its own between
barriers, and three cp.async stages in dynamic shared memory), each again with every copy landing only at the wait
that completes its group; the 128-row one also with its keys split over the grid (flash-mma-key-splits) and its
combine. Cases: ragged N (a partial last key tile and rows past N), causal with a diagonal tile, key masks with a
fully masked element and a whole masked tile, f16 with D and K not multiples of 16 and 8, a key tile whose max
grows after the first, u one element into its buffer (2 bytes: the element-staging fallback), D = 128, D = 256
(one row tile: the 128-row form does not fit) and D = K = 256 (the lanes' own row sums: the ones block does not
fit the registers). ex2.approx runs as exact f32 and the MMA sums in float64: the SFU's ulps and the tensor cores'
summation order are the GPU run's to check, as are races (the block runs in lockstep: a missing barrier goes
unseen here, racecheck sees it). Needs moe-opt ($MOE_OPT, else build/bin/moe-opt): skipped without it.
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
WORKGROUP = re.compile(r"memref<(\d+)x(\d+)x(bf16|f16), #gpu.address_space<workgroup>>")

#: The 64-row kernel without split keys (lit's %flash_base64): one 16-row MMA tile a warp, two cp.async buffers in
#: static shared memory. Each variant starts from it and names its own options (a later option overrides an earlier
#: one in moe-opt's parsing), so "rows128" is the default kernel without split keys.
BASE64 = "flash-mma-block-rows=64 flash-mma-key-splits=1"
VARIANTS = {
    "rows64": "",
    # Two row tiles a warp, the lazy rescale, three cp.async stages in dynamic shared memory.
    "rows128": "flash-mma-block-rows=128",
}
# Both variants stage with cp.async (where D / K is a multiple of 8 and the base 16-byte aligned), so each runs again
# with each copy landing at the wait that needs it (simt.run_kernel's async_copies="wait"): a tile read before its
# group is waited for, or a group count off by one, reads stale data.
ASYNC_VARIANTS = list(VARIANTS)


def lower(B, N, D, K, t, tau, causal, masked, options, dynamic=False):
    """The lowered module of one similarity_inform (with `dynamic`, B and N dynamic: the torch ops' kernels)."""
    if dynamic:
        B, N = "?", "?"
    mask = f" key_mask(%m : tensor<{B}x{N}xi1>)" if masked else ""
    marg = f", %m: tensor<{B}x{N}xi1>" if masked else ""
    attrs = f" tau({tau:e})" + (" causal(true)" if causal else "")
    text = (f"func.func @f(%u: tensor<{B}x{N}x{D}x{t}>, %e: tensor<{B}x{N}x{K}x{t}>{marg}) -> "
            f"tensor<{B}x{N}x{K}xf32> {{\n"
            f"  %p = moe.similarity_inform %u, %e{mask}{attrs} : tensor<{B}x{N}x{D}x{t}>, "
            f"tensor<{B}x{N}x{K}x{t}> -> tensor<{B}x{N}x{K}xf32>\n  return %p : tensor<{B}x{N}x{K}xf32>\n}}\n")
    out = simt.lower(MOE_OPT, text, f"{BASE64} {options}")   # cached: the copy timings lower the same text again
    assert '"similarity_inform_mma_0"' in out, "not the tensor-core kernel"
    return out


def bits(x, t):
    x = np.asarray(x, np.float32)
    if t == "f16":
        return x.astype(np.float16).view(np.uint16)
    return simt._f32_to_bits(x, "bf16")


def values(b, t):
    return simt._bits_to_f32(b, t).astype(np.float64)


def block_rows(text):
    """The query rows a block of the kernel owns: the divisor of the host's grid (ceil(N / rows)), the first
    ceildivui of the host function @f (it follows the gpu.module, whose kernels have their own: the split kernel's
    key tiles, ceil(keys / 64), and their own value names)."""
    host = text[text.index('sym_name = "f"}>'):]
    divisor = re.search(r'"arith.ceildivui"\(%\w+, (%\w+)\)', host).group(1)
    return int(re.search(rf'{divisor} = "arith.constant"\(\) <{{value = (\d+) : index}}>', host).group(1))


def kernel_header(text, kernel):
    """The module's lines and the index of `kernel`'s generic gpu.func header among them (the gpu.func whose first
    sym_name after it is the kernel's: the name follows the body)."""
    lines = text.splitlines()
    starts = [n for n, line in enumerate(lines) if '"gpu.func"' in line]
    start = next(n for n in starts
                 if f'sym_name = "{kernel}"' in next(line for line in lines[n:] if 'sym_name = "' in line))
    return lines, start


def shared_memory(text, kernel):
    """(workgroup buffers, dynamic shared memory bytes) of `kernel`: its two workgroup buffers (keys, values) as
    its signature gives them, or none and the launch's dynamic_shared_memory_size (the 128-row kernel's three
    cp.async stages)."""
    lines, start = kernel_header(text, kernel)
    head = next(line for line in lines[start:] if "^bb0(" in line)
    wg = [((int(r), int(c)), np.uint16) for r, c, _t in WORKGROUP.findall(head)]
    launch = re.search(rf'"gpu.launch_func"\(([^)]*)\) <{{kernel = @\w+::@{kernel}, '
                       r"operandSegmentSizes = array<i32: ([\d, ]+)>", text)
    seg = [int(x) for x in launch.group(2).split(",")]
    if not seg[10]:
        assert len(wg) == 2, head
        return wg, 0
    assert not wg, head
    operand = [x.strip() for x in launch.group(1).split(",")][sum(seg[:10])]
    size = int(re.search(rf'{operand} = "arith.constant"\(\) <{{value = (\d+) : i32}}>', text).group(1))
    return wg, size


def warp_threads(text):
    """Whether the lowered kernel's warps take loops of their own between barriers (the 128-row kernel's lazy
    rescale: a warp leaves the hot loop at a tile of its own), so that simt runs each in a thread instead of the
    block in lockstep. The lazy rescale comes with the 128-row kernel (not where a key mask meets split keys: the
    threads then run a kernel whose warps keep together, as lockstep would)."""
    return block_rows(text) == 128


def run(text, u, e, mask, K, misalign, async_copies="issue", threads=False):
    B, N, _ = u.shape
    out = np.full((B, N, K), np.nan, np.float32)   # rows the kernel does not write stay NaN and fail
    mem = simt.Memory()
    args = [u, u, e] + ([mask] if mask is not None else []) + [out]
    for a in args:
        mem.add(a, None, misalign_bytes=2 if (misalign and a is u) else 0)
    kernel = "similarity_inform_mma_0"
    body = simt.parse(text, kernel)
    wg, dyn = shared_memory(text, kernel)
    simt.run_kernel(body, args, BLOCK, (-(-N // block_rows(text)), B), mem, workgroup=wg, lockstep=not threads,
                    dynamic_smem=dyn, async_copies=async_copies, warp_threads=threads)
    return out


def case(name, rng):
    """(B, N, D, K, type, tau, causal, u, e, mask) of a named case, u and e as bits of their type."""
    if name == "ragged_bf16":
        B, N, D, K, t, tau, causal = 2, 150, 64, 16, "bf16", 1.0, False
    elif name == "causal_bf16":
        B, N, D, K, t, tau, causal = 2, 100, 64, 16, "bf16", 0.5, True
    elif name == "mask_f16":
        B, N, D, K, t, tau, causal = 2, 70, 40, 12, "f16", 1.0, False
    elif name == "mask_tile_bf16":
        B, N, D, K, t, tau, causal = 2, 150, 64, 16, "bf16", 1.0, False
    elif name == "growing_max_bf16":
        B, N, D, K, t, tau, causal = 1, 140, 32, 8, "bf16", 0.25, False
    else:
        raise KeyError(name)
    u = rng.standard_normal((B, N, D)).astype(np.float32) * 0.3
    if name == "growing_max_bf16":
        # Keys whose norms grow with j: most rows' max grows in every key tile (the rescale runs), while rows
        # with a negative dot to the growing direction keep theirs (a tile where some warps skip it).
        u[:, :, 0] = np.linspace(-2.0, 3.0, N)[None, :]
    e = rng.random((B, N, K)).astype(np.float32)
    e /= e.sum(-1, keepdims=True)
    mask = None
    if name == "mask_f16":
        mask = rng.random((B, N)) > 0.3
        mask[1] = False                                   # every key masked: p = 0
    if name == "mask_tile_bf16":
        mask = rng.random((B, N)) > 0.3
        mask[1, :64] = False                              # a whole key tile masked in one element
    return B, N, D, K, t, tau, causal, bits(u, t), bits(e, t), mask


CASES = ["ragged_bf16", "causal_bf16", "mask_f16", "mask_tile_bf16", "growing_max_bf16"]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("name", CASES)
def test_flash_mma_kernel(variant, name):
    rng = np.random.default_rng(CASES.index(name) + 47)
    B, N, D, K, t, tau, causal, u, e, mask = case(name, rng)
    text = lower(B, N, D, K, t, tau, causal, mask is not None, VARIANTS[variant])
    got = run(text, u, e, mask, K, misalign=False, threads=warp_threads(text))
    ref = R.ref_similarity(torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t)), tau=tau, causal=causal,
                           key_mask=torch.from_numpy(mask) if mask is not None else None).numpy()
    np.testing.assert_allclose(got, ref, **R.MMA_TOL)
    if mask is not None and name == "mask_f16":
        assert np.all(got[1] == 0.0), "a fully masked element's rows must be zeros"


@pytest.mark.parametrize("variant", ASYNC_VARIANTS)
@pytest.mark.parametrize("name", CASES)
def test_flash_mma_copies_land_late(variant, name):
    """The cp.async variants with every copy landing as late as the hardware may let it: at the
    cp.async.wait.group that completes its group. The pipeline must wait for a tile's group (all but the
    stages - 2 groups committed after it) before its barrier and reads."""
    rng = np.random.default_rng(CASES.index(name) + 47)
    B, N, D, K, t, tau, causal, u, e, mask = case(name, rng)
    text = lower(B, N, D, K, t, tau, causal, mask is not None, VARIANTS[variant])
    got = run(text, u, e, mask, K, misalign=False, async_copies="wait", threads=warp_threads(text))
    ref = R.ref_similarity(torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t)), tau=tau, causal=causal,
                           key_mask=torch.from_numpy(mask) if mask is not None else None).numpy()
    np.testing.assert_allclose(got, ref, **R.MMA_TOL)


def growing_max_inputs(seed, B, N, D, K, t, scale):
    """u [B, N, D] (normal times `scale`) whose feature 0 grows from -2 to 3 over the keys, so that the rows with a
    positive dot to it see their max grow tile after tile and the others keep the first tile's, and e [B, N, K]
    with rows summing to 1; both rounded to type t."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((B, N, D)).astype(np.float32) * scale
    u[:, :, 0] = np.linspace(-2.0, 3.0, N)[None, :]
    e = rng.random((B, N, K)).astype(np.float32)
    e /= e.sum(-1, keepdims=True)
    return bits(u, t), bits(e, t)


@pytest.mark.parametrize("t", ["bf16", "f16"])
def test_lazy_rescale_hot_loop_and_exact_steps(t):
    """The 128-row kernel's lazy rescale over enough whole tiles for its hot loop (N = 520: 8 whole tiles, the hot
    loop's [0, 384) with 3 stages): keys whose norms grow with j, so that the rows with a positive dot to that
    direction see their max grow past the margin (7 in log2 units for bf16, 2 for f16) tile after tile (their warps
    leave the hot loop for the exact step, then go back in), while the rows with a negative one keep the max of the
    first tile (their warps stay in the hot loop); copies landing at their wait. Against float64. (A kernel whose
    test never finds a weight of 2 or more fails here: its weights overflow after the first tile.)"""
    B, N, D, K, tau = 1, 520, 32, 8, 0.25
    u, e = growing_max_inputs(29, B, N, D, K, t, 0.3)
    text = lower(B, N, D, K, t, tau, False, False, VARIANTS["rows128"])
    got = run(text, u, e, None, K, misalign=False, async_copies="wait", threads=warp_threads(text))
    ref = R.ref_similarity(torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t)), tau=tau).numpy()
    np.testing.assert_allclose(got, ref, **R.MMA_TOL)


def test_flash_mma_d128():
    """D = 128, K = 16 on the 128-row kernel: two row tiles still fit the registers, and three stages of 64-key
    tiles would not fit 48 KiB (60 KiB): the kernel takes 32-key tiles (30 KiB of dynamic shared memory). A
    growing max, copies landing at their wait, against float64."""
    B, N, D, K, t, tau = 1, 300, 128, 16, "bf16", 0.5
    u, e = growing_max_inputs(3, B, N, D, K, t, 0.2)
    text = lower(B, N, D, K, t, tau, False, False, VARIANTS["rows128"])
    assert block_rows(text) == 128
    wg, dyn = shared_memory(text, "similarity_inform_mma_0")
    assert (wg, dyn) == ([], 3 * 32 * (136 + 24) * 2), (wg, dyn)
    got = run(text, u, e, None, K, misalign=False, async_copies="wait", threads=warp_threads(text))
    ref = R.ref_similarity(torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t)), tau=tau).numpy()
    np.testing.assert_allclose(got, ref, **R.MMA_TOL)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_flash_mma_misaligned_keys(variant):
    """u one bf16 element into its buffer: the keys take the element staging (the 16-byte and cp.async paths
    need a 16-byte aligned base), the values the wide path."""
    rng = np.random.default_rng(7)
    B, N, D, K, t, tau, causal, u, e, mask = case("causal_bf16", rng)
    text = lower(B, N, D, K, t, tau, causal, False, VARIANTS[variant])
    got = run(text, u, e, None, K, misalign=True, threads=warp_threads(text))
    ref = R.ref_similarity(torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t)), tau=tau,
                           causal=causal).numpy()
    np.testing.assert_allclose(got, ref, **R.MMA_TOL)


def test_sum_mma_rescale_is_skipped_exactly():
    """The sums from the MMA and the skipped rescale change only the sum's rounding, not the weights: with e one
    expert a key (a one-hot e), every output is a ratio of sums of the same rounded probabilities, so both forms'
    rows add to 1 within f32 rounding. Where the ones block would take the fragments held through the key loop past
    160 registers (D = K = 256) each lane sums its own scores (unrounded p) instead: those rows keep the bf16
    rounding of P in their sums (the contrast: the check sees where the sums come from), and are still within
    MMA_TOL of float64."""
    rng = np.random.default_rng(11)
    B, N, t, tau = 1, 130, "bf16", 0.5
    for variant in VARIANTS:
        D, K = 32, 8
        u = bits(rng.standard_normal((B, N, D)).astype(np.float32) * 0.5, t)
        onehot = np.zeros((B, N, K), np.float32)
        onehot[0, np.arange(N), rng.integers(0, K, N)] = 1.0
        text = lower(B, N, D, K, t, tau, False, False, VARIANTS[variant])
        got = run(text, u, bits(onehot, t), None, K, misalign=False, threads=warp_threads(text))
        np.testing.assert_allclose(got.sum(-1), 1.0, rtol=0, atol=1e-5, err_msg=variant)
    D, K = 256, 256
    # Logits of order 1 (|u|^2 / tau about 1.3): every key's p counts in the sums, not the diagonal's alone.
    u = bits(rng.standard_normal((B, N, D)).astype(np.float32) * 0.05, t)
    onehot = np.zeros((B, N, K), np.float32)
    onehot[0, np.arange(N), rng.integers(0, K, N)] = 1.0
    e = bits(onehot, t)
    ref = R.ref_similarity(torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t)), tau=tau).numpy()
    text = lower(B, N, D, K, t, tau, False, False, VARIANTS["rows128"])
    got = run(text, u, e, None, K, misalign=False, threads=warp_threads(text))
    assert np.abs(got.sum(-1) - 1.0).max() > 1e-5, "the lanes' own sums should show P's rounding"
    np.testing.assert_allclose(got, ref, **R.MMA_TOL, err_msg="rows128")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_flash_mma_training_forward_lse(variant):
    """similarity_inform_fwd: the mixed probabilities and each row's log-sum-exp (natural units: m2 ln 2 + ln l,
    which the backward recomputes p from), causal with a key mask, against float64 (the lse within 1e-2
    absolute: the weights are exact f32 here, the logits' products of bf16 operands are exact; what is left
    is P's rounding in the sum of sum-mma)."""
    rng = np.random.default_rng(5)
    B, N, D, K, t, tau = 2, 150, 64, 16, "bf16", 0.5
    u = bits(rng.standard_normal((B, N, D)).astype(np.float32) * 0.3, t)
    e = rng.random((B, N, K)).astype(np.float32)
    e = bits(e / e.sum(-1, keepdims=True), t)
    mask = rng.random((B, N)) > 0.3
    mask[:, 0] = True                      # every causal row sees a key
    text = (f"func.func @f(%u: tensor<{B}x{N}x{D}x{t}>, %e: tensor<{B}x{N}x{K}x{t}>, %m: tensor<{B}x{N}xi1>) -> "
            f"(tensor<{B}x{N}x{K}xf32>, tensor<{B}x{N}xf32>) {{\n"
            f"  %p, %lse = moe.similarity_inform_fwd %u, %e key_mask(%m : tensor<{B}x{N}xi1>) tau({tau:e}) "
            f"causal(true) : tensor<{B}x{N}x{D}x{t}>, tensor<{B}x{N}x{K}x{t}> -> tensor<{B}x{N}x{K}xf32>, "
            f"tensor<{B}x{N}xf32>\n  return %p, %lse : tensor<{B}x{N}x{K}xf32>, tensor<{B}x{N}xf32>\n}}\n")
    text = simt.lower(MOE_OPT, text, f"{BASE64} {VARIANTS[variant]}")
    p = np.full((B, N, K), np.nan, np.float32)
    lse = np.full((B, N), np.nan, np.float32)
    mem = simt.Memory()
    args = [u, u, e, mask, p, lse]
    for a in args:
        mem.add(a, None)
    kernel = "similarity_inform_fwd_mma_0"
    body = simt.parse(text, kernel)
    wg, dyn = shared_memory(text, kernel)
    threads = warp_threads(text)
    simt.run_kernel(body, args, BLOCK, (-(-N // block_rows(text)), B), mem, workgroup=wg, lockstep=not threads,
                    dynamic_smem=dyn, async_copies="wait", warp_threads=threads)
    uu, ee, mm = (torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t)), torch.from_numpy(mask))
    np.testing.assert_allclose(p, R.ref_similarity(uu, ee, tau=tau, causal=True, key_mask=mm).numpy(), **R.MMA_TOL)
    ref_lse = torch.logsumexp(R.similarity_logits(uu, tau, True, None, mm), -1).numpy()
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-2)


#: The default kernel pair: the 128-row kernel with its keys split 4 ways at most (the lazy rescale, 3 stages) and
#: the combine; on top of BASE64, whose key-splits=1 it overrides.
SPLIT = "flash-mma-block-rows=128 flash-mma-key-splits=4"


def host_splits(N, B, Nk, cols=64, most=4):
    """launchSplitFlashMixMma's choice: min(most, ceil(264 / blocks), key tiles), at least 1."""
    blocks = -(-N // 128) * B
    return max(1, min(most, -(-264 // blocks), max(1, -(-Nk // cols))))


@pytest.mark.parametrize("name,causal,masked,with_lse", [
    ("ragged", False, False, False), ("causal", True, False, False), ("masked", False, True, False),
    ("causal_masked_lse", True, True, True)])
@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("copies", ["issue", "wait"])
def test_flash_mma_key_splits(name, causal, masked, with_lse, splits, copies):
    """flash-mma-key-splits: the 128-row kernel with its keys split over the grid's z (the host's choice, 4 here,
    and other counts the kernel must take as well: 1, and 3 over 5 key tiles: uneven shares, empty shares of the
    causal blocks), its partial rows combined by the second kernel, against float64 (p, and the lse of the training
    forward); with one split also the direct kernel the host then launches instead. Each copy lands at its issue
    and, again, at its wait (the shares start at any tile: the pipeline's buffers are the tiles' indices mod 3, its
    prologue two groups from the share's first tile)."""
    check_key_splits(SPLIT, "bf16", causal, masked, with_lse, splits, copies)


def check_key_splits(options, t, causal, masked, with_lse, splits, copies):
    """The split kernel of `options` (on top of BASE64) with `splits` splits (None: the host's count) and its
    combine against float64, and with one split the direct kernel too (test_flash_mma_key_splits)."""
    rng = np.random.default_rng(13)
    # K = 12 in the lse case: the unfused combine merges 8 columns a pass over the splits, then the last 4.
    B, N, D, K, tau = 2, 300, 64, 12 if with_lse else 16, 0.5 if causal else 1.0
    u = bits(rng.standard_normal((B, N, D)).astype(np.float32) * 0.3, t)
    e = rng.random((B, N, K)).astype(np.float32)
    e = bits(e / e.sum(-1, keepdims=True), t)
    mask = None
    if masked:
        mask = rng.random((B, N)) > 0.3
        mask[:, 0] = True
        if not causal:
            mask[1] = False                # every key masked: p = 0
    op = "similarity_inform_fwd" if with_lse else "similarity_inform"
    mask_attr = f" key_mask(%m : tensor<{B}x{N}xi1>)" if masked else ""
    marg = f", %m: tensor<{B}x{N}xi1>" if masked else ""
    res = f"tensor<{B}x{N}x{K}xf32>" + (f", tensor<{B}x{N}xf32>" if with_lse else "")
    outs = "%p, %lse" if with_lse else "%p"
    text = (f"func.func @f(%u: tensor<{B}x{N}x{D}x{t}>, %e: tensor<{B}x{N}x{K}x{t}>{marg}) -> ({res}) {{\n"
            f"  {outs} = moe.{op} %u, %e{mask_attr} tau({tau:e}){' causal(true)' if causal else ''} : "
            f"tensor<{B}x{N}x{D}x{t}>, tensor<{B}x{N}x{K}x{t}> -> {res}\n  return {outs} : {res}\n}}\n")
    text = simt.lower(MOE_OPT, text, f"{BASE64} {options}")   # cached: the split counts and copy timings share it
    # _mma_0: the direct kernel the host launches where it picks one split (below); _mma_1 the split kernel.
    kernel = f"{op}_mma_1"
    combine = simt.parse(text, f"{op}_mma_combine_0")
    S = splits or host_splits(N, B, N)
    p = np.full((B, N, K), np.nan, np.float32)
    lse = np.full((B, N), np.nan, np.float32)
    ws = np.full((S, B, N, K + 2), np.nan, np.float32)   # every split writes every row of its blocks
    mem = simt.Memory()
    outs = [p] + ([lse] if with_lse else [])
    args = [u, u, e] + ([mask] if masked else []) + outs + [ws]
    for a in args:
        mem.add(a, None)
    body = simt.parse(text, kernel)
    wg, dyn = shared_memory(text, kernel)
    threads = warp_threads(text)
    simt.run_kernel(body, args, BLOCK, (-(-N // 128), B, S), mem, workgroup=wg, lockstep=not threads,
                    dynamic_smem=dyn, async_copies=copies, warp_threads=threads)
    assert not np.isnan(ws).any(), "a split left a row of the workspace unwritten"
    simt.run_kernel(combine, [ws] + outs, BLOCK, -(-(B * N) // BLOCK), mem)
    uu, ee = torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t))
    mm = torch.from_numpy(mask) if masked else None
    np.testing.assert_allclose(p, R.ref_similarity(uu, ee, tau=tau, causal=causal, key_mask=mm).numpy(), **R.MMA_TOL)
    if with_lse:
        ref_lse = torch.logsumexp(R.similarity_logits(uu, tau, causal, None, mm), -1).numpy()
        np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-2)
    if masked and not causal:
        assert np.all(p[1] == 0.0), "a fully masked element's rows must be zeros"
    if splits == 1:
        # The direct 128-row kernel (the same tiles, no workspace): what a decode step runs.
        p.fill(np.nan)
        lse.fill(np.nan)
        kernel, direct_args = f"{op}_mma_0", args[:-1]
        direct = simt.parse(text, kernel)
        wg, dyn = shared_memory(text, kernel)
        simt.run_kernel(direct, direct_args, BLOCK, (-(-N // 128), B, 1), mem, workgroup=wg, lockstep=not threads,
                        dynamic_smem=dyn, async_copies=copies, warp_threads=threads)
        np.testing.assert_allclose(p, R.ref_similarity(uu, ee, tau=tau, causal=causal, key_mask=mm).numpy(),
                                   **R.MMA_TOL)
        if with_lse:
            np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-2)


def test_flash_mma_d256_causal():
    """The issue's second shape in small: causal, D = 256, K = 64 on the default block rows (one row tile: the
    128-row form's two do not fit the registers, and the whole tiles are not peeled past 128 features: every tile
    the checked one), N = 100 over four 32-key tiles."""
    rng = np.random.default_rng(3)
    B, N, D, K, t, tau = 1, 100, 256, 64, "bf16", 1.0
    # Four clusters: a row's keys of its cluster compete at logits ~6 (random rows would have their own key's
    # logit far above every other, which a wrong feature order leaves in place: q = k).
    centers = rng.standard_normal((4, D)).astype(np.float32) * 0.15
    u = centers[np.arange(N) % 4][None] + rng.standard_normal((B, N, D)).astype(np.float32) * 0.05
    u = bits(u, t)
    e = rng.random((B, N, K)).astype(np.float32)
    e = bits(e / e.sum(-1, keepdims=True), t)
    text = lower(B, N, D, K, t, tau, True, False, VARIANTS["rows128"])
    assert block_rows(text) == 64, "D = 256 takes one row tile a warp"
    got = run(text, u, e, None, K, misalign=False, threads=warp_threads(text))
    ref = R.ref_similarity(torch.from_numpy(values(u, t)), torch.from_numpy(values(e, t)), tau=tau,
                           causal=True).numpy()
    np.testing.assert_allclose(got, ref, **R.MMA_TOL)


@pytest.mark.parametrize("D", [64, 256])
def test_attention_posterior_mixing(D):
    """attention_posterior's mixing on the tensor-core kernel (one row tile a warp: its per-element bias and score
    loads; at D = 256 single-buffered with the lanes' own sums): the kernel alone, on head means, bias and scores
    given here, against
    float64 softmax_j(<u_i, m_j> / sigma^2 + bias_j + s[b, h*, i, j]) e. Two batch elements with different heads,
    N = 100 (a partial key tile, rows past N), scores large enough that the bias and the scores decide the weights."""
    rng = np.random.default_rng(41)
    B, H, N, K, sigma, t = 2, 4, 100, 16, 1.5, "bf16"
    u = bits(rng.standard_normal((B, N, D)).astype(np.float32) * 0.2, t)
    means = bits(rng.standard_normal((B, N, D)).astype(np.float32) * 0.2, t)
    e = rng.random((B, N, K)).astype(np.float32)
    e = bits(e / e.sum(-1, keepdims=True), t)
    bias = (rng.standard_normal((B, N)) * 1.5).astype(np.float32)
    s = (rng.standard_normal((B, H, N, N)) * 2.0).astype(np.float32)
    head = np.array([1, 3], np.int32)
    ts = [f"tensor<{B}x{H}x{N}x{N}xf32>", f"tensor<{B}x{N}x{D}x{t}>", f"tensor<{B}x{H}x{N}x16xf32>",
          f"tensor<{D}x64xf32>", f"tensor<{B}x{N}x{K}x{t}>"]
    res = f"tensor<{B}x{N}x{K}xf32>, tensor<{B}xi32>"
    text = (f"func.func @f(%s: {ts[0]}, %u: {ts[1]}, %v: {ts[2]}, %wo: {ts[3]}, %e: {ts[4]}) -> ({res}) {{\n"
            f"  %p, %h = moe.attention_posterior %s, %u, %v, %wo, %e sigma({sigma:e}) : {', '.join(ts)} -> {res}\n"
            f"  return %p, %h : {res}\n}}\n")
    text = simt.lower(MOE_OPT, text, f"{BASE64} {VARIANTS['rows128']}")
    out = np.full((B, N, K), np.nan, np.float32)
    mem = simt.Memory()
    args = [u, means, e, bias, s, head, out]
    for a in args:
        mem.add(a, None)
    kernel = "attention_posterior_mma_0"
    body = simt.parse(text, kernel)
    wg, dyn = shared_memory(text, kernel)
    simt.run_kernel(body, args, BLOCK, (-(-N // 64), B), mem, workgroup=wg, lockstep=True, dynamic_smem=dyn,
                    async_copies="wait")
    uu, mm, ee = values(u, t), values(means, t), values(e, t)
    logits = np.einsum("bid,bjd->bij", uu, mm) / sigma ** 2 + bias[:, None, :].astype(np.float64) + \
        s[np.arange(B), head].astype(np.float64)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    ref = np.einsum("bij,bjk->bik", w / w.sum(-1, keepdims=True), ee)
    np.testing.assert_allclose(out, ref, **R.MMA_TOL)
