"""The CPU kernel cache behind ``torch.ops.moe.*``: ahead-of-time compiled shared objects, in memory and on disk.

A kernel is one moe op for one *static signature*: the op, its attributes, the input dtypes and the static sizes,
with the token-like dimensions (batch, sequence, tokens) dynamic, so one kernel serves every token count. The C++
extension (``lib/Runtime/Torch``) names it by a key string::

    topk_renorm|k=2|mode=logits|renormalize=1|in:scores:f32:?x64

and, on an in-memory miss, calls :func:`load` (registered once by :mod:`.extension`), which

1. verifies the call: the op of its key with the call's sizes, by the op's ODS verifier (:mod:`.verify`: the one
   check of every torch op, with the messages of the eager ops and the fake kernels);
2. returns the kernel already loaded in this process, or
3. loads ``<cache>/<hash>.so`` when an earlier process built it, or
4. builds it, in this process (:mod:`.driver`, :mod:`.compiler`: ``libmoe_compiler.so``): the module the compiler
   builds from the key (:func:`kernel_module`: the op of include/MoE/IR/KernelKeys.td with its ODS builder, verified),
   whose ``@kernel`` takes the inputs as tensors with the token-like dimensions dynamic and returns the results, lowered by
   canonicalize and ``moe-lower-to-llvm{results-to-out-params=true}`` (the results become out-params appended to
   the arguments and the kernel computes them in the caller's buffers: no copy), translated to LLVM IR, optimized
   at ``-O3`` (needed anyway: the parallel kernels hold coroutines that only the middle end lowers), compiled and
   linked by the library's lld against ``libmoe_kernel_runtime.so`` (and compiler-rt's helpers) into a shared
   object, written under a temporary name and renamed, so concurrent processes never see a partial one. No process
   is started and no compiler is needed; a process that only loads cached kernels never loads the compiler.

``<hash>`` covers the key, the thread setting, the target (``$MOE_TARGET_CPU``: ``native``, the default, or an x86-64
CPU name such as ``x86-64-v3`` (AVX2) or ``x86-64-v4`` (AVX-512); it is moe-lower-to-llvm's ``target-cpu``, which sets the
kernels' vector width, and the code generator's CPU), the CPU, the compiler library (path, size, mtime), the runtime library
and a format version. The cache directory is ``$MOE_KERNEL_CACHE`` or
``~/.cache/moe_mlir/kernels``. :data:`stats` counts compiles and disk loads of this process (tests use it).

**CUDA.** A call on CUDA tensors has ``device=cuda:N`` in its key. Its kernel is built in process for that device's
chip (``sm_XY``, :func:`moe_mlir.runtime.cuda.chip_of`) with ``moe-lower-to-nvvm{results-to-out-params=true
wait-at-return=false}`` (the results computed in torch's outputs; the host code launches on the ambient stream,
PyTorch's current one, and returns without waiting) and the host code generator; the device code is embedded in
the shared object (linked against ``libmoe_cuda_runtime.so``), a fatbin (cubin for the chip + PTX) where the CUDA
toolkit's ptxas is present, else PTX that the driver compiles at load (:func:`.driver.cuda_binary_format`), and
loaded by its constructor when the file is loaded. Its file is ``<cache>/cuda-<toolchain>/<name>.so`` where
``<name>`` hashes the key (without the device index), the chip and the format version, and ``<toolchain>`` the
compiler library, the format and ptxas. Directories in ``$MOE_KERNEL_PREBUILT`` (``:``-separated) are searched for
``<name>.so`` first: the same shared objects, which :func:`prebuild_cuda` builds ahead of time by the same recipe
(a fatbin) on a machine with this compiler but no GPU (``python -m moe_mlir.runtime.prebuild``, run by ``scripts/gpu-check.sh``), for a GPU machine without
this compiler.
``$MOE_KERNEL_RECORD`` names a file every key a process asks for is appended to (what to prebuild).
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from . import verify
from .driver import (CompileError, build_cpu_kernel, build_cuda_kernel, cache_dir, cuda_binary_format, cuda_toolkit,
                     digest, stamp)

__all__ = ["KernelKey", "parse_key", "kernel_module", "load", "cache_dir", "num_threads", "target_cpu", "stats",
           "CompileError"]

#: Bump when the generated module or the build changes meaning.
FORMAT_VERSION = "3"


@dataclass
class Stats:
    compiles: int = 0
    disk_loads: int = 0
    keys: list[str] = field(default_factory=list)


#: Compiles and disk loads in this process.
stats = Stats()

_lock = threading.Lock()
_loaded: dict[str, tuple[ctypes.CDLL, int]] = {}


# ----------------------------------------------------------------------------------------------------------------
# Keys
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class KernelKey:
    op: str
    attrs: dict[str, str]
    #: name -> (element type, dims with "?" for the dynamic ones)
    inputs: dict[str, tuple[str, list[str]]]
    #: "cuda:N" for a call on CUDA tensors, else None (CPU)
    device: Optional[str] = None
    #: the key itself
    text: str = ""
    #: result name -> element type, where the call asks for another than the op infers (``out:indices:i64``)
    outputs: dict[str, str] = field(default_factory=dict)


def _parse_dims(text: str) -> list[str]:
    return [] if text == "scalar" else text.split("x")


def parse_key(key: str) -> KernelKey:
    parts = key.split("|")
    attrs: dict[str, str] = {}
    inputs: dict[str, tuple[str, list[str]]] = {}
    outputs: dict[str, str] = {}
    for p in parts[1:]:
        if p.startswith("in:"):
            _, name, elem, dims = p.split(":")
            inputs[name] = (elem, _parse_dims(dims))
        elif p.startswith("out:"):
            _, name, elem = p.split(":")
            outputs[name] = elem
        else:
            name, value = p.split("=", 1)
            attrs[name] = value
    device = attrs.pop("device", None)
    return KernelKey(parts[0], attrs, inputs, device, key, outputs)


def _without_device(key: str) -> str:
    """The key of the same kernel on any device (CUDA kernels of one chip serve every device of that chip)."""
    return "|".join(p for p in key.split("|") if not p.startswith("device="))


# ----------------------------------------------------------------------------------------------------------------
# The MLIR module of a kernel
# ----------------------------------------------------------------------------------------------------------------


def kernel_module(k: KernelKey) -> str:
    """The MLIR module of the kernel: ``@kernel(inputs as tensors...) -> (results as tensors...)``, the op of the key
    built in C++ with its ODS builder, its result types inferred and verified (include/MoE/IR/KernelKeys.td,
    :func:`.keys.kernel_module`): nothing of an op's surface is written here.

    Lowered with ``results-to-out-params``, it is called as ``_mlir_ciface_kernel(inputs..., outputs...)``, one
    memref descriptor pointer each, the outputs allocated by the caller: the kernel computes its results in them
    (the buffers it would have allocated are the caller's; no copy).
    """
    from . import keys

    try:
        return keys.kernel_module(k.text)
    except keys.KeyBuildError as e:
        raise CompileError(f"moe: the kernel key {k.text!r} builds no valid op:\n{e}") from None


# ----------------------------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------------------------


def num_threads() -> int:
    """The kernels' worker count: ``$MOE_NUM_THREADS``, ``$OMP_NUM_THREADS``, else the CPU count."""
    for var in ("MOE_NUM_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(var)
        if v and v.isdigit() and int(v) >= 1:
            return int(v)
    return os.cpu_count() or 1


#: /proc/cpuinfo flags each x86-64 level needs (beyond the previous level), to refuse a target the host cannot run.
_LEVEL_FLAGS = {
    "x86-64-v2": {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"},
    "x86-64-v3": {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"},
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
}


def target_cpu() -> str:
    """The CPU the kernels are compiled for: ``$MOE_TARGET_CPU`` (an x86-64 CPU name of LLVM), else ``native``.
    Raises :class:`CompileError` for an x86-64-vN level whose instructions this CPU lacks."""
    t = os.environ.get("MOE_TARGET_CPU", "").strip() or "native"
    if t in ("native", "host"):
        return "native"
    if t in _LEVEL_FLAGS:
        need: set[str] = set()
        for level, flags in _LEVEL_FLAGS.items():
            need |= flags
            if level == t:
                break
        have = set(_cpu_id().split("flags", 1)[-1].replace(":", " ").split())
        missing = sorted(need - have) if have else []
        if missing:
            raise CompileError(f"MOE_TARGET_CPU={t} needs {', '.join(missing)}, which this CPU lacks")
    return t


def _tools() -> tuple[str, str]:
    """(libmoe_compiler.so, libmoe_kernel_runtime.so)."""
    from . import compiler as _compiler
    from .locate import find_runtime_lib as _find_runtime_lib

    lib = _compiler.library_path()
    if lib is None:
        raise CompileError(f"{_compiler.LIBRARY} not found: build it (cmake --build build) or set MOE_COMPILER")
    rt = os.environ.get("MOE_KERNEL_RUNTIME") or _find_runtime_lib("libmoe_kernel_runtime.so")
    if rt is None:
        raise CompileError("libmoe_kernel_runtime.so not found: build it (cmake --build build)")
    return lib, str(Path(rt).resolve())


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        lines = [l for l in text.splitlines() if l.startswith(("model name", "flags"))][:2]
        return platform.machine() + "|" + "|".join(lines)
    except OSError:
        return platform.machine() + "|" + platform.processor()


def _digest(key: str, lib: str, rt: str, threads: int, target: str = "native") -> str:
    return digest(FORMAT_VERSION, key, str(threads), target, _cpu_id(), stamp(lib), stamp(rt))


def build(k: KernelKey, key: str, dest: Path, rt: str, threads: int, target: str = "native") -> None:
    """Compiles the kernel of ``k`` for the CPU ``target`` into the shared object ``dest`` (atomically, in this
    process; :mod:`.driver`) against the kernel runtime ``rt``."""
    # A custom score's region text may hold line breaks: the header comment is one line.
    one_line = key.replace("\n", " ")
    build_cpu_kernel(kernel_module(k), dest, rt, threads, target, header=f"// {one_line}\n")


def cuda_kernel_name(key: str, chip: str) -> str:
    """File name (without ``.so``) of the CUDA kernel of ``key`` for ``chip``: the same on every machine."""
    return digest(FORMAT_VERSION, "cuda", _without_device(key), chip)


def build_cuda(k: KernelKey, key: str, dest: Path, rt: str, chip: str) -> None:
    """Compiles the CUDA kernel of ``k`` for ``chip`` into the shared object ``dest`` (atomically, in this process;
    :mod:`.driver`) against the CUDA runtime ``rt``. Needs no GPU."""
    one_line = key.replace("\n", " ")
    build_cuda_kernel(kernel_module(k), dest, rt, chip, header=f"// {one_line} ({chip})\n")


def build_cuda_aot(k: KernelKey, key: str, dest: Path, rt_dir: str, chip: str) -> None:
    """Compiles the CUDA kernel of ``k`` for ``chip`` into the shared object ``dest`` that ``$MOE_KERNEL_PREBUILT``
    serves on a machine without this compiler (:func:`prebuild_cuda`): the same recipe as :func:`build_cuda`, in this
    process, with a fatbin (the cubin for the chip and PTX) against the CUDA runtime in ``rt_dir``. Needs the CUDA
    toolkit's ptxas/fatbinary, not a GPU."""
    one_line = key.replace("\n", " ")
    build_cuda_kernel(kernel_module(k), dest, os.path.join(rt_dir, "libmoe_cuda_runtime.so"), chip,
                      header=f"// {one_line} ({chip})\n", fmt="fatbin")


def _prebuilt_dirs() -> list[Path]:
    return [Path(d) for d in os.environ.get("MOE_KERNEL_PREBUILT", "").split(":") if d]


def _cuda_kernel_file(k: KernelKey, key: str, rt: str) -> Path:
    """The shared object of a CUDA key: prebuilt (``$MOE_KERNEL_PREBUILT``), cached, or built now in this process
    against the CUDA runtime ``rt``."""
    from . import compiler as _compiler
    from . import cuda

    chip = cuda.chip_of(int(k.device.split(":")[1]))
    name = cuda_kernel_name(key, chip) + ".so"
    for d in _prebuilt_dirs():
        if (d / name).is_file():
            stats.disk_loads += 1
            return d / name
    lib = _compiler.library_path()
    if lib is None:
        where = ", ".join(str(d) for d in _prebuilt_dirs()) or "no $MOE_KERNEL_PREBUILT"
        raise CompileError(f"{_compiler.LIBRARY} not found and no prebuilt CUDA kernel {name} for {chip} ({where}): "
                           "build the project (cmake --build build) or prebuild the kernels (moe_mlir.runtime.prebuild)")
    fmt = cuda_binary_format()
    ptxas = os.path.join(cuda_toolkit(), "bin", "ptxas")
    toolchain = digest(stamp(lib), fmt, stamp(ptxas) if fmt == "fatbin" else "", length=12)
    path = cache_dir() / f"cuda-{toolchain}" / name
    if path.is_file():
        stats.disk_loads += 1
    else:
        build_cuda(k, key, path, rt, chip)
        stats.compiles += 1
    return path


def _load_cuda(k: KernelKey, key: str) -> tuple[ctypes.CDLL, int]:
    from . import cuda

    if k.op.startswith("attention_posterior") and k.attrs.get("head_select") == "all":
        raise NotImplementedError(f"moe.{k.op}: head_select='all' has no CUDA kernel (convert-moe-to-gpu lowers "
                                  "the min-entropy head only); call it on CPU tensors")

    rt = cuda.runtime()  # before the kernel: it binds to this copy
    path = _cuda_kernel_file(k, key, str(Path(rt.path).resolve()))
    index = int(k.device.split(":")[1])
    if index != 0:
        # The object loads its module once, for the device current at load time, and dlopen loads a file once:
        # another device gets its own copy of the file.
        copy = cache_dir() / f"cuda-device{index}" / path.name
        if not copy.is_file():
            copy.parent.mkdir(parents=True, exist_ok=True)
            part = copy.with_name(f"{copy.name}.{os.getpid()}.part")
            shutil.copyfile(path, part)
            os.replace(part, copy)
        path = copy
    # The object's constructor loads the embedded device code on the runtime's default device.
    rt.rt.mgpuSetDefaultDevice(index)
    lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    err = rt.take_driver_error()
    if err:
        raise RuntimeError(f"moe: loading the CUDA kernel {path.name} for {k.device} failed: {err}")
    addr = ctypes.cast(lib._mlir_ciface_kernel, ctypes.c_void_p).value
    assert addr
    return lib, addr


def _record(key: str) -> None:
    path = os.environ.get("MOE_KERNEL_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(key + "\n")


def loaded_library(key: str) -> ctypes.CDLL:
    """The shared object :func:`load` loaded for ``key``."""
    with _lock:
        return _loaded[key][0]


def load(key: str, shapes: str, validate_only: int = 0, user_op: Optional[str] = None) -> int:
    """The kernel cache entry point (called by the C++ extension on a miss): the address of the kernel's
    ``_mlir_ciface_kernel`` (0 with ``validate_only``). Raises the ValueError/TypeError of the torch op ``user_op``
    (by default the key's) for an invalid call: the op verifier on the call's sizes (``shapes``)."""
    k = parse_key(key)
    verify.verify_key(verify.call_key(key, shapes), user_op)
    if validate_only:
        return 0
    with _lock:
        hit = _loaded.get(key)
        if hit is not None:
            return hit[1]
        _record(key)
        if k.device is not None:
            _loaded[key] = _load_cuda(k, key)
            stats.keys.append(key)
            return _loaded[key][1]
        lib_path, rt = _tools()
        threads = num_threads()
        target = target_cpu()
        path = cache_dir() / f"{_digest(key, lib_path, rt, threads, target)}.so"
        if path.is_file():
            stats.disk_loads += 1
        else:
            build(k, key, path, rt, threads, target)
            stats.compiles += 1
        stats.keys.append(key)
        # Local: the kernel's runtime calls bind to the process's one copy of each (the async ABI of
        # libmoe_kernel_runtime.so, the error slot of libmoe_cpu_runtime.so, its dependency); no other library puts
        # those names into the global scope (the execution API loads upstream's async runtime locally).
        lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
        addr = ctypes.cast(lib._mlir_ciface_kernel, ctypes.c_void_p).value
        assert addr
        _loaded[key] = (lib, addr)
        return addr


#: The kernel ops of torch.ops.moe.* that the extension registers for the CPU only: the sequence-level balance loss's
#: and the capacity's (lib/Runtime/Torch/TorchOps.def: Cuda column CpuOnly), which have no GPU lowering. On CUDA
#: tensors they run their PyTorch references (ops/balance.py, ops/capacity.py), so there is no CUDA kernel to prebuild
#: for them: a CPU run that records kernel keys for a GPU machine (scripts/gpu-check.sh) may list them, and
#: prebuild_cuda leaves them out. Every other kernel op (TorchOps.def's CudaKernels: the routing, mixing, gradient and
#: router-loss ops) has CUDA kernels; the GPU machine has no LLVM to compile them, so they must be prebuilt there.
CPU_ONLY_OPS: frozenset[str] = frozenset({
    "sequence_balance_loss", "sequence_balance_loss_backward", "bias_update", "apply_capacity"})


def cuda_kernel_op(op: str) -> bool:
    """Whether ``op``'s kernel has a CUDA build (prebuild_cuda builds its keys)."""
    return op not in CPU_ONLY_OPS


def prebuild_cuda(keys: list[str], out_dir: Path, chip: str) -> int:
    """Builds the CUDA kernels of ``keys`` (any device index) for ``chip`` into ``out_dir`` as ``$MOE_KERNEL_PREBUILT``
    expects them; returns how many were built (the others were there). Keys of :data:`CPU_ONLY_OPS` are left out. Needs the compiler library and the CUDA toolkit;
    no GPU. The builds run one after another: the compiler library takes one at a time."""
    from .locate import find_runtime_lib as _find_runtime_lib

    rt = _find_runtime_lib("libmoe_cuda_runtime.so")
    if rt is None:
        raise CompileError("prebuilding CUDA kernels needs libmoe_cuda_runtime.so (cmake --build build)")
    todo = []
    for key in dict.fromkeys(keys):
        k = parse_key(key)
        if not cuda_kernel_op(k.op):
            continue
        k.device = k.device or "cuda:0"
        dest = out_dir / (cuda_kernel_name(key, chip) + ".so")
        if not dest.is_file():
            todo.append((k, key, dest))
    for k, key, dest in todo:
        build_cuda_aot(k, key, dest, str(Path(rt).resolve().parent), chip)
    return len(todo)
