"""Loads the C++ torch extension (``libmoe_torch.so``: the CPU kernels of ``torch.ops.moe.*``) and connects it to the
kernel cache.

Found at ``$MOE_TORCH_LIB`` or ``<build>/lib/libmoe_torch.so`` (the build directories of :mod:`moe_mlir.runtime.locate`).
Loading it registers the CPU kernels with the dispatcher; :func:`load` then hands the extension the cache's
:func:`moe_mlir.runtime.cache.load` (once, through ctypes: calls never go through ctypes) and registers the CUDA
kernels when they are usable (an extension built with the CUDA runtime, a CUDA device, ``libmoe_cuda_runtime.so``,
and libmoe_compiler.so or ``$MOE_KERNEL_PREBUILT``; ``$MOE_TORCH_CUDA_KERNELS=0`` keeps them off): else CUDA tensors run the
eager references, and :data:`cuda_unavailable` says why.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Callable, Optional

import torch

from . import cache

__all__ = ["load", "find_library", "clear_kernels", "library_path", "cuda_unavailable"]

_lib: Optional[ctypes.PyDLL] = None
library_path: Optional[str] = None
#: Why ``torch.ops.moe.*`` on CUDA tensors run the eager references (None: they run the CUDA kernels).
cuda_unavailable: Optional[str] = "the extension is not loaded"


def find_library() -> Optional[str]:
    env = os.environ.get("MOE_TORCH_LIB")
    if env:
        return env if Path(env).is_file() else None
    from .locate import find_runtime_lib as _find_runtime_lib

    return _find_runtime_lib("libmoe_torch.so")


def load(grad_path: Callable) -> Optional[str]:
    """Loads the extension; returns None on success, else why it is unavailable.

    ``grad_path(name, keyset, args)``: runs op ``name`` (dispatch keys ``keyset``) on ``args`` (a tuple of the schema's arguments) with its autograd, for
    the calls of ops with a Python autograd (``route``) where some input requires grad (the extension's AutogradCPU
    kernel takes the others in C++; the dialect ops' autograd is C++ altogether, lib/Runtime/Torch/Autograd.cpp)."""
    global _lib, library_path
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
    global cuda_unavailable
    cuda_unavailable = _enable_cuda(lib)
    return None


def _enable_cuda(lib: ctypes.PyDLL) -> Optional[str]:
    """Registers the CUDA kernels when usable; else the reason they are not."""
    if os.environ.get("MOE_TORCH_CUDA_KERNELS", "1") == "0":
        return "MOE_TORCH_CUDA_KERNELS=0"
    if not hasattr(lib, "moeTorchEnableCuda"):
        return "libmoe_torch.so was built without the CUDA kernels (no CUDA toolkit at configure time)"
    if not torch.cuda.is_available():
        return "no CUDA device"
    from . import compiler, cuda

    try:
        cuda.runtime()
    except OSError as err:  # FileNotFoundError too
        return f"the CUDA runtime does not load: {err}"
    if compiler.library_path() is None and not os.environ.get("MOE_KERNEL_PREBUILT"):
        return f"neither {compiler.LIBRARY} (to compile the CUDA kernels) nor $MOE_KERNEL_PREBUILT (prebuilt ones)"
    lib.moeTorchEnableCuda.argtypes = []
    lib.moeTorchEnableCuda.restype = ctypes.c_int32
    if lib.moeTorchEnableCuda() != 0:
        return "registering the CUDA kernels failed (see stderr)"
    return None


def clear_kernels() -> None:
    """Forgets the kernel addresses the extension holds (tests: the next call of a signature asks the cache)."""
    if _lib is not None:
        _lib.moeTorchClearKernels()
