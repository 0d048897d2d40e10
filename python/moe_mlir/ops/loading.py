"""The compiled kernels of ``torch.ops.moe.*`` (lib/Runtime/Torch + :mod:`moe_mlir.runtime`): the tables the op
modules fill (their whole-graph lowering, their Python autograd), loading the extension, and the eager fallback's
one-time warning.

The op modules import this one and fill :data:`KEY_OPS`, ``_PYTHON_AUTOGRAD``, ``_STOP_GRADIENT`` and
``_GRAD_OPS`` as they define their ops; :mod:`moe_mlir.ops` calls :func:`_load_kernels` once, after every op module.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

from torch import Tensor

from ._autograd import _stop_gradient_backward, _stop_gradient_setup

_FALLBACK_WARNED = False
_KERNELS_UNAVAILABLE: Optional[str] = None
_EXTENSION_LOADED = False


#: The device types without compiled kernels whose fallback has been announced (once each per process).
_DEVICES_WARNED: set[str] = set()
#: The device types the ops have kernels for (CUDA: where the extension was built with them; an op without a CUDA
#: kernel runs its reference there by design, see moe_mlir.runtime.extension.cuda_unavailable) or need none ("meta":
#: the fake kernels).
_KERNEL_DEVICES = ("cpu", "cuda", "meta")


def _note_fallback(t: Tensor) -> None:
    """Called by the eager kernels: on a CPU tensor they run only when the compiled kernels are unavailable; on a
    device without kernels (MPS, XPU, ...) always, as the documented fallback: the eager references run there (torch
    ops on the tensors' own device), announced by a one-time RuntimeWarning per device type."""
    global _FALLBACK_WARNED
    device = t.device.type
    if device == "cpu" and not _FALLBACK_WARNED:
        _FALLBACK_WARNED = True
        warnings.warn(f"moe: the compiled CPU kernels are unavailable ({_KERNELS_UNAVAILABLE or 'not loaded'}); "
                      "torch.ops.moe.* run the eager references", RuntimeWarning, stacklevel=3)
    elif device not in _KERNEL_DEVICES and device not in _DEVICES_WARNED:
        _DEVICES_WARNED.add(device)
        warnings.warn(f"moe: no compiled kernels for {device} tensors; torch.ops.moe.* run the eager references "
                      f"(moe_mlir.reference: torch ops on the {device} device, slower than a kernel)", RuntimeWarning,
                      stacklevel=3)


#: The torch ops that a whole graph lowers to the op of their kernel key (mlir/lowerings/moe_ops.py: the key's op,
#: built by the compiler from include/MoE/IR/KernelKeys.td), by torch op name: the name of their key.
KEY_OPS: dict[str, str] = {}

#: The Python autograd of the differentiable dialect ops, (op, backward, setup_context). The extension registers their
#: autograd in C++ (lib/Runtime/Torch/Autograd.cpp: no Python per call, the same semantics); these are registered
#: only when it does not load, so that an op has one autograd either way.
_PYTHON_AUTOGRAD: list[tuple] = []

#: The stop-gradient ops (003 §5.10, 004 §1.2): without the extension (whose AutogradCPU kernel runs them below
#: autograd) their outputs are marked non-differentiable here, so they never require grad either way.
_STOP_GRADIENT: list = []

#: The ops with a Python (recompute) autograd that the extension calls back into (:func:`_autograd_call`), by name.
_GRAD_OPS: dict[str, object] = {}
_AUTOGRAD_IMPLS: dict[str, Callable] = {}


def kernels_available() -> bool:
    """True when ``torch.ops.moe.*`` run the compiled kernels on CPU tensors (else the eager references)."""
    return _KERNELS_UNAVAILABLE is None and _EXTENSION_LOADED


def _autograd_call(name: str, keyset, args: tuple):
    """The extension's path for a CPU call of ``route`` with an input that requires grad: the custom op's own autograd
    (the recompute backward registered above), whose forward redispatches to the CPU kernel."""
    impl = _AUTOGRAD_IMPLS.get(name)
    if impl is None:
        from torch._library.autograd import make_autograd_impl

        op = _GRAD_OPS[name]
        impl = _AUTOGRAD_IMPLS[name] = make_autograd_impl(op._opoverload, op)
    return impl(keyset, *args)


def _load_kernels() -> None:
    global _KERNELS_UNAVAILABLE, _EXTENSION_LOADED
    from ..runtime import extension

    reason = extension.load(_autograd_call)
    _EXTENSION_LOADED = reason is None
    _KERNELS_UNAVAILABLE = reason
    if not _EXTENSION_LOADED:
        for op, backward, setup in _PYTHON_AUTOGRAD:
            op.register_autograd(backward, setup_context=setup)
        for op in _STOP_GRADIENT:
            op.register_autograd(_stop_gradient_backward, setup_context=_stop_gradient_setup)
