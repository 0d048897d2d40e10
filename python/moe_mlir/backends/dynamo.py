"""``torch.compile(model, backend="moe")``: raise the routing idioms of each Dynamo graph, then compile it with inductor.

Works with torch.compile's defaults: automatic dynamic shapes (SymInt inputs), graph breaks and data-dependent
expert loops (Dynamo hands the backend one FX graph per region; each is compiled on its own). For each graph:

1. :func:`to_aten_graph`: the Dynamo (torch-level) graph traced to a *pre-dispatch* aten graph with ``make_fx`` on
   the graph's own fake inputs (so SymInt shapes stay symbolic, ``no_grad`` regions stay in the graph as
   ``_set_grad_enabled`` and nothing is decomposed yet). Data-dependent pieces are traced as Dynamo traced them:
   a dynamic Python float (a 0-d tensor input read by ``.item()``) keeps its backed SymFloat, and ``nonzero`` /
   ``.item()`` in a graph (Dynamo's ``capture_*`` options) become unbacked symbols in the same ShapeEnv;
2. :func:`moe_mlir.frontend.raising.raise_routing_idioms` rewrites softmax→topk→renorm, topk→softmax and
   softmax(UUᵀ/τ)E into ``torch.ops.moe.*``;
3. inductor (``torch._inductor.compile_fx.compile_fx``) compiles the raised graph: dense code is inductor's, the moe
   ops are extern (fallback) kernels calling whatever implementation is registered behind ``torch.ops.moe.*``
   (their fake kernels give the symbolic output shapes; their recompute backward keeps training working), except
   the backward ops of :data:`.inductor_options.DECOMPOSITIONS`, which inductor fuses from their aten form; the
   ops' version enters inductor's cache keys (:mod:`.inductor_options`).

Training: raising happens on the forward (pre-dispatch) graph, before autograd; inductor's ``compile_fx`` (or
``aot_eager`` with ``dense="eager"``) then runs AOTAutograd on the raised graph when an input or parameter requires
grad: the joint graph holds each ``torch.ops.moe.*`` call and its registered backward (whatever implements it), and
the partitioned forward and backward graphs are both compiled. In-place buffer updates under ``no_grad`` (Symphony's
graph) stay in the forward graph. ``python/tests/test_training.py`` checks the gradients against eager for every
``moe_mlir.models`` block and HF's Mixtral and Qwen3-MoE blocks.

A graph with nothing to raise is handed to inductor untouched, so it compiles exactly as
``backend="inductor"`` would. If tracing or raising fails, or inductor rejects the raised graph, the backend warns
(:class:`MoERaisingWarning`) and compiles the original graph with inductor: it never fails where inductor succeeds.

Nothing here loads a shared libLLVM or libMLIR: the moe ops' kernels are built by ``libmoe_compiler.so``, whose LLVM
is linked in with its symbols hidden (so that triton's LLVM in the same process is untouched). The whole-graph
execution API runs only on the explicit whole-graph path (``options={"whole_graph": True}``,
``moe_mlir.compile(..., backend="executor")``).

``options`` (``torch.compile(..., backend="moe", options={...})``):

* ``dense``: ``"inductor"`` (default) or ``"eager"`` (the raised aten graph is run as is, by AOTAutograd without a
  compiler: for debugging and fast tests);
* ``whole_graph``: ``True`` compiles the graph with the whole-graph MLIR path instead (static shapes only):
  :func:`moe_mlir.backends.whole_graph.compile_whole_graph` (``target``, ``backend``, ``params`` as for it).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
import torch.fx as fx

from ..frontend.partitioning import is_moe_op, moe_op_name
from ..frontend.raising import raise_routing_idioms
from . import raised_cache

__all__ = ["MoERaisingWarning", "CompiledGraph", "capture_graphs", "to_aten_graph", "moe_backend",
           "register_backend"]


class MoERaisingWarning(UserWarning):
    """Raising was skipped for one graph (tracing or raising failed); the graph is compiled without it."""


@dataclass
class CompiledGraph:
    """What the backend did with one Dynamo graph (see :func:`capture_graphs`)."""

    #: The graph inductor was given: the raised aten graph, or the Dynamo graph when nothing was raised.
    graph_module: fx.GraphModule
    #: How many of each idiom were raised (all zero: nothing was).
    counts: dict[str, int] = field(default_factory=dict)
    #: Why raising was skipped (None when it ran).
    fallback: Optional[str] = None
    #: One line for each top-k left unraised, saying why (also on the ``moe_mlir.raising`` logger).
    misses: list[str] = field(default_factory=list)

    @property
    def raised(self) -> int:
        return sum(self.counts.values())

    def moe_ops(self) -> list[str]:
        """The ``torch.ops.moe.*`` calls in the compiled graph, by name (``"topk_renorm"``...)."""
        return [moe_op_name(n.target) for n in self.graph_module.graph.nodes
                if n.op == "call_function" and is_moe_op(n.target)]


_capture = threading.local()


@contextlib.contextmanager
def capture_graphs() -> Iterator[list[CompiledGraph]]:
    """Collects a :class:`CompiledGraph` for each graph the backend compiles inside the ``with`` block."""
    log: list[CompiledGraph] = []
    prev = getattr(_capture, "log", None)
    _capture.log = log
    try:
        yield log
    finally:
        _capture.log = prev


def _record(entry: CompiledGraph) -> None:
    log = getattr(_capture, "log", None)
    if log is not None:
        log.append(entry)


def _fake_inputs(gm: fx.GraphModule, example_inputs: list[Any]) -> list[Any]:
    """The graph's inputs as Dynamo traced them (fake tensors with symbolic shapes, SymInts)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
    if len(fakes) != len(example_inputs) or any(f is None for f in fakes):
        return list(example_inputs)  # not a Dynamo graph (a hand-made one): trace on the given inputs
    return fakes


