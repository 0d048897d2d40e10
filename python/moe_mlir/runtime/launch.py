"""A compiled kernel of a kernel key, called from Python: the torch op that has no C++ glue.

A torch op's CPU kernel is named by its key (``op|attr=value|...|in:name:elem:dims``, lib/Runtime/Torch/
TorchKernels.h) and built from it by the compiler (include/MoE/IR/KernelKeys.td: the key's op with its ODS builder).
The extension's C++ glue (lib/Runtime/Torch) writes the key, checks and launches with a few microseconds of host
time; :func:`call_kernel` does the same from Python with the generic key writer :func:`kernel_key`, for an op that
has no such glue yet (a new router: its torch op is its ``ops/`` module alone)::

    @torch.library.custom_op("moe::my_op", mutates_args=())
    def my_op(logits: Tensor, k: int) -> Tensor:
        out = logits.new_empty((logits.shape[0], k), dtype=torch.float32)
        call_kernel("my_op", {"logits": logits, "k": k}, [out], dynamic={"logits": (0,)})
        return out

The results are allocated by the caller (the op's fake kernel knows their shapes) and computed in place
(``results-to-out-params``). CPU tensors only.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any, Mapping, Optional, Sequence

import torch

from . import cache
from .abi import describe, mlir_elem, pointers
from .keys import key_input, key_value

__all__ = ["kernel_key", "call_kernel"]


def kernel_key(op: str, args: Mapping[str, Any],
               dynamic: Mapping[str, Sequence[int]] = {}) -> tuple[str, str, list[torch.Tensor]]:
    """The key of ``op`` on ``args`` (by name, in the kernel's parameter order: a tensor is an input, whose dimensions
    listed in ``dynamic[name]`` are token-like, ``?``; None is left out; anything else is an attribute), the call's
    concrete shapes (what the kernel cache verifies) and the input tensors in order."""
    attrs, ins, shapes, tensors = [], [], [], []
    for name, v in args.items():
        if isinstance(v, torch.Tensor):
            elem = mlir_elem(v.dtype)
            ins.append(key_input(name, elem, v.shape, dynamic.get(name, ())))
            shapes.append(key_input(name, elem, v.shape)[len("in:"):])
            tensors.append(v)
        elif v is not None:
            attrs.append(f"{name}={key_value(v)}")
    return "|".join([op, *attrs, *ins]), "|".join([op, *shapes]), tensors


def _take_error(kernel: ctypes.CDLL) -> Optional[str]:
    """The message ``kernel`` reported (an index out of range) in the process's one error slot, cleared; None if there
    is none. The slot (``moeTakeError``, libmoe_cpu_runtime.so, ErrorReporting.h) is looked up through the kernel's
    own dependencies: the copy it reports to, wherever the runtime was found."""
    take = kernel.moeTakeError
    take.argtypes = [ctypes.c_char_p, ctypes.c_int64]
    take.restype = ctypes.c_int32
    buf = ctypes.create_string_buffer(512)
    return buf.value.decode(errors="replace") if take(buf, len(buf)) else None


def call_kernel(op: str, args: Mapping[str, Any], results: Sequence[torch.Tensor],
                dynamic: Mapping[str, Sequence[int]] = {}) -> None:
    """Runs the CPU kernel of the key ``op`` on ``args`` (:func:`kernel_key`) into ``results`` (the kernel's results in
    its order, allocated by the caller, contiguous). The kernel cache validates the call and builds the kernel on a
    miss (:func:`moe_mlir.runtime.cache.load`: the op's ValueError/TypeError for an invalid call); an index the kernel
    reports out of range is a ValueError."""
    key, shapes, inputs = kernel_key(op, args, dynamic)
    for t in (*inputs, *results):
        if t.device.type != "cpu":
            raise ValueError(f"moe.{op}: call_kernel runs CPU kernels; got a tensor on {t.device}")
    if any(not r.is_contiguous() for r in results):
        raise ValueError(f"moe.{op}: the results must be contiguous")
    addr = cache.load(key, shapes)
    inputs = [t.contiguous() for t in inputs]  # kept alive until the call returns
    descs = [describe(t) for t in (*inputs, *results)]
    ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(descs)))(addr)(*pointers(descs))
    err = _take_error(cache.loaded_library(key))
    if err:
        # The extension's wording (TorchOps.cpp, checkReportedError).
        m = re.fullmatch(r"moe\.(\w+): '(\w+)' element (\d+) is (-?\d+), outside \[0, (\d+)\).*", err)
        if m:
            op_name, operand, pos, value, bound = m.groups()
            err = (f"moe.{op_name}: '{operand}' holds {value}, outside [0, {bound}): the value indexes no expert "
                   f"(element {pos})")
        raise ValueError(err)
