"""Index results as int64 from the kernels (``indices_dtype=torch.int64`` of ``torch.ops.moe.route`` and
``torch.ops.moe.topk_renorm``; ``moe.route``/``moe.topk_renorm`` with an i64 result): the same experts as the int32
results, every element written, through autograd, the fake kernels and the whole-graph importer; any other dtype is
a TypeError. A raised router keeps the int32 and a cast (see test_raised_router_casts_the_kernels_int32)."""
import re

import pytest
import torch

import moe_mlir  # noqa: F401  (registers torch.ops.moe)
from moe_mlir.backends.dynamo import capture_graphs

ROUTES = [
    dict(k=2),
    dict(k=4, scoring="sigmoid"),
    dict(k=8, scoring="sigmoid", n_group=8, topk_group=4, renormalize=True, routed_scaling_factor=2.5, bias=True),
    dict(k=6, n_group=8, topk_group=3, group_score="max"),
    dict(k=1, scoring="sigmoid", order="topk_then_score"),
]


def _route(x, spec, **kw):
    spec = dict(spec)
    bias = torch.linspace(-0.2, 0.3, x.shape[1]) if spec.pop("bias", False) else None
    return torch.ops.moe.route(x, bias, spec.pop("k"), **spec, **kw)


def _adversarial(T, E, gen):
    x = torch.randn(T, E, generator=gen)
    if T >= 4:
        x[0] = 0.0                      # every score tied: the lowest indices
        x[1, 3] = float("nan")          # NaN ranks first
        x[2] = float("-inf")            # a fully masked row
        x[3, ::2] = float("-inf")
    return x


@pytest.mark.parametrize("T", [0, 1, 33])
@pytest.mark.parametrize("E", [16, 64])
@pytest.mark.parametrize("spec", ROUTES, ids=[str(i) for i in range(len(ROUTES))])
def test_route_int64_indices_are_the_int32_ones(T, E, spec):
    x = _adversarial(T, E, torch.Generator().manual_seed(T * 100 + E))
    w32, i32 = _route(x, spec)
    w64, i64 = _route(x, spec, indices_dtype=torch.int64)
    assert i32.dtype == torch.int32 and i64.dtype == torch.int64
    assert torch.equal(i64, i32.long())
    torch.testing.assert_close(w64, w32, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("shape", [(0, 16), (1, 16), (33, 16), (2, 9, 64), (5, 256)])
@pytest.mark.parametrize("mode,renormalize", [("logits", True), ("logits", False), ("probs", True)])
def test_topk_renorm_int64_indices_are_the_int32_ones(shape, mode, renormalize):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(7))
    if mode == "probs":
        x = x.softmax(-1)
    k = min(4, shape[-1])
    w32, i32 = torch.ops.moe.topk_renorm(x, k, mode, renormalize)
    w64, i64 = torch.ops.moe.topk_renorm(x, k, mode, renormalize, indices_dtype=torch.int64)
    assert i64.dtype == torch.int64 and i64.shape == i32.shape
    assert torch.equal(i64, i32.long())
    torch.testing.assert_close(w64, w32, rtol=0, atol=0)


def test_bf16_logits_and_replay_with_int64_indices():
    x = torch.randn(17, 32).bfloat16()
    w32, i32 = torch.ops.moe.route(x, None, 4, "softmax", renormalize=True)
    w64, i64 = torch.ops.moe.route(x, None, 4, "softmax", renormalize=True, indices_dtype=torch.int64)
    assert torch.equal(i64, i32.long()) and torch.equal(w64, w32)
    # The given choice comes back as given, in the dtype asked for.
    wr, ir = torch.ops.moe.route(x, None, 4, "softmax", renormalize=True, replay=i64, indices_dtype=torch.int64)
    assert ir.dtype == torch.int64 and torch.equal(ir, i64) and torch.equal(wr, w64)


@pytest.mark.parametrize("dtype", [torch.int16, torch.float32, torch.uint8])
def test_other_index_dtypes_are_a_type_error(dtype):
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match=r"moe\.route: 'indices_dtype' must be torch\.int32 or torch\.int64"):
        torch.ops.moe.route(x, None, 2, indices_dtype=dtype)
    with pytest.raises(TypeError, match=r"moe\.topk_renorm: 'indices_dtype' must be torch\.int32 or torch\.int64"):
        torch.ops.moe.topk_renorm(x, 2, indices_dtype=dtype)


