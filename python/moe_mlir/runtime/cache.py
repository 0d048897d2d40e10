"""The CPU kernel cache behind ``torch.ops.moe.*``: ahead-of-time compiled shared objects, in memory and on disk.

A kernel is one moe op for one *static signature*: the op, its attributes, the input dtypes and the static sizes,
with the token-like dimensions (batch, sequence, tokens) dynamic, so one kernel serves every token count. The C++
extension (``lib/Runtime/Torch``) names it by a key string::

    topk_renorm|k=2|mode=logits|renormalize=1|in:scores:f32:?x64

and, on an in-memory miss, calls :func:`load` (registered once by :mod:`.extension`), which

1. validates the call with the op's Python validators (on meta tensors of the call's shapes: the same messages as
   the eager ops);
2. returns the kernel already loaded in this process, or
3. loads ``<cache>/<hash>.so`` when an earlier process built it, or
4. builds it: an MLIR module whose ``@kernel`` takes the inputs as tensors with the token-like dimensions dynamic
   and the outputs as memrefs written in place (``bufferization.materialize_in_destination``), lowered by
   ``moe-opt --moe-lower-to-llvm`` (a subprocess: MLIR/LLVM are never loaded into the torch process), translated
   with ``mlir-translate --mlir-to-llvmir``, optimized and compiled with ``clang -O3`` (the ``opt -O3`` pipeline is
   needed anyway: the parallel kernels hold coroutines that only the middle end lowers) and linked with ``c++
   -shared`` against ``libmoe_kernel_runtime.so`` (no libLLVM/libMLIR dependency). The file is written under a
   temporary name and renamed, so concurrent processes never see a partial one.

``<hash>`` covers the key, the thread setting, the target (``$MOE_TARGET_CPU``: ``native``, the default, or an x86-64
CPU name such as ``x86-64-v3`` (AVX2) or ``x86-64-v4`` (AVX-512); it is moe-opt's ``target-cpu``, which sets the
kernels' vector width, and clang's ``-march``), the CPU, the moe-opt binary (path, size, mtime), the runtime library
and a format version. The cache directory is ``$MOE_KERNEL_CACHE`` or
``~/.cache/moe_mlir/kernels``. :data:`stats` counts compiles and disk loads of this process (tests use it).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from .abi import DTYPE_OF_ELEM, memref_type, tensor_type

__all__ = ["KernelKey", "parse_key", "kernel_module", "load", "cache_dir", "num_threads", "target_cpu", "stats",
           "CompileError"]

#: Bump when the generated module or the build changes meaning.
FORMAT_VERSION = "1"
LLVM_BIN = Path("/usr/lib/llvm-22/bin")


class CompileError(RuntimeError):
    """Building a kernel failed (moe-opt, mlir-translate, clang or the link); carries the tool's diagnostics."""


@dataclass
class Stats:
    compiles: int = 0
    disk_loads: int = 0
    keys: list[str] = field(default_factory=list)


#: Compiles and disk loads in this process.
stats = Stats()

#: Validators per op, set by :mod:`moe_mlir.ops` (see :data:`moe_mlir.ops.KEY_VALIDATORS`).
validators: dict[str, Callable[[dict, dict], None]] = {}

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


def _parse_dims(text: str) -> list[str]:
    return [] if text == "scalar" else text.split("x")


def parse_key(key: str) -> KernelKey:
    parts = key.split("|")
    attrs: dict[str, str] = {}
    inputs: dict[str, tuple[str, list[str]]] = {}
    for p in parts[1:]:
        if p.startswith("in:"):
            _, name, elem, dims = p.split(":")
            inputs[name] = (elem, _parse_dims(dims))
        else:
            name, value = p.split("=", 1)
            attrs[name] = value
    return KernelKey(parts[0], attrs, inputs)


