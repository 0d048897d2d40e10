"""End to end: imported graphs run through ``moe-opt --moe-lower-to-llvm | mlir-runner`` (the "runner" backend of
moe_mlir.compile) and match eager PyTorch; the moe ops' compiled lowering matches their eager references on
adversarial inputs; torch.compile(backend="moe") works. Skipped (with the reason) when moe-opt cannot lower the moe
ops yet or mlir-runner is missing.

Tolerance: 1e-5 (abs and rel) — the compiled code and torch both accumulate in f32 but in different orders.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import moe_mlir
from moe_mlir.api import compile
from moe_mlir.backends.tools import MoERuntimeError
from moe_mlir.models import acmoe, attention_inform, hyper_router, similarity_inform, symphony

from test_importer import AtenSurface, TransformerBlock

NAN, INF = float("nan"), float("inf")


def assert_same(got, want, atol=1e-5, rtol=1e-5):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g.detach(), w.detach(), atol=atol, rtol=rtol, equal_nan=True)


@pytest.mark.parametrize("use_custom_ops", [True, False], ids=["custom_ops", "plain_torch"])
@pytest.mark.parametrize("mod", [similarity_inform, attention_inform, hyper_router, acmoe, symphony],
                         ids=lambda m: m.__name__.split(".")[-1])
def test_model_runs_compiled(mod, use_custom_ops, runner):
    model, args = mod.example(use_custom_ops=use_custom_ops)
    compiled = compile(model, args, backend="runner")
    assert compiled.backend == "runner"
    with torch.no_grad():
        assert_same(compiled(*args), model(*args))


def test_transformer_block_runs_compiled(runner):
    torch.manual_seed(0)
    m = TransformerBlock().eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        assert_same(compile(m, (x,), backend="runner")(x), m(x))


def test_aten_surface_runs_compiled(runner):
    torch.manual_seed(1)
    x, i, m = torch.randn(4, 6), torch.randint(0, 6, (4, 2)), torch.rand(4, 6) > 0.5
    model = AtenSurface()
    assert_same(compile(model, (x, i, m), backend="runner")(x, i, m), model(x, i, m))


class Semantics(nn.Module):
    """torch's edge semantics the lowerings must keep: NaN through max/argmax, -inf rows, bf16 rounding."""

    def forward(self, x, h):
        return (
            torch.softmax(x, -1),  # a -inf row gives NaN in torch: so must the compiled code
            torch.logsumexp(x, -1),
            x.amax(-1),
            x.argmax(-1),
            torch.topk(x, 2, dim=0).values,
            (h.float() * 3).to(torch.bfloat16) + h,
            F.gelu(h.float(), approximate="tanh"),
            F.layer_norm(h.float(), (4,)),
        )


def test_edge_semantics_run_compiled(runner):
    x = torch.tensor([[1.0, NAN, 2.0, 0.0], [-INF, -INF, -INF, -INF], [3.0, 3.0, -1.0, 2.0]])
    h = torch.randn(3, 4).to(torch.bfloat16)
    m = Semantics()
    assert_same(compile(m, (x, h), backend="runner")(x, h), m(x, h), atol=1e-2, rtol=1e-2)


class OneOp(nn.Module):
    def __init__(self, name: str, *attrs, first_only: bool = False):
        super().__init__()
        self.name, self.attrs, self.first_only = name, attrs, first_only

    def forward(self, *xs):
        r = getattr(torch.ops.moe, self.name)(*xs, *self.attrs)
        return r[0] if self.first_only else r


