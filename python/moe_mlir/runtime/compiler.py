"""The in-process kernel compiler (``libmoe_compiler.so``, include/MoE/Runtime/KernelCompiler.h) for ctypes.

Its C ABI (strings UTF-8, ``err`` NUL-terminated)::

    int32_t moeCompileKernel(const char *mlir, int64_t len, const char *pipeline, const char *targetCpu,
                             int32_t optLevel, const char *const *linkArgs, int32_t numLinkArgs,
                             const char *sharedObjectPath, double *seconds, char *err, int64_t errCap);
    //   MLIR text -> the passes on the module (moe-opt's builtin.module(...) contents) -> LLVM IR -> LLVM's
    //   -O<optLevel> -> a host object -> lld (linked into the library) with linkArgs -> sharedObjectPath;
    //   seconds[5] (or NULL): each stage's time. 0, or 1 with the diagnostics in err.

A kernel key's module, what it compiles for the torch ops, comes from :mod:`.keys` (``libmoe_keys.so``: the op
verifier without the code generators).

The library holds LLVM and MLIR (linked statically, symbols hidden). It is loaded at the first kernel build of a
process, never by ``import moe_mlir`` or to load a cached kernel (a shared object, loaded with ``dlopen``). Where it
is: ``$MOE_COMPILER``, else beside the other runtime libraries (:func:`moe_mlir.runtime.locate.find_runtime_lib`).
Imports nothing of the package but :mod:`.locate`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional, Sequence

from .locate import RuntimeLibrary, find_runtime_lib

__all__ = ["CompilerLibraryError", "LIBRARY", "STAGES", "library_path", "builtins_archive", "compile_kernel"]

LIBRARY = "libmoe_compiler.so"
#: compiler-rt's builtins, copied beside the runtime libraries by the build (lib/Runtime/Compiler/CMakeLists.txt).
BUILTINS = "libclang_rt.builtins-x86_64.a"
#: The stages :func:`compile_kernel` times, in order.
STAGES = ("mlir", "translate", "optimize", "codegen", "link")
_ERR_CAP = 1 << 16


class CompilerLibraryError(RuntimeError):
    """The in-process compiler failed (its diagnostics), or its library is missing."""


def builtins_archive() -> Optional[str]:
    """compiler-rt's builtins archive beside the runtime libraries, or None."""
    return find_runtime_lib(BUILTINS)


def _declare(lib: ctypes.CDLL) -> None:
    lib.moeCompileKernel.argtypes = [
        ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32,
        ctypes.POINTER(ctypes.c_char_p), ctypes.c_int32, ctypes.c_char_p, ctypes.POINTER(ctypes.c_double),
        ctypes.c_char_p, ctypes.c_int64]
    lib.moeCompileKernel.restype = ctypes.c_int32


_library = RuntimeLibrary(LIBRARY, "MOE_COMPILER", CompilerLibraryError, _declare)
#: Path of ``libmoe_compiler.so`` or None.
library_path = _library.path


def compile_kernel(mlir: str, pipeline: str, dest: Path, target_cpu: str = "native", opt_level: int = 3,
                   link_args: Sequence[str] = ()) -> dict[str, float]:
    """Compiles ``mlir`` with the passes ``pipeline`` on the module (the inside of moe-opt's
    ``--pass-pipeline='builtin.module(...)'``, ending in the LLVM dialect) for the host CPU ``target_cpu`` and links
    it with ld.lld's ``link_args`` into the shared object ``dest``; returns the seconds of each of :data:`STAGES`.
    :class:`CompilerLibraryError` with the compiler's diagnostics on failure."""
    lib = _library()
    text = mlir.encode()
    args = (ctypes.c_char_p * max(1, len(link_args)))(*[a.encode() for a in link_args])
    err = ctypes.create_string_buffer(_ERR_CAP)
    seconds = (ctypes.c_double * len(STAGES))()
    rc = lib.moeCompileKernel(text, len(text), pipeline.encode(), target_cpu.encode(), opt_level, args,
                              len(link_args), str(dest).encode(), seconds, err, _ERR_CAP)
    if rc != 0:
        raise CompilerLibraryError(err.value.decode(errors="replace"))
    return dict(zip(STAGES, seconds))
