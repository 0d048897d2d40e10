"""torch.export for the whole-graph path: the model exported whole (eval mode), then decomposed to core ATen except
the ops the consumer keeps whole (the MLIR importer keeps ``linear``, ``softmax``, ``layer_norm``... so that the
printed IR stays small and the raising patterns simple)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch.export import ExportedProgram

__all__ = ["export_program"]


def export_program(
    model: torch.nn.Module,
    example_args: Sequence[Any],
    example_kwargs: Optional[dict[str, Any]] = None,
    *,
    decompose: bool = True,
    eval_mode: bool = True,
    keep: Optional[Callable[[Any], bool]] = None,
) -> ExportedProgram:
    """``torch.export`` ``model`` (in eval mode unless told otherwise) and decompose every op of the default table
    for which ``keep(op)`` is false.

    The model's training flag is restored afterwards.
    """
    was_training = model.training
    if eval_mode:
        model.eval()
    try:
        ep = torch.export.export(model, tuple(example_args), kwargs=example_kwargs or {}, strict=False)
    finally:
        model.train(was_training)
    if decompose:
        table = torch.export.default_decompositions()
        for op in list(table.keys()):
            if keep is not None and keep(op):
                table.pop(op)
        ep = ep.run_decompositions(table)
    return ep
