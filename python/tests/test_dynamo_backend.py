"""``torch.compile(backend="moe")`` (moe_mlir.backends.dynamo): raising then inductor, with torch.compile's defaults.

The HF and seed-model acceptance tests are in test_hf_models.py; here: what the backend hands inductor, its
fallbacks, its options, ``moe_mlir.compile``'s default path, and that it loads no LLVM (a subprocess).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import moe_mlir
from moe_mlir.backends import dynamo
from moe_mlir.backends.dynamo import MoERaisingWarning, capture_graphs, moe_backend


class Router(nn.Module):
    """The Mixtral/Qwen router idiom: softmax in f32, top-k, in-place renormalization, cast back."""

    def __init__(self, d: int = 16, e: int = 8, k: int = 2) -> None:
        super().__init__()
        self.gate = nn.Linear(d, e, bias=False)
        self.k = k

    def forward(self, x):
        logits = self.gate(x)
        p = F.softmax(logits, dim=-1, dtype=torch.float)
        w, i = torch.topk(p, self.k, dim=-1)
        w /= w.sum(dim=-1, keepdim=True)
        return w.to(x.dtype), i


class Dense(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.lin(x)).softmax(-1)


def _spy_inductor(monkeypatch) -> list:
    import torch._inductor.compile_fx as cfx

    calls = []
    real = cfx.compile_fx

    def spy(gm, example_inputs, *a, **k):
        calls.append(gm)
        return real(gm, example_inputs, *a, **k)

    monkeypatch.setattr(cfx, "compile_fx", spy)
    return calls


def test_graph_without_idioms_goes_to_inductor_untouched(monkeypatch):
    torch._dynamo.reset()
    calls = _spy_inductor(monkeypatch)
    m = Dense().eval()
    x = torch.randn(4, 16)
    with capture_graphs() as log, torch.no_grad():
        got = torch.compile(m, backend="moe")(x)
        want = m(x)
    torch.testing.assert_close(got, want)
    assert len(log) == 1 and log[0].raised == 0 and log[0].fallback is None
    assert calls == [log[0].graph_module]  # the Dynamo graph itself, as backend="inductor" would get it
    assert any(n.name.startswith("l_") or n.name.startswith("L_") for n in calls[0].graph.find_nodes(op="placeholder"))


def test_router_is_raised_and_follows_new_token_counts(monkeypatch):
    torch._dynamo.reset()
    calls = _spy_inductor(monkeypatch)
    m = Router().eval()
    c = torch.compile(m, backend="moe")
    with capture_graphs() as log, torch.no_grad():
        for t in (6, 13, 64, 2):  # (a size of 1 would be specialized: a third graph)
            x = torch.randn(t, 16)
            (w, i), (w_e, i_e) = c(x), m(x)
            torch.testing.assert_close(w, w_e)
            assert torch.equal(i, i_e) and i.dtype == torch.int64
    assert len(log) == 2  # static first, then one graph with a symbolic token count
    assert [g.moe_ops() for g in log] == [["topk_renorm"], ["topk_renorm"]]
    assert calls == [g.graph_module for g in log]
    sym = [n for n in log[1].graph_module.graph.find_nodes(op="placeholder")
           if isinstance(n.meta.get("val"), torch.SymInt)]
    assert sym, "the second graph should take the token count as a SymInt"


def test_moe_mlir_compile_default_is_the_dynamic_path():
    torch._dynamo.reset()
    m = Router().eval()
    c = moe_mlir.compile(m, (torch.randn(4, 16),))
    with capture_graphs() as log, torch.no_grad():
        for t in (4, 9, 2):
            x = torch.randn(t, 16)
            torch.testing.assert_close(c(x)[0], m(x)[0])
    assert log and all(g.moe_ops() == ["topk_renorm"] for g in log)
    with pytest.raises(ValueError, match="apply to the whole-graph path only"):
        moe_mlir.compile(m, params="argument")
    with pytest.raises(ValueError, match="backend must be"):
        moe_mlir.compile(m, backend="tvm")


def test_raising_failure_falls_back_with_a_warning(monkeypatch):
    torch._dynamo.reset()

    def boom(gm, misses=None):
        raise RuntimeError("matcher bug")

    monkeypatch.setattr(dynamo, "raise_routing_idioms", boom)
    m = Router().eval()
    x = torch.randn(5, 16)
    with capture_graphs() as log, pytest.warns(MoERaisingWarning, match="matcher bug"), torch.no_grad():
        got = torch.compile(m, backend="moe", options={"dense": "eager"})(x)
    torch.testing.assert_close(got[0], m(x)[0])
    assert log[0].fallback == "RuntimeError: matcher bug" and log[0].moe_ops() == []


def test_dense_compiler_rejecting_the_raised_graph_falls_back(monkeypatch):
    """If the dense compiler fails on the raised graph, the original graph is compiled (no raising)."""
    torch._dynamo.reset()
    from torch._dynamo.backends.debugging import aot_eager

    def picky(gm, example_inputs):
        if any(getattr(n.target, "namespace", None) == "moe" for n in gm.graph.nodes):
            raise RuntimeError("no moe ops here")
        return aot_eager(gm, example_inputs)

    monkeypatch.setattr(dynamo, "_dense_compiler", lambda dense: picky)
    m = Router().eval()
    x = torch.randn(5, 16)
    with capture_graphs() as log, pytest.warns(MoERaisingWarning, match="no moe ops here"), torch.no_grad():
        got = torch.compile(m, backend="moe")(x)
    torch.testing.assert_close(got[0], m(x)[0])
    assert log[0].moe_ops() == [] and "no moe ops here" in log[0].fallback


def test_unknown_options_are_refused():
    gm = torch.fx.symbolic_trace(Dense())
    with pytest.raises(ValueError, match=r"unknown options for the moe backend: \['mode'\]"):
        moe_backend(gm, [torch.randn(2, 16)], options={"mode": "max-autotune"})
    with pytest.raises(ValueError, match="'inductor' or 'eager'"):
        moe_backend(gm, [torch.randn(2, 16)], options={"dense": "tvm"})


def test_no_llvm_in_process_and_triton_and_inductor_compile_after():
    """Neither ``torch.ops.moe.*`` on a cold kernel cache (the kernel compiled in a child process, into the disk
    cache) nor ``torch.compile(backend="moe")`` loads libLLVM/libMLIR into the caller, so triton's own LLVM (a full
    torch install; it segfaulted when libLLVM was loaded first) and inductor work after them, and our ops still
    work after triton. Without triton (the lean install) the same invariant is asserted and inductor checked; with
    it (checked by hand with triton 3.9.0 from PyPI) a triton kernel is also compiled to PTX for sm_90 (no GPU
    needed). One subprocess (a clean address space) for both entry points: a second one cost ~3 s of interpreter
    and torch start-up (issue #36)."""
    script = textwrap.dedent("""
        import importlib.util, torch, moe_mlir
        from moe_mlir.backends.dynamo import capture_graphs

        def maps():
            return sorted({l.split()[-1].rsplit("/", 1)[-1] for l in open("/proc/self/maps").read().splitlines()
                           if any(s in l for s in ("libLLVM", "libMLIR", "libMoEExecutorC"))})

        # torch.ops.moe on a cold cache.
        x = torch.randn(37, 64)
        w, i = torch.ops.moe.topk_renorm(x, 8)
        ref_w, ref_i = torch.topk(torch.softmax(x, -1), 8)
        torch.testing.assert_close(w, ref_w / ref_w.sum(-1, keepdim=True))
        assert torch.equal(i.long(), ref_i), (i, ref_i)
        assert maps() == [], maps()

        # torch.compile(backend="moe") raising a router.
        r = torch.nn.Linear(8, 4)
        def route(a):
            return torch.topk(torch.softmax(r(a), -1), 2)
        with capture_graphs() as log, torch.no_grad():
            torch.compile(route, backend="moe")(torch.randn(5, 8))
        assert log[0].moe_ops() == ["topk_renorm"], log
        assert maps() == [], maps()

        if importlib.util.find_spec("triton") is not None:
            import triton, triton.language as tl
            from triton.backends.compiler import GPUTarget

            @triton.jit
            def twice(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
                o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n) * 2, mask=o < n)

            src = triton.compiler.ASTSource(fn=twice, constexprs={"BLOCK": 128},
                                            signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                                                       "BLOCK": "constexpr"})
            assert ".entry twice" in triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        f = torch.compile(lambda a: (a.sin() * 2).sum(-1), backend="inductor")
        torch.testing.assert_close(f(x), (x.sin() * 2).sum(-1))
        w2, _ = torch.ops.moe.topk_renorm(x * 3, 8)
        assert torch.isfinite(w2).all() and torch.allclose(w2.sum(-1), torch.ones(37))
        assert maps() == [], maps()
        print("OK")
    """)
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(moe_mlir.__file__).parents[1]),
                                                           os.environ.get("PYTHONPATH", "")]),
                   MOE_KERNEL_CACHE=cache)
        path = Path(cache) / "after_triton.py"  # a file: @triton.jit reads its function's source
        path.write_text(script)
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-4000:]
        assert any(Path(cache).rglob("*.so")), "the cold call compiled nothing into the cache"


