"""Acceptance of issue #32 item 4 for the load-balancing loss: transformers' MixtralForCausalLM, Qwen3MoeForCausalLM
and OlmoeForCausalLM (tiny configs, random weights, nothing downloaded) with ``output_router_logits=True`` train
20 optimizer steps through ``torch.compile(backend="moe")`` with the same total loss (LM loss +
``router_aux_loss_coef`` · aux loss) as eager at every step (relative 1e-5), over three batch shapes (one with a
left-padded attention mask), and the backend raised both the routers and the loss (no MoERaisingWarning; every
graph that computes the aux loss holds ``moe.load_balancing_loss``).

Cost: ``dynamic=True`` and ``dense="eager"`` (the same raising, the dense code run by AOTAutograd without
inductor's C++ compile), so each model compiles one graph set for the unmasked shapes and one for the masked one.
"""

from __future__ import annotations

import copy
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from moe_mlir.backends.dynamo import MoERaisingWarning, capture_graphs  # noqa: E402
from torch_checks import tiny_moe_causal_lm  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(torch.ops.moe, "load_balancing_loss"),
    reason="torch.ops.moe.load_balancing_loss not registered yet (issue #32, engineer H1's op)")

H, V, STEPS = 32, 64, 20
#: (batch, sequence, left padding of row 0 or None for no attention mask): the steps cycle through them.
SHAPES = [(2, 9, None), (3, 6, None), (2, 8, 3)]
#: ACMoE's fine-tuning coefficient (003, App. Swin): large enough that the aux loss moves the total.
AUX_COEF = 0.1


def _model(name: str) -> torch.nn.Module:
    model = tiny_moe_causal_lm(name, H, vocab_size=V, router_aux_loss_coef=AUX_COEF).train()
    model.config._experts_implementation = "grouped_mm"
    return model


def _batch(step: int, g: torch.Generator):
    b, s, pad = SHAPES[step % len(SHAPES)]
    ids = torch.randint(0, V, (b, s), generator=g)
    if pad is None:
        return dict(input_ids=ids, labels=ids)
    mask = torch.ones(b, s, dtype=torch.int64)
    mask[0, :pad] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "olmoe"])
def test_training_with_the_balancing_loss_matches_eager(name):
    model = _model(name)
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    torch._dynamo.reset()
    c = torch.compile(model, backend="moe", dynamic=True, options={"dense": "eager"})
    g = torch.Generator().manual_seed(7)
    aux_seen = []
    with warnings.catch_warnings(record=True) as record, capture_graphs() as log:
        warnings.simplefilter("always")
        for step in range(STEPS):
            batch = _batch(step, g)
            out, want = c(**batch), ref(**batch)
            # The total (LM + coefficient · aux) and the aux loss itself, at every step.
            torch.testing.assert_close(out.loss, want.loss, rtol=1e-5, atol=0,
                                       msg=lambda m: f"{name}, step {step}: {m}")
            torch.testing.assert_close(out.aux_loss, want.aux_loss, rtol=1e-5, atol=0,
                                       msg=lambda m: f"{name}, step {step}, aux: {m}")
            aux_seen.append(float(want.aux_loss))
            for o, loss in ((opt, out.loss), (opt_ref, want.loss)):
                o.zero_grad()
                loss.backward()
                o.step()
    assert not [str(w.message) for w in record if issubclass(w.category, MoERaisingWarning)]
    assert log and all(g.fallback is None for g in log), [g.fallback for g in log]
    raised = [op for g in log for op in g.moe_ops()]
    # Two graph sets (unmasked shapes, masked shape: dynamic=True serves every length): each raised the two
    # routers and the loss, whichever graph Dynamo put the loss in.
    assert raised.count("load_balancing_loss") == 2 and raised.count("topk_renorm") == 4, raised
    # Not a test that cannot fail: the aux loss is away from its balanced minimum k and moves as the router trains.
    assert len(set(aux_seen)) == STEPS and max(aux_seen) > 2.0
