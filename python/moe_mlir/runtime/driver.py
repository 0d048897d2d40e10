"""The compiler driver: every build of a product, in process (:mod:`.compiler`) or by the build tools (``moe-opt``,
``mlir-runner``), and the one disk cache the products are kept in.

Products:

* a CPU kernel of ``torch.ops.moe.*`` (:func:`build_cpu_kernel`, for :mod:`.cache`): in process;
* a CUDA kernel of ``torch.ops.moe.*`` (:func:`build_cuda_kernel`, for :mod:`.cache`): in process, built when it is
  first called, or ahead of time for a machine without this compiler (``fmt="fatbin"``: :func:`.cache.prebuild_cuda`,
  :mod:`.prebuild`);
* a GPU library of the whole-graph CUDA split (:func:`moe_mlir.backends.cuda.build_gpu_library`): in process;
* MLIR text through ``moe-opt`` passes (:func:`run_moe_opt`, for the whole-graph paths).

Every CUDA product comes from one recipe, :func:`build_cuda_library`: ``moe-lower-to-nvvm`` in process
(``libmoe_compiler.so``: the device code embedded as a ``gpu.binary``, loaded by the library's constructor), the host
code generator at ``-O2`` for any x86-64, and lld against ``libmoe_cuda_runtime.so``, named by its soname, so that
the library binds to the copy the process has loaded. Its tools come from one finder, :func:`find_gpu_toolchain`.
``tools/moe-aot/moe-aot.py`` is a separate command-line tool, not a recipe of this package: it writes relocatable
objects, LLVM IR and manifests for the GPU check bundle (``scripts/gpu-check.sh``), which links them on a machine
without LLVM; the in-process compiler makes only linked shared objects.

The disk cache is one directory, :func:`cache_dir` (``$MOE_KERNEL_CACHE`` or ``~/.cache/moe_mlir/kernels``): a
product's name is the :func:`digest` of what it depends on (its input, the options, the :func:`stamp` of each tool
and runtime library), and it is written under a temporary name and renamed (:func:`publish`), so that concurrent
processes never see a partial one and every process finds what another built.

The compiler library (``libmoe_compiler.so``) is loaded at the first build: its LLVM, linked in with hidden symbols,
enters the process then, never at import or to load a cached product. Imports nothing of the package but
:mod:`.locate` (where the tools are) and :mod:`.compiler`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .locate import find_moe_opt, find_runtime_lib

__all__ = ["CompileError", "MoEOptError", "GpuToolchain", "GpuToolchainError", "cache_dir", "digest", "stamp",
           "publish", "run_process", "run_moe_opt", "find_gpu_toolchain", "build_cpu_kernel",
           "build_cuda_library", "build_cuda_kernel", "cuda_binary_format", "cuda_toolkit", "KERNEL_NVVM_OPTIONS"]


class CompileError(RuntimeError):
    """Building a kernel failed (the in-process compiler, or a tool of the CUDA recipe); carries the diagnostics."""


class MoEOptError(RuntimeError):
    """``moe-opt`` rejected the module (parse, verifier or pass failure); carries its stderr."""


class GpuToolchainError(FileNotFoundError):
    """A library or tool the CUDA recipe needs is missing (libmoe_compiler.so, the CUDA toolkit's ptxas and
    fatbinary, libmoe_cuda_runtime.so, libmoe_cpu_runtime.so; moe-opt for the whole-graph split); the message names
    it and how to provide it."""


# ----------------------------------------------------------------------------------------------------------------
# The disk cache
# ----------------------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """The directory of every compiled product: ``$MOE_KERNEL_CACHE``, else ``~/.cache/moe_mlir/kernels``."""
    env = os.environ.get("MOE_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "moe_mlir" / "kernels"


def digest(*parts: str, length: int = 40) -> str:
    """The name of a product: a hash of what it depends on (each part NUL-terminated)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:length]


def stamp(path: str) -> str:
    """Identifies a tool or library binary (its real path, size and mtime): a rebuilt one names new products."""
    try:
        st = os.stat(path)
    except OSError:
        return path
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


