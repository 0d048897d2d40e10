"""The seed models' auxiliary losses (issue #32 item 3): ``balance_loss_coef`` / ``z_loss_coef`` on the standard
SMoE block, ACMoE's two-layer stack (the paper's recipe: 0.01, 0.1 for fine-tuning) and HyperRouter give
``aux_loss`` = coefficient · loss of the router's logits, the same through ``torch.ops.moe.*`` and through the
plain-PyTorch idioms, with the same gradients; under ``torch.compile(backend="moe")`` the idioms are raised to the
loss ops."""

from __future__ import annotations

import warnings

import pytest
import torch

from moe_mlir.backends.dynamo import MoERaisingWarning, capture_graphs
from moe_mlir.models import ACMoEStack, HyperRouterBlock, StandardSMoEBlock

pytestmark = pytest.mark.skipif(
    not all(hasattr(torch.ops.moe, n) for n in ("load_balancing_loss", "router_z_loss")),
    reason="torch.ops.moe.load_balancing_loss / router_z_loss not registered yet (issue #32, engineer H1's ops)")

E, K = 8, 2


def _reference_losses(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Switch's balancing loss and ST-MoE's z-loss of logits [T, E], written from their definitions."""
    p = torch.softmax(logits, -1)
    chosen = torch.zeros_like(p).scatter_(1, p.topk(k, -1).indices, 1.0)
    balance = logits.shape[1] * (chosen.mean(0) * p.mean(0)).sum()
    z = torch.logsumexp(logits, -1).square().mean()
    return balance, z


def _pair(cls, seed: int, **kw):
    torch.manual_seed(seed)
    ops = cls(use_custom_ops=True, **kw).train()
    plain = cls(use_custom_ops=False, **kw).train()
    plain.load_state_dict(ops.state_dict())
    return ops, plain


def test_standard_block_aux_loss_is_the_coefficients_times_the_losses():
    block, _ = _pair(StandardSMoEBlock, 0, num_experts=E, k=K, balance_loss_coef=0.01, z_loss_coef=1e-3)
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1))
    block(x)
    with torch.no_grad():  # the router's logits, recomputed from the block's parts
        u = block.ln2(x + block.attn(block.ln1(x)).out)
        logits = block.gate(u).reshape(-1, E)
    balance, z = _reference_losses(logits, K)
    torch.testing.assert_close(block.aux_loss.detach(), 0.01 * balance + 1e-3 * z, atol=1e-7, rtol=1e-5)
    assert block.aux_loss.dtype == torch.float32 and block.aux_loss.requires_grad


def test_no_coefficients_no_aux_loss():
    block = StandardSMoEBlock(num_experts=E, k=K)
    block(torch.randn(1, 4, 32))
    assert block.aux_loss.item() == 0.0 and not block.aux_loss.requires_grad
    with pytest.raises(ValueError, match="balance_loss_coef"):
        StandardSMoEBlock(balance_loss_coef=-0.01)
    with pytest.raises(ValueError, match="z_loss_coef"):
        StandardSMoEBlock(z_loss_coef=float("nan"))


@pytest.mark.parametrize("cls,kw", [
    (ACMoEStack, dict(balance_loss_coef=0.01)),  # ACMoE's pre-training recipe
    (ACMoEStack, dict(balance_loss_coef=0.1, z_loss_coef=1e-3)),  # its fine-tuning recipe, plus a z-loss
    (HyperRouterBlock, dict(balance_loss_coef=0.01, z_loss_coef=1e-3)),
])
def test_custom_ops_and_plain_idioms_agree_with_gradients(cls, kw):
    ops, plain = _pair(cls, 2, num_experts=E, k=K, **kw)
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(3))
    for m in (ops, plain):
        (m(x).square().mean() + m.aux_loss).backward()
    torch.testing.assert_close(ops.aux_loss, plain.aux_loss, atol=1e-7, rtol=1e-5)
    assert ops.aux_loss.item() > 0
    for (name, p), q in zip(ops.named_parameters(), plain.parameters()):
        if p.grad is not None or q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_plain_idioms_are_raised_under_the_moe_backend():
    """The plain-PyTorch model (no custom op in its code) compiled with backend="moe": its routers and both layers'
    losses are raised; the loss and its gradients equal eager's."""
    _, plain = _pair(StandardSMoEBlock, 4, num_experts=E, k=K, balance_loss_coef=0.01, z_loss_coef=1e-3)
    ref = StandardSMoEBlock(num_experts=E, k=K, use_custom_ops=False, balance_loss_coef=0.01, z_loss_coef=1e-3)
    ref.load_state_dict(plain.state_dict())
    torch._dynamo.reset()
    c = torch.compile(plain, backend="moe", options={"dense": "eager"})
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(5))
    with warnings.catch_warnings(record=True) as record, capture_graphs() as log:
        warnings.simplefilter("always")
        got = c(x).square().mean() + plain.aux_loss
        got.backward()
    want = ref(x).square().mean() + ref.aux_loss
    want.backward()
    assert not [str(w.message) for w in record if issubclass(w.category, MoERaisingWarning)]
    raised = sorted(op for g in log for op in g.moe_ops())
    assert raised == ["load_balancing_loss", "router_z_loss", "topk_renorm"], raised
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