#: c10 names of the dtypes no kernel takes (the extension names them so): the validators then raise their TypeError.
_C10_DTYPES = {"Byte": torch.uint8, "Char": torch.int8, "Short": torch.int16, "ComplexFloat": torch.complex64,
               "ComplexDouble": torch.complex128, "ComplexHalf": torch.complex32}


def _meta_inputs(shapes: str) -> dict[str, torch.Tensor]:
    out = {}
    for p in shapes.split("|")[1:]:
        name, elem, dims = p.split(":")
        dtype = DTYPE_OF_ELEM.get(elem) or _C10_DTYPES.get(elem, torch.complex128)
        out[name] = torch.empty([int(d) for d in _parse_dims(dims)], dtype=dtype, device="meta")
    return out


# ----------------------------------------------------------------------------------------------------------------
# The MLIR module of a kernel
# ----------------------------------------------------------------------------------------------------------------


def _float(v: str) -> str:
    # MLIR float literals need a '.'; f32 attributes round the double like the eager ops' f32 arithmetic does.
    return f"{float(v):.9e}"


def _bool(v: str) -> str:
    return "true" if v == "1" else "false"


def _outputs(k: KernelKey) -> list[tuple[str, list[str]]]:
    """Result (element type, dims) of the op, in order."""
    a, i = k.attrs, k.inputs
    op = k.op
    if op == "topk_renorm":
        r = [i["scores"][1][0], a["k"]]
        return [("f32", r), ("i32", r)]
    if op == "similarity_inform":
        return [("f32", list(i["e"][1]))]
    if op == "similarity_inform_topk":
        r = [i["u"][1][0], i["u"][1][1], a["k"]]
        return [("f32", r), ("i32", r)]
    if op in ("attention_posterior", "attention_posterior_topk"):
        s, e = i["scores"][1], i["e"][1]
        head = ("i32", [s[0]])
        if op == "attention_posterior":
            return [("f32", [s[0], s[2], e[2]]), head]
        r = [s[0], s[2], a["k"]]
        return [("f32", r), ("i32", r), head]
    if op == "mad_dispersion":
        n = a["num_experts"]
        return [("f32", [n, i["tokens"][1][1]]), ("i32", [n])]
    if op == "adjacency_update":
        return [("f32", list(i["a"][1]))]
    if op == "hyper_router":
        n = int(a["num_experts"])
        d = int(i["w2"][1][0]) // n - 1
        return [("f32", [str(n), str(d)]), ("f32", [str(n)])]
    raise ValueError(f"moe: no kernel for op {op!r}")


def _op_text(k: KernelKey, args: dict[str, str], types: dict[str, str]) -> tuple[str, str]:
    """(the op with its operands and attributes, the operand types after ':') for the generic parts."""
    a = k.attrs
    op = k.op

    def opt_operand(name: str, kw: str) -> str:
        return f" {kw}({args[name]} : {types[name]})" if name in args else ""

    if op == "topk_renorm":
        return (f"moe.topk_renorm {args['scores']} k({a['k']}) mode({a['mode']}) "
                f"renormalize({_bool(a['renormalize'])})", types["scores"])
    if op in ("similarity_inform", "similarity_inform_topk"):
        text = f"moe.{op} {args['u']}, {args['e']}" + opt_operand("ws", "ws") + opt_operand("key_mask", "key_mask")
        if op == "similarity_inform_topk":
            text += f" k({a['k']}) renormalize({_bool(a['renormalize'])})"
        text += f" tau({_float(a['tau'])}) causal({_bool(a['causal'])})"
        return text, f"{types['u']}, {types['e']}"
    if op in ("attention_posterior", "attention_posterior_topk"):
        names = ("scores", "u", "v", "wo", "e")
        text = f"moe.{op} " + ", ".join(args[n] for n in names)
        if op == "attention_posterior_topk":
            text += f" k({a['k']}) renormalize({_bool(a['renormalize'])})"
        text += f" sigma({_float(a['sigma'])}) head_select({a['head_select']})"
        if a["head_scale"] != "none":
            text += f" head_scale({_float(a['head_scale'])})"
        return text, ", ".join(types[n] for n in names)
    if op == "mad_dispersion":
        return (f"moe.mad_dispersion {args['tokens']}, {args['assign']} num_experts({a['num_experts']}) "
                f"eps({_float(a['eps'])}) clip({_float(a['clip'])}) normalize({a['normalize']}) "
                f"measure({a['measure']}) empty({a['empty']})", f"{types['tokens']}, {types['assign']}")
    if op == "adjacency_update":
        return (f"moe.adjacency_update {args['a']}, {args['idx']} beta({_float(a['beta'])}) norm({a['norm']}) "
                f"include_self({_bool(a['include_self'])})", f"{types['a']}, {types['idx']}")
    if op == "hyper_router":
        names = ("emb", "w1", "b1", "w2", "b2")
        return (f"moe.hyper_router " + ", ".join(args[n] for n in names) + f" num_experts({a['num_experts']})",
                ", ".join(types[n] for n in names))
    raise ValueError(f"moe: no kernel for op {op!r}")


