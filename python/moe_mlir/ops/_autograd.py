"""Autograd helpers of the ops: the recompute backward (the reference re-run under autograd, for ops whose kernels
are cheap next to the experts), ``ctx.needs_input_grad`` padded to the op's arity, and the stop-gradient autograd."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ..reference import _IN_BACKWARD


def _register_recompute_autograd(op, ref: Callable, tensor_args: "int | Sequence[int]",
                                 float_outputs: Sequence[int]) -> None:
    """Registers a backward that re-runs ``ref`` (same arguments as the op) with grad enabled and returns the input
    gradients.

    ``tensor_args``: the positions of the (optional) tensor operands, or their number when they lead; the rest are
    attributes. ``float_outputs``: the outputs that carry gradients (index outputs do not).
    """
    positions = tuple(range(tensor_args)) if isinstance(tensor_args, int) else tuple(tensor_args)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*[inputs[p] if isinstance(inputs[p], Tensor) else None for p in positions])
        ctx.inputs = [None if p in positions else v for p, v in enumerate(inputs)]
        ctx.present = [isinstance(inputs[p], Tensor) for p in positions]

    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        args = list(ctx.inputs)
        leaves = []
        for p, t, present in zip(positions, saved, ctx.present):
            if present and t.is_floating_point():
                t = t.detach().requires_grad_(True)
            args[p] = t
            leaves.append(t)
        token = _IN_BACKWARD.set(True)
        try:
            with torch.enable_grad():
                outs = ref(*args)
                outs = outs if isinstance(outs, tuple) else (outs,)
                want = [(i, t) for i, t in enumerate(leaves) if isinstance(t, Tensor) and t.requires_grad]
                pairs = [(outs[o], grads[o]) for o in float_outputs if grads[o] is not None]
                result: list[Optional[Tensor]] = [None] * len(args)
                if want and pairs:
                    gs = torch.autograd.grad(
                        [p[0] for p in pairs], [t for _, t in want], [p[1] for p in pairs], allow_unused=True
                    )
                    for (i, t), g in zip(want, gs):
                        result[positions[i]] = None if g is None else g.to(t.dtype)
        finally:
            _IN_BACKWARD.reset(token)
        return tuple(result)

    op.register_autograd(backward, setup_context=setup_context)


def _needs(ctx, n: int) -> tuple[bool, ...]:
    """``ctx.needs_input_grad`` for the op's ``n`` arguments (it covers the arguments the caller passed, not the
    defaults)."""
    given = tuple(ctx.needs_input_grad)
    return given + (False,) * (n - len(given))


def _stop_gradient_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(*(output if isinstance(output, tuple) else (output,)))


def _stop_gradient_backward(ctx, *grads):
    raise AssertionError("unreachable: the outputs of a stop-gradient op are non-differentiable")

