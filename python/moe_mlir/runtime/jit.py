"""The in-process kernel compiler and loader (``libmoe_compiler.so``, include/MoE/Runtime/KernelJIT.h) for ctypes.

Its C ABI (strings UTF-8, ``err`` NUL-terminated)::

    int32_t moeJitCompile(const char *mlir, int64_t len, const char *pipeline, const char *targetCpu,
                          int32_t optLevel, const char *objectPath, double *seconds, char *err, int64_t errCap);
    //   MLIR text -> the passes on the module (moe-opt's builtin.module(...) contents) -> LLVM IR -> LLVM's
    //   -O<optLevel> -> a host object at objectPath; seconds[4] (or NULL): each stage's time. 0, or 1 with the
    //   diagnostics in err.
    void *moeJitLoad(const char *objectPath, const char *const *libs, int32_t numLibs,
                     const char *const *archives, int32_t numArchives, const char *symbol, char *err, int64_t errCap);
    //   Links the object into the process (ORC): undefined symbols from libs (through their own handles), the
    //   archives, then the process; runs its initializers; the address of symbol, or NULL with the reason.

The library is loaded on the first kernel build or load of a process (it brings LLVM and MLIR), never by
``import moe_mlir``. Where it is: ``$MOE_COMPILER``, else beside the other runtime libraries
(:func:`moe_mlir.runtime.locate.find_runtime_lib`). Imports nothing of the package but :mod:`.locate`.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Optional, Sequence

from .locate import find_runtime_lib

__all__ = ["JitError", "library_path", "builtins_archive", "compile_object", "load_object"]

LIBRARY = "libmoe_compiler.so"
#: compiler-rt's builtins, copied beside the library by the build (lib/Runtime/Compiler/CMakeLists.txt).
BUILTINS = "libclang_rt.builtins-x86_64.a"
_ERR_CAP = 1 << 16


class JitError(RuntimeError):
    """The in-process compiler or loader failed (its diagnostics), or its library is missing."""


def library_path() -> Optional[str]:
    """Path of ``libmoe_compiler.so`` or None."""
    env = os.environ.get("MOE_COMPILER")
    if env:
        return env if os.path.isfile(env) else None
    return find_runtime_lib(LIBRARY)


def builtins_archive() -> Optional[str]:
    """compiler-rt's builtins archive beside the runtime libraries, or None."""
    return find_runtime_lib(BUILTINS)


_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def _library() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            path = library_path()
            if path is None:
                raise JitError(f"{LIBRARY} not found: build it (cmake --build build) or set MOE_COMPILER")
            lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
            lib.moeJitCompile.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_char_p,
                                          ctypes.c_int32, ctypes.c_char_p, ctypes.POINTER(ctypes.c_double),
                                          ctypes.c_char_p, ctypes.c_int64]
            lib.moeJitCompile.restype = ctypes.c_int32
            lib.moeJitLoad.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int32,
                                       ctypes.POINTER(ctypes.c_char_p), ctypes.c_int32, ctypes.c_char_p,
                                       ctypes.c_char_p, ctypes.c_int64]
            lib.moeJitLoad.restype = ctypes.c_void_p
            _lib = lib
        return _lib


#: The stages :func:`compile_object` times, in order.
STAGES = ("mlir", "translate", "optimize", "codegen")


def compile_object(mlir: str, pipeline: str, dest: Path, target_cpu: str = "native",
                   opt_level: int = 3) -> dict[str, float]:
    """Compiles ``mlir`` with the passes ``pipeline`` on the module (the inside of moe-opt's
    ``--pass-pipeline='builtin.module(...)'``, ending in the LLVM dialect) into the host object
    ``dest`` for ``target_cpu``; returns the seconds of each of :data:`STAGES`. :class:`JitError` with the compiler's
    diagnostics on failure."""
    lib = _library()
    text = mlir.encode()
    err = ctypes.create_string_buffer(_ERR_CAP)
    seconds = (ctypes.c_double * len(STAGES))()
    rc = lib.moeJitCompile(text, len(text), pipeline.encode(), target_cpu.encode(), opt_level, str(dest).encode(),
                           seconds, err, _ERR_CAP)
    if rc != 0:
        raise JitError(err.value.decode(errors="replace"))
    return dict(zip(STAGES, seconds))


def _strings(items: Sequence[str]):
    arr = (ctypes.c_char_p * max(1, len(items)))(*[s.encode() for s in items])
    return arr, len(items)


def load_object(path: Path, symbol: str, libs: Sequence[str] = (), archives: Sequence[str] = ()) -> int:
    """Links the object at ``path`` into this process (a copy of its own per call) and returns the address of
    ``symbol``; undefined symbols resolve in ``libs`` (their own symbols and dependencies), ``archives``, then the
    process. :class:`JitError` on failure."""
    lib = _library()
    libs_arr, n_libs = _strings(libs)
    arch_arr, n_arch = _strings(archives)
    err = ctypes.create_string_buffer(_ERR_CAP)
    addr = lib.moeJitLoad(str(path).encode(), libs_arr, n_libs, arch_arr, n_arch, symbol.encode(), err, _ERR_CAP)
    if not addr:
        raise JitError(err.value.decode(errors="replace"))
    return int(addr)