def _pre_dispatch(gm: fx.GraphModule) -> bool:
    """Whether ``gm`` is traced at the pre-dispatch level (above autograd: grad-mode regions kept), as it is unless
    it runs ``torch.vmap`` and changes no grad mode. A pre-dispatch trace of Dynamo's vmap (``_add_batch_dim``...:
    Mamba's reference scan in Jamba, Bamba, ...) leaves the batched tensors' values in the graph as real-tensor
    constants, which AOTAutograd rejects ("expected FakeTensor for arg"); traced below the functorch layer the
    vmap becomes its batched aten ops. Without a grad-mode change in the graph the two traces are the same
    program for autograd (AOTAutograd derives the backward from the aten graph either way)."""
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    vmap = any(getattr(t, "__module__", None) == "torch._functorch.predispatch" for t in targets)
    return not vmap or any(t is torch._C._set_grad_enabled for t in targets)


def to_aten_graph(gm: fx.GraphModule, example_inputs: list[Any]) -> fx.GraphModule:
    """``gm`` traced to a pre-dispatch aten graph (same inputs and outputs, shapes as symbolic as Dynamo's)."""
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    pre_dispatch = _pre_dispatch(gm)
    fakes = _fake_inputs(gm, example_inputs)
    if detect_fake_mode(fakes) is None:
        return make_fx(gm, pre_dispatch=pre_dispatch, tracing_mode="real")(*fakes)
    memos = [getattr(f, "item_memo", None) if isinstance(f, torch.Tensor) else None for f in fakes]
    if not any(m is not None for m in memos):
        return make_fx(gm, pre_dispatch=pre_dispatch, tracing_mode="fake")(*fakes)

    # A Python float Dynamo keeps dynamic (``dynamic=True``, or automatic dynamic after a change: RMSNorm's eps,
    # a router's scaling factor...) is a 0-d tensor input read by ``.item()``; its fake carries the backed SymFloat
    # in ``item_memo``. make_fx re-fakes the inputs (same ShapeEnv) and the copies lose the memo, so ``.item()``
    # would be data-dependent and abort the trace: the copies get the originals' memos back (as AOTAutograd's
    # ``_detach_and_copy_item_memo`` does for the same graph).
    def with_memos(*args: Any) -> Any:
        for a, m in zip(args, memos):
            if m is not None and isinstance(a, torch.Tensor) and a.item_memo is None:
                a.item_memo = m
        return gm(*args)

    return make_fx(with_memos, pre_dispatch=pre_dispatch, tracing_mode="fake")(*fakes)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, as it was after it. Tracing a model allocates a few
    hundred thousand short-lived objects; in a process holding torch and transformers (~400k tracked objects) they
    set off full collections that took half of a warm compile's trace (0.15 of 0.3 s for a 2-layer Qwen3-MoE):
    time that backend "inductor", whose warm compile loads its caches without tracing, never pays. What the block
    leaves behind is collected as usual afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _raise(gm: fx.GraphModule, example_inputs: list[Any]) -> CompiledGraph:
    fakes = _fake_inputs(gm, example_inputs)
    key = raised_cache.key_of(gm, fakes) if raised_cache.enabled() else None
    hit = raised_cache.load(key, fakes) if key else None
    if hit is not None:  # a warm compile: raising's result without the trace (module doc of raised_cache)
        raised, counts = hit
        return CompiledGraph(raised if raised is not None else gm, counts)
    misses: list[str] = []
    try:
        with _gc_paused():
            aten_gm = to_aten_graph(gm, example_inputs)
            counts = raise_routing_idioms(aten_gm, misses)
    except Exception as e:  # noqa: BLE001 - any failure here must leave inductor's path intact
        warnings.warn(f"moe backend: raising skipped for this graph ({type(e).__name__}: {e}); compiling it "
                      "without raising", MoERaisingWarning, stacklevel=3)
        return CompiledGraph(gm, {}, fallback=f"{type(e).__name__}: {e}")
    if not any(counts.values()):
        if key:
            raised_cache.store(key, None, counts)
        return CompiledGraph(gm, counts, misses=misses)
    if key and (trip := raised_cache.round_trip(aten_gm, fakes)) is not None:
        # Compile the rebuilt graph, as a warm run will: the same code, so inductor's caches serve that run.
        aten_gm, entry = trip
        raised_cache.store(key, entry, counts)
    return CompiledGraph(aten_gm, counts, misses=misses)


