"""Expert parallelism (:mod:`moe_mlir.expert_parallel`) with real processes: gloo on CPU, 2 and 4 ranks.

Each world size is one job of spawned processes that runs every case on one process group (tiny sizes, so that the
file stays within a minute or so on two loaded cores) and writes, per rank and case, the measured differences or the
exception raised; the tests below assert on those. The references are HF transformers' own eager experts loop on
*one* process holding all experts and all ranks' tokens (code no one here wrote), or plain PyTorch written here.

Tolerance: the sharded computation adds a token's weighted expert outputs in increasing expert order, grouped by rank
(a different association than the single process's running ``index_add_``), and runs each expert's GEMM on another
number of rows: f32 rounding differences (seen: <= 5e-7 on outputs ~1), hence atol/rtol 1e-5 (1e-4 for gradients
summed over many rows).

The processes meet through a rendezvous file (no port to race for) and run with a deadline and a collective timeout
(hang guards, far above a working job's time), so a broken collective fails the test instead of hanging it. A dead
peer is seen by gloo as a closed connection, not by the timeout. No assertion depends on timing.
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
import traceback
from datetime import timedelta

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from moe_mlir import expert_parallel as ep  # noqa: E402
from moe_mlir.expert_parallel.layout import ExpertLayout  # noqa: E402
from moe_mlir.expert_parallel.plan import local_plan, rank_plan  # noqa: E402

H, I, E = 16, 8, 8
# Hang guards only, never reached by a working job: generous, since the job runs beside the other test stages (and
# one rank may compile a kernel or a graph while its peer already waits in a collective).
DEADLINE_S = 1200
COLLECTIVE_TIMEOUT_S = 300
ATOL, RTOL = 1e-5, 1e-5
GRAD_TOL = dict(atol=1e-4, rtol=1e-4)
# Tokens per rank: uneven, and one rank with none.
TOKENS = {2: (6, 0), 4: (5, 0, 7, 3)}
# Uneven blocks (a rank with a single expert; with 4 ranks, a rank with none).
UNEVEN = {2: (1, 7), 4: (3, 0, 4, 1)}


# ----------------------------------------------------------------------------------------------------------------
# The plan alone (no processes)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("experts_per_rank", [(2, 2, 2, 2), (3, 0, 4, 1), (8,)])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_rank_plan_sends_each_token_once_per_rank(experts_per_rank, k):
    """Every (token, rank that owns one of its experts) pair is sent exactly once, rank-major and by token within a
    rank; each token's ``gather`` lists its rows in increasing rank order; the local plan expands them back."""
    layout = ExpertLayout(E, experts_per_rank)
    W = layout.world_size
    g = torch.Generator().manual_seed(k)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(23)]).to(torch.int32)
    plan = rank_plan(ids, layout)
    owner = torch.tensor([r for r, n in enumerate(experts_per_rank) for _ in range(n)])
    pairs = sorted({(r, t) for t in range(ids.shape[0]) for r in owner[ids[t].long()].tolist()})
    assert list(zip(plan.send_rank.tolist(), plan.send_token.tolist())) == pairs  # rank-major, once each
    assert plan.send_counts.tolist() == [sum(1 for r, _ in pairs if r == q) for q in range(W)]
    assert plan.send_counts.sum() <= ids.numel()
    for t in range(ids.shape[0]):
        rows = [p for p in plan.gather[t].tolist() if p < len(pairs)]
        assert [pairs[p] for p in rows] == [(r, t) for r in sorted(set(owner[ids[t].long()].tolist()))]
    # Receiving side: the local ids of the rows sent to each rank, and their expansion per local expert.
    lids = ep.plan.local_ids(ids, plan, layout)
    for r in range(W):
        sel = plan.send_rank == r
        lp = local_plan(lids[sel], experts_per_rank[r])
        start = layout.start(r)
        want = torch.bincount(ids.long().reshape(-1), minlength=E)[start:start + experts_per_rank[r]]
        assert lp.tokens_per_expert.tolist() == want.tolist()
        toks = plan.send_token[sel][lp.row]
        assert all(start + int(e) in ids[int(t)].tolist() for t, e in zip(toks, lp.expert))