def kernel_module(k: KernelKey) -> str:
    """The MLIR module of the kernel: ``@kernel(inputs as tensors..., outputs as memrefs...)``."""
    args = {name: f"%{name}" for name in k.inputs}
    types = {name: tensor_type(dims, elem) for name, (elem, dims) in k.inputs.items()}
    outs = _outputs(k)
    out_tensors = [tensor_type(d, e) for e, d in outs]
    out_memrefs = [memref_type(d, e) for e, d in outs]
    params = [f"{args[n]}: {types[n]}" for n in k.inputs] + [f"%out{j}: {t}" for j, t in enumerate(out_memrefs)]
    op, in_types = _op_text(k, args, types)
    n = len(outs)
    res = "%r" if n == 1 else f"%r:{n}"
    lines = [
        "module {",
        f"  func.func @kernel({', '.join(params)}) {{",
        f"    {res} = {op} : {in_types} -> {', '.join(out_tensors)}",
    ]
    for j in range(n):
        r = "%r" if n == 1 else f"%r#{j}"
        lines.append(f"    bufferization.materialize_in_destination {r} in restrict writable %out{j} "
                     f": ({out_tensors[j]}, {out_memrefs[j]}) -> ()")
    lines += ["    return", "  }", "}", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# Building
# ----------------------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    env = os.environ.get("MOE_KERNEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "moe_mlir" / "kernels"


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
    """(moe-opt, the directory of libmoe_kernel_runtime.so)."""
    from .locate import find_moe_opt, find_runtime_lib as _find_runtime_lib

    moe_opt = find_moe_opt()
    if moe_opt is None:
        raise CompileError("moe-opt not found: build it (cmake --build build) or set MOE_OPT")
    rt = os.environ.get("MOE_KERNEL_RUNTIME") or _find_runtime_lib("libmoe_kernel_runtime.so")
    if rt is None:
        raise CompileError("libmoe_kernel_runtime.so not found: build it (cmake --build build)")
    return moe_opt, str(Path(rt).resolve().parent)


def _stamp(path: str) -> str:
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        lines = [l for l in text.splitlines() if l.startswith(("model name", "flags"))][:2]
        return platform.machine() + "|" + "|".join(lines)
    except OSError:
        return platform.machine() + "|" + platform.processor()


def _digest(key: str, moe_opt: str, rt_dir: str, threads: int, target: str = "native") -> str:
    h = hashlib.sha256()
    for part in (FORMAT_VERSION, key, str(threads), target, _cpu_id(), _stamp(moe_opt),
                 _stamp(str(Path(rt_dir) / "libmoe_kernel_runtime.so"))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def _run(cmd: list[str], what: str, stdin: Optional[str] = None) -> str:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise CompileError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr.strip()}")
    return proc.stdout


def _llvm_tool(name: str) -> str:
    p = LLVM_BIN / name
    if p.is_file():
        return str(p)
    found = shutil.which(f"{name}-22") or shutil.which(name)
    if found is None:
        raise CompileError(f"{name} (LLVM 22) not found")
    return found


def _builtins() -> list[str]:
    """LLVM's compiler-rt builtins archive, linked in statically when present: code for a CPU without a native
    instruction for some conversion calls a helper instead (``__truncsfbf2`` for f32 -> bf16 below AVX-512 BF16),
    which Debian 12's libgcc (GCC 12) does not have."""
    try:
        path = _run([_llvm_tool("clang"), "--rtlib=compiler-rt", "-print-libgcc-file-name"], "clang").strip()
    except CompileError:
        return []
    return [path] if path and Path(path).is_file() else []


def build(k: KernelKey, key: str, dest: Path, moe_opt: str, rt_dir: str, threads: int,
          target: str = "native") -> None:
    """Compiles the kernel of ``k`` for the CPU ``target`` into ``dest`` (atomically)."""
    mlir = kernel_module(k)
    with tempfile.TemporaryDirectory(prefix="moe-kernel-") as tmp:
        t = Path(tmp)
        (t / "kernel.mlir").write_text(f"// {key}\n" + mlir)
        _run([moe_opt, "--canonicalize", f"--moe-lower-to-llvm=num-threads={threads} target-cpu={target}",
              str(t / "kernel.mlir"),
              "-o", str(t / "kernel.llvm.mlir")], "moe-opt")
        _run([_llvm_tool("mlir-translate"), "--mlir-to-llvmir", str(t / "kernel.llvm.mlir"), "-o",
              str(t / "kernel.ll")], "mlir-translate")
        _run([_llvm_tool("clang"), "-O3", f"-march={target}", "-fPIC", "-c", "-Wno-override-module",
              str(t / "kernel.ll"), "-o", str(t / "kernel.o")], "clang")
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f"{dest.name}.{os.getpid()}.{threading.get_ident()}.part")
        _run([os.environ.get("CXX", "c++"), "-shared", "-o", str(part), str(t / "kernel.o"), *_builtins(),
              f"-L{rt_dir}", "-lmoe_kernel_runtime", f"-Wl,-rpath,{rt_dir}"], "link")
        os.replace(part, dest)


