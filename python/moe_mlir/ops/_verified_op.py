"""``torch.ops.moe.<op>`` defined with its one check: every call of the eager kernel and of the fake kernel first
verifies the call's kernel key (:func:`moe_mlir.runtime.verify.verify`, the op's ODS verifier).

The key's operands and attributes are the torch op's arguments by name (include/MoE/IR/KernelKeys.td names them so);
``views`` says what a kernel reads where that is not the argument itself (a cotangent read as f32, indices read as
i32, an argument the key does not take), so that an op module states its schema once, in the function it decorates,
and its check never repeats the argument list.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Mapping, Optional

import torch

from ..runtime.verify import KernelView, verify

__all__ = ["moe_op", "document", "as_f32", "as_f32_scalar", "as_i32", "not_in_key", "OpCheck"]


def as_f32(t: Optional[torch.Tensor]) -> Optional[KernelView]:
    """A tensor the kernel converts to f32 (a cotangent autograd hands over in any float dtype, f64 logits)."""
    return None if t is None else KernelView(torch.float32, t.shape)


def as_i32(t: Optional[torch.Tensor]) -> Any:
    """Indices the kernel reads as i32: the torch op takes i64 too. Another dtype is left for the verifier to name."""
    if t is not None and t.dtype in (torch.int32, torch.int64):
        return KernelView(torch.int32, t.shape)
    return t


def as_f32_scalar(t: torch.Tensor) -> KernelView:
    """A one-value tensor (a scalar cotangent or saved scalar) read as an f32 scalar: the torch op takes any shape of
    one element (its ``check`` says so), where the kernel's operand has rank 0."""
    return KernelView(torch.float32, ())


def not_in_key(value: Any) -> None:
    """An argument of the torch op that its kernel key does not take (a choice of what to compute, checked here)."""
    return None


class OpCheck:
    """The check of one torch op's calls: binds a call to the op's signature, verifies kernel key ``key`` on the
    arguments mapped through ``views`` (a view returning None leaves the argument out of the key), then runs
    ``check`` (the torch op's own rules, given the arguments by name); errors name ``moe.<user_op>``."""

    def __init__(self, fn: Callable, user_op: str, key: Optional[str] = None,
                 views: Optional[Mapping[str, Callable]] = None, check: Optional[Callable] = None) -> None:
        self.signature = inspect.signature(fn)
        self.user_op, self.key, self.check = user_op, key or user_op, check
        self.views = dict(views or {})
        unknown = set(self.views) - set(self.signature.parameters)
        if unknown:
            raise TypeError(f"moe.{user_op}: views name no argument: {sorted(unknown)}")

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        named = {name: self.views[name](v) if name in self.views else v for name, v in bound.arguments.items()}
        verify(self.key, named, self.user_op)
        if self.check is not None:
            self.check(**bound.arguments)


def document(name: str, doc: str, *objects: Any) -> None:
    """Makes ``doc`` what ``help()`` shows for ``torch.ops.moe.<name>`` (the overload packet users call), its default
    overload (what graphs hold) and ``objects`` (the ``CustomOpDef`` of :mod:`moe_mlir.ops`): torch.library gives a
    custom op's packet no docstring, only its schema."""
    packet = getattr(torch.ops.moe, name)
    for obj in (packet, packet.default, *objects):
        obj.__doc__ = doc


def moe_op(name: str, *, fake: Callable, key: Optional[str] = None, views: Optional[Mapping[str, Callable]] = None,
           check: Optional[Callable] = None) -> Callable[[Callable], Any]:
    """``torch.library.custom_op("moe::<name>")`` of the decorated function (its schema inferred from it; the eager
    reference it runs where no kernel does) with ``fake`` as its fake kernel, both preceded by the call's
    :class:`OpCheck` against kernel key ``key`` (default ``name``). ``check``, when given, runs after the verifier
    with the arguments by name: the rules of the torch op itself that the key's op does not state (what it takes
    and converts before the kernel sees it, which a view hides from the key). The returned op's ``check`` attribute
    is the whole check, for the decompositions that stand in for the op; ``prototype`` and ``fake`` are the decorated
    function and ``fake`` (what a form derived from the op, ops/fused.py's, builds on). The decorated function's
    docstring, after the schema, is the op's ``help()`` (:func:`document`)."""

    def define(fn: Callable):
        check_call = OpCheck(fn, name, key, views, check)

        @functools.wraps(fn)
        def eager(*args, **kwargs):
            check_call(*args, **kwargs)
            return fn(*args, **kwargs)

        @functools.wraps(fake)
        def fake_kernel(*args, **kwargs):
            check_call(*args, **kwargs)
            return fake(*args, **kwargs)

        schema = torch.library.infer_schema(fn, mutates_args=())
        op = torch.library.custom_op(f"moe::{name}", eager, mutates_args=(), schema=schema)
        op.register_fake(fake_kernel)
        op.check, op.prototype, op.fake = check_call, fn, fake
        document(name, f"torch.ops.moe.{name}{schema}\n\n{inspect.cleandoc(fn.__doc__ or '')}", op)
        return op

    return define
