"""adjacency_update's CPU kernel strategies (lib/Conversion/MoEToCPU/AdjacencyUpdate.cpp) against the reference.

The kernel counts co-selections with a histogram of token masks (E <= 8, and E <= 12 from 2^E tokens on), per-token
vector row adds of the mask (E <= 64, except k = 1 with E > lanes) or per-pair scalar counting (the rest); which one runs depends on E, k and the
target's vector width, so every case runs compiled for x86-64-v3 (AVX2, 8 lanes) and x86-64-v4 (AVX-512, 16
lanes), on one worker and on two (several token blocks, so the per-worker counts are summed). Inputs: random
indices with repeated experts in a token's slots (each counts once), k = E, k = 1, E = 1, no tokens, token counts
that are not a multiple of the kernel's 512-token blocks; out-of-range indices raise the op's index error.
"""

from __future__ import annotations

import pytest
import torch

from moe_mlir import reference as R
from moe_mlir.runtime import cache, extension
from torch_checks import gen, needs_cpu_kernels, same, use_cpu_target

pytestmark = needs_cpu_kernels

@pytest.fixture(params=[("x86-64-v3", 2), ("x86-64-v4", 2), ("x86-64-v4", 1)], ids=lambda p: f"{p[0]}-t{p[1]}")
def target(request, monkeypatch):
    """Kernels compiled for this target and worker count: fresh in-process kernel tables (the extension's and the
    cache's) before and after, so that no call of this test or a later one gets a kernel of another target."""
    cpu, threads = request.param
    use_cpu_target(monkeypatch, cpu, threads)
    yield cpu
    extension.clear_kernels()


def ran_adjacency_kernel(before: int) -> bool:
    return any(k.startswith("adjacency_update|") for k in cache.stats.keys[before:])


# (E, k): histogram (E <= 8; E <= 12 from 2^E tokens on), mask rows (E <= 64, k >= 2), counting (E > 64; k = 1
# with E > lanes: E = 64, k = 1 on both targets), and E = 16, k = 1: rows on AVX-512 (one vector per row),
# counting on AVX2 (two).
SIZES = [(1, 1), (3, 3), (5, 3), (8, 2), (8, 8), (10, 3), (12, 12), (16, 1), (16, 2), (24, 4), (64, 1), (64, 2),
         (64, 8), (100, 4)]


def _indices(g, T: int, E: int, k: int, dtype) -> torch.Tensor:
    idx = torch.randint(0, E, (T, k), generator=g, dtype=dtype)
    if T > 0 and k > 1:
        rep = torch.rand(T, generator=g) < 0.3  # a third of the tokens repeat their first expert in the last slot
        idx[rep, -1] = idx[rep, 0]
        idx[0] = idx[0, 0]  # one token with all slots equal
    return idx


@pytest.mark.parametrize("E,k", SIZES, ids=[f"E{e}-k{k}" for e, k in SIZES])
def test_strategies_match_reference(target, E, k):
    """Raw counts (norm none, beta 0: exact integers) for several token counts (no tokens, one, fewer and more than
    the 512-token blocks of two workers, a ragged last block, more than 2^12: E <= 12 switches to the histogram)."""
    g = gen(100 * E + k)
    before = len(cache.stats.keys)
    for T in (0, 1, 700, 3001, 4500):
        a = torch.rand(E, E, generator=g)
        idx = _indices(g, T, E, k, torch.int32)
        for include_self in (True, False):
            same(torch.ops.moe.adjacency_update(a, idx, 0.0, "none", include_self),
                 R.adjacency_update(a, idx, 0.0, "none", include_self))
    assert ran_adjacency_kernel(before)


@pytest.mark.parametrize("E,k", [(8, 2), (64, 8)])
def test_row_norm_and_i64_indices(target, E, k):
    g = gen(7)
    a = torch.rand(E, E, generator=g)
    idx = _indices(g, 2500, E, k, torch.int64)
    same(torch.ops.moe.adjacency_update(a, idx, 0.9, "row", True), R.adjacency_update(a, idx, 0.9, "row", True))


@pytest.mark.parametrize("E,k", [(8, 2), (16, 4), (64, 8), (64, 2)])
def test_counts_are_exact_on_one_expert_pair(target, E, k):
    """Every token picks the same two experts (the worst case for a histogram bin and a row): raw counts."""
    T = 5000
    idx = torch.tensor([[E - 1, 0] + [E - 1] * (k - 2)], dtype=torch.int32).repeat(T, 1)
    out = torch.ops.moe.adjacency_update(torch.zeros(E, E), idx, 0.0, "none", True)
    ref = torch.zeros(E, E)
    for j in (0, E - 1):
        for m in (0, E - 1):
            ref[j, m] = T
    same(out, ref)


@pytest.mark.parametrize("E,k", [(8, 2), (24, 4), (64, 8), (64, 2), (100, 4)])
@pytest.mark.parametrize("bad", [-1, "E", "E+7", 1 << 40])
def test_out_of_range_index_raises(target, E, k, bad):
    bad = {"E": E, "E+7": E + 7}.get(bad, bad)
    idx = torch.randint(0, E, (1500, k), generator=gen(3))
    idx[1234, k - 1] = bad
    with pytest.raises(ValueError, match=rf"moe.adjacency_update: 'idx' holds {bad}, outside \[0, {E}\)"):
        torch.ops.moe.adjacency_update(torch.rand(E, E), idx)
    # the next valid call is unaffected
    idx[1234, k - 1] = 0
    same(torch.ops.moe.adjacency_update(torch.eye(E), idx), R.adjacency_update(torch.eye(E), idx, 0.9, "row", True))
