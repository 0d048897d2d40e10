"""Expert capacity (``torch.ops.moe.apply_capacity``: moe.dispatch_plan's capacity option) and DeepSeek-V3's
auxiliary-loss-free bias update (``torch.ops.moe.bias_update``: moe.bias_update), on the compiled CPU kernels,
against plain-PyTorch references written from the papers, not from our reference module:

* Switch Transformer's capacity (transformers' ``SwitchTransformersTop1Router``: ``token_priority =
  cumsum(one_hot(expert_index), dim=tokens)``, an assignment is kept while its priority is ``<= capacity``), taken
  slot-major for k > 1 (GShard: every first choice before any second choice);
* V-MoE's batch-prioritized routing for ``drop="probability"``: the assignments sorted by gate weight (largest
  first, ties in the position order), then the same cumsum;
* DeepSeek-V3's rule ``b_i += u * sign(mean(c) - c_i)`` as one PyTorch expression, bit for bit, and over 50 steps of
  a small router trained with SGD.

Each capacity case covers ties, skewed routing (every token to one expert), empty experts, capacity 0, capacity
>= T·k, k = 1 and k > 1; the kernels are compared for 1 and 2 worker threads.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from moe_mlir import ops
from moe_mlir.reference import routing as RR
from moe_mlir.runtime import extension
from torch_checks import gen as g
from torch_checks import needs_cpu_kernels, use_cpu_target

M = torch.ops.moe


def kernel(call, *args):
    """``call(*args)`` on the compiled kernels: the eager fallback would warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return call(*args)


# ================================================================================================================
# The papers' rules, in plain PyTorch
# ================================================================================================================


