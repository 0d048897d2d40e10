"""Loads the C++ torch extension (``libmoe_torch.so``: the CPU kernels of ``torch.ops.moe.*``) and connects it to the
kernel cache.

Found at ``$MOE_TORCH_LIB`` or ``<build>/lib/libmoe_torch.so`` (the build directories of :mod:`moe_mlir.runtime.locate`).
Loading it registers the CPU kernels with the dispatcher; :func:`load` then hands the extension the cache's
:func:`moe_mlir.runtime.cache.load` (once, through ctypes: calls never go through ctypes).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Callable, Optional

import torch

from . import cache

__all__ = ["load", "find_library", "clear_kernels", "library_path"]

_lib: Optional[ctypes.PyDLL] = None
library_path: Optional[str] = None


def find_library() -> Optional[str]:
    env = os.environ.get("MOE_TORCH_LIB")
    if env:
        return env if Path(env).is_file() else None
    from .locate import find_runtime_lib as _find_runtime_lib

    return _find_runtime_lib("libmoe_torch.so")


def load(validators: dict[str, Callable[[dict, dict], None]], grad_path: Callable) -> Optional[str]:
    """Loads the extension; returns None on success, else why it is unavailable.

    ``grad_path(name, keyset, args)``: runs op ``name`` (dispatch keys ``keyset``) on ``args`` (a tuple of the schema's arguments) with its autograd, for
    the calls where some input requires grad (the extension's AutogradCPU kernel takes the others in C++)."""
    global _lib, library_path
    cache.validators.update(validators)
    if _lib is not None:
        return None
    if os.environ.get("MOE_TORCH_KERNELS", "1") == "0":
        return "MOE_TORCH_KERNELS=0"
    path = find_library()
    if path is None:
        return "libmoe_torch.so not found: build the project (cmake --build build) or set MOE_TORCH_LIB"
    try:
        torch.ops.load_library(path)
        lib = ctypes.PyDLL(path)  # the same handle; PyDLL keeps the GIL during the call
        lib.moeTorchSetLoader.argtypes = [ctypes.py_object, ctypes.py_object]
        lib.moeTorchSetLoader.restype = None
        lib.moeTorchSetLoader(cache.load, grad_path)
        lib.moeTorchClearKernels.argtypes = []
        lib.moeTorchClearKernels.restype = None
    except (OSError, AttributeError, RuntimeError) as err:
        return f"{path} does not load: {err}"
    _lib = lib
    library_path = path
    return None


def clear_kernels() -> None:
    """Forgets the kernel addresses the extension holds (tests: the next call of a signature asks the cache)."""
    if _lib is not None:
        _lib.moeTorchClearKernels()
