"""The CPU kernels whose strategy follows the target (issue #16), on x86-64-v3 (AVX2) and x86-64-v4 (AVX-512).

- topk_renorm's knockout rounds (TopkRenorm.cpp): up to 8 rows of a static K at a time, then one by one, their keys
  in scratch; the lowest index holding the top key as a max of and-ed lanes. A row of fewer than 8 key vectors scans
  them all every round and knocks the pick out with a scalar store (AVX-512 at K <= 112); a longer one (AVX2 from
  K = 57 on, both at K = 200 and 256) goes over two levels, its chunk maxima first, then the one chunk holding the top
  key, knocked out by a vector store. Inputs with ties (zeros, repeated values across chunks: the lowest chunk
  holding the top key must win), NaN, +-inf and fully masked rows, K not a multiple of the lanes (a ragged chunk, and
  a ragged vector of chunk maxima at K = 200), k = K (every entry knocked out), row counts not a multiple of four.
- mad_dispersion's column blocks are 32 features on both targets (two AVX-512 vectors, four AVX2 ones), with a
  ragged last block when D is not a multiple of 32: the result is bit-identical to the portable lowering's on both
  targets, so the targets agree bit for bit.
- hyper_router's GEMV reads two rows a step on AVX2 and one on AVX-512 (HyperRouter.cpp): odd row counts (the
  single-row remainder), a row length that is not a multiple of the lanes (masked tail), and a matrix above the
  inline bound (64-row items on the workers).
"""

from __future__ import annotations

import pytest
import torch

from moe_mlir import reference as R
from moe_mlir.runtime import extension
from torch_checks import gen, needs_cpu_kernels, same, use_cpu_target

pytestmark = needs_cpu_kernels

TARGETS = [("x86-64-v3", 2), ("x86-64-v3", 1), ("x86-64-v4", 2)]


def _run(monkeypatch, cpu: str, threads: int, fn):
    """fn() with the kernels compiled for `cpu` and `threads` workers; fresh kernel tables before and after."""
    use_cpu_target(monkeypatch, cpu, threads)
    try:
        return fn()
    finally:
        extension.clear_kernels()


def _scores(g, T: int, K: int, kind: str) -> torch.Tensor:
    x = torch.randn(T, K, generator=g)
    if kind == "ties":  # few distinct values: equal keys in every chunk, the lower index must win
        x = torch.randint(0, 3, (T, K), generator=g).float()
        x[::5] = 0.0  # whole rows of equal keys
    elif kind == "special":
        x[torch.rand(T, K, generator=g) < 0.05] = float("nan")
        x[torch.rand(T, K, generator=g) < 0.05] = float("inf")
        x[torch.rand(T, K, generator=g) < 0.2] = float("-inf")
        x[1] = float("-inf")  # a fully masked row
        x[2, -1] = float("nan")  # NaN in the last chunk
    elif kind == "probs":
        x = torch.softmax(x, -1)
        x[3] = 0.0  # zero sum
    return x


@pytest.mark.parametrize("cpu,threads", TARGETS, ids=lambda p: str(p))
@pytest.mark.parametrize("K,k", [(64, 8), (24, 5), (256, 8), (40, 1), (200, 8), (72, 72)])
@pytest.mark.parametrize("kind", ["random", "ties", "special", "probs"])
def test_topk_renorm_knockout(monkeypatch, cpu, threads, K, k, kind):
    g = gen(K * 100 + k)
    x = _scores(g, 203, K, kind)  # 203 rows: whole groups, then single rows
    modes = [("probs", True), ("probs", False)] if kind == "probs" else [("logits", True), ("logits", False)]

    def run():
        return [torch.ops.moe.topk_renorm(x, k, mode, renorm) for mode, renorm in modes]

    for (w, i), (mode, renorm) in zip(_run(monkeypatch, cpu, threads, run), modes):
        ew, ei = R.topk_renorm(x, k, mode, renorm)
        assert torch.equal(i, ei), f"{mode} renorm={renorm}: indices differ"
        same(w, ew)


@pytest.mark.parametrize("D", [64, 40, 1024, 8])
@pytest.mark.parametrize("measure", ["mad", "variance"])
def test_mad_dispersion_blocks(monkeypatch, D, measure):
    g = gen(D)
    T, E = 777, 8
    x = torch.randn(T, D, generator=g)
    assign = torch.randint(0, E - 1, (T,), generator=g, dtype=torch.int32)  # cluster E-1 empty
    assign[:50] = 2  # a run of tokens into one cluster row (read after write)
    args = (E, 1e-3, 10.0, "feature", measure, "identity")
    outs = {p: _run(monkeypatch, *p, lambda: torch.ops.moe.mad_dispersion(x, assign, *args)) for p in TARGETS}
    same(outs[TARGETS[0]], R.mad_dispersion(x, assign, *args), rtol=2e-5)
    for p in TARGETS[1:]:  # bit-identical to the portable lowering on every target, hence to each other
        assert all(torch.equal(a, b) for a, b in zip(outs[p], outs[TARGETS[0]])), p


@pytest.mark.parametrize("cpu,threads", TARGETS, ids=lambda p: str(p))
@pytest.mark.parametrize("E,D,Dh", [(3, 4, 37), (64, 64, 70), (1, 0, 16), (5, 8, 8)])
def test_hyper_router_rows(monkeypatch, cpu, threads, E, D, Dh):
    """E·(D+1) rows: 15 (odd: one row after the pairs), 4160 of 70 columns (291200 elements, above the inline
    bound: 64-row items on the workers; 70 = 8 whole AVX2 vectors + a 6-column tail), 1, 45."""
    g = gen(E * 1000 + D + Dh)
    De = 11
    ts = [torch.randn(De, generator=g), torch.randn(Dh, De, generator=g), torch.randn(Dh, generator=g),
          torch.randn(E * (D + 1), Dh, generator=g), torch.randn(E * (D + 1), generator=g)]
    w, b = _run(monkeypatch, cpu, threads, lambda: torch.ops.moe.hyper_router(*ts, E))
    ew, eb = R.hyper_router(*[t.double() for t in ts], E)
    same((w, b), (ew.float(), eb.float()), atol=1e-4, rtol=1e-4)
