"""The CUDA runtime (``libmoe_cuda_runtime.so``, ``lib/Runtime/CUDA``) as the torch ops' CUDA kernels use it.

The kernels of ``torch.ops.moe.*`` on CUDA tensors run on PyTorch's current stream and return without waiting, so an
out-of-range index (``mad_dispersion``'s ``assign``, ``adjacency_update``'s ``idx``) is not reported by the call: the
kernel skips the element and records the first such error in the runtime's device error word. :func:`check_errors`
reads it after the caller's own synchronization (``torch.cuda.synchronize()``, ``tensor.cpu()``...) and raises the
same :class:`ValueError` as the CPU kernels::

    w, counts = torch.ops.moe.mad_dispersion(x, assign, 8)     # CUDA tensors: no host wait
    torch.cuda.synchronize()
    moe_mlir.runtime.cuda.check_errors()                       # ValueError if an element of assign was out of range

Found at ``$MOE_CUDA_RUNTIME`` or next to the build's other libraries (``$MOE_GPU_RUNTIME_DIR``, then
:func:`moe_mlir.runtime.locate.find_runtime_lib`).
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from pathlib import Path
from typing import Optional

__all__ = ["find_runtime", "runtime", "chip_of", "check_errors", "CudaRuntime"]

_lock = threading.Lock()
_runtime: Optional["CudaRuntime"] = None


def find_runtime() -> Optional[str]:
    """Path of ``libmoe_cuda_runtime.so`` or None."""
    env = os.environ.get("MOE_CUDA_RUNTIME")
    if env:
        return env if Path(env).is_file() else None
    d = os.environ.get("MOE_GPU_RUNTIME_DIR")
    if d and (Path(d) / "libmoe_cuda_runtime.so").is_file():
        return str(Path(d) / "libmoe_cuda_runtime.so")
    from .locate import find_runtime_lib

    return find_runtime_lib("libmoe_cuda_runtime.so")


class CudaRuntime:
    """ctypes view of ``libmoe_cuda_runtime.so`` (:attr:`rt`: the mgpu ABI, streams, driver errors; MoECudaRuntime.h)
    and of ``libmoe_cpu_runtime.so`` beside it (:attr:`cpu`: the index errors it reports, ErrorReporting.h), loaded
    once per process with RTLD_GLOBAL: compiled libraries (the torch ops' CUDA kernels, the CUDA backend's) name
    the runtime as a dependency and must bind to this very copy (one ambient stream, one error word), as must the
    torch extension (dlopen RTLD_NOLOAD by name)."""

    def __init__(self, path: str):
        self.path = path
        self.cpu = ctypes.CDLL(str(Path(path).resolve().parent / "libmoe_cpu_runtime.so"), mode=ctypes.RTLD_GLOBAL)
        self.rt = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        rt, cpu = self.rt, self.cpu
        for name, args, res in (
            ("mgpuSetDefaultDevice", [ctypes.c_int32], None),
            ("mgpuMemcpy", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p], None),
            ("moeGpuSetStream", [ctypes.c_void_p], None),
            ("moeGpuFree", [ctypes.c_void_p], None),
            ("moeGpuPollErrors", [], ctypes.c_int32),
            ("moeGpuTakeDriverError", [ctypes.c_char_p, ctypes.c_int64], ctypes.c_int32),
            ("moeGpuDeviceCount", [], ctypes.c_int32),
        ):
            getattr(rt, name).argtypes = args
            getattr(rt, name).restype = res
        cpu.moeTakeError.argtypes = [ctypes.c_char_p, ctypes.c_int64]
        cpu.moeTakeError.restype = ctypes.c_int32
        cpu.moeSetErrorEcho.argtypes = [ctypes.c_int32]
        cpu.moeSetErrorEcho.restype = None
        cpu.moeSetErrorEcho(0)  # errors become Python exceptions, not stderr lines

    def device_count(self) -> int:
        return int(self.rt.moeGpuDeviceCount())

    def take_driver_error(self) -> Optional[str]:
        buf = ctypes.create_string_buffer(1024)
        return buf.value.decode(errors="replace") if self.rt.moeGpuTakeDriverError(buf, len(buf)) else None

    def take_index_error(self) -> Optional[str]:
        buf = ctypes.create_string_buffer(1024)
        return buf.value.decode(errors="replace") if self.cpu.moeTakeError(buf, len(buf)) else None


def runtime(path: Optional[str] = None) -> CudaRuntime:
    """The runtime of this process, loaded at the first call (from ``path``, else :func:`find_runtime`);
    :class:`FileNotFoundError` when it is not built, :class:`OSError` when it does not load (no driver)."""
    global _runtime
    with _lock:
        if _runtime is None:
            path = path or find_runtime()
            if path is None or not Path(path).is_file():
                raise FileNotFoundError(f"libmoe_cuda_runtime.so not found{f' at {path}' if path else ''}: build it "
                                        "(cmake --build build; it needs the CUDA toolkit at configure time) or set "
                                        "MOE_CUDA_RUNTIME")
            _runtime = CudaRuntime(path)
        return _runtime


def chip_of(index: int) -> str:
    """``sm_XY`` of CUDA device ``index`` (``$MOE_GPU_CHIP`` overrides it)."""
    env = os.environ.get("MOE_GPU_CHIP")
    if env:
        return env
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


#: "moe.<op>: '<operand>' element <i> is <v>, outside [0, <n>)..." (ErrorReporting.cpp) -> the eager ops' wording.
_INDEX_ERROR = re.compile(r"moe\.([^:]+): '([^']+)' element (\d+) is (-?\d+), outside \[0, (\d+)\)")


def check_errors() -> None:
    """Raises the first index error a CUDA kernel of the torch ops recorded since the last check, as the CPU kernels
    word it (:class:`ValueError`), and clears it; a CUDA driver error of an earlier call as :class:`RuntimeError`.

    Call it after synchronizing the streams the ops ran on: it reads the device error word with a blocking copy on
    the legacy default stream (waits for that stream and the blocking streams, never for the whole device). A no-op
    when the runtime was never loaded (no CUDA kernel ran)."""
    if _runtime is None:
        return
    rt = _runtime
    err = rt.take_driver_error()
    if err:
        raise RuntimeError(f"moe: CUDA driver error: {err}")
    rt.rt.moeGpuPollErrors()
    msg = rt.take_index_error()
    if msg:
        raise index_error(msg)


def index_error(msg: str) -> ValueError:
    """The runtime's index error ``msg`` (ErrorReporting.cpp) worded as the torch op's CPU kernels word it
    (checkReportedError of lib/Runtime/Torch/TorchOps.cpp)."""
    m = _INDEX_ERROR.match(msg)
    if not m:
        return ValueError(msg)
    op, operand, pos, value, bound = m.groups()
    if operand == "head":
        # moe.attention_posterior_grad's h* (the only 'head' operand), checked by the kernels of the torch op
        # attention_posterior_backward.
        return ValueError(f"moe.attention_posterior_backward: 'head' holds {value}, outside [0, {bound}): it indexes "
                          "no head")
    return ValueError(f"moe.{op}: '{operand}' holds {value}, outside [0, {bound}): the value indexes no expert "
                      f"(element {pos})")
