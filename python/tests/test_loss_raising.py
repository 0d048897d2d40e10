"""Raising of the routers' auxiliary losses (issue #32 item 3): transformers' ``load_balancing_loss_func`` in both
of its forms and the router z-loss idiom become ``torch.ops.moe.load_balancing_loss`` / ``router_z_loss`` under
``torch.compile(backend="moe")``; values and gradients equal eager's; near misses are left alone.

The per-layer form is transformers' own function (the installed release); the concatenated form (transformers
< 5, and many copies in user code) is written here from its definition. Dense code runs through
``dense="eager"`` (the same raising, without inductor's C++ compile per graph).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from moe_mlir.backends.dynamo import MoERaisingWarning, capture_graphs

pytestmark = pytest.mark.skipif(
    not all(hasattr(torch.ops.moe, n) for n in ("load_balancing_loss", "router_z_loss")),
    reason="torch.ops.moe.load_balancing_loss / router_z_loss not registered yet (issue #32, engineer H1's ops)")

E, K = 8, 2


def concatenated_form(gate_logits, num_experts, top_k, attention_mask=None):
    """transformers < 5's ``load_balancing_loss_func``: one softmax over every layer's logits concatenated."""
    logits = torch.cat(list(gate_logits), dim=0)
    p = F.softmax(logits, dim=-1)
    _, sel = torch.topk(p, top_k, dim=-1)
    expert_mask = F.one_hot(sel, num_experts)
    if attention_mask is None:
        f = torch.mean(expert_mask.float(), dim=0)
        P = torch.mean(p, dim=0)
    else:
        b, s = attention_mask.shape
        layers = logits.shape[0] // (b * s)
        m3 = attention_mask[None, :, :, None, None].expand((layers, b, s, top_k, num_experts)).reshape(
            -1, top_k, num_experts)
        f = torch.sum(expert_mask.float() * m3, dim=0) / torch.sum(m3, dim=0)
        m2 = attention_mask[None, :, :, None].expand((layers, b, s, num_experts)).reshape(-1, num_experts)
        P = torch.sum(p * m2, dim=0) / torch.sum(m2, dim=0)
    return torch.sum(f * P.unsqueeze(0)) * num_experts


def per_layer_form(gate_logits, num_experts, top_k, attention_mask=None):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    return load_balancing_loss_func(tuple(gate_logits), num_experts, top_k, attention_mask)


def switch_z_loss(router_logits):
    """transformers' ``router_z_loss_func`` (switch_transformers, nllb_moe) on ``[G, S, E]``."""
    from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func

    return router_z_loss_func(router_logits)


def _run(fn, cases, dynamic, expect):
    """Compiles ``fn``; for each case (a tuple of arguments, tensors requiring grad where the gradient is checked)
    compares value and gradients with eager; returns the backend's log after checking that nothing was skipped
    and that every graph holds ``expect`` (a list of moe op names)."""
    torch._dynamo.reset()
    c = torch.compile(fn, backend="moe", dynamic=dynamic, options={"dense": "eager"})
    with warnings.catch_warnings(record=True) as record, capture_graphs() as log:
        warnings.simplefilter("always")
        for args in cases:
            leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            got, want = c(*args), fn(*args)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, equal_nan=True)
            if leaves and want.requires_grad:
                g = torch.autograd.grad(got, leaves)
                w = torch.autograd.grad(want, leaves)
                for a, b in zip(g, w):
                    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert not [str(w.message) for w in record if issubclass(w.category, MoERaisingWarning)]
    assert log and all(g.fallback is None and g.moe_ops() == expect for g in log), \
        [(g.moe_ops(), g.fallback) for g in log]
    return log


def _logits(*rows, seed=0, e=E):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(r, e, generator=g).mul_(2).requires_grad_() for r in rows]


def _mask(b, s, pad, seed=0):
    """An attention mask [b, s] (int64, as tokenizers give) with ``pad`` left-padded positions in row 0."""
    m = torch.ones(b, s, dtype=torch.int64)
    m[0, :pad] = 0
    return m


@pytest.mark.parametrize("form", [per_layer_form, concatenated_form])
@pytest.mark.parametrize("dynamic", [False, True])
def test_balancing_loss_without_mask_is_raised(form, dynamic):
    # three layers of 10 rows, then 6: two graphs when static, one when dynamic
    cases = [(*_logits(10, 10, 10, seed=1), ), (*_logits(6, 6, 6, seed=2), )]
    _run(lambda a, b, c: form((a, b, c), E, K), cases, dynamic, ["load_balancing_loss"])


@pytest.mark.parametrize("form", [per_layer_form, concatenated_form])
@pytest.mark.parametrize("dynamic", [False, True])
def test_balancing_loss_with_attention_mask_is_raised(form, dynamic):
    cases = [(*_logits(10, 10, seed=3), _mask(2, 5, 2)), (*_logits(12, 12, seed=4), _mask(3, 4, 3))]
    _run(lambda a, b, m: form((a, b), E, K, m), cases, dynamic, ["load_balancing_loss"])


def test_balancing_loss_one_layer_bool_mask_and_k_equals_e():
    """One layer (no concatenation), a float mask with fractional weights (used as a multiplier, as transformers
    does), and k = E (every expert selected: f = 1)."""
    m = torch.tensor([[1.0, 0.5, 0.0, 1.0], [0.25, 1.0, 1.0, 0.0]])
    for k in (1, E):
        _run(lambda a, mask: per_layer_form((a,), E, k, mask), [(*_logits(8, seed=5), m)], False,
             ["load_balancing_loss"])
        _run(lambda a, mask: concatenated_form((a,), E, k, mask), [(*_logits(8, seed=6), m)], False,
             ["load_balancing_loss"])


