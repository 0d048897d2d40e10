"""The cache of raised graphs (moe_mlir.backends.raised_cache): a warm compile of backend "moe" does not trace.

A user's second run (a new process, caches filled) must get what the first got: the same raised graph (same code,
so inductor's caches serve it), the same numbers, forward and backward, with no trace of the model; and a stale,
corrupt or foreign entry must never be served. The conftest gives every test an empty cache directory; the "warm"
compiles here follow a ``torch._dynamo.reset()`` with ``to_aten_graph`` made to fail, so a trace would show.
"""

from __future__ import annotations

import copy
import json
import math
import operator
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.fx as fx  # noqa: E402
from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek  # noqa: E402

from moe_mlir.backends import dynamo, raised_cache  # noqa: E402
from moe_mlir.backends.dynamo import MoERaisingWarning, capture_graphs  # noqa: E402
from torch_checks import init_hf_module, same_expert_sets, tiny_moe_causal_lm  # noqa: E402

H = 32


def _forbid_tracing(monkeypatch) -> None:
    def traced(*args, **kwargs):
        raise AssertionError("the model was traced on a warm compile")

    monkeypatch.setattr(dynamo, "to_aten_graph", traced)


def _entries(tmp_path) -> list:
    d = tmp_path / "raised"
    return sorted(d.glob("*.json")) if d.exists() else []


def _compiled(log) -> list:
    return [(g.moe_ops(), g.fallback, g.graph_module.code) for g in log]


def _run(make, call, dense: str):
    """Compiles ``make()`` afresh under backend "moe" and calls ``call`` on it: (its result, the backend's log);
    no MoERaisingWarning."""
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as record, capture_graphs() as log:
        warnings.simplefilter("always")
        out = call(torch.compile(make(), backend="moe", options={"dense": dense}))
    skipped = [str(w.message) for w in record if issubclass(w.category, MoERaisingWarning)]
    assert not skipped, skipped
    return out, log


@pytest.mark.parametrize("name,dense", [("qwen3_moe", "inductor"), ("mixtral", "eager"), ("olmoe", "eager")])
def test_warm_compile_of_a_causal_lm_serves_the_same_graph_without_tracing(name, dense, tmp_path, monkeypatch):
    model = tiny_moe_causal_lm(name, H, vocab_size=64)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))

    def call(c):
        with torch.no_grad():
            return c(input_ids=ids, labels=ids)

    with torch.no_grad():
        ref = model(input_ids=ids, labels=ids)
    cold, cold_log = _run(lambda: model, call, dense)
    assert [op for g in cold_log for op in g.moe_ops()].count("topk_renorm") == 2
    assert _entries(tmp_path), "the cold compile stored nothing"
    _forbid_tracing(monkeypatch)
    from torch._dynamo.utils import counters

    hits = counters["aot_autograd"]["autograd_cache_hit"]
    warm, warm_log = _run(lambda: model, call, dense)
    assert _compiled(warm_log) == _compiled(cold_log)  # the same ops and the same code: inductor's keys match
    if dense == "inductor":
        assert counters["aot_autograd"]["autograd_cache_hit"] > hits, dict(counters["aot_autograd"])
    for out in (cold, warm):
        for field in ("logits", "aux_loss", "loss"):
            torch.testing.assert_close(getattr(out, field), getattr(ref, field), atol=1e-5, rtol=1e-4)


def test_warm_training_step_equals_eager(tmp_path, monkeypatch):
    """A Qwen3-MoE training step (labels, aux loss, backward) compiled cold, then warm from the entry: the loss and
    every parameter's gradient equal eager's both times."""
    base = tiny_moe_causal_lm("qwen3_moe", H, vocab_size=64).train()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(5))
    ref = copy.deepcopy(base)
    loss_e = ref(input_ids=ids, labels=ids).loss
    loss_e.backward()
    for warm in (False, True):
        if warm:
            _forbid_tracing(monkeypatch)
        model = copy.deepcopy(base)

        def step(c):
            loss = c(input_ids=ids, labels=ids).loss
            loss.backward()
            return loss

        loss, log = _run(lambda: model, step, "eager")
        assert [op for g in log for op in g.moe_ops()].count("topk_renorm") == 2, warm
        torch.testing.assert_close(loss, loss_e, atol=1e-5, rtol=1e-4)
        for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
            assert (p.grad is None) == (q.grad is None), pname
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{pname}: {m}")