def load(key: str, shapes: str, validate_only: int = 0) -> int:
    """The kernel cache entry point (called by the C++ extension on a miss): the address of the kernel's
    ``_mlir_ciface_kernel`` (0 with ``validate_only``). Raises the op's ValueError/TypeError for an invalid call."""
    k = parse_key(key)
    check = validators.get(k.op)
    if check is None:
        raise ValueError(f"moe: no kernel for op {k.op!r}")
    check(_meta_inputs(shapes), k.attrs)
    if validate_only:
        return 0
    with _lock:
        hit = _loaded.get(key)
        if hit is not None:
            return hit[1]
        moe_opt, rt_dir = _tools()
        threads = num_threads()
        target = target_cpu()
        path = cache_dir() / f"{_digest(key, moe_opt, rt_dir, threads, target)}.so"
        if path.is_file():
            stats.disk_loads += 1
        else:
            build(k, key, path, moe_opt, rt_dir, threads, target)
            stats.compiles += 1
        stats.keys.append(key)
        # RTLD_DEEPBIND: the kernel's runtime calls (moeReportIndexError, the async ABI) bind to
        # libmoe_kernel_runtime.so, its own dependency, even when the CUDA backend or the execution API has put
        # libmoe_cpu_runtime.so's same-named symbols (another error slot) into the global scope.
        lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_DEEPBIND)
        addr = ctypes.cast(lib._mlir_ciface_kernel, ctypes.c_void_p).value
        assert addr
        _loaded[key] = (lib, addr)
        return addr
