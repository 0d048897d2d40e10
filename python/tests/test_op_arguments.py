"""Size-like arguments of torch.ops.moe.* are validated before anything is allocated (issue #36).

A negative, zero or huge ``k``, ``num_experts``, group count or block size gets the op's own ValueError, in the
same words on the compiled kernels (the C++ extension asks the kernel cache's validators before it copies an
operand or allocates a result: before, ``topk_renorm(x, -1)`` gave torch's "Trying to create tensor with negative
dimension -1" and ``topk_renorm(x, 2**40)`` tried to allocate 16 TB) and in the fake kernels, which torch.compile and
torch.export trace with. A result whose size no operand bounds (``mad_dispersion``'s ``[E, D]``, ``dispatch_plan``'s
``[E + 1]``, ``attention_posterior``'s ``[B, N, K]``) is checked against the kernels' 2^31 - 1 elements before it
is allocated. Valid edge values still work: ``k = K``, zero tokens.

Every op of torch.ops.moe has a case here (test_every_op_has_a_case); the ops without a size argument are covered
by their tensor-shaped sizes (``k`` from the indices of topk_renorm_backward, results of multiplied operand sizes)
and zero tokens.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from moe_mlir import ops
from moe_mlir import reference as R
from moe_mlir.reference import routing as RR
from torch_checks import gen as g
from torch_checks import needs_cpu_kernels, same

M = torch.ops.moe
HUGE = 2**40
LIMIT = "more than the kernels support: at most 2147483647 per tensor (2^31 - 1: the kernels index with i32)"


def rejects(call, args: tuple, message: str) -> None:
    """``call(*args)`` raises the op's ValueError ``message`` on real CPU tensors (the compiled kernels, or the
    eager op where they are unavailable) and on fake tensors (what torch.compile traces with)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        call(*args)
    with FakeTensorMode() as mode:
        fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        with pytest.raises(ValueError, match=re.escape(message)):
            call(*fake)


