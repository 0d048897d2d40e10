"""The raised graphs of backend ``"moe"`` on disk, so that a warm compile does not trace the model again.

Raising (:func:`moe_mlir.backends.dynamo._raise`) traces each Dynamo graph to a pre-dispatch aten graph with
``make_fx`` (~0.12 s for a 2-layer Qwen3-MoE forward, ~0.3 s for the first graph of a process) before inductor sees
it. On a user's second run inductor itself traces nothing: its AOTAutograd and FX-graph caches serve the compiled
graphs. Without this cache backend ``"moe"`` still paid the trace of every graph, the only reason its warm compile
was slower than inductor's (+0.1 s a graph; +0.5 s for a generate loop's three graphs).

An entry maps a Dynamo graph to what raising made of it:

* **Key** (:func:`key_of`): the Dynamo graph's code, its inputs as Dynamo traced them (dtype, device, symbolic shape
  and strides, ``requires_grad``, parameter or not; SymInt/SymFloat expressions), the grad mode, and everything
  raising depends on: the package's Python sources and :func:`.inductor_options.ops_version` (the extension), the
  torch and transformers versions and the ``MOE_*`` environment. A graph with attributes (constants, submodules), or
  one on real tensors (not Dynamo's fakes), has no key: it is traced every time, as before.
* **Value**: the raised graph node by node (ops by their qualified names, arguments as JSON) and the idiom counts, or
  "nothing raised" (the Dynamo graph is then compiled as it is, as under ``backend="inductor"``). A graph whose
  nodes do not serialize (higher-order ops, tensors larger than :data:`_MAX_CONSTANT`, unknown argument types,
  data-dependent sizes) is not stored.

The graph inductor compiles is the one rebuilt from the entry on the cold run as on the warm one (:func:`round_trip`),
so both runs hand inductor the same graph (same code, no node metadata) and its caches, keyed by that code, hit.
Entries are written under a temporary name and renamed (concurrent processes never read a partial file); an entry
that does not load is ignored and traced again. The directory is ``<kernel cache>/raised``
(:func:`moe_mlir.runtime.driver.cache_dir`, ``$MOE_KERNEL_CACHE``); ``MOE_RAISE_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch
import torch.fx as fx

__all__ = ["enabled", "key_of", "load", "round_trip", "store"]

#: Bumped when the entry format or the key's contents change.
_FORMAT = 2
#: Largest tensor constant (elements) an entry holds by value (raising's constants are empty bias tensors).
_MAX_CONSTANT = 64
_PACKAGE = Path(__file__).resolve().parents[1]


class _NotCacheable(Exception):
    """The graph holds something an entry cannot represent."""


def enabled() -> bool:
    return os.environ.get("MOE_RAISE_CACHE", "1") != "0"


def _directory() -> Path:
    from ..runtime.driver import cache_dir

    return cache_dir() / "raised"


# ---------------------------------------------------------------------------------------------------------------
# The key
# ---------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _sources() -> str:
    """A hash of the package's Python sources (raising, the ops' schemas and fake kernels, the experts)."""
    h = hashlib.sha256()
    for f in sorted(_PACKAGE.rglob("*.py")):
        h.update(str(f.relative_to(_PACKAGE)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _input(value: Any) -> list[Any]:
    if isinstance(value, torch.Tensor):
        # item_memo: the SymFloat of a dynamic Python float (a 0-d tensor input read by .item())
        return ["tensor", str(value.dtype), str(value.device), [str(s) for s in value.shape],
                [str(s) for s in value.stride()], str(value.storage_offset()), value.requires_grad,
                isinstance(value, torch.nn.Parameter), value.layout is torch.strided,
                str(getattr(value, "item_memo", None))]
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)) or value is None:
        return [type(value).__name__, str(value)]
    raise _NotCacheable(f"an input of type {type(value).__name__}")


def key_of(gm: fx.GraphModule, inputs: list[Any]) -> Optional[str]:
    """The entry name of Dynamo graph ``gm`` on ``inputs`` (its fake inputs), or None when it cannot have one."""
    if any(n.op in ("get_attr", "call_module") for n in gm.graph.nodes):
        return None
    from torch._subclasses.fake_tensor import FakeTensor

    if any(isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor) for v in inputs):
        return None  # a graph traced on real tensors (not Dynamo's): raising may have read their values
    from .inductor_options import ops_version

    try:
        described = [_input(v) for v in inputs]
    except _NotCacheable:
        return None
    transformers = sys.modules.get("transformers")
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("MOE_"))
    parts = [_FORMAT, torch.__version__, getattr(transformers, "__version__", None), _sources(), ops_version(), env,
             torch.is_grad_enabled(), gm.code, described]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:40]


# ---------------------------------------------------------------------------------------------------------------
# Graphs as JSON
# ---------------------------------------------------------------------------------------------------------------


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _target(t: Any) -> list[str]:
    if isinstance(t, torch._ops.OpOverload):
        return ["op", t.namespace, t._opname, t._overloadname]
    module, qualname = getattr(t, "__module__", None), getattr(t, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        try:
            if _resolve(module, qualname) is t:
                return ["fn", module, qualname]
        except (ImportError, AttributeError):
            pass
    raise _NotCacheable(f"the call target {t!r}")


def _untarget(t: list[str]) -> Any:
    if t[0] == "op":
        return getattr(getattr(getattr(torch.ops, t[1]), t[2]), t[3])
    return _resolve(t[1], t[2])


_ENUMS = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}


def _arg(a: Any) -> Any:
    if isinstance(a, fx.Node):
        return {"node": a.name}
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if isinstance(a, float):
        return {"float": repr(a)}  # inf and nan included, exactly
    if isinstance(a, (list, tuple)):
        return {"list" if isinstance(a, list) else "tuple": [_arg(x) for x in a]}
    if isinstance(a, dict) and all(isinstance(k, str) for k in a):
        return {"dict": {k: _arg(v) for k, v in a.items()}}
    if isinstance(a, slice):
        return {"slice": [_arg(a.start), _arg(a.stop), _arg(a.step)]}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    for kind, cls in _ENUMS.items():
        if isinstance(a, cls):
            return {kind: str(a).removeprefix("torch.")}
    raise _NotCacheable(f"an argument of type {type(a).__name__}")


def _unarg(a: Any, nodes: dict[str, fx.Node]) -> Any:
    if not isinstance(a, dict):
        return a
    (kind, v), = a.items()
    if kind == "node":
        return nodes[v]
    if kind == "float":
        return float(v)
    if kind in ("list", "tuple"):
        items = [_unarg(x, nodes) for x in v]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _unarg(x, nodes) for k, x in v.items()}
    if kind == "slice":
        return slice(*(_unarg(x, nodes) for x in v))
    if kind == "device":
        return torch.device(v)
    return getattr(torch, v)  # dtype, layout, memory_format


def _constant(t: Any) -> dict[str, Any]:
    if (not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor or t.numel() > _MAX_CONSTANT
            or t.layout is not torch.strided or t.device.type != "cpu" or t.requires_grad):
        raise _NotCacheable("an attribute that is not a small CPU tensor constant")
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "values": t.flatten().tolist()}


def _unconstant(c: dict[str, Any]) -> torch.Tensor:
    return torch.tensor(c["values"], dtype=getattr(torch, c["dtype"])).reshape(c["shape"])


def _serialize(gm: fx.GraphModule) -> dict[str, Any]:
    nodes, constants = [], {}
    for n in gm.graph.nodes:
        if n.meta.get("unbacked_bindings"):  # data-dependent sizes (nonzero, .item()): traced every time
            raise _NotCacheable("a data-dependent node")
        if n.op == "get_attr":
            constants[n.target] = _constant(getattr(gm, n.target))
            target: Any = n.target
        elif n.op == "call_function":
            target = _target(n.target)
        elif n.op in ("placeholder", "output"):
            target = n.target
        else:
            raise _NotCacheable(f"a {n.op} node")
        nodes.append([n.op, n.name, target, _arg(n.args), _arg(n.kwargs)])
    return {"nodes": nodes, "constants": constants}


def _deserialize(entry: dict[str, Any], inputs: list[Any]) -> fx.GraphModule:
    """The graph of ``entry``; its placeholders carry ``inputs`` (Dynamo's fakes) as their ``val``, as the traced
    graph's did (the rest of the traced graph's node metadata is not kept: inductor's compile does not read it)."""
    graph = fx.Graph()
    made: dict[str, fx.Node] = {}
    for op, name, target, args, kwargs in entry["nodes"]:
        if op == "call_function":
            target = _untarget(target)
        node = graph.create_node(op, target, _unarg(args, made), _unarg(kwargs, made), name=name)
        made[name] = node
    placeholders = graph.find_nodes(op="placeholder")
    if len(placeholders) != len(inputs):
        raise ValueError(f"the entry has {len(placeholders)} inputs, the graph {len(inputs)}")
    for node, value in zip(placeholders, inputs):
        node.meta["val"] = value
    constants = {k: _unconstant(c) for k, c in entry["constants"].items()}
    return fx.GraphModule(constants, graph)


# ---------------------------------------------------------------------------------------------------------------
# Entries
# ---------------------------------------------------------------------------------------------------------------


def round_trip(raised: fx.GraphModule, inputs: list[Any]) -> Optional[tuple[fx.GraphModule, dict[str, Any]]]:
    """``raised`` rebuilt from its entry form (placeholders on ``inputs``), and that form; None when it does not
    serialize."""
    try:
        entry = _serialize(raised)
        return _deserialize(json.loads(json.dumps(entry)), inputs), entry
    except (_NotCacheable, TypeError, ValueError, AttributeError):
        return None


def load(key: str, inputs: list[Any]) -> Optional[tuple[Optional[fx.GraphModule], dict[str, int]]]:
    """(the raised graph on ``inputs``, or None for "nothing raised"; the counts) of entry ``key``, or None when
    there is none or it does not load."""
    try:
        entry = json.loads((_directory() / f"{key}.json").read_text())
        if entry.get("format") != _FORMAT:
            return None
        counts = {str(k): int(v) for k, v in entry["counts"].items()}
        return (_deserialize(entry["graph"], inputs) if entry["graph"] is not None else None), counts
    except Exception:  # noqa: BLE001 - a missing, partial or stale entry is traced again
        return None


def store(key: str, graph: Optional[dict[str, Any]], counts: dict[str, int]) -> None:
    """Writes entry ``key`` (``graph``: :func:`round_trip`'s form, None for "nothing raised"); a failure to write
    (a read-only cache) only costs the next run its trace."""
    try:
        directory = _directory()
        directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"format": _FORMAT, "counts": counts, "graph": graph})
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, directory / f"{key}.json")
    except OSError:
        pass