def test_reduce_paths_give_the_same_bits():
    """The CPU reduce (one index_add_ pass) adds each row's sources in the order of the gathers (CUDA's path)."""
    from moe_mlir.expert_parallel.exchange import _reduce_by_gathers
    layout = ExpertLayout(E, (3, 0, 4, 1))
    g = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(E, generator=g)[:5] for _ in range(40)])
    plan = rank_plan(ids, layout)
    src = torch.randn(int(plan.send_counts.sum()), 33, generator=g) * 1e3
    a = ep.exchange.reduce(src, plan.gather, plan.send_token)
    b = _reduce_by_gathers(src, plan.gather)
    assert torch.equal(a, b)
    # and reduce is the adjoint of expand: <expand(x), y> == <x, reduce(y)>
    x = torch.randn(40, 33, generator=g, dtype=torch.float64)
    y = torch.randn(src.shape, generator=g, dtype=torch.float64)
    lhs = (ep.exchange.expand(x, plan.send_token, plan.gather) * y).sum()
    rhs = (x * ep.exchange.reduce(y, plan.gather, plan.send_token)).sum()
    torch.testing.assert_close(lhs, rhs)


def test_layout_errors():
    with pytest.raises(ValueError, match="sums to 7, not num_experts = 8"):
        ExpertLayout(8, (4, 3))
    with pytest.raises(ValueError, match="non-negative"):
        ExpertLayout(8, (9, -1))
    assert ExpertLayout.even(10, 4).experts_per_rank == (3, 3, 2, 2)
    assert ExpertLayout(8, (3, 0, 4, 1)).rank_of(torch.tensor([0, 2, 3, 6, 7])).tolist() == [0, 0, 2, 2, 3]


# ----------------------------------------------------------------------------------------------------------------
# The processes
# ----------------------------------------------------------------------------------------------------------------


def _rendezvous_file() -> str:
    """A fresh file for init_method="file://...": no port to pick, so no other process can take it between the
    choice and the ranks' bind (a free-port probe can lose that race on a busy machine)."""
    fd, path = tempfile.mkstemp(prefix="moe-ep-rdzv-")
    os.close(fd)
    os.unlink(path)  # the file store creates it; a stale one from an earlier job must not exist
    return path


def _diff(a, b) -> float:
    """max |a - b| / (atol + rtol |b|): <= 1 means close."""
    if a is None or b is None:
        a = torch.zeros(0) if a is None else a
        b = torch.zeros_like(a) if b is None else b
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return float(((a.double() - b.double()).abs() / (ATOL + RTOL * b.double().abs())).max())


def _gdiff(a, b) -> float:
    if a is None or b is None:
        a = torch.zeros_like(b) if a is None else a
        b = torch.zeros_like(a) if b is None else b
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    tol = GRAD_TOL
    return float(((a.double() - b.double()).abs() / (tol["atol"] + tol["rtol"] * b.double().abs())).max())


def _block(name: str, k: int, seed: int):
    from transformers import GptOssConfig, Qwen3MoeConfig
    from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3
    if name == "gpt_oss":
        m = gpt_oss.GptOssMLP(GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E,
                                           num_experts_per_tok=k))
    else:
        m = qwen3.Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E,
                                                        num_experts_per_tok=k, norm_topk_prob=True))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def _slice(rank: int, world: int) -> slice:
    T = TOKENS[world]
    return slice(sum(T[:rank]), sum(T[: rank + 1]))


def _coef(n: int, shape) -> torch.Tensor:
    return torch.linspace(-1, 1, n).view(shape)


def _case_block(rank, world, name, generic=False, compiled=False):
    """A transformers MoE block with its experts sharded == one process with all experts, forward and gradients
    (input, local experts' parameters, router summed over ranks)."""
    from moe_mlir import experts as X
    from moe_mlir.experts import hf as XH
    ref = _block(name, 3, 1)
    m = copy.deepcopy(ref)
    ep.shard_experts(m)
    xall = torch.randn(1, sum(TOKENS[world]), H, generator=torch.Generator().manual_seed(7)).requires_grad_(True)
    out_ref = ref(xall)
    out_ref = out_ref[0] if isinstance(out_ref, tuple) else out_ref
    c = _coef(out_ref.numel(), out_ref.shape)
    (out_ref * c).sum().backward()
    sl = _slice(rank, world)
    x = xall.detach()[:, sl].clone().requires_grad_(True)
    saved = XH._known_gate
    if generic:  # the grouped-GEMM path (taken for gates the fused loop does not know, post-norms and CUDA)
        XH._known_gate = lambda module: None
    try:
        run = torch.compile(m, backend="eager") if compiled else m
        out = run(x)
    finally:
        XH._known_gate = saved
    out = out[0] if isinstance(out, tuple) else out
    (out * c[:, sl]).sum().backward()
    res = {"out": _diff(out, out_ref[:, sl]), "grad x": _gdiff(x.grad, xall.grad[:, sl])}
    ex, ex_ref = X.hf_experts_modules(m)[0], X.hf_experts_modules(ref)[0]
    mine = ex.ep_layout.local_experts(rank)
    for pname in ep.hf.EXPERT_PARAMS:
        p = getattr(ex, pname, None)
        if isinstance(p, torch.nn.Parameter):
            res[f"grad {pname}"] = _gdiff(p.grad, getattr(ex_ref, pname).grad[mine.start:mine.stop])
    ep.allreduce_replicated_grads(m)
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        if "experts" not in n:
            res[f"grad {n} (summed over ranks)"] = _gdiff(p.grad, q.grad)
    return res


