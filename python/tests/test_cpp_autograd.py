"""The C++ autograd of the differentiable ``torch.ops.moe.*`` (lib/Runtime/Torch/Autograd.cpp).

With the extension loaded, topk_renorm, similarity_inform, similarity_inform_topk, attention_posterior,
attention_posterior_topk and hyper_router have their autograd in C++ (one ``torch::autograd::Function`` each at
AutogradCPU/AutogradCUDA); ops.py registers its Python autograd only when the extension does not load. What the
gradients are is checked by test_autograd.py (against the spec's maths in float64, gradcheck) and
test_grad_ops.py (the backward kernels); here, what the C++ registration changes:

* a forward+backward step calls no Python of moe_mlir (the point of the change: ~60 us per step at decode sizes);
* ``requires_grad`` on a subset of the inputs: the others get no gradient, and the gradients asked for equal the
  full computation's;
* non-contiguous and undefined output gradients; integer outputs (indices, the chosen head) are non-differentiable;
* AOTAutograd (``torch.compile(fullgraph=True)``) traces the forward and the backward ops as graph nodes and the
  compiled step equals eager;
* double backward raises a clear error; float64 raises the forward's TypeError (the ops take f32/f16/bf16);
* without the extension (``MOE_TORCH_KERNELS=0``) the Python autograd gives the same gradients.

Tolerances: the kernels are the same in every path compared, but AOTAutograd and the Python fallback may order the
same f32 sums differently (the fallback runs the eager references): ``atol=1e-5, rtol=1e-4`` there, exact equality
where the same kernels run on the same inputs.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from moe_mlir import ops
from torch_checks import needs_cpu_kernels

moe = torch.ops.moe
pytestmark = needs_cpu_kernels
PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
TOL = dict(atol=1e-5, rtol=1e-4)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@dataclass
class Case:
    """``op(*args)``; ``diff``: the positions of the differentiable tensor inputs; ``float_out``: the outputs with a
    gradient (the others are integer)."""

    id: str
    op: Callable
    args: tuple
    diff: tuple[int, ...]
    float_out: tuple[int, ...]


def _cases() -> list[Case]:
    g = gen(1)
    probs = lambda *s: torch.softmax(torch.randn(*s, generator=g), -1)  # noqa: E731
    u, e, ws = torch.randn(2, 6, 4, generator=g), probs(2, 6, 5), torch.randn(4, 4, generator=g) * 0.5
    mask = torch.tensor([[True] * 6, [True, False, True, True, False, True]])
    scores = torch.randn(2, 3, 6, 6, generator=g)
    v, wo, ea = torch.randn(2, 3, 6, 2, generator=g), torch.randn(4, 6, generator=g), probs(2, 6, 5)
    emb, w1, b1 = torch.randn(3, generator=g), torch.randn(5, 3, generator=g), torch.randn(5, generator=g)
    w2, b2 = torch.randn(4 * 3, 5, generator=g), torch.randn(12, generator=g)
    return [
        Case("topk_renorm", moe.topk_renorm, (torch.randn(4, 7, generator=g), 3, "logits", True), (0,), (0,)),
        Case("topk_renorm-probs", moe.topk_renorm, (probs(2, 3, 7), 2, "probs", False), (0,), (0,)),
        Case("similarity_inform", moe.similarity_inform, (u, e, ws, mask, 0.7, True), (0, 1, 2), (0,)),
        Case("similarity_inform-no-ws", moe.similarity_inform, (u, e, None, None, 1.0, False), (0, 1), (0,)),
        Case("similarity_inform_topk", moe.similarity_inform_topk, (u, e, 2, ws, mask, 0.7, False, True),
             (0, 1, 3), (0,)),
        Case("attention_posterior", moe.attention_posterior, (scores, u, v, wo, ea, 0.8, "min_entropy", None),
             (0, 1, 2, 3, 4), (0,)),
        Case("attention_posterior-all", moe.attention_posterior, (scores, u, v, wo, ea, 1.0, "all", 2.0),
             (0, 1, 2, 3, 4), (0,)),
        Case("attention_posterior_topk", moe.attention_posterior_topk,
             (scores, u, v, wo, ea, 2, 1.0, "min_entropy", None, True), (0, 1, 2, 3, 4), (0,)),
        Case("hyper_router", moe.hyper_router, (emb, w1, b1, w2, b2, 4), (0, 1, 2, 3, 4), (0, 1)),
    ]


CASES = _cases()
IDS = [c.id for c in CASES]


def _forward(case: Case, wanted) -> tuple[list, tuple]:
    """The op on fresh leaves for the inputs ``wanted`` (``requires_grad``), the others as given: (args, outputs
    as a tuple)."""
    args = [a.detach().clone().requires_grad_(True) if i in wanted else a for i, a in enumerate(case.args)]
    outs = case.op(*args)
    return args, outs if isinstance(outs, tuple) else (outs,)


def _cotangents(case: Case, outs: tuple) -> list[torch.Tensor]:
    return [torch.randn(outs[o].shape, generator=gen(5 + o)) for o in case.float_out]


def _run(case: Case, wanted, cot_fn=None):
    """Forward with ``requires_grad`` on the inputs ``wanted``, then the gradients of ``Σ <out, cot>``: returns
    (outputs, {position: gradient})."""
    args, outs = _forward(case, wanted)
    cots = _cotangents(case, outs)
    if cot_fn is not None:
        cots = [cot_fn(c) for c in cots]
    grads = torch.autograd.grad([outs[o] for o in case.float_out], [args[i] for i in wanted], cots)
    return outs, dict(zip(wanted, grads))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_autograd_is_cpp(case: Case):
    _, out = _forward(case, case.diff)
    assert type(out[0].grad_fn).__name__ == "CppFunction", type(out[0].grad_fn)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_training_step_calls_no_python_of_moe_mlir(case: Case):
    """The forward and the backward of a warm op (its kernels in memory) run without a Python frame of moe_mlir:
    no setup_context, backward or validator in Python (what cost ~60 us per call before)."""
    _run(case, case.diff)  # warm: compile or load the kernels
    calls = []

    def profile(frame, event, arg):
        if event == "call" and "moe_mlir" in frame.f_code.co_filename:
            calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        args, outs = _forward(case, case.diff)
        sum(outs[o].sum() for o in case.float_out).backward()
    finally:
        sys.setprofile(None)
    assert calls == []
    assert all(args[i].grad is not None for i in case.diff)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradients_only_for_the_inputs_that_require_grad(case: Case):
    """Each input alone, and every pair: the gradients equal those of the full computation (same kernels: exactly),
    and the other inputs get none."""
    _, full = _run(case, case.diff)
    subsets = [(i,) for i in case.diff] + list(itertools.combinations(case.diff, 2))
    for wanted in subsets:
        args, outs = _forward(case, wanted)
        cots = _cotangents(case, outs)
        sum((outs[o] * c).sum() for o, c in zip(case.float_out, cots)).backward()
        for i in case.diff:
            if i in wanted:
                assert args[i].grad is not None and args[i].grad.dtype == args[i].dtype
                torch.testing.assert_close(args[i].grad, full[i], atol=0, rtol=0, msg=lambda m: f"{wanted}: {m}")
            else:
                assert args[i].grad is None


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_autograd_grad_of_a_subset_does_not_touch_the_others(case: Case):
    """torch.autograd.grad asked for one input while all require grad: only that one is computed (the others'
    .grad stay None), equal to the full computation."""
    _, full = _run(case, case.diff)
    for i in case.diff:
        args, outs = _forward(case, case.diff)
        cots = _cotangents(case, outs)
        (gi,) = torch.autograd.grad([outs[o] for o in case.float_out], [args[i]], cots)
        torch.testing.assert_close(gi, full[i], atol=0, rtol=0)
        assert all(args[j].grad is None for j in case.diff)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_non_contiguous_output_gradients(case: Case):
    """An output gradient that is a transposed or broadcast view gives the gradients of its contiguous copy."""
    def transposed(c):  # the same values, stored transposed
        return c.transpose(0, -1).contiguous().transpose(0, -1) if c.dim() > 1 else c[::1]

    _, ref = _run(case, case.diff)
    _, got = _run(case, case.diff, transposed)
    for i in case.diff:
        torch.testing.assert_close(got[i], ref[i], atol=0, rtol=0)
    # a broadcast (stride-0) view against its materialized copy
    _, got = _run(case, case.diff, lambda c: c[..., :1].expand(c.shape))
    _, ref = _run(case, case.diff, lambda c: c[..., :1].expand(c.shape).contiguous())
    for i in case.diff:
        torch.testing.assert_close(got[i], ref[i], atol=0, rtol=0)


@pytest.mark.parametrize("case", [c for c in CASES if c.op not in (moe.similarity_inform, moe.hyper_router)],
                         ids=lambda c: c.id)
def test_integer_outputs_are_not_differentiable(case: Case):
    _, outs = _forward(case, case.diff)
    assert outs[0].requires_grad
    for o in range(1, len(outs)):
        assert outs[o].dtype == torch.int32
        assert not outs[o].requires_grad and outs[o].grad_fn is None
    # a loss built only on the choice reaches no input
    with pytest.raises(RuntimeError, match="does not require grad"):
        outs[1].float().sum().backward()


def test_hyper_router_undefined_output_gradient_is_zero():
    """Only ``w`` (or only ``b``) used: the unused output's gradient is undefined and counts as zero; a frozen
    hypernetwork still passes gradient to emb."""
    case = next(c for c in CASES if c.id == "hyper_router")
    emb = case.args[0].detach().requires_grad_(True)
    w, b = moe.hyper_router(emb, *case.args[1:])
    cot = torch.randn(w.shape, generator=gen(2))
    (w * cot).sum().backward()
    emb2 = case.args[0].detach().requires_grad_(True)
    w2, b2 = moe.hyper_router(emb2, *case.args[1:])
    torch.autograd.backward([w2, b2], [cot, torch.zeros_like(b2)])
    assert emb.grad.abs().sum() > 0
    torch.testing.assert_close(emb.grad, emb2.grad, atol=0, rtol=0)
    emb3 = case.args[0].detach().requires_grad_(True)
    moe.hyper_router(emb3, *case.args[1:])[1].sum().backward()
    assert emb3.grad.abs().sum() > 0


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_double_backward_raises_a_clear_error(case: Case):
    args, outs = _forward(case, case.diff)
    loss = sum((outs[o] ** 2).sum() for o in case.float_out)
    grads = torch.autograd.grad(loss, [args[i] for i in case.diff], create_graph=True)
    with pytest.raises(RuntimeError, match=r"moe\.\w+: double backward is not supported"):
        sum(g.sum() for g in grads).backward()


def test_float64_raises_the_forward_type_error():
    """The ops take f32/f16/bf16 (the dialect's MoE_FloatTensor); float64 is refused before any graph is built
    (gradcheck runs in f32 here, test_autograd.py; the closed forms are gradchecked in float64 in test_grad_ops.py)."""
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match=r"moe.topk_renorm: 'scores' must be f32, f16 or bf16, got torch.float64"):
        moe.topk_renorm(x, 2)
    u = torch.randn(1, 3, 2, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match=r"moe.similarity_inform: 'u' must be f32"):
        moe.similarity_inform(u, torch.rand(1, 3, 4), None, None, 1.0, False)


def test_half_inputs_get_gradients_of_their_dtype():
    x = torch.randn(4, 6, generator=gen(3)).to(torch.bfloat16).requires_grad_(True)
    w, _ = moe.topk_renorm(x, 2)
    (w * torch.randn(w.shape, generator=gen(4))).sum().backward()
    assert x.grad.dtype == torch.bfloat16 and x.grad.abs().sum() > 0


# ================================================================================================================
# AOTAutograd
# ================================================================================================================


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compiled_training_step_through_aot_autograd_equals_eager(case: Case):
    """torch.compile(fullgraph=True) with AOTAutograd: the forward graph holds the op, the backward graph the
    backward ops (as nodes, not Python), and the compiled gradients equal eager's."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {}

    def capture(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = str(gm.graph)
            return make_boxed_func(gm.forward)

        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=capture("fw"), bw_compiler=capture("bw"))
    float_out = case.float_out

    def step(*args):
        outs = case.op(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum((outs[o] * (o + 1.5)).sin().sum() for o in float_out)

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    results = []
    for fn in (step, compiled):
        args = [a.detach().clone().requires_grad_(True) if i in case.diff else a for i, a in enumerate(case.args)]
        loss = fn(*args)
        loss.backward()
        results.append((loss.detach(), [args[i].grad for i in case.diff]))
    (l_eager, g_eager), (l_comp, g_comp) = results
    torch.testing.assert_close(l_comp, l_eager, **TOL)
    for a, b in zip(g_comp, g_eager):
        torch.testing.assert_close(a, b, **TOL)
    name = case.op._qualified_op_name.split("::")[1] if hasattr(case.op, "_qualified_op_name") else case.id
    # The similarity forms run their training forward (p and lse saved; the fused form's gate unfused on p).
    forward_ops = {"similarity_inform": ["similarity_inform_fwd.default"],
                   "similarity_inform_topk": ["similarity_inform_fwd.default", "topk_renorm.default"]}
    for f in forward_ops.get(name, [name]):
        assert f"moe.{f}" in graphs["fw"], graphs["fw"]
    backward_ops = {"topk_renorm": ["topk_renorm_backward"],
                    "similarity_inform": ["similarity_inform_backward"],
                    "similarity_inform_topk": ["topk_renorm_backward", "similarity_inform_backward"],
                    "attention_posterior": ["attention_posterior_backward"],
                    "attention_posterior_topk": ["attention_posterior.default", "topk_renorm_backward",
                                                 "attention_posterior_backward"],
                    "hyper_router": ["hyper_router_backward"]}[name]
    for b in backward_ops:
        assert f"moe.{b}" in graphs["bw"], graphs["bw"]


def test_opcheck_of_the_fused_forms_with_gradients():
    """torch.library.opcheck (schema, fake kernel, autograd registration, AOT dispatch) of the fused forms, which
    test_ops.py's samples do not cover, with inputs that require grad."""
    for case in CASES:
        if case.op not in (moe.similarity_inform_topk, moe.attention_posterior_topk):
            continue
        args = tuple(a.detach().clone().requires_grad_(True) if i in case.diff else a
                     for i, a in enumerate(case.args))
        result = torch.library.opcheck(case.op.default, args)
        assert all(v == "SUCCESS" for v in result.values()), (case.id, result)


# ================================================================================================================
# Without the extension: the Python autograd
# ================================================================================================================


def test_python_autograd_without_the_extension_gives_the_same_gradients(tmp_path):
    """MOE_TORCH_KERNELS=0: the ops run their eager references and ops.py registers its Python autograd (one
    autograd per op either way); its gradients equal the C++ autograd's on the compiled kernels, and mad_dispersion
    and adjacency_update stay stop-gradient."""
    results = {}
    for case in CASES:
        _, grads = _run(case, case.diff)
        results[case.id] = [grads[i] for i in case.diff]
    saved = tmp_path / "cpp.pt"
    torch.save(results, saved)
    script = textwrap.dedent(f"""
        import sys, warnings
        warnings.simplefilter("ignore")
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import torch
        from moe_mlir import ops
        assert not ops.kernels_available()
        import test_cpp_autograd as T
        cpp = torch.load({str(saved)!r})
        for case in T.CASES:
            outs, grads = T._run(case, case.diff)
            assert type(outs[0].grad_fn if isinstance(outs, tuple) else outs.grad_fn).__name__ != "CppFunction"
            for i, (g, c) in enumerate(zip([grads[j] for j in case.diff], cpp[case.id])):
                torch.testing.assert_close(g, c, atol=1e-5, rtol=1e-4, msg=lambda m: f"{{case.id}} input {{i}}: {{m}}")
        # the stop-gradient ops stay stop-gradient without the extension
        t = torch.randn(6, 3, requires_grad=True)
        assert not any(o.requires_grad for o in torch.ops.moe.mad_dispersion(t, torch.tensor([0, 1, 0, 2, 1, 1]), 3))
        a = torch.rand(3, 3, requires_grad=True)
        assert not torch.ops.moe.adjacency_update(a, torch.tensor([[0, 1], [1, 2]])).requires_grad
        print("ok")
    """)
    env = dict(os.environ, MOE_TORCH_KERNELS="0", PYTHONPATH=PACKAGE_ROOT)
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout[-2000:] + p.stderr[-4000:]