def test_warm_router_with_dynamic_floats(tmp_path, monkeypatch):
    """DeepSeek-V3's router under ``dynamic=True`` (its routed_scaling_factor a dynamic float: a 0-d tensor input
    read by ``.item()``), two token counts: one ``moe.route``, the same experts as eager, cold and warm."""
    cfg = DeepseekV3Config(hidden_size=H, moe_intermediate_size=16, n_routed_experts=64, num_experts_per_tok=8,
                           n_group=4, topk_group=2, n_shared_experts=1, norm_topk_prob=True,
                           routed_scaling_factor=2.827)
    router = init_hf_module(deepseek.DeepseekV3TopkRouter(cfg), seed=7)
    xs = [torch.randn(t, H, generator=torch.Generator().manual_seed(t)) for t in (64, 7)]

    def call(c):
        with torch.no_grad():
            return [c(x) for x in xs]

    for warm in (False, True):
        if warm:
            _forbid_tracing(monkeypatch)
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as record, capture_graphs() as log:
            warnings.simplefilter("always")
            outs = call(torch.compile(router, backend="moe", dynamic=True, options={"dense": "eager"}))
        assert not [w for w in record if issubclass(w.category, MoERaisingWarning)]
        assert [g.moe_ops() for g in log] == [["route"]], warm
        with torch.no_grad():
            for (logits, w, i), x in zip(outs, xs):
                logits_e, w_e, i_e = router(x)
                torch.testing.assert_close(logits, logits_e)
                same_expert_sets(w, i, w_e, i_e)


class _Dense(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


def test_graph_with_nothing_to_raise_is_remembered_and_compiled_as_it_is(tmp_path, monkeypatch):
    """A graph without routing is stored as "nothing raised": the warm compile hands inductor the Dynamo graph
    itself, untraced (as backend="inductor" would get it)."""
    m, x = _Dense(), torch.randn(3, 8)
    _, cold = _run(lambda: m, lambda c: c(x), "eager")
    assert cold[0].graph_module is not None and cold[0].raised == 0
    (entry,) = _entries(tmp_path)
    assert json.loads(entry.read_text())["graph"] is None
    _forbid_tracing(monkeypatch)
    out, warm = _run(lambda: m, lambda c: c(x), "eager")
    assert warm[0].raised == 0 and "l_x_" in warm[0].graph_module.code.lower()  # Dynamo's graph, not an aten one
    torch.testing.assert_close(out, m(x))


def test_bad_entries_are_traced_again(tmp_path, monkeypatch):
    """A truncated entry, one of another format and one whose graph has one input more: each is ignored (the
    graph is traced and raised again, no warning, same numbers) and replaced by a good one."""
    model = tiny_moe_causal_lm("mixtral", H, vocab_size=64)
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(3))

    def call(c):
        with torch.no_grad():
            return c(input_ids=ids).logits

    with torch.no_grad():
        ref = model(input_ids=ids).logits
    _, log = _run(lambda: model, call, "eager")
    (path,) = _entries(tmp_path)
    good = json.loads(path.read_text())
    more_inputs = copy.deepcopy(good)
    more_inputs["graph"]["nodes"].insert(0, ["placeholder", "extra", "extra", {"tuple": []}, {"dict": {}}])
    for bad in (path.read_text()[: len(path.read_text()) // 2], json.dumps({**good, "format": -1}),
                json.dumps(more_inputs)):
        path.write_text(bad)
        traces = []
        real = dynamo.to_aten_graph
        monkeypatch.setattr(dynamo, "to_aten_graph", lambda *a: traces.append(1) or real(*a))
        out, again = _run(lambda: model, call, "eager")
        monkeypatch.setattr(dynamo, "to_aten_graph", real)
        assert traces == [1] and _compiled(again) == _compiled(log)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
        assert json.loads(path.read_text()) == good


def test_switched_off_or_unwritable(tmp_path, monkeypatch):
    m, x = _Dense(), torch.randn(3, 8)
    monkeypatch.setenv("MOE_RAISE_CACHE", "0")
    _run(lambda: m, lambda c: c(x), "eager")
    assert _entries(tmp_path) == []
    monkeypatch.delenv("MOE_RAISE_CACHE")
    (tmp_path / "raised").write_text("a file where the directory should be")
    out, log = _run(lambda: m, lambda c: c(x), "eager")  # nothing stored, nothing raised, no error
    torch.testing.assert_close(out, m(x))


def _dynamo_graph(fn, *inputs):
    got = []

    def grab(gm, example_inputs):
        got.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=grab)(*inputs)
    return got[0]