def _cumsum_keep(experts: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Switch's rule on assignments listed in their priority order: kept while the expert's running count (its
    one-hot cumsum) is <= capacity."""
    mask = F.one_hot(experts.long(), num_experts)
    priority = torch.cumsum(mask, dim=0)
    return (priority * mask).sum(-1) <= capacity


def switch_keep(indices: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    T, k = indices.shape
    slot_major = indices.t().reshape(-1)
    return _cumsum_keep(slot_major, num_experts, capacity).reshape(k, T).t()


def vmoe_keep(indices: torch.Tensor, weights: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    T, k = indices.shape
    slot_major = indices.t().reshape(-1)
    w = weights.float().t().reshape(-1)
    order = torch.argsort(w, descending=True, stable=True)
    keep = torch.empty(T * k, dtype=torch.bool)
    keep[order] = _cumsum_keep(slot_major[order], num_experts, capacity)
    return keep.reshape(k, T).t()


def papers(indices, weights, num_experts, capacity, drop):
    keep = (switch_keep(indices, num_experts, capacity) if drop == "position"
            else vmoe_keep(indices, weights, num_experts, capacity))
    kept = torch.where(keep, weights, torch.zeros((), dtype=weights.dtype))
    dropped = torch.bincount(indices[~keep].long(), minlength=num_experts)
    return kept, dropped


def check(indices, weights, num_experts, capacity, drop):
    kept, dropped = kernel(M.apply_capacity, indices, weights, num_experts, capacity, drop)
    ref_kept, ref_dropped = papers(indices, weights, num_experts, capacity, drop)
    assert kept.dtype == weights.dtype and dropped.dtype == torch.int64
    # Exact: a kept weight is the input weight, a dropped one 0.
    assert torch.equal(kept.isnan(), ref_kept.isnan())
    assert torch.equal(torch.nan_to_num(kept), torch.nan_to_num(ref_kept))
    assert torch.equal(dropped, ref_dropped)
    # Our eager reference (the fallback, and what the backward recomputes) agrees as well.
    ours_ref = RR.apply_capacity(indices, weights, num_experts, capacity, drop)
    assert torch.equal(torch.nan_to_num(ours_ref[0]), torch.nan_to_num(ref_kept))
    assert torch.equal(ours_ref[1], ref_dropped)


def _random_case(T, k, E, seed):
    scores = torch.rand(T, E, generator=g(seed))
    w, idx = torch.topk(scores, k, dim=-1)
    return idx.to(torch.int32), w


def _cases():
    """(name, indices, weights, E): ties, skew, empty experts, k = 1 and k > 1, a single token."""
    idx, w = _random_case(37, 2, 8, 1)
    yield "random_k2", idx, w, 8
    idx1, w1 = _random_case(29, 1, 4, 2)
    yield "random_k1", idx1, w1, 4
    idx3, w3 = _random_case(16, 3, 6, 3)
    yield "random_k3_i64", idx3.long(), w3, 6
    # Ties: weights on a coarse grid (many equal), -0.0 next to 0.0.
    tw = (torch.randint(0, 3, (37, 2), generator=g(4)).float() / 2)
    tw[::5, 1] = -0.0
    tw[1::5, 1] = 0.0
    yield "ties", idx, tw, 8
    # Skew: every token's first choice is expert 5.
    sk = idx.clone()
    sk[:, 0] = 5
    sk[:, 1] = torch.where(idx[:, 1] == 5, 0, idx[:, 1])
    yield "skew", sk, w, 8
    yield "skew_k1", torch.full((29, 1), 3, dtype=torch.int32), w1, 4
    # Empty experts: only experts 0 and 1 of 8 receive tokens.
    yield "empty_experts", (idx % 2).to(torch.int32), w, 8
    yield "one_token", idx[:1], w[:1], 8


CASES = list(_cases())


@needs_cpu_kernels
@pytest.mark.parametrize("drop", ["position", "probability"])
@pytest.mark.parametrize("name,indices,weights,E", CASES, ids=[c[0] for c in CASES])
def test_apply_capacity_matches_the_papers(name, indices, weights, E, drop):
    T, k = indices.shape
    for capacity in (0, 1, ops.capacity_of(T, k, E, 1.0), ops.capacity_of(T, k, E, 0.5), T * k, 2**40):
        check(indices, weights, E, capacity, drop)


@needs_cpu_kernels
def test_apply_capacity_probability_nan_and_half_weights():
    # NaN ranks first (torch.sort's descending order); f16/bf16 weights are ranked as f32 and returned as given.
    idx, w = _random_case(23, 2, 4, 5)
    w[3, 1] = float("nan")
    w[7, 0] = float("nan")
    check(idx, w, 4, 5, "probability")
    for dtype in (torch.float16, torch.bfloat16):
        check(idx, w.to(dtype), 4, 5, "probability")
        check(idx, w.to(dtype), 4, 5, "position")


@needs_cpu_kernels
def test_apply_capacity_zero_tokens():
    idx, w = torch.zeros(0, 2, dtype=torch.int32), torch.zeros(0, 2)
    kept, dropped = kernel(M.apply_capacity, idx, w, 4, 3)
    assert kept.shape == (0, 2) and torch.equal(dropped, torch.zeros(4, dtype=torch.int64))


@needs_cpu_kernels
def test_apply_capacity_same_for_any_thread_count(monkeypatch):
    # Large enough for several work items of the plan's parallel phases (32 rows each).
    idx, w = _random_case(300, 2, 8, 6)
    results = []
    try:
        for threads in (1, 2):
            use_cpu_target(monkeypatch, "native", threads)
            results.append([kernel(M.apply_capacity, idx, w, 8, 60, drop) for drop in ("position", "probability")])
    finally:
        extension.clear_kernels()
    for a, b in zip(*results):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    check(idx, w, 8, 60, "position")
    check(idx, w, 8, 60, "probability")


@needs_cpu_kernels
@pytest.mark.parametrize("drop", ["position", "probability"])
def test_apply_capacity_gradient_is_the_kept_mask(drop):
    idx, w = _random_case(37, 2, 8, 7)
    w = w.clone().requires_grad_(True)
    kept, _ = M.apply_capacity(idx, w, 8, 6, drop)
    r = torch.randn(37, 2, generator=g(8))
    (kept * r).sum().backward()
    keep = switch_keep(idx, 8, 6) if drop == "position" else vmoe_keep(idx, w.detach(), 8, 6)
    assert torch.equal(w.grad, torch.where(keep, r, torch.zeros(())))


def test_capacity_of():
    # Switch Transformer: ceil(factor * tokens * k / E); an even load is not rounded up by float error.
    assert ops.capacity_of(1024, 1, 64, 1.25) == 20
    assert ops.capacity_of(1000, 2, 8, 1.0) == 250
    assert ops.capacity_of(10, 1, 3, 1.0) == 4
    assert ops.capacity_of(100, 1, 10, 1.1) == 12  # 1.1 * 10 = 11.000000000000002 in the float's exact value
    assert ops.capacity_of(0, 2, 8, 2.0) == 0
    assert ops.capacity_of(7, 2, 8, 0.0) == 0
    with pytest.raises(ValueError, match="'factor' \\(-1.0\\) must be finite and >= 0"):
        ops.capacity_of(8, 1, 2, -1.0)
    with pytest.raises(ValueError, match="'num_experts' \\(0\\) must be >= 1"):
        ops.capacity_of(8, 1, 0, 1.0)


# ================================================================================================================
# bias_update
# ================================================================================================================


def deepseek_rule(bias: torch.Tensor, counts: torch.Tensor, u: float) -> torch.Tensor:
    """DeepSeek-V3 (§2.1.2): the bias of an overloaded expert decreases by u, an underloaded one's increases."""
    c = counts.float()
    return bias.float() + u * torch.sign(c.mean() - c)


@needs_cpu_kernels
@pytest.mark.parametrize("E", [1, 8, 256])
@pytest.mark.parametrize("count_dtype", [torch.int32, torch.int64, torch.float32])
def test_bias_update_is_the_rule_bit_for_bit(E, count_dtype):
    bias = torch.randn(E, generator=g(10)) * 0.01
    # Half the experts exactly at the mean (25), the others in pairs 25 ± d: both signs and sign(0) = 0 occur.
    d = torch.randint(1, 25, ((E - E // 2 + 1) // 2,), generator=g(11))
    counts = torch.cat([torch.full((E // 2,), 25), torch.stack([25 + d, 25 - d], 1).reshape(-1)])[:E]
    counts = counts[torch.randperm(E, generator=g(12))].to(count_dtype)
    if count_dtype == torch.float32:
        counts = counts / 2  # weighted counts; halves keep the mean exact
    for u in (1e-3, 0.0, 0.3):
        assert torch.equal(kernel(M.bias_update, bias, counts, u), deepseek_rule(bias, counts, u))
    # Balanced: nothing moves.
    same_load = torch.full((E,), 7, dtype=count_dtype)
    assert torch.equal(kernel(M.bias_update, bias, same_load, 1e-3), bias)


@needs_cpu_kernels
def test_bias_update_edges():
    bias = torch.tensor([0.5, -0.25, 0.0, 1.0])
    # NaN or inf counts: torch.sign(nan) = 0 leaves those experts (and, for NaN, all) unchanged, as the rule does.
    for bad in (float("nan"), float("inf")):
        counts = torch.tensor([1.0, bad, 3.0, 0.0])
        assert torch.equal(kernel(M.bias_update, bias, counts, 1e-3), deepseek_rule(bias, counts, 1e-3))
    # A bf16 bias comes back f32; zero experts give an empty result.
    got = kernel(M.bias_update, bias.bfloat16(), torch.tensor([4, 0, 0, 0], dtype=torch.int32), 0.125)
    assert got.dtype == torch.float32
    assert torch.equal(got, bias.bfloat16().float() + torch.tensor([-0.125, 0.125, 0.125, 0.125]))
    assert kernel(M.bias_update, torch.zeros(0), torch.zeros(0, dtype=torch.int32), 1e-3).shape == (0,)
    # Out of place: the input is untouched.
    b = bias.clone()
    kernel(M.bias_update, b, torch.tensor([4, 0, 0, 0], dtype=torch.int32), 0.5)
    assert torch.equal(b, bias)


@needs_cpu_kernels
def test_deepseek_v3_bias_balancing_over_50_steps():
    """A DeepSeek-V3-style router (sigmoid scores, selection bias, top-2 of 8, renormalized) trained with SGD for 50
    steps: the bias the ops produce (counts from the dispatch plan of each step's routing, moe.bias_update after the
    optimizer step) equals, bit for bit at every step, that of the same loop with the paper's rule in PyTorch (counts
    by bincount); the skewed start is balanced out."""
    T, D, E, k, u, steps = 32, 8, 8, 2, 1e-2, 50
    torch.manual_seed(0)
    router = torch.nn.Linear(D, E, bias=False)
    with torch.no_grad():
        router.weight[0] += 0.5  # skewed towards expert 0 at the start
    experts = torch.randn(E, D, D, generator=g(12)) / D**0.5
    runs = []
    for use_ops in (True, False):
        model = copy.deepcopy(router)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        bias = torch.zeros(E)
        history = []
        for step in range(steps):
            x = torch.randn(T, D, generator=g(1000 + step)) + 0.5  # with the skewed weights: expert 0 overloaded
            target = torch.randn(T, D, generator=g(2000 + step))
            w, idx = M.route(model(x), bias, k, "sigmoid", "score_then_topk", 1, 1, "top2_sum", True, 1.0)
            y = torch.einsum("tk,tkd->td", w, torch.einsum("td,tkde->tke", x, experts[idx.long()]))
            loss = F.mse_loss(y, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if use_ops:
                counts = M.dispatch_plan(idx, E)[0]
                bias = kernel(M.bias_update, bias, counts, u)
            else:
                counts = torch.bincount(idx.reshape(-1).long(), minlength=E)
                bias = bias + u * torch.sign(counts.float().mean() - counts.float())
            history.append((bias.clone(), counts.clone()))
        runs.append(history)
    for (b, c), (rb, rc) in zip(*runs):
        assert torch.equal(c.long(), rc.long())
        assert torch.equal(b, rb)
    # The aux-loss-free update does its job: expert 0's load falls from most of the tokens to about its share.
    loads = torch.stack([c.float() for _, c in runs[0]])
    assert loads[0, 0] >= 0.75 * T and loads[-10:, 0].mean() <= 0.5 * T


@needs_cpu_kernels
def test_capacity_ops_trace_under_torch_compile():
    # The fake kernels and the autograd trace (aot_eager: no code generation): same values and gradient as eager.
    def step(idx, w, b, c):
        kept, dropped = M.apply_capacity(idx, w, 8, 5, "probability")
        return kept * 2, dropped, M.bias_update(b, c, 1e-3)

    torch._dynamo.reset()
    idx, w0 = _random_case(20, 2, 8, 13)
    b, c = torch.zeros(8), torch.randint(0, 9, (8,), generator=g(14), dtype=torch.int32)
    w, w_ref = w0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
    out = torch.compile(step, backend="aot_eager", fullgraph=True)(idx, w, b, c)
    ref = step(idx, w_ref, b, c)
    assert all(torch.equal(o, r) for o, r in zip(out, ref))
    out[0].sum().backward()
    ref[0].sum().backward()
    assert torch.equal(w.grad, w_ref.grad)


@needs_cpu_kernels
@pytest.mark.parametrize("drop", ["position", "probability"])
def test_switch_block_capacity_factor(drop):
    """The seed models' Switch-style block with a capacity factor: the gate weights of the over-capacity
    assignments become 0 exactly as the papers' rule says, with custom ops or plain PyTorch, and training still
    gets gradients (through the kept weights)."""
    from moe_mlir.models.acmoe import StandardSMoEBlock

    torch.manual_seed(3)
    block = StandardSMoEBlock(num_experts=4, k=2, capacity_factor=0.5, capacity_drop=drop, return_routing=True)
    uncapped, plain = copy.deepcopy(block), copy.deepcopy(block)
    uncapped.capacity_factor = None
    plain.use_custom_ops = False
    x = torch.randn(2, 6, 32, generator=g(15))
    y, w, idx = block(x)
    _, w_all, idx_all = uncapped(x)
    assert torch.equal(idx, idx_all)
    # C = ceil(0.5 * 12 tokens * 2 / 4) = 3 of the 24 assignments per expert.
    ref_kept, ref_dropped = papers(idx.reshape(12, 2), w_all.detach().reshape(12, 2), 4, 3, drop)
    assert torch.equal(w.detach().reshape(12, 2), ref_kept) and torch.equal(block.dropped, ref_dropped)
    assert int(ref_dropped.sum()) >= 12
    y_plain, w_plain, _ = plain(x)
    torch.testing.assert_close(w_plain, w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(y_plain, y, atol=1e-5, rtol=1e-4)
    y.sum().backward()
    assert block.gate.weight.grad is not None and torch.isfinite(block.gate.weight.grad).all()
    with pytest.raises(ValueError, match="capacity_factor"):
        StandardSMoEBlock(capacity_factor=-1.0)