def _cases():
    torch.manual_seed(2)
    X = torch.tensor([[1.0, NAN, 3.0, INF, 3.0], [NAN, NAN, 0.0, 1.0, 2.0], [-INF] * 5, [0.5, -INF, 2.0, -INF, -INF],
                      [3.0, 3.0, 3.0, 3.0, 3.0], [INF, 0.0, 1.0, 2.0, 2.0], [0.0] * 5])
    cases = []
    for mode in ("logits", "probs"):
        for renorm in (True, False):
            cases.append((f"topk_renorm-{mode}-{renorm}", OneOp("topk_renorm", 2, mode, renorm), (X,)))
    cases.append(("topk_renorm-k=K", OneOp("topk_renorm", 5), (X,)))
    # k > 64: the CPU kernel's weight epilogue is a loop over 16-lane chunks (unrolled up to k = 64).
    W = torch.cat([torch.cat([X.repeat(1, 4), torch.randn(7, 80)], -1), torch.full((1, 100), -INF)])
    for mode in ("logits", "probs"):
        for renorm in (True, False):
            cases.append((f"topk_renorm-k=90-{mode}-{renorm}", OneOp("topk_renorm", 90, mode, renorm), (W,)))
    u, e = torch.randn(2, 5, 4), torch.softmax(torch.randn(2, 5, 3), -1)
    mask = torch.tensor([[False, True, True, False, True], [False] * 5])
    e_nan = e.clone()
    e_nan[0, 4, 1] = NAN
    cases.append(("similarity_inform-causal", OneOp("similarity_inform", None, None, 0.7, True), (u, e)))

    class Sim(nn.Module):
        def forward(self, u, e, ws, m):
            return torch.ops.moe.similarity_inform(u, e, ws, m, 0.5, True)

    cases.append(("similarity_inform-ws-mask-nan", Sim(), (u, e_nan, torch.randn(4, 4) * 0.3, mask)))
    sc, uu = torch.randn(2, 3, 5, 5) * 2, torch.randn(2, 5, 4) * 0.5
    v, wo, ee = torch.randn(2, 3, 5, 2) * 0.5, torch.randn(4, 6) * 0.5, torch.softmax(torch.randn(2, 5, 3), -1)
    masked = sc.clone()
    masked[0, :, 1, :] = -INF
    masked[1, 0] = -INF
    nan_head = sc.clone()
    nan_head[0, 2, 0, 1] = NAN
    tied = sc.clone()
    tied[:, 1] = tied[:, 0]
    tied[:, 2] = tied[:, 0]
    for tag, s in (("random", sc), ("masked", masked), ("nan_head", nan_head), ("tied_heads", tied)):
        cases.append((f"attention_posterior-min_entropy-{tag}", OneOp("attention_posterior", 1.3), (s, uu, v, wo, ee)))
    # `head` of head_select=all folds to a constant; see the report on returning constants.
    cases.append(("attention_posterior-all-masked", OneOp("attention_posterior", 1.3, "all", first_only=True),
                  (masked, uu, v, wo, ee)))
    x, a = torch.randn(14, 4), torch.randint(0, 3, (14,))
    a[0] = 3  # a singleton; cluster 4 empty
    for norm, meas, emp, clip in (("feature", "mad", "identity", 10.0), ("expert", "variance", "raw", 0.0),
                                  ("global", "mad", "raw", 1.5), ("global", "variance", "identity", 10.0)):
        cases.append((f"mad_dispersion-{norm}-{meas}-{emp}-{clip}", OneOp("mad_dispersion", 5, 1e-3, clip, norm, meas,
                                                                          emp), (x, a.to(torch.int32))))
    A, idx = torch.rand(6, 6), torch.randint(0, 5, (20, 2))
    idx[0] = torch.tensor([2, 2])
    for norm in ("row", "col", "none"):
        cases.append((f"adjacency_update-{norm}", OneOp("adjacency_update", 0.9, norm, norm != "col"), (A, idx)))
    cases.append(("hyper_router", OneOp("hyper_router", 4),
                  (torch.randn(5), torch.randn(6, 5), torch.randn(6), torch.randn(16, 6), torch.randn(16))))
    return cases


@pytest.mark.parametrize("name,model,args", _cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_moe_op_lowering_matches_eager_reference(name, model, args, runner):
    assert_same(compile(model, args, backend="runner")(*args), model(*args))


def test_runtime_index_error_is_reported(runner):
    m = OneOp("mad_dispersion", 3)
    x, good = torch.randn(5, 2), torch.tensor([0, 1, 2, 1, 0])
    compiled = compile(m, (x, good), backend="runner")
    with pytest.raises(MoERuntimeError, match=r"'assign' element 2 is 7, outside \[0, 3\)"):
        compiled(x, torch.tensor([0, 1, 7, 1, 0]))
    with pytest.raises(ValueError, match=r"'assign' holds 7"):
        m(x, torch.tensor([0, 1, 7, 1, 0]))  # eager: the same rule


def test_torch_compile_backend_whole_graph_option(runner):
    """``options={"whole_graph": True}``: each Dynamo graph compiled by the whole-graph MLIR path."""
    torch._dynamo.reset()
    model, args = hyper_router.example()
    compiled = torch.compile(model, backend="moe", dynamic=False,
                             options={"whole_graph": True, "backend": "runner"})
    with torch.no_grad():
        assert_same(compiled(*args), model(*args))


def test_compile_rejects_wrong_input_shapes(runner):
    model, args = similarity_inform.example()
    compiled = compile(model, args, backend="runner")
    with pytest.raises(ValueError, match=r"is tensor<2x9x32xf32>, the compiled function takes tensor<2x8x32xf32>"):
        compiled(torch.randn(2, 9, 32))


class IntegerAndFloatArith(nn.Module):
    def forward(self, a, b, x, y):
        return (torch.remainder(a, b), torch.fmod(a, b), torch.remainder(x, y), torch.fmod(x, y), a.pow(2),
                x.pow(y.abs()), x.pow(3), torch.div(x, y), (a > 0) & (b > 0), ~(a > b))


def test_integer_and_float_arithmetic_semantics(runner):
    """Python-style remainder (sign of the divisor) vs C-style fmod, integer powers, boolean logic."""
    a, b = torch.tensor([7, -7, 7, -7, 0]), torch.tensor([3, 3, -3, -3, 5])
    x, y = torch.tensor([7.5, -7.5, 7.5, -7.5, 0.0]), torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0])
    m = IntegerAndFloatArith()
    assert_same(compile(m, (a, b, x, y), backend="runner")(a, b, x, y), m(a, b, x, y))