def test_key_follows_what_raising_depends_on(monkeypatch):
    def f(x):
        return torch.softmax(x, -1).topk(2)

    x = torch.randn(4, 8)
    gm, inputs = _dynamo_graph(f, x)
    fakes = dynamo._fake_inputs(gm, inputs)
    key = raised_cache.key_of(gm, fakes)
    assert key is not None and key == raised_cache.key_of(gm, fakes)
    mode = fakes[0].fake_mode
    others = {
        "dtype": raised_cache.key_of(gm, [mode.from_tensor(torch.empty(4, 8, dtype=torch.float64))]),
        "shape": raised_cache.key_of(gm, [mode.from_tensor(torch.empty(4, 9))]),
        "strides": raised_cache.key_of(gm, [mode.from_tensor(torch.empty(8, 4).t())]),
        "requires_grad": raised_cache.key_of(gm, [mode.from_tensor(torch.empty(4, 8, requires_grad=True))]),
    }
    with torch.no_grad():
        others["grad mode"] = raised_cache.key_of(gm, fakes)
    monkeypatch.setenv("MOE_SOMETHING", "1")
    others["MOE_* environment"] = raised_cache.key_of(gm, fakes)
    monkeypatch.delenv("MOE_SOMETHING")
    for what, other in others.items():
        assert other is not None and other != key, what
    assert raised_cache.key_of(gm, [torch.empty(4, 8)]) is None  # real tensors: raising may read their values
    gm.register_buffer("scale", torch.ones(1))  # an attribute: no key (its value is not in the code)
    gm.graph.get_attr("scale")
    assert raised_cache.key_of(gm, fakes) is None


def _same_nodes(a: fx.GraphModule, b: fx.GraphModule) -> None:
    def form(g):
        return [(n.op, n.name, n.target, repr(n.args), repr(n.kwargs)) for n in g.graph.nodes]

    assert form(a) == form(b)


def test_round_trip_keeps_every_argument_kind():
    g = fx.Graph()
    x = g.placeholder("x")
    n = g.placeholder("n")
    c = g.get_attr("c")
    calls = [
        g.call_function(torch.ops.aten.clamp.default, (x, -math.inf, math.inf)),
        g.call_function(torch.ops.aten.add.Scalar, (x, float("nan"))),
        g.call_function(torch.ops.aten.mul.Scalar, (x, -0.0)),
        g.call_function(torch.ops.aten._to_copy.default, (x,), {"dtype": torch.bfloat16, "layout": torch.strided,
                                                                "device": torch.device("cpu"),
                                                                "memory_format": torch.preserve_format}),
        g.call_function(torch.ops.aten.view.default, (x, [n, -1])),
        g.call_function(operator.getitem, (x, (slice(None, 2, None), None))),
        g.call_function(operator.getitem, ((x, c), 1)),
        g.call_function(torch.ops.aten.cat.default, ([x, c], 0)),
        g.call_function(torch.ops.aten.sym_size.int, (x, 0)),
        g.call_function(torch._C._set_grad_enabled, (False,)),
        g.call_function(torch.ops.moe.topk_renorm.default, (x, 2)),
    ]
    g.output(tuple(calls))
    gm = fx.GraphModule({"c": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, g)
    inputs = [torch.empty(2, 3), 2]
    trip = raised_cache.round_trip(gm, inputs)
    assert trip is not None
    rebuilt, entry = trip
    _same_nodes(gm, rebuilt)  # by repr: nan != nan
    assert torch.equal(rebuilt.c, gm.c) and rebuilt.c.dtype == torch.float32
    assert [p.meta["val"] is v for p, v in zip(rebuilt.graph.find_nodes(op="placeholder"), inputs)] == [True, True]
    assert json.loads(json.dumps(entry)) == entry


@pytest.mark.parametrize("what", ["large constant", "lambda target", "data-dependent"])
def test_graphs_that_do_not_serialize_are_not_stored(what):
    g = fx.Graph()
    x = g.placeholder("x")
    attrs = {}
    if what == "large constant":
        attrs["big"] = torch.zeros(raised_cache._MAX_CONSTANT + 1)
        y = g.call_function(torch.ops.aten.add.Tensor, (x, g.get_attr("big")))
    elif what == "lambda target":
        y = g.call_function(lambda t: t + 1, (x,))
    else:
        y = g.call_function(torch.ops.aten.nonzero.default, (x,))
        y.meta["unbacked_bindings"] = {"u0": ()}
    g.output((y,))
    gm = fx.GraphModule(attrs, g)
    assert raised_cache.round_trip(gm, [torch.empty(2)]) is None
