"""Our kernels through the C interface of the execution API (include/MoE/Runtime/ExecutorC.h).

Compile once (``moeExecCompile``: parse, ``--moe-lower-to-llvm``, JIT), then call many times. The argument
descriptors (``MoeTensorC`` arrays) are built once per case so that a timed call is one ``moeExecCall``: the C
API's own work (descriptor set-up, the compiled function, copying the results into the caller's buffers) is timed,
the Python marshalling is not. Torch-free except for the tensor buffers, so bench/memory.py can use it with numpy.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]


def _load_executor_c():
    """python/moe_mlir/runtime/executor_c.py (the ctypes binding of ExecutorC.h) loaded as a file, not through the
    package: importing moe_mlir would import torch, and bench/memory.py's worker must not."""
    path = REPO / "python" / "moe_mlir" / "runtime" / "executor_c.py"
    spec = importlib.util.spec_from_file_location("moe_executor_c", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


executor_c = _load_executor_c()

#: numpy/torch dtype names in mlir::moe::DType order (executor_c.DTYPES).
DTYPE_INDEX = {name: i for i, name in enumerate(("float32", "float16", "bfloat16", "float64", "bool", "int8",
                                                  "int32", "int64"))}


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
        self.lib = executor_c.load(self.path)

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
        return executor_c.tensor_array([(shape, DTYPE_INDEX[dtype_name], ptr) for shape, dtype_name, ptr in bufs],
                                       self._keep)

    def __call__(self) -> None:
        if self._call(self.handle, self.fn, self.ins, self.n_in, self.outs, self.n_out, self.err, len(self.err)):
            raise RuntimeError(f"moeExecCall @{self.fn.decode()}: {self.err.value.decode(errors='replace')}")


def torch_buf(t):
    assert t.is_contiguous()
    return (tuple(t.shape), str(t.dtype).replace("torch.", ""), t.data_ptr())


def numpy_buf(a):
    assert a.flags["C_CONTIGUOUS"]
    return (tuple(a.shape), str(a.dtype), a.ctypes.data)
