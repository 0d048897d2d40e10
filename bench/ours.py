"""Our kernels through the C interface of the execution API (include/MoE/Runtime/ExecutorC.h).

Compile once (``moeExecCompile``: parse, ``--moe-lower-to-llvm``, JIT), then call many times. The argument
descriptors (``MoeTensorC`` arrays) are built once per case so that a timed call is one ``moeExecCall``: the C
API's own work (descriptor set-up, the compiled function, copying the results into the caller's buffers) is timed,
the Python marshalling is not. Torch-free except for the tensor buffers, so bench/memory.py can use it with numpy.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]

#: mlir::moe::DType order (ExecutorC.h).
DTYPE_INDEX = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "bool": 4, "int8": 5, "int32": 6,
               "int64": 7}


class MoeTensorC(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("rank", ctypes.c_int32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("data", ctypes.c_void_p)]


def build_dir() -> Path:
    d = os.environ.get("MOE_BUILD_DIR", "build")
    p = Path(d)
    return p if p.is_absolute() else REPO / p


def find_library() -> str:
    env = os.environ.get("MOE_EXECUTOR_LIB")
    if env:
        return env
    p = build_dir() / "lib" / "libMoEExecutorC.so"
    if not p.is_file():
        raise FileNotFoundError(f"{p} is missing: build it (ninja -C {build_dir()} MoEExecutorC) or set "
                                "MOE_BUILD_DIR / MOE_EXECUTOR_LIB")
    return str(p)


class Executor:
    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path or find_library()
        lib = ctypes.CDLL(self.path)
        lib.moeExecCompile.restype = ctypes.c_void_p
        lib.moeExecCompile.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_char_p,
                                       ctypes.c_int64]
        lib.moeExecCall.restype = ctypes.c_int32
        lib.moeExecCall.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(MoeTensorC), ctypes.c_int32,
                                    ctypes.POINTER(MoeTensorC), ctypes.c_int32, ctypes.c_char_p, ctypes.c_int64]
        lib.moeExecDestroy.restype = None
        lib.moeExecDestroy.argtypes = [ctypes.c_void_p]
        self.lib = lib

    def compile(self, mlir: str, opt_level: int = 3) -> tuple[int, float]:
        """Returns (handle, seconds)."""
        err = ctypes.create_string_buffer(1 << 16)
        data = mlir.encode()
        t0 = time.perf_counter()
        h = self.lib.moeExecCompile(data, len(data), opt_level, err, len(err))
        dt = time.perf_counter() - t0
        if not h:
            raise RuntimeError("moeExecCompile failed: " + err.value.decode(errors="replace")[:4000])
        return h, dt


class BoundCall:
    """One function of a compiled module bound to fixed input/output buffers.

    ``arrays``: objects with ``.shape``, a dtype name (``dtype_name``) and a data pointer (``ptr``) -- use
    :func:`torch_buf` or :func:`numpy_buf`.
    """

    def __init__(self, exe: Executor, handle: int, fn: str, inputs: Sequence, outputs: Sequence) -> None:
        self.exe, self.handle, self.fn = exe, handle, fn.encode()
        self._keep = []
        self.ins = self._arr(inputs)
        self.outs = self._arr(outputs)
        self.n_in, self.n_out = len(inputs), len(outputs)
        self.err = ctypes.create_string_buffer(1 << 12)
        self._call = exe.lib.moeExecCall

    def _arr(self, bufs):
        arr = (MoeTensorC * max(len(bufs), 1))()
        for i, (shape, dtype_name, ptr) in enumerate(bufs):
            sh = (ctypes.c_int64 * max(len(shape), 1))(*shape)
            self._keep.append(sh)
            arr[i] = MoeTensorC(DTYPE_INDEX[dtype_name], len(shape), sh, ctypes.c_void_p(ptr))
        return arr

    def __call__(self) -> None:
        if self._call(self.handle, self.fn, self.ins, self.n_in, self.outs, self.n_out, self.err, len(self.err)):
            raise RuntimeError(f"moeExecCall @{self.fn.decode()}: {self.err.value.decode(errors='replace')}")


def torch_buf(t):
    assert t.is_contiguous()
    return (tuple(t.shape), str(t.dtype).replace("torch.", ""), t.data_ptr())


def numpy_buf(a):
    assert a.flags["C_CONTIGUOUS"]
    return (tuple(a.shape), str(a.dtype), a.ctypes.data)