def _routing(kind: str, world: int, k: int, layout: ExpertLayout):
    g = torch.Generator().manual_seed(11)
    T = sum(TOKENS[world])
    if kind == "skewed: every token to rank 0's experts":
        block = list(layout.local_experts(0))
        ids = torch.stack([torch.tensor(block)[torch.randperm(len(block), generator=g)[:k]] for _ in range(T)])
    elif kind == "expert 3 and rank 1's experts hit by no token":
        idle = {3} | set(layout.local_experts(1))
        pool = torch.tensor([e for e in range(E) if e not in idle])
        ids = torch.stack([pool[torch.randperm(len(pool), generator=g)[:k]] for _ in range(T)])
    else:  # random, k = E included
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    w = torch.rand(T, k, generator=g) + 0.1
    return ids.to(torch.int32), w


def _case_experts(rank, world, name, kind, k, experts_per_rank=None, generic=False):
    """The experts module called directly with a given routing (HF's eager loop holding all experts as reference):
    output and gradients of the hidden states, the gate weights and the local experts' parameters."""
    from moe_mlir import experts as X
    from moe_mlir.experts import hf as XH
    full = X.hf_experts_modules(_block(name, k, 2))[0]
    sh = copy.deepcopy(full)
    ep.shard_experts(sh, experts_per_rank=experts_per_rank)
    ids, w = _routing(kind, world, k, sh.ep_layout)
    xall = torch.randn(ids.shape[0], H, generator=torch.Generator().manual_seed(5)).requires_grad_(True)
    wall = w.clone().requires_grad_(True)
    ref = type(full).forward.__wrapped__(full, xall, ids.long(), wall)
    c = _coef(ref.numel(), ref.shape)
    (ref * c).sum().backward()
    sl = _slice(rank, world)
    x = xall.detach()[sl].clone().requires_grad_(True)
    wi = w[sl].clone().requires_grad_(True)
    saved = XH._known_gate
    if generic:
        XH._known_gate = lambda module: None
    try:
        out = sh(x, ids[sl], wi)
    finally:
        XH._known_gate = saved
    (out * c[sl]).sum().backward()
    res = {"out": _diff(out, ref[sl]), "grad x": _gdiff(x.grad, xall.grad[sl]),
           "grad weights": _gdiff(wi.grad, wall.grad[sl])}
    mine = sh.ep_layout.local_experts(rank)
    for pname in ep.hf.EXPERT_PARAMS:
        p = getattr(sh, pname, None)
        if isinstance(p, torch.nn.Parameter):
            res[f"grad {pname}"] = _gdiff(p.grad, getattr(full, pname).grad[mine.start:mine.stop])
    return res


