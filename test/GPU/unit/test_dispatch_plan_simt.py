"""moe.dispatch_plan's three GPU kernels as moe-opt emits them, run without a GPU: each case is lowered with
`moe-opt --convert-moe-to-gpu --mlir-print-op-generic` and its gpu.funcs executed by simt.py in the order the host
code launches them (dispatch_counts and dispatch_scatter one warp a chunk of 1024 assignments, dispatch_scan one
block of 256 threads in lockstep), then compared with the GPU harness's plain-Python plan (run_gpu_tests.
ref_dispatch_plan), every entry of every result. The results and the scratch buffer start as garbage: the plan has
no memsets on the host any more, so an entry the kernels forget to write shows. Indices: random, empty experts,
every assignment on one expert over several chunks, T = 1, T = 0, out of range (the error word), i64, and the
indices moe.route's kernel has just written (route followed by dispatch_plan is lowered as one chain).
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

CHUNK = 1024        # assignments a chunk warp takes (DispatchPlan.cpp's kChunk)
SCAN_THREADS = 256  # the scan block (kScanThreads)
GARBAGE = 0x5A5A5A5A
#: The plan's result types after the indices type, for E experts.
PLAN_TYPES = "tensor<{E}xi32>, tensor<{E1}xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32>, tensor<1xi32>"


def moe_opt(text, options=""):
    return simt.lower(MOE_OPT, text, options)


def lower_plan(E, k, B, itype="i32"):
    types = PLAN_TYPES.format(E=E, E1=E + 1)
    text = (f"func.func @f(%i: tensor<?x{k}x{itype}>) -> ({types}) {{\n"
            f"  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %i num_experts({E}) block_size({B}) : "
            f"tensor<?x{k}x{itype}> -> {types}\n"
            f"  return %c, %o, %ord, %inv, %p, %b, %n : {types}\n}}\n")
    return moe_opt(text)


def garbage(n):
    return np.full(n, GARBAGE, dtype=np.int32)


def run_plan(text, idx, E, B, suffix="0"):
    """The three kernels on idx [T, k] (i32 or i64): the seven results and the error word."""
    T, k = idx.shape
    N = T * k
    chunks = -(-N // CHUNK)
    padded = N + E * (B - 1)
    res = [garbage(E), garbage(E + 1), garbage(N), garbage(N), garbage(padded), garbage(-(-padded // B)),
           garbage(1)]
    scratch = garbage(chunks * E + E + 1)
    word = np.zeros(5, dtype=np.int64)
    mem = simt.Memory()
    for a in [idx, scratch, word] + res:
        mem.add(a, None)
    word_addr = np.int64(mem.buffers[2][0])
    counts, offsets, order, inverse, padded_order, blocks, num = res
    kernels = [
        (f"dispatch_counts_{suffix}", [idx, scratch, word_addr], 32, chunks, False),
        (f"dispatch_scan_{suffix}", [idx, scratch, counts, offsets, blocks, num, order, padded_order],
         SCAN_THREADS, 1, True),
        (f"dispatch_scatter_{suffix}", [idx, scratch, offsets, order, inverse, padded_order], 32, chunks, False),
    ]
    for name, args, block, grid, lockstep in kernels:
        body = simt.parse(text, name)
        # The kernel's arguments as DispatchPlan.cpp passes them, then its one workgroup buffer.
        assert len(body[0][0]) == len(args) + 1, (name, body[0][0])
        args = [np.full(simt.LANES if not lockstep else block, a) if isinstance(a, np.int64) else a for a in args]
        if grid:  # the runtime launches nothing for an empty grid
            simt.run_kernel(body, args, block, grid, mem, workgroup=[((E,), np.int32)], lockstep=lockstep)
    return res, word


def check(text, idx, E, B, suffix="0"):
    got, word = run_plan(text, idx, E, B, suffix)
    want = R.ref_dispatch_plan(torch.from_numpy(idx.astype(np.int64)), E, B)
    names = ["counts", "offsets", "order", "inverse", "padded_order", "block_experts", "num_padded"]
    for name, g, w in zip(names, got, want):
        assert np.array_equal(g, w.numpy()), f"{name}: {g.tolist()[:64]} != {w.tolist()[:64]}"
    bad = (idx < 0) | (idx >= E)
    assert (word[0] != 0) == bool(bad.any()), word
    if bad.any():
        n = int(word[2])
        assert word[1] != 0 and bad.reshape(-1)[n] and word[3] == idx.reshape(-1)[n] and word[4] == E, word


def indices(T, k, E, rng, kind):
    if kind == "random":
        return rng.integers(0, E, (T, k)).astype(np.int32)
    if kind == "few_experts":      # most experts empty
        return rng.integers(0, 3, (T, k)).astype(np.int32) * (E // 3)
    if kind == "one_expert":       # every assignment on one expert, over several chunks
        return np.full((T, k), E - 1, dtype=np.int32)
    if kind == "out_of_range":
        x = rng.integers(0, E, (T, k)).astype(np.int32)
        x.reshape(-1)[[3, 5, -1]] = [-1, E, E + 7]
        return x
    raise ValueError(kind)


# (E, k, B, T, kind): DeepSeek-V3's plan at decode and over chunks, odd E, B = 1, T = 1 and 0.
CASES = [
    (256, 8, 64, 64, "random"),
    (256, 8, 64, 300, "random"),          # 2400 assignments: 3 chunks
    (256, 8, 64, 300, "one_expert"),
    (256, 8, 64, 40, "few_experts"),
    (256, 8, 64, 1, "random"),
    (256, 8, 64, 0, "random"),
    (160, 6, 16, 50, "random"),
    (7, 2, 1, 600, "random"),             # 1200 assignments, B = 1: no padding
    (37, 3, 5, 20, "out_of_range"),
]


@pytest.mark.parametrize("E,k,B,T,kind", CASES, ids=[f"E{c[0]}_k{c[1]}_B{c[2]}_T{c[3]}_{c[4]}" for c in CASES])
def test_plan_equals_reference(E, k, B, T, kind):
    rng = np.random.default_rng(E * 131 + T)
    check(lower_plan(E, k, B), indices(T, k, E, rng, kind), E, B)


def test_i64_indices():
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 64, (100, 4)).astype(np.int64)
    check(lower_plan(64, 4, 8, "i64"), idx, 64, 8)


def route_then_plan(options):
    """DeepSeek-V3's route followed by its plan, lowered as one chain."""
    types = PLAN_TYPES.format(E=256, E1=257)
    text = ("func.func @f(%x: tensor<?x256xf32>, %bias: tensor<256xf32>) -> (tensor<?x8xf32>, " + types + ") {\n"
            "  %w, %i = moe.route %x bias(%bias : tensor<256xf32>) k(8) scoring(sigmoid) n_group(8) "
            "topk_group(4) renormalize(true) : tensor<?x256xf32> -> tensor<?x8xf32>, tensor<?x8xi32>\n"
            "  %c, %o, %ord, %inv, %p, %b, %n = moe.dispatch_plan %i num_experts(256) block_size(64) : "
            "tensor<?x8xi32> -> " + types + "\n"
            "  return %w, %c, %o, %ord, %inv, %p, %b, %n : tensor<?x8xf32>, " + types + "\n}\n")
    return moe_opt(text, options)


