"""What the FX rewrites of :mod:`.raising` and :mod:`.hf_rewrites` share: matching calls and views, reading a
node's fake value, and adding a node with its fake value (so later matchers can read its shape and dtype)."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx as fx

aten = torch.ops.aten

__all__ = ["FLOATS", "VIEWS", "through_views", "fake_val", "new_node", "is_call", "tensor_val"]

#: The float dtypes routing runs on.
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
#: The ops that only view a tensor under another shape.
VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def through_views(n: Any) -> Any:
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in VIEWS:
        n = n.args[0]
    return n


def fake_val(fn, *args, **kwargs):
    """Runs ``fn`` on the fake values of FX nodes (also inside lists: a view's sizes may be SymInt nodes) to get
    the new node's meta['val']."""
    from torch._guards import detect_fake_mode

    vals = list(fx.node.map_arg(args, lambda a: a.meta["val"]))
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None:
        return fn(*vals, **kwargs)
    with mode:
        return fn(*vals, **kwargs)


def new_node(graph: fx.Graph, target, args: tuple, kwargs: Optional[dict] = None, like: Optional[fx.Node] = None) -> fx.Node:
    n = graph.call_function(target, args, kwargs or {})
    n.meta["val"] = fake_val(lambda *a: target(*a, **(kwargs or {})), *args)
    if like is not None and "stack_trace" in like.meta:
        n.meta["stack_trace"] = like.meta["stack_trace"]
    return n


def is_call(n: Any, targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def tensor_val(n: fx.Node) -> Optional[torch.Tensor]:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None