def publish(part: Path, dest: Path) -> None:
    """Moves a finished file or directory ``part`` to ``dest`` atomically. A directory another process published
    first wins (``part`` is removed); a file replaces (both are the same product)."""
    if part.is_dir():
        try:
            os.rename(part, dest)
        except OSError:
            shutil.rmtree(part, ignore_errors=True)
    else:
        os.replace(part, dest)


def _part(dest: Path) -> Path:
    """A temporary name beside ``dest``, unique to this process and thread."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.with_name(f"{dest.name}.{os.getpid()}.{threading.get_ident()}.part")


# ----------------------------------------------------------------------------------------------------------------
# Tools
# ----------------------------------------------------------------------------------------------------------------


def cuda_toolkit() -> str:
    """The CUDA toolkit whose ptxas and fatbinary make cubins: ``$MOE_CUDA_TOOLKIT``, else ``/usr/local/cuda``."""
    return os.environ.get("MOE_CUDA_TOOLKIT", "/usr/local/cuda")


#: The CUDA toolkit's tools each ``gpu.binary`` format needs: ``fatbin`` (cubin for the chip + PTX), ``bin`` (cubin)
#: and ``isa`` (PTX, which the driver compiles when the library is loaded: none).
FORMAT_TOOLS = {"fatbin": ("ptxas", "fatbinary"), "bin": ("ptxas",), "isa": ()}


def cuda_binary_format(toolkit: Optional[str] = None) -> str:
    """The best ``gpu.binary`` format the toolkit makes: ``fatbin`` (cubin for the chip + PTX) where it has ptxas and
    fatbinary, else ``isa`` (PTX alone, which the driver compiles when the kernel is loaded)."""
    bin_dir = os.path.join(toolkit or cuda_toolkit(), "bin")
    return "fatbin" if all(os.access(os.path.join(bin_dir, t), os.X_OK) for t in FORMAT_TOOLS["fatbin"]) else "isa"


@dataclass(frozen=True)
class GpuToolchain:
    """What the CUDA recipe (:func:`build_cuda_library`) needs, found by :func:`find_gpu_toolchain`."""

    compiler: str  # libmoe_compiler.so (moe-lower-to-nvvm, LLVM, lld)
    toolkit: str  # the CUDA toolkit: its tools of FORMAT_TOOLS[fmt] make the device code
    fmt: str  # the gpu.binary format: fatbin, bin or isa
    runtime_dir: str  # holds libmoe_cuda_runtime.so and libmoe_cpu_runtime.so

    @property
    def runtime(self) -> str:
        """The CUDA runtime the products link against (by soname)."""
        return os.path.join(self.runtime_dir, "libmoe_cuda_runtime.so")

    def stamps(self) -> tuple[str, ...]:
        """What a product of this toolchain depends on besides its input and options, for its :func:`digest`: the
        compiler library, the runtime, the format and its tools."""
        tools = [stamp(os.path.join(self.toolkit, "bin", t)) for t in FORMAT_TOOLS[self.fmt]]
        return (stamp(self.compiler), stamp(self.runtime), self.fmt, *tools)


def find_gpu_toolchain(runtime_dir: Optional[str] = None, fmt: Optional[str] = "fatbin") -> GpuToolchain:
    """The toolchain of the CUDA recipe: ``libmoe_compiler.so`` (:func:`.compiler.library_path`), the CUDA toolkit
    (:func:`cuda_toolkit`) with the tools of ``fmt`` (None: the best it makes, :func:`cuda_binary_format`), and the
    runtime libraries in ``runtime_dir`` (else beside the build's, :func:`.locate.find_runtime_lib`). No LLVM tool, C++
    compiler or GPU. :class:`GpuToolchainError` naming all that is missing."""
    from . import compiler

    missing: list[str] = []
    lib = compiler.library_path()
    if lib is None:
        missing.append(f"{compiler.LIBRARY} (build it: cmake --build <build>, or set MOE_COMPILER)")
    toolkit = cuda_toolkit()
    fmt = fmt or cuda_binary_format(toolkit)
    if fmt not in FORMAT_TOOLS:
        raise ValueError(f"gpu.binary format {fmt!r}: expected one of {', '.join(FORMAT_TOOLS)}")
    for tool in FORMAT_TOOLS[fmt]:
        if not os.access(os.path.join(toolkit, "bin", tool), os.X_OK):
            missing.append(f"{tool} of the CUDA toolkit (not in {toolkit}/bin; set MOE_CUDA_TOOLKIT), for the {fmt} "
                           "format")
    if runtime_dir is None:
        rt = find_runtime_lib("libmoe_cuda_runtime.so")
        if rt is None:
            missing.append("libmoe_cuda_runtime.so (build it: ninja -C <build> moe_cuda_runtime; it needs the CUDA "
                           "toolkit's cuda.h and stub libcuda.so at configure time)")
        else:
            runtime_dir = os.path.dirname(os.path.abspath(rt))
    elif not os.path.isfile(os.path.join(runtime_dir, "libmoe_cuda_runtime.so")):
        missing.append(f"libmoe_cuda_runtime.so in {runtime_dir}")
    if runtime_dir is not None and not os.path.isfile(os.path.join(runtime_dir, "libmoe_cpu_runtime.so")):
        missing.append(f"libmoe_cpu_runtime.so beside libmoe_cuda_runtime.so in {runtime_dir} (build it: ninja -C "
                       "<build> moe_cpu_runtime)")
    if missing:
        raise GpuToolchainError("the GPU build cannot run; missing:\n  - " + "\n  - ".join(missing))
    return GpuToolchain(lib, toolkit, fmt, os.path.abspath(runtime_dir))  # type: ignore[arg-type]


def run_process(cmd: Sequence[str], stdin: Optional[str] = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Runs ``cmd`` (text in and out, captured); the caller reads the exit status."""
    return subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, timeout=timeout)


