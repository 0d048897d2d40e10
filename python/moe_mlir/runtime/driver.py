"""The compiler driver: every build of a product, in process (:mod:`.compiler`) or by the build tools (``moe-opt``,
``mlir-translate``, ``llc``, the C++ linker, ``moe-aot.py``, ``mlir-runner``), and the one disk cache the products
are kept in.

Products:

* a CPU kernel of ``torch.ops.moe.*`` (:func:`build_cpu_kernel`, for :mod:`.cache`): in process;
* a CUDA kernel of ``torch.ops.moe.*`` (:func:`build_cuda_kernel`, for :mod:`.cache`): in process; and, by the
  tools, the same shared object for a machine without this compiler (:func:`build_cuda_library`, for
  :mod:`.prebuild`);
* a GPU library of the whole-graph CUDA split (:func:`moe_mlir.backends.cuda.build_gpu_library`, through
  :func:`run_moe_aot`);
* MLIR text through ``moe-opt`` passes (:func:`run_moe_opt`, for the whole-graph path).

Both CUDA products come from one recipe, :func:`run_moe_aot` (``tools/moe-aot/moe-aot.py --link``: moe-lower-to-nvvm,
mlir-translate, llc, the link against ``libmoe_cuda_runtime.so``; a stdlib-only script, so that the GPU check bundle
builds with it on a machine without this package), with the tools of one finder, :func:`find_gpu_toolchain`.

The disk cache is one directory, :func:`cache_dir` (``$MOE_KERNEL_CACHE`` or ``~/.cache/moe_mlir/kernels``): a
product's name is the :func:`digest` of what it depends on (its input, the options, the :func:`stamp` of each tool
and runtime library), and it is written under a temporary name and renamed (:func:`publish`), so that concurrent
processes never see a partial one and every process finds what another built.

The kernels of the torch ops are built in process (``libmoe_compiler.so``, loaded at the first build: its LLVM, linked
in with hidden symbols, enters the torch process then, never at import or to load a cached kernel); the whole-graph
paths run the tools. Imports nothing of the package but :mod:`.locate` (where the tools are) and :mod:`.compiler`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .locate import LLVM_BIN, find_moe_aot, find_moe_opt, find_runtime_lib

__all__ = ["CompileError", "MoEOptError", "GpuToolchain", "GpuToolchainError", "cache_dir", "digest", "stamp",
           "publish", "llvm_tool", "run_process", "run_tool", "run_moe_opt", "find_gpu_toolchain", "run_moe_aot",
           "build_cpu_kernel", "build_cuda_kernel", "build_cuda_library", "cuda_binary_format", "cuda_toolkit"]


class CompileError(RuntimeError):
    """Building a kernel failed (the in-process compiler, or a tool of the CUDA recipe); carries the diagnostics."""


class MoEOptError(RuntimeError):
    """``moe-opt`` rejected the module (parse, verifier or pass failure); carries its stderr."""


class GpuToolchainError(FileNotFoundError):
    """A tool or library the GPU build needs is missing (moe-opt, moe-aot.py, mlir-translate, llc, ptxas,
    fatbinary, a C++ compiler, libmoe_cuda_runtime.so); the message names it and how to provide it."""


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


def llvm_tool(name: str) -> str:
    """An LLVM 22 tool: ``/usr/lib/llvm-22/bin/<name>``, else ``<name>-22`` or ``<name>`` on PATH."""
    p = LLVM_BIN / name
    if p.is_file():
        return str(p)
    found = shutil.which(f"{name}-22") or shutil.which(name)
    if found is None:
        raise CompileError(f"{name} (LLVM 22) not found")
    return found


def cuda_toolkit() -> str:
    return os.environ.get("MOE_CUDA_TOOLKIT", "/usr/local/cuda")


@dataclass(frozen=True)
class GpuToolchain:
    """The tools of the CUDA recipe (:func:`run_moe_aot`)."""
    moe_opt: str
    moe_aot: str
    llvm_bin: str
    toolkit: str
    cxx: str
    runtime_dir: str  # holds libmoe_cuda_runtime.so and libmoe_cpu_runtime.so


def find_gpu_toolchain(moe_opt: Optional[str] = None, runtime_dir: Optional[str] = None) -> GpuToolchain:
    """Every tool of the CUDA recipe (``moe_opt`` and ``runtime_dir`` as given, else found), or
    :class:`GpuToolchainError` naming all that are missing."""
    missing: list[str] = []
    moe_opt = moe_opt or find_moe_opt()
    if moe_opt is None:
        missing.append("moe-opt (build it: ninja -C <build> moe-opt, or set MOE_OPT)")
    aot = find_moe_aot()
    if aot is None:
        missing.append(f"moe-aot.py (not at {os.environ.get('MOE_AOT') or 'tools/moe-aot/moe-aot.py'}; set MOE_AOT)")
    llvm_bin = str(LLVM_BIN)
    for tool in ("mlir-translate", "llc"):
        if not os.access(os.path.join(llvm_bin, tool), os.X_OK):
            missing.append(f"{tool} (not in {llvm_bin})")
    toolkit = cuda_toolkit()
    for tool in ("ptxas", "fatbinary"):
        if not os.access(os.path.join(toolkit, "bin", tool), os.X_OK):
            missing.append(f"{tool} of the CUDA toolkit (not in {toolkit}/bin; set MOE_CUDA_TOOLKIT)")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        missing.append("a C++ compiler to link the library (c++/g++, or set CXX)")
    if runtime_dir is None:
        rt = find_runtime_lib("libmoe_cuda_runtime.so")
        if rt is None:
            missing.append("libmoe_cuda_runtime.so (build it: ninja -C <build> moe_cuda_runtime; it needs the CUDA "
                           "toolkit's cuda.h and stub libcuda.so at configure time)")
        else:
            runtime_dir = os.path.dirname(rt)
    if runtime_dir is not None and not os.path.isfile(os.path.join(runtime_dir, "libmoe_cpu_runtime.so")):
        missing.append(f"libmoe_cpu_runtime.so beside libmoe_cuda_runtime.so in {runtime_dir} (build it: ninja -C "
                       "<build> moe_cpu_runtime)")
    if missing:
        raise GpuToolchainError("the GPU build cannot run; missing:\n  - " + "\n  - ".join(missing))
    return GpuToolchain(moe_opt, aot, llvm_bin, toolkit, cxx, runtime_dir)  # type: ignore[arg-type]


def run_moe_aot(src: Path, out_dir: Path, name: str, tc: GpuToolchain, chip: str, fmt: str = "fatbin",
                pipeline_options: str = "", canonicalize: bool = False,
                timeout: float = 900) -> subprocess.CompletedProcess:
    """The CUDA recipe: ``moe-aot.py SRC --link`` into ``out_dir/lib<name>.so`` (moe-lower-to-nvvm for ``chip``
    with ``pipeline_options``, mlir-translate, llc, ``c++ -shared`` against ``tc.runtime_dir``'s
    libmoe_cuda_runtime.so, which the library names by its soname: a process that loaded the runtime already binds
    to that copy). The caller reads the exit status and stderr (moe-aot.py names the failed step)."""
    cmd = [sys.executable, tc.moe_aot, str(src), "-o", str(out_dir), "--name", name, "--chip", chip, "--format", fmt,
           "--toolkit", tc.toolkit, "--moe-opt", tc.moe_opt, "--llvm-bin", tc.llvm_bin, "--cxx", tc.cxx,
           "--link", "--runtime-dir", tc.runtime_dir]
    if canonicalize:
        cmd.append("--canonicalize")
    if pipeline_options:
        cmd += ["--pipeline-options", pipeline_options]
    return run_process(cmd, timeout=timeout)


def run_process(cmd: Sequence[str], stdin: Optional[str] = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Runs ``cmd`` (text in and out, captured); the caller reads the exit status."""
    return subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, timeout=timeout)