class CountingRouter(nn.Module):
    """Training-mode routing that also updates a buffer in place (an expert-load counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(16, 8)
        self.register_buffer("load", torch.zeros(8))

    def forward(self, x):
        w, i = torch.topk(F.softmax(self.gate(x), -1), 2)
        w = w / w.sum(-1, keepdim=True)
        self.load.add_(F.one_hot(i, 8).sum((0, 1)))
        return (w * x[:, :2]).square().sum()


def test_training_with_a_buffer_update_through_the_raised_graph():
    """Backward through the raised topk_renorm and an in-place buffer update in the same graph: the loss, the
    gradients and the buffer equal eager's over several steps and token counts."""
    torch._dynamo.reset()
    import copy

    m = CountingRouter()
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend="moe", options={"dense": "eager"})
    with capture_graphs() as log:
        for t in (5, 9, 3):
            x = torch.randn(t, 16)
            y, y_ref = c(x), ref(x)
            y.backward()
            y_ref.backward()
            torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(m.load, ref.load)
    torch.testing.assert_close(m.gate.weight.grad, ref.gate.weight.grad)
    torch.testing.assert_close(m.gate.bias.grad, ref.gate.bias.grad)
    assert [g.moe_ops() for g in log] == [["topk_renorm"], ["topk_renorm"]]


