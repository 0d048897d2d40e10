"""Zero-sized dimensions at run time through torch.ops.moe.* (issue #15).

The compiled kernels keep token-like dimensions dynamic (one kernel serves every token count), so a zero there is
only seen at run time: the decode step of a batch that routes nothing, an empty sequence batch, a sequence without
tokens or keys. Every op must return the defined result (empty tensors of the right shape, or the values the
references give: W = 1 without tokens, a = beta * a without co-selections, p = 0 and head 0 without keys, head -1
always for head_select="all"), and the same kernel must still be right on the next non-empty call.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from moe_mlir import reference as R
from torch_checks import gen as g
from torch_checks import needs_cpu_kernels, same

pytestmark = needs_cpu_kernels


def check(op, ref, *args, atol=2e-6, rtol=2e-5):
    """``op(*args)`` on the compiled kernels (no fallback warning) against ``ref(*args)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the eager fallback would warn
        out = op(*args)
    same(out, ref(*args), atol=atol, rtol=rtol)
    return out


@pytest.mark.parametrize("shape", [(0, 8), (3, 0, 8), (0, 0, 8)])
@pytest.mark.parametrize("mode", ["logits", "probs"])
def test_topk_renorm(shape, mode):
    w, i = check(torch.ops.moe.topk_renorm, lambda x, k, m, r: R.topk_renorm(x, k, m, r),
                 torch.rand(shape), 2, mode, True)
    assert w.shape == (*shape[:-1], 2) and i.dtype == torch.int32
    x = torch.rand(5, 8, generator=g(1))  # the same kernel, tokens again
    check(torch.ops.moe.topk_renorm, R.topk_renorm, x, 2, mode, True)


