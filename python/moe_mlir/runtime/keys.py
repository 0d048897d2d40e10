"""The torch ops' kernel keys as ops (``libmoe_keys.so``, include/MoE/Runtime/KernelCompiler.h) for ctypes.

Its C ABI (strings UTF-8, ``err`` NUL-terminated)::

    int32_t moeKernelModule(const char *key, int64_t len, char *out, int64_t outCap, int64_t *outLen,
                            char *err, int64_t errCap);
    //   A torch op's kernel key -> its kernel module (the op built with its ODS builder, inferred types,
    //   verified: MoE/IR/KernelKey.h) as text in out (outLen: its length; call again when it did not fit).
    int32_t moeKernelKeyOp(...same...);
    //   The key's op alone, for the FX importer, by lines: its name and number of regions, its operands as
    //   indices into the key's inputs, its attributes as one dictionary, each result type.
    int32_t moeKernelKeyOps(char *out, int64_t outCap, int64_t *outLen);
    //   The ops of the key table (include/MoE/IR/KernelKeys.td), space-separated.

The library is the dialect and MLIR's IR and parser, linked statically with their symbols hidden (about 6 MB, 3 ms
to load): the op verifier, which checks every torch op call (:mod:`.verify`), so it is loaded by any process that
calls one, and the source of the modules the kernel compiler (:mod:`.compiler`) compiles. Where it is:
``$MOE_KEYS_LIBRARY``, else beside the other runtime libraries (:func:`moe_mlir.runtime.locate.find_runtime_lib`).
Imports nothing of the package but :mod:`.locate`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

from .locate import RuntimeLibrary

__all__ = ["KeyBuildError", "LIBRARY", "library_path", "key_input", "key_value", "key_ops", "kernel_module", "kernel_key_op", "verify_key",
           "KeyOp"]

LIBRARY = "libmoe_keys.so"
_ERR_CAP = 1 << 16


class KeyBuildError(RuntimeError):
    """A kernel key builds no valid op (the diagnostics, the op verifier's among them), or the library is missing."""


def _declare(lib: ctypes.CDLL) -> None:
    for fn in (lib.moeKernelModule, lib.moeKernelKeyOp):
        fn.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64,
                       ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_int64]
        fn.restype = ctypes.c_int32
    lib.moeKernelKeyOps.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
    lib.moeKernelKeyOps.restype = ctypes.c_int32


_library = RuntimeLibrary(LIBRARY, "MOE_KEYS_LIBRARY", KeyBuildError, _declare)
#: Path of ``libmoe_keys.so`` or None.
library_path = _library.path


def _key_text(fn_name: str, key: str) -> str:
    fn = getattr(_library(), fn_name)
    text = key.encode()
    cap = 1 << 14
    while True:
        out = ctypes.create_string_buffer(cap)
        n = ctypes.c_int64(0)
        err = ctypes.create_string_buffer(_ERR_CAP)
        if fn(text, len(text), out, cap, ctypes.byref(n), err, _ERR_CAP) != 0:
            raise KeyBuildError(err.value.decode(errors="replace"))
        if n.value < cap:
            return out.value.decode()
        cap = n.value + 1


def key_value(v: Any) -> str:
    """An attribute's text in a key, as the extension writes it: booleans 1/0, floats in their shortest round-trip
    form, integers and strings as they are."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def key_input(name: str, elem: str, shape: Sequence[int], dynamic: Sequence[int] = ()) -> str:
    """An input's part of a key, ``in:<name>:<elem>:<dims>`` (the dimensions in ``dynamic`` as ``?``; ``scalar`` for
    rank 0): the one writer of it, for :func:`.launch.kernel_key`, :mod:`.verify` and the whole-graph importer."""
    dims = "x".join("?" if d in dynamic else str(n) for d, n in enumerate(shape)) or "scalar"
    return f"in:{name}:{elem}:{dims}"


def key_ops() -> list[str]:
    """The ops of the kernel-key table (include/MoE/IR/KernelKeys.td), in its order: every torch op kernel family."""
    lib, n = _library(), ctypes.c_int64(0)
    lib.moeKernelKeyOps(None, 0, ctypes.byref(n))
    out = ctypes.create_string_buffer(n.value + 1)
    lib.moeKernelKeyOps(out, n.value + 1, ctypes.byref(n))
    return out.value.decode().split()


def kernel_module(key: str) -> str:
    """The kernel module of a torch op's kernel key (``op|attr=value|...|in:name:elem:dims|...``):
    ``func.func @kernel(inputs...) -> (results...)`` around the op the key names, built in C++ with its ODS builder
    and inferred result types, verified (include/MoE/IR/KernelKeys.td). :class:`KeyBuildError` with the diagnostics (the
    op verifier's among them) for a key of no op or an invalid one."""
    return _key_text("moeKernelModule", key)


def verify_key(key: str) -> None:
    """Builds and verifies the op of ``key`` (:func:`kernel_module`); :class:`KeyBuildError` with the diagnostics for an
    invalid one (:mod:`.verify` words them as the torch op's error)."""
    _key_text("moeKernelModule", key)


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