class VmapScanRouter(nn.Module):
    """A router after a ``torch.vmap``-ed step (the pattern of Mamba's reference scan in transformers' Jamba,
    Bamba...): Dynamo keeps the vmap as pre-dispatch batching ops in the graph."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.router = Router(d)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        y = torch.vmap(lambda row: row * self.scale + row.sin())(x)
        w, i = self.router(y)
        return w, i


@pytest.mark.parametrize("grad", [False, True])
def test_graph_with_vmap_is_raised_and_equals_eager(grad):
    """A pre-dispatch trace of Dynamo's vmap leaves its batched values in the graph as real-tensor constants,
    which AOTAutograd rejects (the raised graph fell back with a warning: Jamba's routing was never raised). Such
    graphs are traced below the functorch layer: raised, no warning, equal to eager forward and backward."""
    torch._dynamo.reset()
    import copy
    import warnings

    m = VmapScanRouter()
    ref = copy.deepcopy(m)
    c = torch.compile(m, backend="moe", options={"dense": "eager"})
    x = torch.randn(6, 16)
    with capture_graphs() as log, warnings.catch_warnings():
        warnings.simplefilter("error", MoERaisingWarning)
        with torch.set_grad_enabled(grad):
            w, i = c(x)
            w_ref, i_ref = ref(x)
    assert torch.equal(i, i_ref)
    torch.testing.assert_close(w, w_ref)
    assert [g.moe_ops() for g in log] == [["topk_renorm"]] and log[0].fallback is None
    if grad:
        w.square().sum().backward()
        w_ref.square().sum().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
