"""Data parallel: with 2 gloo processes under DistributedDataParallel, Symphony's co-selection graph and ACMoE's
cluster statistics are synchronised by the models themselves (:mod:`moe_mlir.distributed`): after every step both
ranks hold bit-identical router state, equal to one process training on the concatenated batch. A control run with
:func:`moe_mlir.distributed.local_router_state` shows the replicas drift apart without it.

The processes meet through a rendezvous file (no port to race for) and run with a deadline and a collective timeout
(hang guards far above a working run), so a broken collective fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import moe_mlir  # noqa: F401
from moe_mlir import distributed
from moe_mlir.models import acmoe, symphony

WORLD, STEPS, BATCH, SEQ, D = 2, 3, 4, 6, 16
DEADLINE_S = 1200  # a hang guard, far above a working run


def _rendezvous_file(out_dir: Path) -> str:
    """init_method="file://...": no port to pick, so no other process can take it before the ranks bind it."""
    return str(out_dir / "rendezvous")


def _setup(router: str):
    """The model (same seed on every rank) and the steps' full batches (inputs, targets)."""
    torch.manual_seed(0)
    kw = dict(d_model=D, n_heads=2, num_experts=6, k=2, d_ff=16)
    model = symphony.SymphonyBlock(**kw) if router == "symphony" else acmoe.ACMoEStack(**kw)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, SEQ, D, generator=g), torch.randn(BATCH, SEQ, D, generator=g)) for _ in range(STEPS)]
    return model.train(), data


def _record(model) -> dict:
    """Wraps ACMoE's statistics so that every step's weights are kept (the router state of that model)."""
    log: dict = {"w": []}
    if isinstance(model, acmoe.ACMoEStack):
        inner = model.layer2.dispersion_weights

        def recording(tokens, assign):
            w = inner(tokens, assign)
            log["w"].append(w.detach().clone())
            return w

        model.layer2.dispersion_weights = recording
    return log


def _state(model, log) -> dict:
    out = {f"param.{n}": p.detach().clone() for n, p in model.named_parameters()}
    if isinstance(model, symphony.SymphonyBlock):
        out["adjacency"] = model.adjacency.clone()
    else:
        out["cluster_weights"] = log["w"][-1]
    return out


def _train(model, data, shard=slice(None), wrap=lambda m: m) -> list[dict]:
    log = _record(model)
    net = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    states = []
    for x, y in data:
        loss = F.mse_loss(net(x[shard]), y[shard])
        opt.zero_grad()
        loss.backward()
        opt.step()
        states.append(_state(model, log))
    return states


#: The runs the tests below read: (router, synchronised). All of them run in one spawn of the ranks, one after the
#: other on one process group (each with its own model and DDP wrapper, the same seeds as alone): a spawn costs two
#: interpreters importing torch and a gloo rendezvous, about 2-3 s of CPU each time, and three spawns were most of
#: this file's time.
RUNS = [("symphony", True), ("acmoe", True), ("symphony", False)]


def _run_file(out_dir: Path, rank: int, router: str, sync: bool) -> Path:
    return Path(out_dir) / f"rank{rank}-{router}-{'sync' if sync else 'local'}.pt"


def _worker(rank: int, rdzv: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    # The timeout is a hang guard: generous, since the test runs beside the other stages of the test command.
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=300))
    try:
        for router, sync in RUNS:
            model, data = _setup(router)
            per_rank = BATCH // WORLD
            shard = slice(rank * per_rank, (rank + 1) * per_rank)
            # broadcast_buffers=False: DDP would otherwise copy rank 0's adjacency to every rank at each forward,
            # hiding whether the ranks computed the same graph.
            wrap = lambda m: torch.nn.parallel.DistributedDataParallel(m, broadcast_buffers=False)  # noqa: E731
            if sync:
                states = _train(model, data, shard, wrap)
            else:
                with distributed.local_router_state():
                    states = _train(model, data, shard, wrap)
            torch.save(states, _run_file(Path(out_dir), rank, router, sync))
    finally:
        dist.destroy_process_group()


def _run_ranks(out_dir: Path) -> dict[tuple[str, bool], list[list[dict]]]:
    """Every run of RUNS on WORLD spawned ranks: {(router, sync): [the states of rank 0, of rank 1]}."""
    ctx = mp.start_processes(_worker, args=(_rendezvous_file(out_dir), str(out_dir)), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {WORLD} ranks did not finish within {DEADLINE_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)
    return {(router, sync): [torch.load(_run_file(out_dir, r, router, sync)) for r in range(WORLD)]
            for router, sync in RUNS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, bool], list[list[dict]]]:
    return _run_ranks(tmp_path_factory.mktemp("ranks"))


@pytest.mark.parametrize("router", ["symphony", "acmoe"])
def test_router_state_is_bit_identical_across_ranks_and_equals_one_process(router, runs):
    ranks = runs[(router, True)]
    model, data = _setup(router)
    single = _train(model, data)
    state_key = "adjacency" if router == "symphony" else "cluster_weights"
    for step in range(STEPS):
        a, b, one = ranks[0][step], ranks[1][step], single[step]
        assert a.keys() == b.keys() == one.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"step {step}: {k} differs between the ranks"
        if router == "symphony":
            # Integer co-selection counts: the graph is exactly the single process's.
            assert torch.equal(a[state_key], one[state_key]), f"step {step}: adjacency differs from one process"
            assert a[state_key].abs().sum() > 0
        else:
            # Sums in f64 over the ranks vs the kernel's f32 sums over the whole batch: f32 rounding only.
            torch.testing.assert_close(a[state_key], one[state_key], atol=1e-5, rtol=1e-5)
        for k in a:  # DDP averages two half-batch gradients, one process takes the full-batch mean: rounding only
            if k.startswith("param."):
                torch.testing.assert_close(a[k], one[k], atol=1e-5, rtol=1e-5, msg=lambda m: f"{step} {k}: {m}")


def test_without_synchronisation_the_replicas_diverge(runs):
    """The control: per-rank statistics (the authors' code) give each rank its own graph."""
    ranks = runs[("symphony", False)]
    assert not torch.equal(ranks[0][0]["adjacency"], ranks[1][0]["adjacency"])


def test_helpers_are_inactive_without_a_process_group():
    """Without an initialised process group the helpers are inactive: the models keep their single-process path."""
    assert not distributed.active()
    with distributed.local_router_state():
        assert not distributed.active()
