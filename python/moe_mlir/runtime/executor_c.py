"""The C interface of the execution API (include/MoE/Runtime/ExecutorC.h; in ``libmoe_compiler.so``, and in
``libMoEExecutorC.so`` of a build without it) for ctypes.

Plain C, so that no C++ ABI crosses ctypes; all strings UTF-8, ``err`` NUL-terminated::

    typedef struct { int32_t dtype; int32_t rank; const int64_t *shape; void *data; } MoeTensorC;
    //   dtype: the index of mlir::moe::DType (F32=0, F16, BF16, F64, I1, I8, I32, I64); data: row-major.
    void *moeExecCompile(const char *mlir, int64_t len, int32_t optLevel, char *err, int64_t errCap);
    //   NULL on failure (parse/verify/lowering diagnostics in err).
    int32_t moeExecCall(void *module, const char *fn, const MoeTensorC *inputs, int32_t numInputs,
                        MoeTensorC *outputs, int32_t numOutputs, char *err, int64_t errCap);
    //   outputs: caller-allocated buffers of the exact result shapes; 0 on success, else err holds the
    //   llvm::Error of CompiledModule::call (signature mismatch or a run-time error of the compiled code).
    void moeExecDestroy(void *module);

The one binding of that ABI, used by :class:`moe_mlir.backends.cpu.ExecutorLibrary` and by ``bench/ours.py``. It
imports nothing but ctypes (no torch, no package import) so that ``bench/memory.py``'s worker can load this file
alone and measure what a C caller of the execution API pays.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

__all__ = ["DTYPES", "MoeTensorC", "load", "tensor_array"]

#: mlir::moe::DType as MLIR element types, in enum order: ``MoeTensorC.dtype`` is an index into this.
DTYPES: tuple[str, ...] = ("f32", "f16", "bf16", "f64", "i1", "i8", "i32", "i64")


class MoeTensorC(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("data", ctypes.c_void_p),
    ]


def load(path: str) -> ctypes.CDLL:
    """Opens the library at ``path`` and declares the signatures of its three functions (raises OSError when it
    cannot be loaded, AttributeError when it lacks one of them)."""
    lib = ctypes.CDLL(path)
    lib.moeExecCompile.restype = ctypes.c_void_p
    lib.moeExecCompile.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int64]
    lib.moeExecCall.restype = ctypes.c_int32
    lib.moeExecCall.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(MoeTensorC), ctypes.c_int32,
                                ctypes.POINTER(MoeTensorC), ctypes.c_int32, ctypes.c_char_p, ctypes.c_int64]
    lib.moeExecDestroy.restype = None
    lib.moeExecDestroy.argtypes = [ctypes.c_void_p]
    return lib


def tensor_array(buffers: Sequence[tuple[Sequence[int], int, int]], keep: list) -> ctypes.Array:
    """A ``MoeTensorC[]`` over ``(shape, dtype index, data address)`` triples; the shape arrays it allocates are
    appended to ``keep``, which must outlive every call that reads the array."""
    arr = (MoeTensorC * max(len(buffers), 1))()
    for i, (shape, dtype, ptr) in enumerate(buffers):
        sizes = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        keep.append(sizes)
        arr[i] = MoeTensorC(dtype, len(shape), sizes, ctypes.c_void_p(ptr))
    return arr