@pytest.mark.parametrize("op", ["route", "topk_renorm"])
def test_gradients_with_int64_indices(op):
    x = torch.randn(9, 16, generator=torch.Generator().manual_seed(3), requires_grad=True)
    g = torch.randn(9, 2, generator=torch.Generator().manual_seed(4))

    def run(**kw):
        xx = x.detach().clone().requires_grad_(True)
        if op == "route":
            w, i = torch.ops.moe.route(xx, None, 2, "sigmoid", renormalize=True, **kw)
        else:
            w, i = torch.ops.moe.topk_renorm(xx, 2, **kw)
        (w * g).sum().backward()
        return w, i, xx.grad

    w32, i32, g32 = run()
    w64, i64, g64 = run(indices_dtype=torch.int64)
    assert torch.equal(i64, i32.long()) and torch.equal(w64, w32)
    torch.testing.assert_close(g64, g32, rtol=0, atol=0)


def test_fake_kernels_give_the_dtype():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 16)
        assert torch.ops.moe.route(x, None, 2, indices_dtype=torch.int64)[1].dtype == torch.int64
        assert torch.ops.moe.route(x, None, 2)[1].dtype == torch.int32
        assert torch.ops.moe.topk_renorm(x, 2, indices_dtype=torch.int64)[1].dtype == torch.int64


def test_kernel_key_names_the_int64_result():
    from moe_mlir.runtime import keys

    text = keys.kernel_module("topk_renorm|k=2|out:indices:i64|in:scores:f32:?x16")
    assert re.search(r"-> tensor<\?x2xf32>, tensor<\?x2xi64>", text), text
    with pytest.raises(keys.KeyBuildError, match="no result 'bogus'"):
        keys.kernel_module("topk_renorm|k=2|out:bogus:i64|in:scores:f32:?x16")
    # The fused mixing ops keep i32 indices: the op verifier refuses the key.
    with pytest.raises(keys.KeyBuildError, match="32-bit signless integer"):
        keys.kernel_module("similarity_inform_topk|k=2|out:indices:i64|in:u:f32:1x?x8|in:e:f32:1x?x4")


def _switch_hf(x):
    probs = torch.softmax(x, dim=-1, dtype=torch.float32)
    return torch.max(probs, dim=-1, keepdim=True)


def _mixtral(x):
    w, i = torch.topk(torch.softmax(x, dim=-1, dtype=torch.float32), 2, dim=-1)
    return w / w.sum(-1, keepdim=True), i


@pytest.mark.parametrize("fn", [_switch_hf, _mixtral], ids=["switch_max", "mixtral_topk"])
def test_raised_router_casts_the_kernels_int32(fn):
    """torch.topk / max give int64: raising keeps the op's int32 and casts after it (a call with a dtype argument
    costs torch.ops' parser more than inductor's fused cast at decode: bench/index_dtype.py); the results are eager's
    at two token counts of one compile."""
    from torch._inductor.utils import fresh_cache, run_and_get_code

    c = torch.compile(fn, backend="moe", dynamic=True)
    with fresh_cache(), capture_graphs() as log:
        for T in (16, 33):
            x = torch.randn(T, 16, generator=torch.Generator().manual_seed(T))
            (w, i), codes = run_and_get_code(lambda: c(x))
            w_ref, i_ref = fn(x)
            assert i.dtype == torch.int64 and torch.equal(i, i_ref)
            torch.testing.assert_close(w, w_ref)
    assert any(g.moe_ops() for g in log)
    code = "\n".join(codes)
    assert not re.search(r"torch\.ops\.moe\.\w+\.default\([^\n]*int64", code), code
    assert "_to_copy" in code, code


def test_whole_graph_path_imports_the_int64_result():
    """The whole-graph path (torch.export -> MLIR -> executor) imports a call with indices_dtype=torch.int64 as the
    op with its i64 result (the key's out:indices:i64), equal to eager."""
    import moe_mlir

    class Router(torch.nn.Module):
        def forward(self, x):
            return torch.ops.moe.topk_renorm(x, 2, indices_dtype=torch.int64)

    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(5))
    compiled = moe_mlir.compile(Router(), example_args=(x,), backend="executor")
    w, i = compiled(x)
    w_ref, i_ref = torch.ops.moe.topk_renorm(x, 2)
    assert "tensor<12x2xi64>" in compiled.mlir, compiled.mlir
    assert i.dtype == torch.int64 and torch.equal(i, i_ref.long())
    torch.testing.assert_close(w, w_ref)
