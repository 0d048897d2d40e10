"""What ``backend="moe"`` gives inductor with a raised graph (one holding ``torch.ops.moe.*``):
decompositions of our backward ops, and our ops' version in inductor's cache keys. A graph with nothing raised gets
neither: it compiles (and is cached) exactly as under ``backend="inductor"``.

* :data:`DECOMPOSITIONS`: backward ops (``topk_renorm_backward``, ``router_stats_backward``) that inductor compiles
  from aten ops instead of calling them. Inside a
  backward graph an extern call ends inductor's fusions: ``topk_renorm_backward`` there cost the OLMoE and Qwen3
  training steps 3 more kernels per layer (the scatter of the weights' gradient, the dense softmax of the raw-logits
  mode and the add into the router's gradient, each fused into a neighbour in inductor's own graph) and an extern
  call each. Its closed form (:func:`moe_mlir.ops.topk.topk_renorm_backward_decomposition`) is O(rows·K) elementwise
  work and reductions over K, which inductor fuses into the kernels around it. The forward ops stay extern: their
  kernels beat inductor's softmax + ``aten.topk``. They enter inductor's own table
  (``torch._inductor.decomposition.decompositions``) at the first raised graph, not as ``compile_fx``'s
  ``decompositions=`` argument: that table holds pybind functions, which inductor cannot pickle into a cache key, so
  every graph compiled with it bypassed the FX-graph and AOTAutograd caches. From then on, inductor decomposes
  these ops in any graph it compiles in the process (a user's direct ``torch.ops.moe`` calls under
  ``backend="inductor"`` too): that only changes graphs holding them.
* :class:`OpsVersion`: inductor's FX-graph cache and AOTAutograd's cache key a graph by its nodes, and a
  ``torch.ops.moe.*`` node by its name only: what AOTAutograd traces for the op (its autograd, C++ in the extension or
  Python, the backward op it calls, these decompositions) is not in the key, so after a change to any of them a
  warm cache served the old forward/backward pair. The pass (a no-op after inductor's post-grad passes, appended to
  the user's) puts their version into both keys (:func:`ops_version`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ..reference import balance as _balance_ref
from ..ops.balance import router_stats_backward
from ..ops.topk import topk_renorm_backward_decomposition

__all__ = ["DECOMPOSITIONS", "OpsVersion", "ops_version", "raised_graph_config", "register_decompositions"]

moe = torch.ops.moe

def router_stats_backward_decomposition(grad_mean_probs, logits, token_mask, weight_sum):
    """``router_stats_backward`` (the load-balancing loss' backward) in aten ops: the reference's closed form
    ``(w_t / W) · p · (g − <p, g>)``, a row softmax and an elementwise product inductor fuses into one kernel (it was
    an extern call and a kernel in the OLMoE step's loss backward, against inductor's one kernel)."""
    router_stats_backward.check(grad_mean_probs, logits, token_mask, weight_sum)
    return _balance_ref.router_stats_backward(grad_mean_probs, logits, token_mask, weight_sum)


#: The moe ops inductor compiles from their aten decomposition (see the module doc).
DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    moe.topk_renorm_backward.default: topk_renorm_backward_decomposition,
    moe.router_stats_backward.default: router_stats_backward_decomposition,
}

_PACKAGE = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def ops_version() -> str:
    """A hash of what defines how AOTAutograd and inductor see ``torch.ops.moe.*``: the op modules (schemas, fake
    kernels, Python autograd), the references the decompositions and recompute backwards run, this module, and the
    loaded extension (its C++ autograd picks the saved tensors and backward ops), by content."""
    from ..ops import loading
    from ..runtime import extension

    h = hashlib.sha256()
    files = (sorted((_PACKAGE / "ops").glob("*.py")) + sorted((_PACKAGE / "reference").glob("*.py"))
             + [Path(__file__)])
    lib = extension.library_path if loading.kernels_available() else None
    for f in files + ([Path(lib)] if lib else []):
        h.update(f.name.encode())
        try:
            h.update(f.read_bytes())
        except OSError:  # an installed package without one of them: its name still counts
            h.update(b"?")
    h.update(b"extension" if lib else b"python autograd")
    return h.hexdigest()


try:
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_custom_graph_passes
except ImportError:  # pragma: no cover - a torch without custom graph passes: no salt
    CustomGraphPass = None  # type: ignore[assignment, misc]


if CustomGraphPass is not None:

    class OpsVersion(CustomGraphPass):
        """A post-grad pass that changes nothing; its ``uuid()`` (:func:`ops_version`) enters inductor's and
        AOTAutograd's cache keys."""

        def __call__(self, graph: torch.fx.Graph) -> None:
            return None

        def uuid(self) -> Optional[Any]:
            return ("moe_mlir.ops", ops_version())

else:  # pragma: no cover
    OpsVersion = None  # type: ignore[assignment, misc]


_registered = False


def register_decompositions() -> None:
    """Adds :data:`DECOMPOSITIONS` to inductor's decomposition table (once; see the module doc)."""
    global _registered
    if _registered:
        return
    from torch._inductor import decomposition

    for op, fn in DECOMPOSITIONS.items():
        decomposition.decompositions.setdefault(op, fn)
    cached = getattr(decomposition, "fast_random_decomps", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()  # a copy of the table, cached at inductor's first compile
    register_positional_fallbacks()
    _registered = True


def register_positional_fallbacks() -> None:
    """Inductor's lowering of every other ``torch.ops.moe.*`` op: the fallback (an extern call) inductor would make
    for it, with the layout constraint it would choose, called with its arguments positional and the trailing ones
    equal to their defaults left out.

    Inductor normalizes a custom op's arguments before its fallback (every argument from the first defaulted one
    on becomes a keyword, defaults filled in), and its Python wrapper passes them so: PyTorch's argument parser took
    8.7 us for ``moe.route`` with its 11 arguments, 7 of them keywords, against 5.7 us for the same call with its 4
    non-default arguments ([16, 16] logits, the EPYC): at decode, the difference between a raised top-1 router and
    inductor's own fused kernel."""
    try:
        from torch._inductor import lowering
        from torch._library.utils import get_layout_constraint_tag

        lowering.tag_to_layout_constraint  # noqa: B018 - present since torch 2.5; else no rewrite at all
    except (ImportError, AttributeError):  # pragma: no cover - an older torch: inductor's own fallbacks
        return
    for name in torch._C._dispatch_get_all_op_names():
        ns, _, rest = name.partition("::")
        if ns != "moe":
            continue
        packet_name, _, overload = rest.partition(".")
        op = getattr(getattr(torch.ops.moe, packet_name), overload or "default")
        if op in DECOMPOSITIONS or op in lowering.lowerings:
            continue
        constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
        try:
            lowering.make_fallback(op, layout_constraint=constraint, warn=False)
        except AssertionError:  # a decomposition inductor knows for it: inductor keeps its own choice
            continue
        lowering.lowerings[op] = _positional_handler(op, lowering.lowerings[op])


def _positional_handler(op: torch._ops.OpOverload, handler: Callable[..., Any]) -> Callable[..., Any]:
    schema = op._schema

    def positional(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = positional_arguments(schema, args, kwargs)
        return handler(*args, **kwargs)

    positional._is_fallback_handler = True  # type: ignore[attr-defined] # what inductor tells fallbacks by
    return positional


_PLAIN = (bool, int, float, str, type(None))


def positional_arguments(schema: torch._C.FunctionSchema, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args`` and ``kwargs`` of a call of ``schema`` as positional arguments in its order, without the trailing
    ones that equal their defaults. A value counts as its default only when it is a plain Python value of the
    default's own type (``1`` does not stand for a default ``1.0``). A call it cannot write so (a keyword-only
    argument, an unknown keyword) comes back as it was."""
    out = list(args)
    rest = dict(kwargs)
    for a in schema.arguments[len(args):]:
        if a.kwarg_only:
            break
        if a.name in rest:
            out.append(rest.pop(a.name))
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            break
    if rest or len(out) < sum(not a.kwarg_only for a in schema.arguments):
        return tuple(args), dict(kwargs)
    while out:
        a, v = schema.arguments[len(out) - 1], out[-1]
        if not (a.has_default_value() and type(v) in _PLAIN and type(v) is type(a.default_value)
                and v == a.default_value):
            break
        out.pop()
    return tuple(out), {}


def raised_graph_config() -> contextlib.AbstractContextManager:
    """The inductor config a graph holding moe ops (raised, or called by the model) compiles under (a ``torch._inductor.config.patch``): :class:`OpsVersion`
    after the user's post-grad passes. Registers :data:`DECOMPOSITIONS` first. (Not ``compile_fx``'s
    ``config_patches=``, which re-enters ``compile_fx`` by its module name: a wrapper of it would see each graph
    twice.) The AOTAutograd key, the one that served stale backward graphs, is computed inside ``compile_fx``; a
    backward compiled later is keyed by its own graph, which holds what the ops' autograd traced."""
    from torch._inductor import config

    register_decompositions()
    if OpsVersion is None:
        return contextlib.nullcontext()
    passes = [*get_custom_graph_passes(config.post_grad_custom_post_pass), OpsVersion()]
    return config.patch(post_grad_custom_post_pass=passes)
