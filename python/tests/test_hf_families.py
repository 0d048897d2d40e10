"""Every MoE language-model family the installed transformers ships, under ``torch.compile(backend="moe")``,
against eager (issue 48 item 1): code no one here wrote, found rather than listed (:mod:`hf_families`).

For each family: its tiny causal LM (random weights) runs eager at three token counts (7, 1, 12) while a hook
records what its first MoE layer receives (the module holding the ``*Experts``: the sparse-MoE block, or the
decoder layer where the MoE sits in the layer as in Gemma4). That module is then compiled and called on the
recorded inputs; its outputs and the gradients of its parameters and floating inputs must equal eager's. The
routing must be raised to a ``torch.ops.moe`` op, or the family is in :data:`NOT_RAISED` with the reason; no
warning of ours may appear (a raised graph that fails to compile falls back with a :class:`MoERaisingWarning`).

Weights: every parameter is drawn again (normal, std 0.1; 1-D ones around 1), so zero-initialised routers (AFMoE,
Gemma4's scales) do not tie every expert: on exact ties torch's top-k order is unspecified (CPU ``nth_element``:
E = 8, k = 2 gives experts 6, 5) while the moe ops take the lowest index (:func:`test_ties_take_the_lowest_index`).

Test time: the module goes through ``dense="eager"`` (the same raising, our kernels, symbolic token counts and graph
breaks; AOTAutograd runs the raised graph uncompiled): inductor's C++ compile of every graph would cost minutes.
test_hf_models.py and bench/models.py compile whole models through inductor.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import hf_families  # noqa: E402
import moe_mlir  # noqa: E402,F401 - registers the backend
from moe_mlir.backends.dynamo import capture_graphs  # noqa: E402

FAMILIES = hf_families.families()
TOKENS = (7, 1, 12)
ROUTING_OPS = ("route", "topk_renorm")

#: model_type -> why backend "moe" leaves the family's routing to inductor (exactly; the test fails when the
#: family becomes raised, so that the entry goes).
NOT_RAISED: dict[str, str] = {
    "axk2": "its DeepSeek-style group mask fills the excluded groups with 0.0, not -inf (an excluded expert can "
            "outrank a kept one whose biased score is negative); moe.route excludes them",
    "inkling_text": "the shared experts' logits are concatenated to the selected ones and the weights are a "
                    "log-sigmoid softmax over both: no weight transform of moe.route",
    "nllb_moe": "NllbMoeTop2Router: top-2 with expert capacity (token priority by cumulative counts) and the second "
                "expert kept by a threshold on its weight: capacity and dropping are not moe.route's",
    "phimoe": "sparsemixer: each pick's weight is a softmax over the logits within a threshold of it (with "
              "jitter in training), not a top-k gate",
    "switch_transformers": "SwitchTransformersTop1Router: top-1 by argmax with expert capacity (a token beyond "
                           "its expert's capacity is dropped by a cumulative-count mask): no op of the dialect drops",
}


def _randomize(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 else 0.0))


def moe_module(model: torch.nn.Module) -> tuple[str, torch.nn.Module]:
    """(name, module) of the module that holds the first ``*Experts`` module of ``model``."""
    for name, mod in model.named_modules():
        if type(mod).__name__.endswith("Experts") and "." in name:
            parent = name.rsplit(".", 1)[0]
            return parent, model.get_submodule(parent)
    for name, mod in model.named_modules():  # a MoE without an experts module of its own (Doge's CDMoE)
        if type(mod).__name__.endswith(("MoE", "Moe")):
            return name, mod
    raise AssertionError(f"{type(model).__name__}: no *Experts or *MoE module")


def _record_calls(model: torch.nn.Module, module: torch.nn.Module, vocab: int) -> list[tuple[tuple, dict]]:
    calls = []

    from transformers.cache_utils import Cache

    def hook(_, args, kwargs):
        # No cache object: a decoder layer would read and extend the one cache every call mutates (a model that
        # makes one even with use_cache=False: DiffusionGemma).
        calls.append((args, {k: None if isinstance(v, Cache) else v for k, v in kwargs.items()}))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    g = torch.Generator().manual_seed(1)
    try:
        with torch.no_grad():
            for t in TOKENS:
                ids = torch.randint(0, vocab, (2, t), generator=g)
                try:  # no cache: a decoder layer (Gemma4's) would get the one cache object every call mutates
                    model(ids, use_cache=False)
                except TypeError:  # a model without a cache (an encoder)
                    model(ids)
    finally:
        handle.remove()
    assert len(calls) == len(TOKENS), f"{len(calls)} calls of the MoE module for {len(TOKENS)} forwards"
    return calls


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


def _detached(x):
    if isinstance(x, torch.Tensor):
        x = x.detach().clone()
        return x.requires_grad_() if x.is_floating_point() else x
    if isinstance(x, tuple):
        return tuple(_detached(v) for v in x)
    if isinstance(x, list):
        return [_detached(v) for v in x]
    if isinstance(x, dict):
        return {k: _detached(v) for k, v in x.items()}
    return x


def _run(module, args, kwargs):
    """Outputs and gradients (parameters, then floating inputs) of a loss over every floating output."""
    args, kwargs = _detached(args), _detached(kwargs)
    params = getattr(module, "_orig_mod", module)  # a compiled module's parameters are the module's own
    params.zero_grad(set_to_none=True)
    outs = [o for o in _tensors(module(*args, **kwargs)) if o.is_floating_point()]
    sum(o.float().square().mean() for o in outs if o.requires_grad).backward()
    grads = {n: p.grad for n, p in params.named_parameters() if p.grad is not None}
    grads.update({f"input {i}": t.grad for i, t in enumerate(_tensors((args, kwargs))) if t.grad is not None})
    return [o.detach() for o in outs], grads


def _report(model_type: str, name: str, module: torch.nn.Module, log) -> None:
    """With ``$MOE_FAMILIES_REPORT`` set: one JSON line per family appended there (bench/hf_families_table.py
    makes the committed table of it)."""
    path = os.environ.get("MOE_FAMILIES_REPORT")
    if not path:
        return
    import json

    ops: dict[str, int] = {}
    for g in log:
        for op, n in g.counts.items():
            if n:
                ops[op] = ops.get(op, 0) + n
    with open(path, "a") as f:
        f.write(json.dumps({"family": model_type, "module": f"{name}: {type(module).__name__}", "raised": ops,
                            "graphs": len(log), "not_raised": NOT_RAISED.get(model_type)}) + "\n")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_family_matches_eager(model_type):
    model = hf_families.build(model_type)
    _randomize(model)
    name, module = moe_module(model)
    calls = _record_calls(model, module.eval(), hf_families.VOCAB)
    torch._dynamo.reset()
    # dynamic: T = 7 and 12 share one graph (T = 1 gets its own, size 1 being specialized).
    compiled = torch.compile(module, backend="moe", options={"dense": "eager"}, dynamic=True)
    with capture_graphs() as log, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for (args, kwargs), t in zip(calls, TOKENS):
            got, got_grads = _run(compiled, args, kwargs)
            want, want_grads = _run(module, args, kwargs)
            where = f"{model_type} ({name}: {type(module).__name__}), T={t}"
            assert len(got) == len(want), where
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4, msg=lambda m: f"{where}: {m}")
            assert got_grads.keys() == want_grads.keys(), where
            for key, w in want_grads.items():
                torch.testing.assert_close(got_grads[key], w, atol=1e-5, rtol=1e-4,
                                           msg=lambda m: f"{where}, gradient of {key}: {m}")
    ours = [str(w.message) for w in caught if "moe" in f"{w.category.__module__} {w.message}".lower()]
    assert not ours, ours
    assert log and all(g.fallback is None for g in log), [g.fallback for g in log]
    raised = sum(g.counts.get(op, 0) for g in log for op in ROUTING_OPS)
    _report(model_type, name, module, log)
    if model_type in NOT_RAISED:
        assert raised == 0, f"{model_type} is raised now: remove it from NOT_RAISED"
    else:
        assert raised > 0, f"{model_type}: routing not raised ({[dict(g.counts) for g in log]})"


def test_families_are_found():
    """The discovery finds the families (a transformers upgrade that breaks it must not pass with none)."""
    assert len(FAMILIES) >= 50, FAMILIES
    for known in ("mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "gemma4_text", "afmoe"):
        assert known in FAMILIES


def test_ties_take_the_lowest_index():
    """AFMoE as transformers initialises it (a zero router: every expert ties): the raised op takes experts
    0..k-1 for every token, torch's top-k its own unspecified order; the weights are equal (1/k each)."""
    model = hf_families.build("afmoe")
    _, block = moe_module(model)
    router = block.router
    x = torch.randn(1, 5, hf_families.HIDDEN)
    torch._dynamo.reset()
    with torch.no_grad(), capture_graphs() as log:
        _, w, i = torch.compile(router, backend="moe")(x, block.expert_bias)
        _, w_e, _ = router(x, block.expert_bias)
    assert sum(g.counts.get("route", 0) for g in log) == 1
    k = model.config.num_experts_per_tok
    assert torch.equal(i, torch.arange(k).expand(5, k))
    torch.testing.assert_close(w, w_e)
