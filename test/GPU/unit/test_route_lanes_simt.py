"""route-map=lanes's kernel as moe-opt emits it, run without a GPU: each case is lowered with
`moe-opt --convert-moe-to-gpu="route-map=lanes" --mlir-print-op-generic` and its gpu.func executed warp by warp in
lockstep by simt.py (shuffles, redux, votes, the 16-byte loads' inline assembly, shared memory, divergent stores),
then compared with the GPU harness's float64 reference (run_gpu_tests.ref_route) as the harness compares the GPU's
results: indices equal where no near-tie reorders them (the reference's choice values at our indices), weights
within rtol 1e-4. Rows: sorted either way (the best experts crowd a lane's list: refills), -inf, NaN, ties, zeros,
and the same rows misaligned by 4 bytes (the 4-byte-load fallback). ex2.approx/rcp.approx run as exact f32, so the
SFU's ulps are the GPU run's to check. Needs moe-opt ($MOE_OPT, else build/bin/moe-opt): skipped without it.
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

MLIR_TYPES = {np.float32: "f32", np.float16: "f16", "bf16": "bf16"}


def lower(E, k, dtype, bias, attrs, replay=None, kernel="route_lanes_0", index="i32"):
    """The module of one moe.route (with `replay`, an index type: the choice given) lowered with route-map=lanes;
    `kernel`: the kernel it must run (route_loop_0 where the lanes' layout takes no shape); `index`: the indices'
    element type (i32, or i64 as torch.topk gives them)."""
    t = MLIR_TYPES[dtype]
    b = f" bias(%b : tensor<{E}xf32>)" if bias else ""
    arg = f", %b: tensor<{E}xf32>" if bias else ""
    r = f" replay(%r : tensor<?x{k}x{replay}>)" if replay else ""
    arg += f", %r: tensor<?x{k}x{replay}>" if replay else ""
    text = (f"func.func @f(%x: tensor<?x{E}x{t}>{arg}) -> (tensor<?x{k}xf32>, tensor<?x{k}x{index}>) {{\n"
            f"  %w, %i = moe.route %x{b}{r} k({k}) {attrs} : tensor<?x{E}x{t}> -> tensor<?x{k}xf32>, "
            f"tensor<?x{k}x{index}>\n  return %w, %i : tensor<?x{k}xf32>, tensor<?x{k}x{index}>\n}}\n")
    out = simt.lower(MOE_OPT, text, "route-map=lanes")
    assert f'"{kernel}"' in out, f"not {kernel}"
    return out


def bf16_bits(x):
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def run(text, x, bias, k, misalign=False, given=None, kernel="route_lanes_0", index=np.int32):
    """The kernel on x [T, E] (f32, f16, or bf16 bits as uint16): (weights, indices of dtype `index`), and with the
    choice `given` [T, k] (a replaying kernel) the error word [5] too."""
    body = simt.parse(text, kernel)
    T = x.shape[0]
    w = np.zeros((T, k), np.float32)
    i = np.full((T, k), -1, index)
    word = np.zeros(5, dtype=np.int64)
    mem = simt.Memory()
    arrays = [x] + ([bias] if bias is not None else []) + [w, i] + ([given, word] if given is not None else [])
    for a in arrays:
        mem.add(a, None, misalign_bytes=4 if (misalign and a is x) else 0)
    args = arrays if given is None else arrays[:-1] + [np.full(simt.LANES, np.int64(mem.buffers[-1][0]))]
    smem = re.search(r"memref<(\d+)xf32, #gpu.address_space<workgroup>>", text)  # none in the loop kernel
    # The token's lanes W: the divisor of the kernel's first remui (tid % W).
    width = int(re.search(r'value = (\d+) : index\}> : \(\) -> index\n\s*%\d+ = "arith.remui"', text).group(1))
    # The block the lowering sized (routeLanesBlockSize: halved where 128 threads' shared memory would not fit).
    block = int(re.search(r'known_block_size = array<i32: (\d+), 1, 1>', text).group(1))
    simt.run_kernel(body, args, block, -(-T // (block // width)), mem,
                    smem_shape=(int(smem.group(1)),) if smem else None)
    return (w, i) if given is None else (w, i, word)


def adversarial(x, rng):
    x[0] = np.sort(x[0])[::-1]
    x[1] = np.sort(x[1])
    x[2] = -np.inf
    x[3, 5] = np.nan
    x[4] = rng.integers(-2, 3, x.shape[1])
    x[5, ::3] = -np.inf
    x[6] = 0.0
    return x


def inputs(x32, dtype):
    """(the kernel's x, as simt.py holds it: 16-bit floats as their bits; the reference's f32 tensor of it)."""
    if dtype == "bf16":
        x = bf16_bits(x32)
        return x, torch.from_numpy((x.astype(np.uint32) << 16).view(np.float32))
    x = x32.astype(dtype)
    xref = torch.from_numpy(x.astype(np.float32))
    return (x.view(np.uint16) if dtype == np.float16 else x), xref


# (E, k, dtype, bias, attributes, reference keywords): the harness's models and route_shapes_*, plus E = 2048.
CASES = [
    (256, 8, np.float32, True, "scoring(sigmoid) n_group(8) topk_group(4) renormalize(true) "
     "routed_scaling_factor(2.500000e+00)", dict(scoring="sigmoid", n_group=8, topk_group=4, renormalize=True,
                                                 scale=2.5)),
    (384, 8, "bf16", True, "scoring(sigmoid) renormalize(true) routed_scaling_factor(2.827000e+00)",
     dict(scoring="sigmoid", renormalize=True, scale=2.827)),
    (160, 6, np.float32, False, "n_group(8) topk_group(3) group_score(max) routed_scaling_factor(1.600000e+01)",
     dict(n_group=8, topk_group=3, group_score="max", scale=16.0)),
    (128, 8, np.float16, False, "renormalize(true)", dict(renormalize=True)),
    (20, 4, np.float32, False, "order(topk_then_score)", dict(order="topk_then_score")),
    (16, 1, np.float32, False, "scoring(sigmoid) order(topk_then_score)",
     dict(scoring="sigmoid", order="topk_then_score")),
    (6, 6, np.float32, False, "renormalize(true)", dict(renormalize=True)),
    (288, 32, np.float32, False, "renormalize(true)", dict(renormalize=True)),
    (896, 16, "bf16", True, "scoring(sigmoid) renormalize(true)", dict(scoring="sigmoid", renormalize=True)),
    (1024, 8, np.float32, True, "scoring(sigmoid) n_group(8) topk_group(4) renormalize(true)",
     dict(scoring="sigmoid", n_group=8, topk_group=4, renormalize=True)),
    (256, 8, np.float16, False, "n_group(4) topk_group(2) group_score(max) renormalize(true)",
     dict(n_group=4, topk_group=2, group_score="max", renormalize=True)),
    (192, 6, np.float32, True, "scoring(sigmoid) n_group(6) topk_group(3) renormalize(true)",
     dict(scoring="sigmoid", n_group=6, topk_group=3, renormalize=True)),
    (64, 8, np.float32, False, "n_group(16) topk_group(4) renormalize(true)",
     dict(n_group=16, topk_group=4, renormalize=True)),
    (2048, 8, np.float32, False, "renormalize(true)", dict(renormalize=True)),
    # Issue #48 item 4's shapes without caps: 32 groups of 64 (a group a lane), 64 of 64 (two a lane), E = 4096
    # and 3000 and 4095 (128 and 96 experts a lane, 64-thread blocks), k = 64, groups of 33 and 100 experts.
    (2048, 8, np.float32, True, "scoring(sigmoid) n_group(32) topk_group(4) renormalize(true)",
     dict(scoring="sigmoid", n_group=32, topk_group=4, renormalize=True)),
    (4096, 64, np.float32, False, "renormalize(true)", dict(renormalize=True)),
    (4096, 16, "bf16", True, "scoring(sigmoid) n_group(64) topk_group(8) renormalize(true)",
     dict(scoring="sigmoid", n_group=64, topk_group=8, renormalize=True)),
    (3000, 64, np.float32, False, "scoring(sigmoid) renormalize(true)", dict(scoring="sigmoid", renormalize=True)),
    # 128 f32 logits and biases a lane: the keys formed 64 slots at a time (2P floats spilled before), a softmax's
    # statistics from the chunks first.
    (4096, 8, np.float32, True, "scoring(sigmoid) n_group(64) topk_group(8) renormalize(true)",
     dict(scoring="sigmoid", n_group=64, topk_group=8, renormalize=True)),
    (4000, 8, np.float32, True, "n_group(8) topk_group(4) renormalize(true)",
     dict(n_group=8, topk_group=4, renormalize=True)),
    (4095, 32, np.float16, False, "order(topk_then_score) renormalize(true)",
     dict(renormalize=True, order="topk_then_score")),
    (264, 8, np.float32, True, "scoring(sigmoid) n_group(8) topk_group(4) renormalize(true)",
     dict(scoring="sigmoid", n_group=8, topk_group=4, renormalize=True)),
    (1000, 8, np.float32, False, "n_group(10) topk_group(3) renormalize(true)",
     dict(n_group=10, topk_group=3, renormalize=True)),
    (100, 64, np.float32, False, "n_group(5) topk_group(4)", dict(n_group=5, topk_group=4)),
    # Groups that neither split evenly over lanes nor fit whole on one (more than 1024 experts: the lanes' layout
    # padded, a group over q lanes with the last slots empty): 3 of 700 over 8 lanes of 88, 2 of 513 over 16 of 33.
    (2100, 8, np.float32, True, "scoring(sigmoid) n_group(3) topk_group(2) renormalize(true)",
     dict(scoring="sigmoid", n_group=3, topk_group=2, renormalize=True)),
    (1026, 8, "bf16", False, "n_group(2) topk_group(1) renormalize(true)",
     dict(n_group=2, topk_group=1, renormalize=True)),
]


# The loop kernel (Route.cpp): shapes past 1024 experts that the lanes' layout does not take, groups needing more
# than 128 slots a lane (5 of 819, 17 of 129, 33 of 65, 64 of 65), more than 4096 experts.
LOOP_CASES = [
    (4095, 8, np.float32, True, "scoring(sigmoid) n_group(5) topk_group(2) renormalize(true) "
     "routed_scaling_factor(2.500000e+00)", dict(scoring="sigmoid", n_group=5, topk_group=2, renormalize=True,
                                                 scale=2.5)),
    (2193, 6, "bf16", False, "n_group(17) topk_group(3) group_score(max) renormalize(true)",
     dict(n_group=17, topk_group=3, group_score="max", renormalize=True)),
    (2145, 8, np.float16, True, "scoring(sigmoid) n_group(33) topk_group(4) renormalize(true)",
     dict(scoring="sigmoid", n_group=33, topk_group=4, renormalize=True)),
    (4160, 8, np.float32, True, "scoring(sigmoid) n_group(64) topk_group(8) renormalize(true)",
     dict(scoring="sigmoid", n_group=64, topk_group=8, renormalize=True)),
    (5000, 12, np.float32, False, "order(topk_then_score) renormalize(true)",
     dict(renormalize=True, order="topk_then_score")),
]


@pytest.mark.parametrize("E,k,dtype,has_bias,attrs,ref", CASES,
                         ids=[f"E{c[0]}_k{c[1]}_{c[4].split()[0]}" for c in CASES])
def test_kernel_equals_reference(E, k, dtype, has_bias, attrs, ref):
    check_kernel(E, k, dtype, has_bias, attrs, ref, T=21, kernel="route_lanes_0", misaligned=(False, True))


@pytest.mark.parametrize("E,k,dtype,has_bias,attrs,ref", LOOP_CASES,
                         ids=[f"E{c[0]}_k{c[1]}_{c[4].split()[0]}" for c in LOOP_CASES])
def test_loop_kernel_equals_reference(E, k, dtype, has_bias, attrs, ref):
    check_kernel(E, k, dtype, has_bias, attrs, ref, T=9, kernel="route_loop_0", misaligned=(False,))


def check_kernel(E, k, dtype, has_bias, attrs, ref, T, kernel, misaligned):
    """`kernel` on T adversarial rows (a partial last block at T = 21) against the float64 reference, the rows
    misaligned by 4 bytes too where `misaligned` says so."""
    rng = np.random.default_rng(E * 7 + k)
    x, xref = inputs(adversarial(rng.standard_normal((T, E)).astype(np.float32), rng), dtype)
    bias = (rng.random(E) * 0.1).astype(np.float32) if has_bias else None
    text = lower(E, k, dtype, has_bias, attrs, kernel=kernel)
    for misalign in misaligned:
        w, i = run(text, x, bias, k, misalign, kernel=kernel)
        rw, ri, rc = R.ref_route(xref, None if bias is None else torch.from_numpy(bias), k, **ref)
        # Near-ties of the f32 choice values may order differently from float64 (check_route's rule).
        full = R.ref_route(xref, None if bias is None else torch.from_numpy(bias), E,
                           **dict(ref, renormalize=False, scale=1.0))
        c = torch.full((T, E), float("nan"), dtype=torch.float64)
        c.scatter_(1, full[1].long(), full[2])
        torch.testing.assert_close(c.gather(1, torch.from_numpy(i).long()), rc, rtol=1e-5, atol=1e-6,
                                   equal_nan=True, msg=lambda m: f"choice values (misaligned={misalign}): {m}")
        assert ((i >= 0) & (i < E)).all()
        assert all(len(set(row)) == k for row in i.tolist()), "an expert picked twice"
        torch.testing.assert_close(torch.from_numpy(w), rw, rtol=1e-4, atol=1e-5, equal_nan=True,
                                   msg=lambda m: f"weights (misaligned={misalign}): {m}")


# The softmax routers (the row's sum over the token's lanes), an elementwise score with groups, the score after the
# choice, k = 64 over 4096 experts (several slots a lane), k not a multiple of the lanes, padded groups.
# The loop kernel's too: a softmax router of 17 groups of 129.
REPLAY_CASES = ([c + ("route_lanes_0",) for c in CASES
                 if c[:2] in {(160, 6), (128, 8), (20, 4), (288, 32), (4096, 64), (256, 8), (6, 6), (1026, 8),
                              (4000, 8)}] +
                [c + ("route_loop_0",) for c in LOOP_CASES if c[:2] == (2193, 6)])


@pytest.mark.parametrize("E,k,dtype,has_bias,attrs,ref,kernel", REPLAY_CASES,
                         ids=[f"E{c[0]}_k{c[1]}_{c[4].split()[0]}" for c in REPLAY_CASES])
def test_replay_of_own_choice_is_bit_for_bit(E, k, dtype, has_bias, attrs, ref, kernel):
    """Routing replay on the lanes kernel (issue #48 item 5; the H200 run of 2026-11-26 found DeepSeek-V2's softmax
    router replayed through the warp kernel a bit off: its row sum in another order), and on the loop kernel: the
    router's own choice given back gives its weights bit for bit; given indices (i32 and i64, a repeated expert)
    weigh as the reference; one outside [0, E) is reported through the error word (op code 5, position, value, E)
    and read as expert 0."""
    rng = np.random.default_rng(E * 11 + k)
    T = 21
    x32 = adversarial(rng.standard_normal((T, E)).astype(np.float32), rng)
    x32[2] = rng.standard_normal(E)              # a row of -inf has no weights to compare bit for bit (NaN)
    x, xref = inputs(x32, dtype)
    bias = (rng.random(E) * 0.1).astype(np.float32) if has_bias else None
    w, i = run(lower(E, k, dtype, has_bias, attrs, kernel=kernel), x, bias, k, kernel=kernel)
    for itype, npt in (("i32", np.int32), ("i64", np.int64)):
        text = lower(E, k, dtype, has_bias, attrs, replay=itype, kernel=kernel)
        w2, i2, word = run(text, x, bias, k, kernel=kernel, given=i.astype(npt))
        assert np.array_equal(i2, i) and word[0] == 0
        assert np.array_equal(w2.view(np.uint32), w.view(np.uint32)), "the own choice's weights not bit for bit"
        given = rng.integers(0, E, (T, k)).astype(npt)
        given[0] = given[0, 0]                   # one expert k times
        w3, i3, word = run(text, x, bias, k, kernel=kernel, given=given)
        assert np.array_equal(i3, given.astype(np.int32)) and word[0] == 0
        want = R.ref_route(xref, None, k, **ref, replay=torch.from_numpy(given))[0]
        torch.testing.assert_close(torch.from_numpy(w3), want, rtol=1e-4, atol=1e-5, equal_nan=True)
        bad = given.copy()
        bad[3, k - 1], bad[5, 0] = E, -1
        w4, i4, word = run(text, x, bias, k, kernel=kernel, given=bad)
        # The first recorded wins; which of the two is first depends on the slots' order.
        assert word[0] != 0 and word[1] == 5 and word[4] == E, word
        assert (int(word[2]), int(word[3])) in {(3 * k + k - 1, E), (5 * k, -1)}, word
        assert i4[3, k - 1] == 0 and i4[5, 0] == 0


@pytest.mark.parametrize("E,k,dtype,has_bias,attrs,ref,kernel", [
    (*CASES[0], "route_lanes_0"), (*LOOP_CASES[0], "route_loop_0")],
    ids=["lanes", "loop"])
def test_i64_indices_are_the_i32_ones(E, k, dtype, has_bias, attrs, ref, kernel):
    """Indices written as i64 (as torch.topk gives them): the same kernel selecting in i32 and sign-extending each
    index at its store; the same weights bit for bit and the same experts as the i32 result, in every element of
    the i64 buffer (it starts at -1: an index left unwritten, or written as 32 bits into 64, shows)."""
    rng = np.random.default_rng(E + k)
    T = 9
    x = adversarial(rng.standard_normal((T, E)).astype(np.float32), rng)
    xin = bf16_bits(x) if dtype == "bf16" else x.astype(dtype)
    bias = rng.standard_normal(E).astype(np.float32) * 0.1 if has_bias else None
    w32, i32 = run(lower(E, k, dtype, has_bias, attrs, kernel=kernel), xin, bias, k, kernel=kernel)
    w64, i64 = run(lower(E, k, dtype, has_bias, attrs, kernel=kernel, index="i64"), xin, bias, k, kernel=kernel,
                   index=np.int64)
    assert np.array_equal(w64.view(np.uint32), w32.view(np.uint32))
    assert i64.dtype == np.int64 and np.array_equal(i64, i32.astype(np.int64))
    assert ((i64 >= 0) & (i64 < E)).all()