def _dynamo_restart() -> tuple[type[BaseException], ...]:
    """Dynamo's ``RestartAnalysis`` signals (AOTAutograd raises ``TensorifyScalarRestartAnalysis`` when a dynamic
    float cannot stay a tensor): they ask Dynamo to trace the frame again and must reach it, not be taken for a
    compile failure (the original graph would raise the same, after a spurious warning)."""
    try:
        from torch._dynamo.exc import RestartAnalysis
    except ImportError:  # pragma: no cover - torch without dynamo
        return ()
    return (RestartAnalysis,)


def _dense_compiler(dense: str) -> Callable[[fx.GraphModule, list[Any]], Callable[..., Any]]:
    if dense == "inductor":
        from torch._inductor.compile_fx import compile_fx

        return compile_fx
    if dense == "eager":
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager
    raise ValueError(f"options['dense'] must be 'inductor' or 'eager', got {dense!r}")


def _holds_moe_ops(gm: fx.GraphModule) -> bool:
    return any(n.op == "call_function" and is_moe_op(n.target) for n in gm.graph.nodes)


def _raised_graph_config(dense: str, gm: Optional[fx.GraphModule] = None) -> contextlib.AbstractContextManager:
    """The inductor config a graph holding ``torch.ops.moe.*`` compiles under (a raised graph, or ``gm`` when the
    model calls them itself): :func:`.inductor_options.raised_graph_config`, our ops' version in the cache keys (it
    registers our backward ops' decompositions with inductor too). Nothing for a graph without them."""
    if dense != "inductor" or (gm is not None and not _holds_moe_ops(gm)):
        return contextlib.nullcontext()
    from .inductor_options import raised_graph_config

    return raised_graph_config()


def moe_backend(gm: fx.GraphModule, example_inputs: list[Any], **options: Any) -> Callable[..., Any]:
    """The ``torch.compile`` backend ``"moe"`` (see the module doc)."""
    options = dict(options.get("options") or {}, **{k: v for k, v in options.items() if k != "options"})
    if options.pop("whole_graph", False):
        from .whole_graph import whole_graph_backend

        return whole_graph_backend(gm, example_inputs, **options)
    dense = options.pop("dense", "inductor")
    if options:
        raise ValueError(f"unknown options for the moe backend: {sorted(options)} (known: dense, whole_graph)")
    compiler = _dense_compiler(dense)
    entry = _raise(gm, example_inputs)
    if entry.graph_module is gm:
        _record(entry)
        with _raised_graph_config(dense, gm):
            return compiler(gm, example_inputs)
    try:
        with _raised_graph_config(dense):
            compiled = compiler(entry.graph_module, example_inputs)
    except _dynamo_restart():
        raise  # not a failure: Dynamo's request to trace the frame again (e.g. with a float specialized)
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"moe backend: the raised graph did not compile ({type(e).__name__}: {e}); compiling the "
                      "graph without raising", MoERaisingWarning, stacklevel=2)
        entry = CompiledGraph(gm, {}, fallback=f"{type(e).__name__}: {e}")
        _record(entry)
        return compiler(gm, example_inputs)
    _record(entry)
    return compiled


def _backend_init() -> None:
    """Fired by Dynamo when ``backend="moe"`` is resolved: makes HF's experts implementation ``"moe"``
    (:mod:`moe_mlir.experts`) selectable when transformers is in use (it is not imported here)."""
    import sys

    if "transformers" in sys.modules:
        from ..experts import register

        register()


moe_backend._dynamo_backend_init = _backend_init  # type: ignore[attr-defined]


def register_backend() -> None:
    """Registers ``"moe"`` with Dynamo (idempotent)."""
    try:
        from torch._dynamo import list_backends
        from torch._dynamo import register_backend as register
    except Exception:  # pragma: no cover - torch without dynamo
        return
    try:
        if "moe" not in list_backends(exclude_tags=()):
            register(compiler_fn=moe_backend, name="moe")
    except Exception:  # already registered through the entry point
        pass
