"""The in-process kernel compiler (``libmoe_compiler.so``, include/MoE/Runtime/KernelCompiler.h) for ctypes.

Its C ABI (strings UTF-8, ``err`` NUL-terminated)::

    int32_t moeCompileKernel(const char *mlir, int64_t len, const char *pipeline, const char *targetCpu,
                             int32_t optLevel, const char *const *linkArgs, int32_t numLinkArgs,
                             const char *sharedObjectPath, double *seconds, char *err, int64_t errCap);
    //   MLIR text -> the passes on the module (moe-opt's builtin.module(...) contents) -> LLVM IR -> LLVM's
    //   -O<optLevel> -> a host object -> lld (linked into the library) with linkArgs -> sharedObjectPath;
    //   seconds[5] (or NULL): each stage's time. 0, or 1 with the diagnostics in err.
    int32_t moeKernelModule(const char *key, int64_t len, char *out, int64_t outCap, int64_t *outLen,
                            char *err, int64_t errCap);
    //   A torch op's kernel key -> its kernel module (the op built with its ODS builder, inferred types,
    //   verified: MoE/IR/KernelKey.h) as text in out (outLen: its length; call again when it did not fit).
    int32_t moeKernelKeyOp(...same...);
    //   The key's op alone, for the FX importer, by lines: its name and number of regions, its operands as
    //   indices into the key's inputs, its attributes as one dictionary, each result type.

The library holds LLVM and MLIR (linked statically, symbols hidden). It is loaded at the first kernel build of a
process, never by ``import moe_mlir`` or to load a cached kernel (a shared object, loaded with ``dlopen``). Where it
is: ``$MOE_COMPILER``, else beside the other runtime libraries (:func:`moe_mlir.runtime.locate.find_runtime_lib`).
Imports nothing of the package but :mod:`.locate`.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .locate import find_runtime_lib

__all__ = ["CompilerLibraryError", "LIBRARY", "STAGES", "library_path", "builtins_archive", "compile_kernel",
           "kernel_module", "kernel_key_op", "KeyOp"]

LIBRARY = "libmoe_compiler.so"
#: compiler-rt's builtins, copied beside the runtime libraries by the build (lib/Runtime/Compiler/CMakeLists.txt).
BUILTINS = "libclang_rt.builtins-x86_64.a"
#: The stages :func:`compile_kernel` times, in order.
STAGES = ("mlir", "translate", "optimize", "codegen", "link")
_ERR_CAP = 1 << 16


class CompilerLibraryError(RuntimeError):
    """The in-process compiler failed (its diagnostics), or its library is missing."""


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
                raise CompilerLibraryError(f"{LIBRARY} not found: build it (cmake --build build) or set MOE_COMPILER")
            lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
            lib.moeCompileKernel.argtypes = [
                ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32,
                ctypes.POINTER(ctypes.c_char_p), ctypes.c_int32, ctypes.c_char_p, ctypes.POINTER(ctypes.c_double),
                ctypes.c_char_p, ctypes.c_int64]
            lib.moeCompileKernel.restype = ctypes.c_int32
            for fn in (lib.moeKernelModule, lib.moeKernelKeyOp):
                fn.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64,
                               ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_int64]
                fn.restype = ctypes.c_int32
            _lib = lib
        return _lib


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


def _key_text(fn_name: str, key: str) -> str:
    fn = getattr(_library(), fn_name)
    text = key.encode()
    cap = 1 << 14
    while True:
        out = ctypes.create_string_buffer(cap)
        n = ctypes.c_int64(0)
        err = ctypes.create_string_buffer(_ERR_CAP)
        if fn(text, len(text), out, cap, ctypes.byref(n), err, _ERR_CAP) != 0:
            raise CompilerLibraryError(err.value.decode(errors="replace"))
        if n.value < cap:
            return out.value.decode()
        cap = n.value + 1


def kernel_module(key: str) -> str:
    """The kernel module of a torch op's kernel key (``op|attr=value|...|in:name:elem:dims|...``):
    ``func.func @kernel(inputs...) -> (results...)`` around the op the key names, built in C++ with its ODS builder
    and inferred result types, verified (include/MoE/IR/KernelKeys.td). :class:`CompilerLibraryError` with the
    diagnostics (the op verifier's among them) for a key of no op or an invalid one."""
    return _key_text("moeKernelModule", key)


@dataclass(frozen=True)
class KeyOp:
    """The op of a kernel key, for a printer of the generic form (:func:`kernel_key_op`)."""

    name: str
    num_regions: int
    #: indices into the key's inputs
    operands: list[int]
    #: every attribute as one dictionary (``{k = 8 : i64, ...}``)
    attributes: str
    #: the inferred result types
    result_types: list[str]


def kernel_key_op(key: str) -> KeyOp:
    """The op of ``key`` (as :func:`kernel_module` builds it) for a printer of the generic form: the FX importer."""
    head, operands, attrs, *types = _key_text("moeKernelKeyOp", key).rstrip("\n").split("\n")
    name, regions = head.split()
    return KeyOp(name, int(regions), [int(i) for i in operands.split()], attrs, types)