def run_tool(cmd: Sequence[str], what: str, stdin: Optional[str] = None, timeout: float = 900) -> str:
    """Runs a build step; its stdout, or :class:`CompileError` with its diagnostics."""
    proc = run_process(cmd, stdin, timeout)
    if proc.returncode != 0:
        raise CompileError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}")
    return proc.stdout


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


def cuda_binary_format(toolkit: Optional[str] = None) -> str:
    """The gpu.binary format of the CUDA kernels built here: ``fatbin`` (cubin for the chip + PTX) where the toolkit
    has ptxas and fatbinary, else ``isa`` (PTX alone, which the driver compiles when the kernel is loaded)."""
    bin_dir = os.path.join(toolkit or cuda_toolkit(), "bin")
    tools = ("ptxas", "fatbinary")
    return "fatbin" if all(os.access(os.path.join(bin_dir, t), os.X_OK) for t in tools) else "isa"


def build_cuda_kernel(mlir: str, dest: Path, runtime: str, chip: str, header: str = "") -> None:
    """Compiles a kernel module for ``chip`` into the shared object ``dest`` (atomically), in this process
    (:mod:`.compiler`): canonicalize and ``moe-lower-to-nvvm`` (the device code embedded in the format of
    :func:`cuda_binary_format`, results as out-params, no wait at return), LLVM IR, the host code generator at
    ``-O2`` for any x86-64 (launch code: the file serves every machine that shares the cache) and lld, against
    ``libmoe_cuda_runtime.so`` (``runtime``); its constructor loads the device code. Needs no GPU; ptxas only for
    cubins."""
    toolkit = cuda_toolkit()
    fmt = cuda_binary_format(toolkit)
    _compile(header + mlir, f"canonicalize,moe-lower-to-nvvm{{chip={chip} format={fmt} toolkit={toolkit} "
             "results-to-out-params=true wait-at-return=false}", dest, "x86-64", 2, runtime,
             f"building the CUDA kernel for {chip}")


