"""The importer's dispatch table: ``LOWERINGS`` (``"namespace::name.overload"`` -> lowering) and :func:`op_key`.

Its own module so that :mod:`.lowerings` (which fills it) and :mod:`.importer` (which reads it) import it and not
each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.fx as fx

if TYPE_CHECKING:  # pragma: no cover
    from .importer import FxImporter

__all__ = ["LOWERINGS", "Lowering", "lowering", "op_key"]


def op_key(target: Any) -> str:
    """``"aten::add.Tensor"`` for ``torch.ops.aten.add.Tensor`` (``.default`` for the unnamed overload)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname or 'default'}"
    return getattr(target, "__name__", str(target))


Lowering = Callable[["FxImporter", fx.Node, dict[str, Any]], Any]

#: The dispatch table: ``"namespace::name.overload"`` -> lowering(importer, node, bound_args).
LOWERINGS: dict[str, Lowering] = {}


def lowering(*keys: str) -> Callable[[Lowering], Lowering]:
    def register(fn: Lowering) -> Lowering:
        for k in keys:
            LOWERINGS[k] = fn
        return fn

    return register