def kernel(call, *args):
    """``call(*args)`` on the compiled kernels: the eager fallback would warn."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return call(*args)


def k_range(op: str, k: int, K: int, what: str) -> str:
    return f"moe.{op}: 'k' ({k}) must be in [1, {K}] ({what})"


def over_limit(op: str, name: str, shape: list[int]) -> str:
    n = 1
    for s in shape:
        n *= s
    return f"moe.{op}: the result '{name}' of shape {shape} would have {n} elements, {LIMIT}"


def expert_count(op: str, E: int) -> str:
    return f"moe.{op}: 'num_experts' ({E}) must be <= 2147483647 (expert indices and counts are i32)"


# ================================================================================================================
# topk_renorm, topk_renorm_backward
# ================================================================================================================

LAST_DIM = "the size of the last dimension of 'scores'"


@pytest.mark.parametrize("k", [-1, 0, 17, HUGE, -HUGE])
def test_topk_renorm_k(k):
    rejects(M.topk_renorm, (torch.randn(4, 16), k), k_range("topk_renorm", k, 16, LAST_DIM))


def test_topk_renorm_k_on_empty_rows():
    # No row to select from, and still the op's message (the kernel key is validated, not the data).
    rejects(M.topk_renorm, (torch.randn(0, 16), -1), k_range("topk_renorm", -1, 16, LAST_DIM))
    rejects(M.topk_renorm, (torch.randn(3, 0), 1), k_range("topk_renorm", 1, 0, LAST_DIM))


@needs_cpu_kernels
@pytest.mark.parametrize("shape", [(5, 16), (0, 16), (2, 0, 16)])
def test_topk_renorm_k_equal_to_K(shape):
    x = torch.randn(shape, generator=g(1))
    out = kernel(M.topk_renorm, x, 16, "logits", True)
    same(out, R.topk_renorm(x, 16, "logits", True))


@pytest.mark.parametrize("k", [0, 17])
def test_topk_renorm_backward_k_from_the_indices(k):
    scores = torch.randn(4, 16)
    rejects(M.topk_renorm_backward, (torch.randn(4, k), scores, torch.zeros(4, k, dtype=torch.int32)),
            f"moe.topk_renorm_backward: the last dimension of 'indices' (k = {k}) must be in [1, 16] (K, the "
            "experts of 'scores')")


@needs_cpu_kernels
@pytest.mark.parametrize("rows", [5, 0])
def test_topk_renorm_backward_k_equal_to_K(rows):
    x = torch.randn(rows, 16, generator=g(2))
    _, idx = R.topk_renorm(x, 16, "logits", True)
    gw = torch.randn(rows, 16, generator=g(3))
    same(kernel(M.topk_renorm_backward, gw, x, idx, "logits", True),
         R._topk_renorm_backward_ref(gw, x, idx, "logits", True))


# ================================================================================================================
# similarity_inform and its fused top-k form; similarity_inform_fwd and _backward
# ================================================================================================================


def similarity_operands(B=2, N=5, D=8, K=6, seed=4):
    return torch.randn(B, N, D, generator=g(seed)), torch.softmax(torch.randn(B, N, K, generator=g(seed + 1)), -1)


@pytest.mark.parametrize("k", [-1, 0, 7, HUGE])
def test_similarity_inform_topk_k(k):
    u, e = similarity_operands()
    rejects(M.similarity_inform_topk, (u, e, k), k_range("similarity_inform_topk", k, 6, "dimension 2 of 'e', K"))


@needs_cpu_kernels
@pytest.mark.parametrize("B,N", [(2, 5), (2, 0), (0, 5)])
def test_similarity_inform_topk_k_equal_to_K(B, N):
    u, e = similarity_operands(B, N)
    same(kernel(M.similarity_inform_topk, u, e, 6), R.similarity_inform_topk(u, e, None, None, 6, True, 1.0, False))


@needs_cpu_kernels
@pytest.mark.parametrize("B,N", [(2, 0), (0, 5)])
def test_similarity_inform_zero_tokens(B, N):
    u, e = similarity_operands(B, N)
    same(kernel(M.similarity_inform, u, e), R.similarity_inform(u, e, None, None, 1.0, False))
    p, lse = kernel(M.similarity_inform_fwd, u, e)
    same(p, R.similarity_inform(u, e, None, None, 1.0, False))
    assert lse.shape == (B, N)
    gp = torch.randn(B, N, 6)
    du, de, _ = kernel(M.similarity_inform_backward, gp, u, e)
    assert du.shape == u.shape and de.shape == e.shape


# ================================================================================================================
# attention_posterior, its fused top-k form and its backward
# ================================================================================================================


def attention_operands(B=2, H=3, N=5, Nk=5, D=8, Dh=4, K=6, seed=6):
    r = lambda *s: torch.randn(*s, generator=g(seed + len(s)))  # noqa: E731
    return r(B, H, N, Nk), r(B, N, D), r(B, H, Nk, Dh), torch.randn(D, H * Dh, generator=g(seed)), \
        torch.softmax(torch.randn(B, Nk, K, generator=g(seed + 9)), -1)


@pytest.mark.parametrize("k", [-1, 0, 7, HUGE])
def test_attention_posterior_topk_k(k):
    rejects(M.attention_posterior_topk, (*attention_operands(), k),
            k_range("attention_posterior_topk", k, 6, "dimension 2 of 'e', K"))


@needs_cpu_kernels
@pytest.mark.parametrize("N", [5, 0])
def test_attention_posterior_topk_k_equal_to_K(N):
    a = attention_operands(N=N)
    same(kernel(M.attention_posterior_topk, *a, 6),
         R.attention_posterior_topk(*a, 6, True, 1.0, "min_entropy", None))


def huge_mixing(N: int):
    """Operands of a few MB whose result p [1, N, 4096] has N * 4096 elements: N from the scores, K from e, so no
    operand bounds it."""
    return (torch.zeros(1, 1, N, 1), torch.zeros(1, N, 1), torch.zeros(1, 1, 1, 1), torch.zeros(1, 1),
            torch.full((1, 1, 4096), 1 / 4096))


def test_attention_posterior_result_over_the_limit():
    N = 2**20  # p: 2^32 elements (16 GB): rejected before anything is allocated
    rejects(M.attention_posterior, huge_mixing(N), over_limit("attention_posterior", "p", [1, N, 4096]))
    rejects(M.attention_posterior_topk, (*huge_mixing(N), 4096),
            over_limit("attention_posterior_topk", "weights", [1, N, 4096]))


@needs_cpu_kernels
def test_attention_posterior_result_over_the_limit_with_the_kernel_in_memory():
    # B and N are dynamic in the kernel: the key of a small call serves the huge one, whose result size the C++
    # extension checks itself (the validators only ran for the first call).
    p, head = kernel(M.attention_posterior, *huge_mixing(3))
    assert p.shape == (1, 3, 4096) and torch.allclose(p, torch.full_like(p, 1 / 4096))
    N = 2**20
    with pytest.raises(ValueError, match=re.escape(over_limit("attention_posterior", "p", [1, N, 4096]))):
        M.attention_posterior(*huge_mixing(N))


@needs_cpu_kernels
@pytest.mark.parametrize("N", [5, 0])
def test_attention_posterior_backward_tokens(N):
    a = attention_operands(N=N)
    _, head = R.attention_posterior(*a, 1.0, "min_entropy", None)
    gp = torch.randn(2, N, 6, generator=g(11))
    same(kernel(M.attention_posterior_backward, gp, *a, head),
         R._attention_posterior_backward_ref(gp, *a, head, 1.0, "min_entropy", None), atol=2e-5, rtol=2e-4)


# ================================================================================================================
# mad_dispersion, adjacency_update
# ================================================================================================================


@pytest.mark.parametrize("E", [-1, 0, -HUGE])
def test_mad_dispersion_num_experts_below_one(E):
    rejects(M.mad_dispersion, (torch.randn(10, 8), torch.zeros(10, dtype=torch.int64), E),
            f"moe.mad_dispersion: 'num_experts' ({E}) must be >= 1")


def test_mad_dispersion_num_experts_huge():
    # Past i32: the expert count itself; within it, the [E, D] result past the kernels' limit.
    x, a = torch.randn(10, 8), torch.zeros(10, dtype=torch.int64)
    rejects(M.mad_dispersion, (x, a, HUGE), expert_count("mad_dispersion", HUGE))
    rejects(M.mad_dispersion, (x, a, 2**28), over_limit("mad_dispersion", "weights", [2**28, 8]))


@needs_cpu_kernels
@pytest.mark.parametrize("T", [10, 0])
def test_mad_dispersion_one_expert(T):
    x, a = torch.randn(T, 8, generator=g(12)), torch.zeros(T, dtype=torch.int64)
    same(kernel(M.mad_dispersion, x, a, 1), R.mad_dispersion(x, a, 1, 1e-4, 10.0, "feature", "mad", "identity"))


@needs_cpu_kernels
def test_adjacency_update_zero_tokens():
    a = torch.softmax(torch.randn(4, 4, generator=g(13)), -1)
    idx = torch.zeros(0, 2, dtype=torch.int64)
    same(kernel(M.adjacency_update, a, idx), R.adjacency_update(a, idx, 0.9, "row", True))


# ================================================================================================================
# hyper_router and its backward
# ================================================================================================================


def hyper_operands(E=3, D=4, De=4, Dh=6, seed=14):
    r = lambda *s: torch.randn(*s, generator=g(seed + len(s) + sum(s)))  # noqa: E731
    return r(De), r(Dh, De), r(Dh), r(E * (D + 1), Dh), r(E * (D + 1))


@pytest.mark.parametrize("E", [-1, 0])
def test_hyper_router_num_experts_below_one(E):
    rejects(M.hyper_router, (*hyper_operands(), E), f"moe.hyper_router: 'num_experts' ({E}) must be >= 1")
    rejects(M.hyper_router_backward, (torch.randn(3, 4), torch.randn(3), *hyper_operands(), E),
            f"moe.hyper_router_backward: 'num_experts' ({E}) must be >= 1")


def test_hyper_router_num_experts_huge():
    grads = (torch.randn(3, 4), torch.randn(3))
    rejects(M.hyper_router, (*hyper_operands(), HUGE), expert_count("hyper_router", HUGE))
    rejects(M.hyper_router_backward, (*grads, *hyper_operands(), HUGE), expert_count("hyper_router_backward", HUGE))
    # 15 rows are no E * (D + 1) for E = 16; the backward knows D from 'grad_w' [E, D].
    rejects(M.hyper_router, (*hyper_operands(), 16),
            "moe.hyper_router: dimension 0 of 'w2' (15) must be num_experts * (D+1) = 16 * (D+1) with D >= 0")
    rejects(M.hyper_router_backward, (*grads, *hyper_operands(), 16),
            "moe.hyper_router_backward: 'w2' must have E*(D+1) = 16*(4+1) = 80 rows, but has 15")


@needs_cpu_kernels
@pytest.mark.parametrize("E,D", [(3, 4), (15, 0), (1, 14)])
def test_hyper_router_num_experts_edges(E, D):
    # E = rows: D = 0 (a router of biases only); E = 1: one expert.
    h = hyper_operands()
    same(kernel(M.hyper_router, *h, E), R.hyper_router(*h, E), atol=2e-5, rtol=2e-4)
    gw, gb = torch.randn(E, D, generator=g(20)), torch.randn(E, generator=g(21))
    same(kernel(M.hyper_router_backward, gw, gb, *h, E), R._hyper_router_backward_ref(gw, gb, *h, E),
         atol=2e-5, rtol=2e-4)


# ================================================================================================================
# route, dispatch_plan
# ================================================================================================================

LOGITS_DIM = "the size of the last dimension of 'logits'"


@pytest.mark.parametrize("k", [-1, 0, 9, HUGE])
def test_route_k(k):
    rejects(M.route, (torch.randn(10, 8), None, k), k_range("route", k, 8, LOGITS_DIM))


@pytest.mark.parametrize("n_group,message", [
    (-1, "'n_group' (-1) must be >= 1"), (0, "'n_group' (0) must be >= 1"),
    (HUGE, f"'n_group' ({HUGE}) must divide the number of experts E = 8")])
def test_route_n_group(n_group, message):
    rejects(M.route, (torch.randn(10, 8), None, 2, "softmax", "score_then_topk", n_group), f"moe.route: {message}")


@pytest.mark.parametrize("topk_group", [-1, 0, 3, HUGE])
def test_route_topk_group(topk_group):
    rejects(M.route, (torch.randn(10, 8), None, 2, "softmax", "score_then_topk", 2, topk_group),
            f"moe.route: 'topk_group' ({topk_group}) must be in [1, n_group = 2]")


@needs_cpu_kernels
@pytest.mark.parametrize("T", [10, 0])
def test_route_k_equal_to_E(T):
    x = torch.randn(T, 8, generator=g(22))
    same(kernel(M.route, x, None, 8), RR.route(x, None, 8))
    # Groups at their bounds: every group kept, k = E.
    same(kernel(M.route, x, None, 8, "sigmoid", "score_then_topk", 4, 4, "top2_sum"),
         RR.route(x, None, 8, "sigmoid", "score_then_topk", 4, 4, "top2_sum"))


@pytest.mark.parametrize("scoring,factor,message", [
    ("softmax", 1.0, "scoring(softmax) is not elementwise"),
    ("sigmoid", 0.0, "'routed_scaling_factor' (0.0) must be finite and > 0"),
    ("sigmoid", float("inf"), "'routed_scaling_factor' (inf) must be finite and > 0")])
def test_route_backward_scoring_and_scale(scoring, factor, message):
    idx = torch.randint(0, 8, (10, 2), generator=g(24))
    rejects(M.route_backward, (torch.randn(10, 2), torch.randn(10, 8), idx, scoring, True, factor),
            f"moe.route_backward: {message}")


@needs_cpu_kernels
@pytest.mark.parametrize("T", [10, 0])
def test_route_backward_k_equal_to_E(T):
    # Every expert picked (k = E): the kernel's gradient is the reference's, also for no tokens.
    x = torch.randn(T, 8, generator=g(25))
    idx = torch.argsort(torch.randn(T, 8, generator=g(26)), -1).to(torch.int32)
    gw = torch.randn(T, 8, generator=g(27))
    ref = torch.func.vjp(lambda z: RR.route_weights(z, idx.long(), "sigmoid", "score_then_topk", True, 2.5), x)[1]
    same(kernel(M.route_backward, gw, x, idx, "sigmoid", True, 2.5), ref(gw)[0], atol=1e-6, rtol=1e-5)


def indices(T=10, k=2, E=4):
    return torch.randint(0, E, (T, k), generator=g(23))


@pytest.mark.parametrize("E", [-1, 0, -HUGE])
def test_dispatch_plan_num_experts_below_one(E):
    rejects(M.dispatch_plan, (indices(), E), f"moe.dispatch_plan: 'num_experts' ({E}) must be >= 1")


def test_dispatch_plan_num_experts_huge():
    # block_size 1: no padding, so only the [E] counts and [E + 1] offsets grow with E.
    rejects(M.dispatch_plan, (indices(), HUGE, 1), over_limit("dispatch_plan", "counts", [HUGE]))


@pytest.mark.parametrize("B", [-1, 0, -HUGE])
def test_dispatch_plan_block_size_below_one(B):
    rejects(M.dispatch_plan, (indices(), 4, B), f"moe.dispatch_plan: 'block_size' ({B}) must be >= 1")


def test_dispatch_plan_block_size_huge():
    padded = 20 + 4 * (HUGE - 1)
    rejects(M.dispatch_plan, (indices(), 4, HUGE),
            f"moe.dispatch_plan: the padded plan (T*k + num_experts*(block_size-1) = {padded}) must fit in i32")


@needs_cpu_kernels
@pytest.mark.parametrize("T", [10, 0])
def test_dispatch_plan_edges(T):
    idx = indices(T)
    same(kernel(M.dispatch_plan, idx, 4, 1), RR.dispatch_plan(idx, 4, 1))
    same(kernel(M.dispatch_plan, idx, 1 if T == 0 else 4, 16), RR.dispatch_plan(idx, 1 if T == 0 else 4, 16))


# ================================================================================================================
# apply_capacity, bias_update (ops/capacity.py)
# ================================================================================================================


def capacity_args(T=10, k=2, E=4):
    return indices(T, k, E), torch.rand(T, k, generator=g(24))


@pytest.mark.parametrize("E", [-1, 0, -HUGE])
def test_apply_capacity_num_experts_below_one(E):
    rejects(M.apply_capacity, (*capacity_args(), E, 2), f"moe.apply_capacity: 'num_experts' ({E}) must be >= 1")


def test_apply_capacity_num_experts_huge():
    rejects(M.apply_capacity, (*capacity_args(), HUGE, 2), over_limit("apply_capacity", "counts", [HUGE]))


@pytest.mark.parametrize("C", [-1, -HUGE])
def test_apply_capacity_negative_capacity(C):
    rejects(M.apply_capacity, (*capacity_args(), 4, C), f"moe.apply_capacity: 'capacity' ({C}) must be >= 0")
    # Zero tokens: still the op's message.
    rejects(M.apply_capacity, (*capacity_args(T=0), 4, C), f"moe.apply_capacity: 'capacity' ({C}) must be >= 0")


def test_apply_capacity_operands():
    idx, w = capacity_args()
    rejects(M.apply_capacity, (idx, w, 4, 2, "random"),
            "moe.apply_capacity: 'drop' must be one of 'position', 'probability', got 'random'")
    rejects(M.apply_capacity, (idx, w[:7], 4, 2),
            "moe.apply_capacity: dimension 0 of 'weights' (7) must equal dimension 0 of 'indices' (T) (10)")
    rejects(M.apply_capacity, (idx, w[:, :1], 4, 2),
            "moe.apply_capacity: dimension 1 of 'weights' (1) must equal dimension 1 of 'indices' (k) (2)")
    rejects(M.apply_capacity, (idx.reshape(-1), w, 4, 2),
            "moe.apply_capacity: 'indices' must have rank 2 ([T, k]), got shape [20]")


@needs_cpu_kernels
def test_apply_capacity_edges():
    # Capacity 0 (all dropped), a huge capacity (nothing dropped), E = 1, zero tokens.
    idx, w = capacity_args()
    same(kernel(M.apply_capacity, idx, w, 4, 0), RR.apply_capacity(idx, w, 4, 0))
    same(kernel(M.apply_capacity, idx, w, 4, HUGE, "probability"), (w, torch.zeros(4, dtype=torch.int64)))
    one = torch.zeros(10, 1, dtype=torch.int32)
    same(kernel(M.apply_capacity, one, w[:, :1], 1, 3), RR.apply_capacity(one, w[:, :1], 1, 3))
    same(kernel(M.apply_capacity, *capacity_args(T=0), 4, 3), (torch.zeros(0, 2), torch.zeros(4, dtype=torch.int64)))
    # An index out of range is the op's ValueError, before any result is used.
    bad = idx.clone()
    bad[3, 1] = 4
    with pytest.raises(ValueError, match="outside"):
        kernel(M.apply_capacity, bad, w, 4, 2)


@pytest.mark.parametrize("rate,shown", [(-1.0, "-1.0"), (float("inf"), "inf"), (float("nan"), "nan"), (1e300, "inf")])
def test_bias_update_rate(rate, shown):
    # The rate is an f32 attribute: 1e300 is inf there.
    rejects(M.bias_update, (torch.zeros(4), torch.zeros(4, dtype=torch.int32), rate),
            f"moe.bias_update: 'rate' ({shown}) must be finite and >= 0")


def test_bias_update_operands():
    b, c = torch.zeros(4), torch.zeros(4, dtype=torch.int32)
    rejects(M.bias_update, (b, c[:3], 1e-3),
            "moe.bias_update: dimension 0 of 'counts' (E = 3) must equal dimension 0 of 'bias' (E = 4)")
    rejects(M.bias_update, (b.reshape(2, 2), c, 1e-3),
            "moe.bias_update: 'bias' must have rank 1 ([E]), got shape [2, 2]")
    with pytest.raises(TypeError, match="'counts' must be i32, i64 or f32"):
        M.bias_update(b, c.to(torch.int8), 1e-3)


@needs_cpu_kernels
def test_bias_update_edges():
    # E = 1 never moves; zero experts.
    same(kernel(M.bias_update, torch.ones(1), torch.tensor([5]), 0.5), torch.ones(1))
    same(kernel(M.bias_update, torch.zeros(0), torch.zeros(0), 0.5), torch.zeros(0))


# ================================================================================================================
# torch.compile sees the fake kernels' messages; every op has a case
# ================================================================================================================


@pytest.mark.parametrize("call,message", [
    (lambda x: M.topk_renorm(x, -1), k_range("topk_renorm", -1, 16, LAST_DIM)),
    (lambda x: M.mad_dispersion(x, torch.zeros(4, dtype=torch.int64), HUGE), expert_count("mad_dispersion", HUGE)),
], ids=["topk_renorm", "mad_dispersion"])
def test_torch_compile_traces_the_message(call, message):
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(call, backend="eager", fullgraph=True)(torch.randn(4, 16))
    assert message in str(info.value)


# ================================================================================================================
# load-balancing losses and statistics (ops/balance.py)
# ================================================================================================================

TOP_K_LOGITS = "the size of the last dimension of 'logits'"


@pytest.mark.parametrize("k", [-1, 0, 9, HUGE])
def test_balance_top_k(k):
    x = torch.randn(6, 8)
    msg = f"'top_k' ({k}) must be in [1, 8] ({TOP_K_LOGITS})"
    rejects(M.load_balancing_loss, (x, k), f"moe.load_balancing_loss: {msg}")
    rejects(M.router_stats, (x, k), f"moe.router_stats: {msg}")
    rejects(M.router_stats_fwd, (x, k), f"moe.router_stats_fwd: {msg}")
    # Zero tokens: still the op's message.
    rejects(M.load_balancing_loss, (torch.randn(0, 8), k), f"moe.load_balancing_loss: {msg}")


def test_balance_edges():
    # k = E, E = 1, T = 0, T = 1 on the kernels.
    x = torch.randn(5, 8)
    kernel(M.load_balancing_loss, x, 8)
    assert kernel(M.load_balancing_loss, torch.randn(4, 1), 1).item() == pytest.approx(1.0)
    assert torch.isnan(kernel(M.router_z_loss, torch.randn(0, 8)))
    c, p = kernel(M.router_stats, torch.randn(1, 8), 2)
    assert c.sum().item() == 2
    rejects(M.router_z_loss_backward, (torch.ones(2), x), "moe.router_z_loss_backward: 'grad' must hold one value")
    rejects(M.router_stats_backward, (torch.ones(7), x, None, torch.tensor(5.0)),
            "moe.router_stats_backward: dimension 0 of 'grad_mean_probs' (7) must equal the expert count E of "
            "'logits' (8)")


@pytest.mark.parametrize("k", [0, 3, HUGE])
def test_sequence_balance_top_k(k):
    s, idx = torch.rand(2, 3, 8), torch.zeros(2, 3, 2, dtype=torch.long)
    msg = f"dimension 2 of 'indices' (2) must equal 'top_k' ({k})"
    rejects(M.sequence_balance_loss, (s, idx, k), f"moe.sequence_balance_loss: {msg}")
    rejects(M.sequence_balance_loss_backward, (torch.ones(()), s, idx, k), f"moe.sequence_balance_loss_backward: {msg}")
    # indices wider than E.
    rejects(M.sequence_balance_loss, (torch.rand(2, 3, 2), torch.zeros(2, 3, 3, dtype=torch.long), 3),
            "moe.sequence_balance_loss: the number of selections k (dimension 2 of 'indices', 3) must be in [1, 2] "
            "(the expert count of 'scores')")


def test_every_op_has_a_case():
    names = {*ops.OP_NAMES, *ops.FUSED_OP_NAMES, *ops.ROUTING_OP_NAMES, "similarity_inform_fwd",
             "similarity_inform_backward", "topk_renorm_backward", "hyper_router_backward",
             "attention_posterior_backward", *ops.BALANCE_OP_NAMES, "router_stats_fwd", "router_stats_backward",
             "router_z_loss_backward", "sequence_balance_loss_backward", "route_backward", *ops.CAPACITY_OP_NAMES}
    registered = {n for n in dir(M) if not n.startswith("_") and isinstance(getattr(M, n),
                                                                           torch._ops.OpOverloadPacket)}
    assert registered == names, f"ops without a case here: {sorted(registered - names)}"
    source = open(__file__).read()
    for name in names:
        assert f"M.{name}," in source or f"M.{name}(" in source, name


@needs_cpu_kernels
def test_a_kept_kernel_still_verifies_sizes_that_relate_differently():
    """The extension keeps its kernels by key and by how the call's sizes compare (Key::verifiedKey: each size's
    rank among the call's sizes, 0 and 1), and checks no rule of an op itself: a call of a known kernel whose token
    counts disagree is verified again, and the op verifier names the operand, before anything is allocated."""
    x, idx = torch.randn(6, 8), torch.zeros(6, 2, dtype=torch.int32)
    kernel(M.route, x, None, 2, "softmax", "score_then_topk", 1, 1, "top2_sum", False, 1.0, idx)
    with pytest.raises(ValueError, match=r"moe\.route: dimension 0 of 'replay' \(T = 6\) must equal dimension 0 of 'logits' \(T = 5\)"):
        M.route(torch.randn(5, 8), None, 2, "softmax", "score_then_topk", 1, 1, "top2_sum", False, 1.0, idx)
    # The same relations as the first call: the kept kernel, no new check.
    kernel(M.route, torch.randn(9, 8), None, 2, "softmax", "score_then_topk", 1, 1, "top2_sum", False, 1.0,
           torch.zeros(9, 2, dtype=torch.int32))
    g, s = torch.randn(4, 2), torch.randn(4, 8)
    kernel(M.topk_renorm_backward, g, s, torch.zeros(4, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"moe\.topk_renorm_backward: dimension 0 of 'indices' \(3\) must equal"):
        M.topk_renorm_backward(g, s, torch.zeros(3, 2, dtype=torch.int32))
