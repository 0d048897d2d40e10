"""Routing fluctuation rate and entropy ratio (000 §4) on hand-computed examples."""

import math

import pytest
import torch

from moe_mlir.metrics import entropy_ratio, routing_entropy, routing_fluctuation_rate


def test_fluctuation_rate_counts_set_changes_only():
    before = torch.tensor([[0, 1], [2, 3], [1, 0], [0, 2]])
    after = torch.tensor([[1, 0], [2, 3], [1, 2], [3, 0]])
    # token 0: same set in another order (no switch); 1: same; 2: {0,1}->{1,2}; 3: {0,2}->{0,3}
    assert routing_fluctuation_rate(before, after).item() == pytest.approx(0.5)
    mask = torch.tensor([True, True, True, False])
    assert routing_fluctuation_rate(before, after, mask).item() == pytest.approx(1 / 3)


def test_fluctuation_rate_top1_and_leading_dims():
    before = torch.tensor([[[3], [1]], [[0], [0]]])  # [B=2, N=2, M=1]
    after = torch.tensor([[[3], [2]], [[0], [1]]])
    assert routing_fluctuation_rate(before, after).item() == pytest.approx(0.5)
    # rank 1 is [T] (one expert per token)
    assert routing_fluctuation_rate(before.reshape(-1), after.reshape(-1)).item() == pytest.approx(0.5)


def test_fluctuation_rate_edge_cases():
    assert routing_fluctuation_rate(torch.zeros(0, 2), torch.zeros(0, 2)).item() == 0.0
    with pytest.raises(ValueError, match="same shape"):
        routing_fluctuation_rate(torch.zeros(3, 2), torch.zeros(3, 1))


def test_entropy_ratio_hand_computed():
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0]])  # entropies ln 2, 0 (0 log 0 = 0)
    e = torch.tensor([[0.5, 0.5], [0.5, 0.5]])  # ln 2, ln 2
    assert routing_entropy(p).tolist() == pytest.approx([math.log(2), 0.0])
    assert entropy_ratio(p, e).item() == pytest.approx(0.5)
    assert entropy_ratio(p, e, torch.tensor([True, False])).item() == pytest.approx(1.0)


def test_entropy_ratio_uniform_over_k():
    K = 16
    u = torch.full((4, K), 1.0 / K)
    q = torch.zeros(4, K)
    q[:, :4] = 0.25  # entropy ln 4 vs ln 16
    assert entropy_ratio(q, u).item() == pytest.approx(math.log(4) / math.log(16))


def test_entropy_ratio_of_similarity_mixing_with_tiny_tau_is_one():
    """tau -> 0 with equal-norm tokens makes S the identity (Cauchy-Schwarz): p = e, ratio 1."""
    torch.manual_seed(0)
    u = torch.nn.functional.normalize(torch.randn(1, 6, 4), dim=-1)
    e = torch.softmax(torch.randn(1, 6, 5), -1)
    p = torch.ops.moe.similarity_inform(u, e, None, None, 1e-4)
    assert entropy_ratio(p, e).item() == pytest.approx(1.0, abs=1e-5)