def _case_torchtitan(rank, world):
    """TorchTitan's dispatcher signature: routed_input sorted by local expert, tokens per local expert, combine ==
    ``Σ_j s[t,j] · x[t] @ W[ids[t,j]]`` (plain PyTorch), forward and gradients; rows sent = the minimum."""
    k = 3
    disp = ep.TorchTitanDispatcher(E, k)
    g = torch.Generator().manual_seed(3)
    T = sum(TOKENS[world])
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    s_all = torch.rand(T, k, generator=g).requires_grad_(True)
    x_all = torch.randn(T, H, generator=g).requires_grad_(True)
    W_all = (torch.randn(E, H, H, generator=g) * 0.3).requires_grad_(True)
    ref = torch.einsum("tk,tkd->td", s_all, torch.einsum("td,tkde->tke", x_all, W_all[ids]))
    c = _coef(ref.numel(), ref.shape)
    (ref * c).sum().backward()
    sl = _slice(rank, world)
    mine = disp.local_experts
    x = x_all.detach()[sl].clone().requires_grad_(True)
    s = s_all.detach()[sl].clone().requires_grad_(True)
    W = W_all.detach()[mine.start:mine.stop].clone().requires_grad_(True)
    counts = torch.bincount(ids[sl].reshape(-1), minlength=E)
    routed, per_expert, md = disp.dispatch(x, s, ids[sl], counts)
    outs, a = [], 0
    for e, n in enumerate(per_expert.tolist()):
        outs.append(routed[a:a + n] @ W[e])
        a += n
    y = disp.combine(torch.cat(outs) if outs else routed, md, x)
    (y * c[sl]).sum().backward()
    want_counts = torch.bincount(ids.reshape(-1), minlength=E)[mine.start:mine.stop]
    h = md.dispatched.handle
    owner = ep.ExpertLayout.even(E, world).rank_of(ids[sl])
    minimum = sum(len(set(row)) for row in owner.tolist())
    return {"out": _diff(y, ref[sl]), "grad x": _gdiff(x.grad, x_all.grad[sl]),
            "grad scores": _gdiff(s.grad, s_all.grad[sl]), "grad W": _gdiff(W.grad, W_all.grad[mine.start:mine.stop]),
            "tokens per local expert": 0.0 if per_expert.tolist() == want_counts.tolist() else float("inf"),
            "rows sent == minimum": 0.0 if sum(h.send_splits) == minimum else float("inf"),
            "rows <= T*k": 0.0 if sum(h.send_splits) <= ids[sl].numel() else float("inf")}


def _raises(fn) -> tuple[str, str]:
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the test asserts on the type and message)
        return type(e).__name__, str(e)
    return "none", ""


def _case_errors(rank, world):
    """Bad inputs on one rank: the same clear ValueError on every rank, and the group still works afterwards."""
    layout = ExpertLayout.even(E, world)
    x = torch.randn(4, H)
    ids = torch.tensor([[0, 5], [1, 7], [2, 2], [6, 3]], dtype=torch.int32)
    w = torch.rand(4, 2)
    last = world - 1
    out = {}
    bad = ids.clone()
    if rank == last:
        bad[2, 1] = E
    out["bad id"] = _raises(lambda: ep.dispatch(x, bad, w, layout))
    xd = torch.randn(4, H + 1) if rank == 0 else x
    out["hidden size"] = _raises(lambda: ep.dispatch(xd, ids, w, layout))
    ids_t = ids[:3] if rank == 0 else ids
    out["rows"] = _raises(lambda: ep.dispatch(x, ids_t, w, layout))
    d = ep.dispatch(x, ids, w, layout)  # the group still works
    y = ep.combine(ep.weighted_reduce(ep.expert_rows(d), d), d.handle)
    out["after"] = ("ok", str(float((y - x * w.sum(1, keepdim=True)).abs().max())))
    return out


def _case_dead_rank(rank, world, q):
    """A rank exits; the other's next dispatch fails with ExpertParallelError (bounded by the group's timeout)."""
    layout = ExpertLayout.even(E, world)
    dist.barrier()
    if rank == world - 1:
        q.put((rank, "dead rank", ("exited", "")))
        q.close()
        q.join_thread()  # flush the queue before dying
        os._exit(0)
    t0 = time.monotonic()
    r = _raises(lambda: ep.dispatch(torch.randn(3, H), torch.zeros(3, 2, dtype=torch.int32), torch.ones(3, 2), layout))
    return r + (time.monotonic() - t0,)


