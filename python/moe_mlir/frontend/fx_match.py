"""What the FX rewrites of :mod:`.raising` and :mod:`.hf_rewrites` share: matching calls and views, reading a
node's fake value, and adding a node with its fake value (so later matchers can read its shape and dtype)."""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch
import torch.fx as fx

aten = torch.ops.aten

__all__ = ["FLOATS", "VIEWS", "through_views", "new_node", "is_call", "tensor_val"]

#: The float dtypes routing runs on.
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
#: The ops that only view a tensor under another shape.
VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def through_views(n: Any) -> Any:
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in VIEWS:
        n = n.args[0]
    return n


def new_node(graph: fx.Graph, target, args: tuple, kwargs: Optional[dict] = None, like: Optional[fx.Node] = None) -> fx.Node:
    """A call of ``target`` at the insertion point, its meta['val'] computed on the fake values of its inputs (nested
    ones too: ``cat``'s list, a view's SymInt sizes) in their fake mode, so later matchers can read its shape and
    dtype."""
    from torch._guards import detect_fake_mode

    kwargs = kwargs or {}
    n = graph.call_function(target, args, kwargs)
    vals = fx.node.map_arg(args, lambda a: a.meta["val"])
    mode = detect_fake_mode([a.meta["val"] for a in n.all_input_nodes])
    with mode if mode is not None else contextlib.nullcontext():
        n.meta["val"] = target(*vals, **kwargs)
    if like is not None and "stack_trace" in like.meta:
        n.meta["stack_trace"] = like.meta["stack_trace"]
    return n


def is_call(n: Any, targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def tensor_val(n: fx.Node) -> Optional[torch.Tensor]:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None