def test_balancing_loss_adversarial_logits():
    """A row with a huge logit (probability 1 in f32), a fully padded batch row (its tokens weigh 0), and all-tied
    logits (every probability 1/E: the op takes the lowest indices, torch's top-k any; the loss is k either way)."""
    a = torch.randn(10, E, generator=torch.Generator().manual_seed(7)) * 3
    a[1, 3] = 80.0
    a.requires_grad_()
    m = torch.ones(2, 5, dtype=torch.int64)
    m[1] = 0
    _run(lambda x, mask: per_layer_form((x,), E, K, mask), [(a, m)], False, ["load_balancing_loss"])
    _run(lambda x: per_layer_form((x,), E, K), [(a,)], False, ["load_balancing_loss"])
    tied = torch.full((6, E), 0.25)  # (no gradient check: dL/dP = E·f depends on which tied experts were chosen)
    _run(lambda x: concatenated_form((x,), E, K), [(tied,)], False, ["load_balancing_loss"])


def test_balancing_loss_in_a_training_graph_gives_eager_gradients():
    """The loss added to another objective (the LM loss's place) in one graph: the raised op's backward flows into
    the logits through P only, as the idiom's does."""
    w = torch.randn(16, E, generator=torch.Generator().manual_seed(8), requires_grad=True)

    def step(x, w):
        logits = x @ w
        return logits.square().mean() + 0.01 * per_layer_form((logits, logits * 0.5), E, K)

    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(9))
    _run(step, [(x, w)], False, ["load_balancing_loss"])


def _left_alone(fn, args):
    torch._dynamo.reset()
    c = torch.compile(fn, backend="moe", options={"dense": "eager"})
    with capture_graphs() as log:
        torch.testing.assert_close(c(*args), fn(*args))
    assert not [op for g in log for op in g.moe_ops()], [g.graph_module.code for g in log]


def test_balancing_loss_near_misses_are_left_alone():
    a, b = (t.detach() for t in _logits(10, 10, seed=10))

    def wrong_divisor(a, b):  # f and P over one layer's rows, not all of them
        p = [F.softmax(x, -1) for x in (a, b)]
        counts = sum(torch.histc(torch.topk(q, K, -1)[1].reshape(-1).float(), bins=E, min=0, max=E) for q in p)
        probs = sum(q.sum(0) for q in p)
        return torch.sum(counts / 10.0 * (probs / 10.0).unsqueeze(0)) * E

    def wrong_bins(a, b):  # histc over E + 1 bins: not a per-expert count
        p = F.softmax(a, -1)
        counts = torch.histc(torch.topk(p, K, -1)[1].reshape(-1).float(), bins=E + 1, min=0, max=E)[:E]
        return torch.sum(counts / 10.0 * (p.sum(0) / 10.0).unsqueeze(0)) * E

    def other_softmax(a, b):  # counts from one layer's choice, probabilities from the other's
        pa, pb = F.softmax(a, -1), F.softmax(b, -1)
        counts = torch.histc(torch.topk(pa, K, -1)[1].reshape(-1).float(), bins=E, min=0, max=E)
        return torch.sum(counts / 10.0 * (pb.sum(0) / 10.0).unsqueeze(0)) * E

    def mean_over_experts(a, b):  # the means over the wrong dimension
        p = F.softmax(torch.cat([a, b]), -1)
        f = F.one_hot(torch.topk(p, K, -1)[1], E).float().mean(0)
        return torch.sum(f * p.mean(1)[:E].unsqueeze(0)) * E

    for fn in (wrong_divisor, wrong_bins, other_softmax, mean_over_experts):
        _left_alone(fn, (a, b))


@pytest.mark.parametrize("dynamic", [False, True])
def test_router_z_loss_is_raised(dynamic):
    g = torch.Generator().manual_seed(11)
    cases = [(torch.randn(2, 5, E, generator=g).mul_(4).requires_grad_(),),
             (torch.randn(3, 7, E, generator=g).mul_(4).requires_grad_(),)]
    _run(switch_z_loss, cases, dynamic, ["router_z_loss"])

    def square_mean(x):  # [T, E], x ** 2 written as a product
        return (torch.logsumexp(x, dim=-1) * torch.logsumexp(x, dim=-1)).mean()

    cases = [(torch.randn(9, E, generator=g).requires_grad_(),), (torch.randn(4, E, generator=g).requires_grad_(),)]
    _run(square_mean, cases, dynamic, ["router_z_loss"])


def test_router_z_loss_adversarial_logits():
    """Large logits (logsumexp must not overflow: eager's is stable too), a -inf logit in a row, one row."""
    x = torch.randn(6, E, generator=torch.Generator().manual_seed(12)) * 50
    x[2, 1] = float("-inf")
    _run(lambda t: torch.logsumexp(t, -1).pow(2).mean(), [(x,), (x[:1],)], False, ["router_z_loss"])


def test_router_z_loss_near_misses_are_left_alone():
    x = torch.randn(2, 5, E, generator=torch.Generator().manual_seed(13))
    _left_alone(lambda t: torch.logsumexp(t, -1).pow(2).sum() / 5, (x,))  # divided by one dim, not the rows
    _left_alone(lambda t: torch.logsumexp(t, 1).pow(2).mean(), (x,))  # over the tokens, not the experts
    _left_alone(lambda t: torch.logsumexp(t, -1).pow(3).mean(), (x,))
    _left_alone(lambda t: torch.logsumexp(t.bfloat16(), -1).pow(2).mean(), (x,))  # in bf16, not the op's f32