def _worker(rank, world, rdzv, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rdzv}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    cases = {
        "qwen3_moe block": lambda: _case_block(rank, world, "qwen3_moe"),
        "gpt_oss block (transposed, biases)": lambda: _case_block(rank, world, "gpt_oss"),
        "qwen3_moe block, grouped-GEMM path": lambda: _case_block(rank, world, "qwen3_moe", generic=True),
        "skewed": lambda: _case_experts(rank, world, "qwen3_moe", "skewed: every token to rank 0's experts", 2),
        "idle experts and rank": lambda: _case_experts(rank, world, "gpt_oss",
                                                       "expert 3 and rank 1's experts hit by no token", 2),
        "k = E": lambda: _case_experts(rank, world, "qwen3_moe", "random", E),
        "uneven experts per rank": lambda: _case_experts(rank, world, "qwen3_moe", "random", 3, UNEVEN[world]),
        "uneven, grouped-GEMM path (gpt_oss)": lambda: _case_experts(rank, world, "gpt_oss", "random", 3,
                                                                     UNEVEN[world], generic=True),
        "torchtitan": lambda: _case_torchtitan(rank, world),
        "errors": lambda: _case_errors(rank, world),
    }
    if world == 2:
        cases["torch.compile"] = lambda: _case_block(rank, world, "qwen3_moe", compiled=True)
    for name, fn in cases.items():
        try:
            q.put((rank, name, fn()))
        except Exception:  # noqa: BLE001  (reported to the test; the next collective may then fail too)
            q.put((rank, name, {"exception": traceback.format_exc()}))
    if world == 2:
        q.put((rank, "dead rank", _case_dead_rank(rank, world, q)))
    q.put((rank, "done", None))


_JOBS: dict[int, dict] = {}


def _job(world: int) -> dict:
    """Runs the job of ``world`` ranks once; returns {case: {rank: result}}."""
    if world in _JOBS:
        return _JOBS[world]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    rdzv = _rendezvous_file()
    procs = [ctx.Process(target=_worker, args=(r, world, rdzv, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict = {}
    done = 0
    deadline = time.monotonic() + DEADLINE_S
    import queue
    while done < world and time.monotonic() < deadline:
        try:
            rank, name, value = q.get(timeout=1.0)
        except queue.Empty:
            if all(not p.is_alive() for p in procs):
                break
            continue
        if name == "done":
            done += 1
        else:
            results.setdefault(name, {})[rank] = value
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    if os.path.exists(rdzv):
        os.unlink(rdzv)
    _JOBS[world] = results
    return results


CLOSE_CASES = ["qwen3_moe block", "gpt_oss block (transposed, biases)", "qwen3_moe block, grouped-GEMM path",
               "skewed", "idle experts and rank", "k = E", "uneven experts per rank",
               "uneven, grouped-GEMM path (gpt_oss)", "torchtitan"]


def _check_close(world: int, case: str) -> None:
    res = _job(world).get(case)
    assert res is not None and sorted(res) == list(range(world)), f"{case}: results from ranks {sorted(res or {})}"
    for rank, r in res.items():
        assert "exception" not in r, f"{case} rank {rank}:\n{r.get('exception')}"
        assert len(r) >= 3
        bad = {k: v for k, v in r.items() if not v <= 1.0}
        assert not bad, f"{case}, {world} ranks, rank {rank}: not close (error / tolerance): {bad}"


@pytest.mark.parametrize("case", CLOSE_CASES)
def test_two_ranks_equal_one_process(case):
    _check_close(2, case)


@pytest.mark.parametrize("case", CLOSE_CASES)
def test_four_ranks_equal_one_process(case):
    _check_close(4, case)


def test_two_ranks_under_torch_compile():
    """The sharded block under torch.compile (dispatch and combine are graph breaks) equals one process."""
    _check_close(2, "torch.compile")


@pytest.mark.parametrize("world", [2, 4])
def test_bad_inputs_raise_the_same_error_on_every_rank(world):
    res = _job(world).get("errors")
    assert res is not None and sorted(res) == list(range(world))
    last = world - 1
    for rank, r in res.items():
        assert "exception" not in r, r.get("exception")
        kind, msg = r["bad id"]
        assert kind == "ValueError" and f"rank {last}: expert id {E} (token 2) is outside [0, {E})" in msg, (rank, msg)
        kind, msg = r["hidden size"]
        assert kind == "ValueError" and "disagree on hidden size D: rank 0: 17" in msg, (rank, msg)
        kind, msg = r["rows"]
        assert kind == "ValueError" and "rank 0: expert ids must be [T, k] with T = 4" in msg, (rank, msg)
        assert r["after"][0] == "ok" and float(r["after"][1]) < 1e-5


def test_a_dead_rank_fails_the_others_with_a_clear_error():
    res = _job(2).get("dead rank")
    assert res is not None and res[1][0] == "exited"
    kind, msg, _elapsed = res[0]
    assert kind == "ExpertParallelError", (kind, msg)
    assert "all-to-all over 2 ranks failed on rank 0" in msg