def build_cuda_library(mlir: str, dest: Path, moe_opt: str, rt_dir: str, chip: str, header: str = "") -> None:
    """Compiles a kernel module for ``chip`` into the shared object ``dest`` (atomically) with the one CUDA recipe,
    ``moe-aot.py --canonicalize --link`` (:func:`locate.find_moe_aot`): ``moe-lower-to-nvvm`` (a fatbin, results as
    out-params, no wait at return), ``mlir-translate``, ``llc``, ``c++ -shared`` against ``libmoe_cuda_runtime.so``
    in ``rt_dir``. Needs LLVM and the CUDA toolkit's ptxas/fatbinary, not a GPU."""
    try:
        tc = find_gpu_toolchain(moe_opt=moe_opt, runtime_dir=rt_dir)
    except GpuToolchainError as e:
        raise CompileError(str(e)) from None
    with tempfile.TemporaryDirectory(prefix="moe-cuda-kernel-") as tmp:
        t = Path(tmp)
        (t / "kernel.mlir").write_text(header + mlir)
        # The runtime is found by name when the kernel is loaded: the process has loaded it already
        # (moe_mlir.runtime.cuda), so a prebuilt kernel works on a machine with the runtime elsewhere.
        proc = run_moe_aot(t / "kernel.mlir", t, "kernel", tc, chip, canonicalize=True,
                           pipeline_options="results-to-out-params=true wait-at-return=false")
        if proc.returncode != 0:
            raise CompileError(f"moe-aot.py failed (exit {proc.returncode}) building the CUDA kernel for {chip}:\n"
                               f"{proc.stderr.strip()}")
        part = _part(dest)
        shutil.copy(t / "libkernel.so", part)
        publish(part, dest)