@pytest.mark.parametrize("B, N", [(0, 5), (2, 0), (0, 0)])
@pytest.mark.parametrize("extras", ["plain", "ws_mask_causal"])
def test_similarity_inform(B, N, extras):
    u, e = torch.randn(B, N, 8, generator=g(2)), torch.rand(B, N, 3, generator=g(3))
    ws = torch.randn(8, 8, generator=g(4)) if extras != "plain" else None
    mask = torch.ones(B, N, dtype=torch.bool) if extras != "plain" else None
    causal = extras != "plain"
    p = check(torch.ops.moe.similarity_inform, R.similarity_inform, u, e, ws, mask, 0.5, causal)
    assert p.shape == (B, N, 3)
    u, e = torch.randn(2, 4, 8, generator=g(5)), torch.rand(2, 4, 3, generator=g(6))
    mask = torch.ones(2, 4, dtype=torch.bool) if extras != "plain" else None
    check(torch.ops.moe.similarity_inform, R.similarity_inform, u, e, ws, mask, 0.5, causal, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("B, N", [(0, 5), (2, 0)])
def test_similarity_inform_topk(B, N):
    u, e = torch.randn(B, N, 8, generator=g(7)), torch.rand(B, N, 4, generator=g(8))
    w, i = check(torch.ops.moe.similarity_inform_topk,
                 lambda u, e, k: R.similarity_inform_topk(u, e, None, None, k, True, 1.0, False), u, e, 2)
    assert w.shape == i.shape == (B, N, 2)


def posterior_inputs(B, H, N, Nk, D=6, Dh=3, K=4, seed=9):
    return (torch.randn(B, H, N, Nk, generator=g(seed)), torch.randn(B, N, D, generator=g(seed + 1)),
            torch.randn(B, H, Nk, Dh, generator=g(seed + 2)), torch.randn(D, H * Dh, generator=g(seed + 3)),
            torch.rand(B, Nk, K, generator=g(seed + 4)))


# (B, N, Nk): no sequences, sequences without queries, queries without keys.
@pytest.mark.parametrize("B, N, Nk", [(0, 3, 5), (2, 0, 5), (2, 3, 0), (0, 0, 0)])
@pytest.mark.parametrize("head_select", ["min_entropy", "all"])
def test_attention_posterior(B, N, Nk, head_select):
    # head_select goes to the op and the reference alike (the op's default is min_entropy).
    args = (*posterior_inputs(B, 2, N, Nk), 1.0, head_select, None)
    p, head = check(torch.ops.moe.attention_posterior, R.attention_posterior, *args, atol=1e-5, rtol=1e-4)
    assert p.shape == (B, N, 4) and head.shape == (B,)
    if Nk == 0:
        assert torch.equal(p, torch.zeros_like(p))  # no key: p = 0
        assert torch.equal(head, torch.full_like(head, 0 if head_select == "min_entropy" else -1))


@pytest.mark.parametrize("B, N, Nk", [(0, 3, 5), (2, 0, 5), (2, 3, 0)])
def test_attention_posterior_topk(B, N, Nk):
    args = posterior_inputs(B, 2, N, Nk, seed=20)
    w, i, head = check(torch.ops.moe.attention_posterior_topk,
                       lambda *a: R.attention_posterior_topk(*a, True, 1.0, "min_entropy", None), *args, 2,
                       atol=1e-5, rtol=1e-4)
    assert w.shape == i.shape == (B, N, 2)


@pytest.mark.parametrize("empty", ["identity", "raw"])
@pytest.mark.parametrize("normalize", ["feature", "expert"])
def test_mad_dispersion_without_tokens(empty, normalize):
    x, a = torch.randn(0, 5), torch.zeros(0, dtype=torch.int64)
    w, counts = check(torch.ops.moe.mad_dispersion, R.mad_dispersion, x, a, 3, 1e-4, 10.0, normalize, "mad", empty)
    assert w.shape == (3, 5) and torch.equal(counts, torch.zeros(3, dtype=counts.dtype))


@pytest.mark.parametrize("norm", ["row", "col", "none"])
def test_adjacency_update_without_tokens(norm):
    a = torch.rand(4, 4, generator=g(30))
    check(torch.ops.moe.adjacency_update, R.adjacency_update, a, torch.zeros(0, 2, dtype=torch.int64), 0.5, norm,
          True)


def test_hyper_router_empty_embedding():
    emb, w1, b1 = torch.randn(0), torch.randn(5, 0), torch.randn(5, generator=g(31))
    w2, b2 = torch.randn(3 * 4, 5, generator=g(32)), torch.randn(12, generator=g(33))
    check(torch.ops.moe.hyper_router, R.hyper_router, emb, w1, b1, w2, b2, 3, atol=1e-5, rtol=1e-5)


# The other end of the sizes: the kernels index with i32, so a tensor of more than 2^31 - 1 elements is rejected
# (at compile time where the shape is static, moe-legalize-shapes; here the token dimension is dynamic, so at run
# time) with an error naming the limit, before anything is copied or run. The stride-0 views below have 2^31
# elements over 32 bytes of storage: a copy (8 GiB) or a kernel run would not return in this test's time.
@pytest.mark.parametrize("case", ["topk_renorm", "similarity_inform", "mad_dispersion"])
def test_over_i32_elements_is_rejected_naming_the_limit(case):
    big = 2**28  # rows of 8 floats: 2^31 elements
    x = torch.zeros(1, 8).expand(big, 8)
    with pytest.raises(ValueError, match=r"has 2147483648 elements, more than the compiled kernels support: "
                                         r"at most 2147483647 per tensor \(2\^31 - 1"):
        if case == "topk_renorm":
            torch.ops.moe.topk_renorm(x, 2, "logits", True)
        elif case == "similarity_inform":
            torch.ops.moe.similarity_inform(x.unsqueeze(0), torch.zeros(1, 1, 3).expand(1, big, 3), None, None,
                                            0.5, False)
        else:
            torch.ops.moe.mad_dispersion(x, torch.zeros(1, dtype=torch.int64).expand(big), 3, 1e-4, 10.0,
                                         "feature", "mad", "identity")
    # The same ops still run on a valid call.
    check(torch.ops.moe.topk_renorm, R.topk_renorm, torch.rand(3, 8, generator=g(40)), 2, "logits", True)
