"""The one check of a ``torch.ops.moe`` call: its op's ODS verifier, run by the compiler on the call's kernel key.

A call is valid when the op its kernel key names (include/MoE/IR/KernelKeys.td: the op built with its ODS builder,
its result types inferred) verifies with the call's sizes: the operands' element types (their ODS type
constraints), the ranks and the relations between sizes, the attributes (the op's verifier in lib/Dialect/MoE/IR)
and the results' sizes against the kernels' i32 indexing. Nothing of an op's rules is written in Python or in the
C++ extension: the fake kernels (what torch.compile and torch.export trace with), the eager references and the
kernel cache's miss path (:func:`moe_mlir.runtime.cache.load`, which the extension calls before it allocates
anything) all call :func:`verify`. The compiler library is loaded once per process (about 9 ms); a key takes about
0.4 ms, and the kernel cache verifies each of its keys once.

The verifier's diagnostic becomes the error the user sees: ``moe.<torch op>: <the verifier's message>``, a
:class:`TypeError` for an element type the operand does not take (``'scores' must be f32, f16 or bf16, got
torch.int64``), else a :class:`ValueError`. A size that torch.compile traces symbolically is left dynamic (``?``)
here: what it takes part in is checked when the call runs.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

import torch

from .abi import MLIR_ELEM
from .keys import key_input, key_value

__all__ = ["verify", "verify_key", "concrete_key", "call_key", "KernelView"]

#: The element type each torch dtype names in a key: the kernels' (abi.MLIR_ELEM), and the ones no op takes, so that
#: the op's type constraint rejects them by name.
_ELEM: dict[torch.dtype, str] = {
    **MLIR_ELEM, torch.float64: "f64", torch.uint8: "ui8", torch.int8: "si8", torch.int16: "i16",
    torch.uint16: "ui16", torch.uint32: "ui32", torch.uint64: "ui64", torch.complex64: "complex<f32>",
    torch.complex128: "complex<f64>", torch.complex32: "complex<f16>", torch.float8_e4m3fn: "f8E4M3FN",
    torch.float8_e5m2: "f8E5M2"}
_DTYPE: dict[str, torch.dtype] = {v: k for k, v in _ELEM.items()}
#: The C++ extension's names of the dtypes no kernel takes (c10::toString; TorchKernels.cpp's dtypeName).
_C10: dict[str, str] = {"Double": "f64", "Byte": "ui8", "Char": "si8", "Short": "i16", "UInt16": "ui16",
                        "UInt32": "ui32", "UInt64": "ui64", "ComplexFloat": "complex<f32>",
                        "ComplexDouble": "complex<f64>", "ComplexHalf": "complex<f16>",
                        "Float8_e4m3fn": "f8E4M3FN", "Float8_e5m2": "f8E5M2"}


def _elem(dtype: torch.dtype) -> str:
    return _ELEM.get(dtype, "complex<f64>")


def _hint(n):
    """A symbolic int's value in the example torch.compile traces with (its hint), or None; a plain value as it is.
    Verifying the example raises at trace time what the call would raise at run time; no guard is added."""
    if not isinstance(n, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return n
    node = n.node
    value = node.maybe_as_int() if isinstance(n, torch.SymInt) else None
    if value is None:
        value = getattr(node, "hint", None)
    return value


def _dims(shape) -> tuple[list[int], list[int]]:
    """The sizes of ``shape`` (a symbolic one without a hint as 0) and the positions of those."""
    sizes, dynamic = [], []
    for d, n in enumerate(shape):
        n = _hint(n)
        if n is None:
            dynamic.append(d)
            sizes.append(0)
            continue
        sizes.append(int(n))
    return sizes, dynamic


class KernelView:
    """An input as the kernel takes it where the torch op converts it first (f64 logits computed in f32, a one-value
    tensor as a scalar): its dtype and shape, for :func:`verify`."""

    def __init__(self, dtype: torch.dtype, shape) -> None:
        self.dtype, self.shape = dtype, tuple(shape)


def concrete_key(key_op: str, args: Mapping[str, Any]) -> Optional[str]:
    """The kernel key of ``key_op`` on ``args`` (by the key's names: a tensor or :class:`KernelView` is an input,
    None is left out, anything else an attribute) with every size static but the symbolic ones without an example;
    None where an attribute is such a symbol."""
    attrs, ins = [], []
    for name, v in args.items():
        if isinstance(v, (torch.Tensor, KernelView)):
            sizes, dynamic = _dims(v.shape)
            ins.append(key_input(name, _elem(v.dtype), sizes, dynamic))
        elif v is not None:
            value = _hint(v)
            if value is None:  # a symbolic attribute without an example: checked when the call runs
                return None
            attrs.append(f"{name}={key_value(value)}")
    return "|".join([key_op, *attrs, *ins])


_DIAGNOSTIC = re.compile(r"^(?:'moe\.\w+' op |kernel key '[\w]+': |moe\.\w+: )?(.*)$")
_TYPE_RULE = re.compile(r"^('[\w]+' must be [\w, ()]+), got (\S+)$")


def _user_error(user_op: str, diagnostics: str) -> Exception:
    """The first diagnostic of the compiler (without its notes) as the torch op's error."""
    first = diagnostics.strip().split("\n", 1)[0]
    body = _DIAGNOSTIC.match(first).group(1)
    m = _TYPE_RULE.match(body)
    if m and m.group(2) in _DTYPE:
        return TypeError(f"moe.{user_op}: {m.group(1)}, got {_DTYPE[m.group(2)]}")
    return ValueError(f"moe.{user_op}: {body}")


_CUSTOM_SCORE = "scoring=custom:"


def verify_key(key: str, user_op: Optional[str] = None) -> None:
    """Verifies the op of ``key`` (a kernel key whose inputs carry the call's sizes); raises the error of the torch op
    ``user_op`` (by default the key's) for an invalid call.

    A custom score's region text is read first by the eager reference's parser (moe_mlir.reference.score_region),
    whose errors name the mistake in the text (a missing moe.yield, an undefined value) where MLIR's parser names its
    grammar; the region's rules are the op verifier's."""
    from . import keys

    for part in key.split("|")[1:]:
        if part.startswith(_CUSTOM_SCORE):
            from ..reference.score_region import parse_score_region

            try:
                parse_score_region(part[len(_CUSTOM_SCORE):])
            except ValueError as e:
                raise _user_error(user_op or key.split("|", 1)[0], str(e)) from None
    try:
        keys.verify_key(key)
    except keys.KeyBuildError as e:
        raise _user_error(user_op or key.split("|", 1)[0], str(e)) from None


def verify(key_op: str, args: Mapping[str, Any], user_op: Optional[str] = None) -> None:
    """Verifies a call of the kernel key ``key_op`` on ``args`` (:func:`concrete_key`): the fake kernels' and the
    eager references' one check; errors name ``user_op`` (the torch op the user called; by default ``key_op``)."""
    key = concrete_key(key_op, args)
    if key is not None:
        verify_key(key, user_op or key_op)


def call_key(key: str, shapes: str) -> str:
    """The key of a kernel cache miss (its ``?`` sizes) with the call's sizes of ``shapes`` (``op|name:elem:dims|...``,
    the extension's): what :func:`verify_key` checks."""
    concrete = {}
    for part in shapes.split("|")[1:]:
        name, elem, dims = part.split(":", 2)
        concrete[name] = f"in:{name}:{_C10.get(elem, elem)}:{dims}"
    return "|".join(concrete.get(p.split(":")[1], p) if p.startswith("in:") else p for p in key.split("|"))