def test_route_then_plan_lanes():
    """The lanes route kernel's indices (ties, -inf rows) go straight into the plan's kernels."""
    E, k, B, T = 256, 8, 64, 37
    out = route_then_plan("route-map=lanes")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((T, E)).astype(np.float32)
    x[1] = 0.0                       # ties everywhere
    x[2] = -np.inf
    bias = (rng.random(E) * 0.1).astype(np.float32)
    w = np.zeros((T, k), np.float32)
    idx = np.full((T, k), GARBAGE, np.int32)
    mem = simt.Memory()
    for a in (x, bias, w, idx):
        mem.add(a, None)
    body = simt.parse(out, "route_lanes_0")
    smem = int(re.search(r"memref<(\d+)xf32, #gpu.address_space<workgroup>>", out).group(1))
    simt.run_kernel(body, [x, bias, w, idx], 128, -(-T // 16), mem, smem_shape=(smem,))
    assert ((idx >= 0) & (idx < E)).all()
    check(out, idx, E, B)


def test_route_then_plan_warp_kernel():
    """The warp route kernel's chain: its plan kernels on the reference's indices (simt.py does not run the
    warp kernel's epilogue)."""
    out = route_then_plan("route-map=warp")
    assert '"route_warp_0"' in out
    rng = np.random.default_rng(6)
    check(out, rng.integers(0, 256, (45, 8)).astype(np.int32), 256, 64)