def run_moe_opt(mlir_text: str, args: Sequence[str] = (), *, moe_opt: Optional[str] = None,
                timeout: float = 600) -> str:
    """Runs ``moe-opt <args>`` on ``mlir_text`` and returns its stdout.

    Raises:
        FileNotFoundError: no moe-opt. MoEOptError: a non-zero exit (the message holds moe-opt's diagnostics).
    """
    tool = moe_opt or find_moe_opt()
    if tool is None:
        raise FileNotFoundError("moe-opt not found: build it (cmake --build build) or set MOE_OPT")
    proc = run_process([tool, *args, "-"], mlir_text, timeout)
    if proc.returncode != 0:
        raise MoEOptError(f"moe-opt {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return proc.stdout


# ----------------------------------------------------------------------------------------------------------------
# Kernels of torch.ops.moe.*
# ----------------------------------------------------------------------------------------------------------------


def _link_args(runtime: str) -> list[str]:
    """ld.lld's arguments for a kernel that calls the runtime library ``runtime`` (by soname, found through its
    directory as run path: a process that loaded it already binds to that copy) and compiler-rt's helpers, linked
    in from the archive (code for a CPU without a native instruction for a conversion calls one, e.g.
    ``__truncsfbf2`` for f32 -> bf16 below AVX-512 BF16, which glibc's libgcc may lack)."""
    from . import compiler

    rt_dir = str(Path(runtime).parent)
    name = Path(runtime).name[len("lib"):-len(".so")]
    builtins = compiler.builtins_archive()
    return [f"-L{rt_dir}", f"-l{name}", "-rpath", rt_dir, *([builtins] if builtins else [])]


def _compile(mlir: str, pipeline: str, dest: Path, target: str, opt_level: int, runtime: str, what: str) -> None:
    from . import compiler

    part = _part(dest)
    try:
        compiler.compile_kernel(mlir, pipeline, part, target, opt_level, _link_args(runtime))
    except compiler.CompilerLibraryError as e:
        part.unlink(missing_ok=True)
        raise CompileError(f"{what}: {e}") from None
    publish(part, dest)


def build_cpu_kernel(mlir: str, dest: Path, runtime: str, threads: int, target: str = "native",
                     header: str = "") -> None:
    """Compiles a kernel module (:func:`moe_mlir.runtime.cache.kernel_module`) for the CPU ``target`` into the
    shared object ``dest`` (atomically), in this process (:mod:`.compiler`): canonicalize and ``moe-lower-to-llvm``
    (results as out-params), LLVM IR, LLVM's ``-O3`` (the parallel kernels hold coroutines that only the middle end
    lowers), the code generator for ``target`` and lld, against ``libmoe_kernel_runtime.so`` (``runtime``)."""
    _compile(header + mlir, f"canonicalize,moe-lower-to-llvm{{num-threads={threads} target-cpu={target} "
             "results-to-out-params=true}", dest, target, 3, runtime, "building the CPU kernel")


# ----------------------------------------------------------------------------------------------------------------
# The CUDA recipe
# ----------------------------------------------------------------------------------------------------------------

#: ``moe-lower-to-nvvm``'s options for a kernel of ``torch.ops.moe.*``: its results are computed into the op's
#: outputs (torch allocates them), and its host code launches on the ambient stream (PyTorch's current one) and
#: returns without waiting. The whole-graph library keeps the defaults: results allocated by the library, a wait at
#: return.
KERNEL_NVVM_OPTIONS = "results-to-out-params=true wait-at-return=false"


def build_cuda_library(mlir: str, dest: Path, chip: str, tc: GpuToolchain, *, options: str = "",
                       canonicalize: bool = False, what: str = "") -> None:
    """The CUDA recipe, for every CUDA product: compiles ``mlir`` (public functions of tensors holding moe ops) for
    ``chip`` into the shared object ``dest`` (atomically), in this process (:mod:`.compiler`):

    * ``canonicalize`` (if asked), then ``moe-lower-to-nvvm{chip format toolkit <options>}`` (``moe-fuse-routing``,
      the kernels, the device code embedded as a ``gpu.binary`` of ``tc.fmt`` that the library's constructor loads);
    * LLVM IR, LLVM's ``-O2`` and the code generator for any x86-64: the host code only launches kernels, and the
      file serves every machine that shares it (a cache, a prebuilt folder);
    * lld against ``tc.runtime``, named by its soname with its directory as run path: a process that has loaded the
      runtime binds to that copy, so a library built here works where the runtime lives elsewhere; compiler-rt's
      builtins linked in from the archive.

    Every public function ``f`` is exported as ``_mlir_ciface_f``. Needs no GPU; ptxas and fatbinary for cubins.
    :class:`CompileError` with the compiler's diagnostics on failure."""
    nvvm = f"chip={chip} format={tc.fmt} toolkit={tc.toolkit}" + (f" {options}" if options else "")
    pipeline = f"moe-lower-to-nvvm{{{nvvm}}}"
    if canonicalize:
        pipeline = "canonicalize," + pipeline
    _compile(mlir, pipeline, dest, "x86-64", 2, tc.runtime, what or f"building the CUDA library for {chip}")


def build_cuda_kernel(mlir: str, dest: Path, runtime: str, chip: str, header: str = "",
                      fmt: Optional[str] = None) -> None:
    """Compiles a kernel module (:func:`moe_mlir.runtime.cache.kernel_module`) for ``chip`` into the shared object
    ``dest`` with the CUDA recipe (:func:`build_cuda_library`): canonicalized first, with :data:`KERNEL_NVVM_OPTIONS`,
    against the CUDA runtime ``runtime``, the device code in the format ``fmt`` (None: the best the toolkit makes,
    :func:`cuda_binary_format`; a kernel prebuilt for a machine without this compiler asks for ``fatbin``, so that
    its driver has the cubin). Its constructor loads the device code."""
    try:
        tc = find_gpu_toolchain(runtime_dir=str(Path(runtime).parent), fmt=fmt)
    except GpuToolchainError as e:
        raise CompileError(f"building the CUDA kernel for {chip}: {e}") from None
    build_cuda_library(header + mlir, dest, chip, tc, options=KERNEL_NVVM_OPTIONS, canonicalize=True,
                       what=f"building the CUDA kernel for {chip}")
