"""The whole-graph MLIR path: a model exported whole, printed as MLIR, compiled by ``moe-opt`` and executed.

The pipeline is: :func:`moe_mlir.mlir.importer.import_program` (torch.export -> MLIR text) -> ``moe-opt`` (parse,
verify, ``--canonicalize`` folds, ``--moe-lower-to-llvm``) -> execution by one of two backends:

* ``"executor"``: the C++ execution API (``include/MoE/Runtime/Executor.h``: parse + lower + JIT with
  ``mlir::ExecutionEngine``), reached through a small C shim loaded with :mod:`ctypes` (see
  :class:`ExecutorLibrary` for the ABI it expects). Compiles once, then calls in-process on the tensors' buffers.
  Loading it brings libMLIR/libLLVM into the process: only this explicit path does.
* ``"runner"``: ``moe-opt --moe-lower-to-llvm | mlir-runner`` per call, with the call's inputs baked in as
  constants of a generated ``@main`` that prints every result element as its raw bits (exact). Slow (a process and
  a JIT per call) but needs nothing beyond the built ``moe-opt``: a debugging aid.

``backend="auto"`` picks the executor when its library is found, else the runner.

``target="cuda"`` is :mod:`moe_mlir.backends.cuda`: the moe ops (routing) compiled ahead of time into a CUDA library
(``moe-lower-to-nvvm`` in process, by the CUDA recipe :func:`moe_mlir.runtime.driver.build_cuda_library`) and called
on device tensors, the rest of the graph run by eager PyTorch on CUDA.

Shapes are static (torch.export of the example inputs; data-dependent control flow does not export): for dynamic
shapes and graph breaks use the default path, :mod:`moe_mlir.backends.dynamo`. Tools: :mod:`.tools`.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from typing import Any, Optional, Sequence

import torch

from ..mlir.builder import FLOAT_BITS, Builder, TensorType, Value, is_float
from ..mlir.importer import ImportedProgram, export_program, import_exported_program


__all__ = [
    "compile_cpu",
    "CompiledModel",
    "ExecutorLibrary",
    "run_with_mlir_runner",
]

from ..runtime import driver, executor_c
from ..runtime.abi import DTYPE_OF_ELEM
from ..runtime.driver import MoEOptError
from ..runtime.locate import LLVM_LIB, find_mlir_runner, find_runtime_lib
from .tools import MoERuntimeError, lower_to_llvm, refuse_gradients, verify


# ----------------------------------------------------------------------------------------------------------------
# Backend 1: the C++ execution API through a C shim
# ----------------------------------------------------------------------------------------------------------------


class ExecutorLibrary:
    """ctypes binding of the C shim over ``mlir::moe::Executor`` (its ABI: :mod:`moe_mlir.runtime.executor_c`), in
    ``libmoe_compiler.so`` (LLVM and MLIR linked in, hidden: what the wheel ships), else ``libMoEExecutorC.so`` (a
    build without the compiler library, e.g. the sanitizer's)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = executor_c.load(path)

    @staticmethod
    def find() -> Optional["ExecutorLibrary"]:
        path = (os.environ.get("MOE_EXECUTOR_LIB") or find_runtime_lib("libmoe_compiler.so")
                or find_runtime_lib("libMoEExecutorC.so"))
        if not path:
            return None
        try:
            return ExecutorLibrary(path)
        except (OSError, AttributeError):
            return None

    def compile(self, mlir_text: str, opt_level: int = 3) -> int:
        err = ctypes.create_string_buffer(1 << 16)
        data = mlir_text.encode()
        handle = self.lib.moeExecCompile(data, len(data), opt_level, err, len(err))
        if not handle:
            raise MoEOptError(f"the execution API could not compile the module:\n{err.value.decode(errors='replace')}")
        return handle

    def call(self, handle: int, fn: str, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        keep: list[Any] = []

        def arr(ts: Sequence[torch.Tensor]) -> ctypes.Array:
            return executor_c.tensor_array(
                [(t.shape, executor_c.DTYPES.index(_elem_of(t)), t.data_ptr()) for t in ts], keep)

        ins, outs = arr(inputs), arr(outputs)
        err = ctypes.create_string_buffer(1 << 16)
        rc = self.lib.moeExecCall(handle, fn.encode(), ins, len(inputs), outs, len(outputs), err, len(err))
        if rc != 0:
            raise MoERuntimeError(err.value.decode(errors="replace"))

    def destroy(self, handle: int) -> None:
        self.lib.moeExecDestroy(handle)


def _elem_of(t: torch.Tensor) -> str:
    from ..mlir.builder import mlir_elem

    return mlir_elem(t.dtype)


# ----------------------------------------------------------------------------------------------------------------
# Backend 2: mlir-runner
# ----------------------------------------------------------------------------------------------------------------


def runner_module(prog: ImportedProgram, inputs: Sequence[torch.Tensor]) -> str:
    """``prog`` plus a ``@main`` that calls it on ``inputs`` (constants) and prints every result element's bits
    (one ``printI64`` per element, then a newline)."""
    b = Builder()
    b.indent = 4
    vals = [b.dense_constant(t, a.type) for t, a in zip(inputs, prog.args)]
    res = [b.fresh() for _ in prog.results]
    types = ", ".join(str(t) for t in prog.results)
    head = f"{res[0]}:{len(res)}" if len(res) > 1 else (res[0] if res else "")
    call = f"call @{prog.func_name}({', '.join(v.name for v in vals)}) : ({', '.join(str(a.type) for a in prog.args)}) -> ({types})"
    b.emit(f"{head} = {call}" if res else call)
    names = [f"{res[0]}#{i}" for i in range(len(res))] if len(res) > 1 else res
    for name, t in zip(names, prog.results):
        v = Value(name, t)
        if t.numel == 0:
            continue
        flat_t = TensorType((t.numel,), t.elem)
        # reshape to 1-D so one loop prints it
        if t.rank != 1:
            flat = b.fresh()
            if t.rank == 0:
                b.emit(f"{flat} = tensor.expand_shape {v.name} [] output_shape [1] : {t} into {flat_t}")
            else:
                reassoc = ", ".join(str(i) for i in range(t.rank))
                b.emit(f"{flat} = tensor.collapse_shape {v.name} [[{reassoc}]] : {t} into {flat_t}")
            v = Value(flat, flat_t)
        c0, c1, n = b.const_index(0), b.const_index(1), b.const_index(t.numel)
        iv = b.fresh("i")
        b.emit(f"scf.for {iv} = {c0} to {n} step {c1} {{")
        b.indent += 2
        x = b.assign(f"tensor.extract {v.name}[{iv}] : {flat_t}")
        if is_float(t.elem):
            ib = f"i{FLOAT_BITS[t.elem]}"
            bits = b.assign(f"arith.bitcast {x} : {t.elem} to {ib}")
            x64 = b.cast(bits, ib, "i64") if ib != "i64" else bits
        else:
            x64 = b.cast(x, t.elem, "i64")
        b.emit(f"func.call @printI64({x64}) : (i64) -> ()")
        b.emit("func.call @printNewline() : () -> ()")
        b.indent -= 2
        b.emit("}")
    text = prog.text.rstrip()
    assert text.endswith("}")
    main = (
        "  func.func private @printI64(i64)\n"
        "  func.func private @printNewline()\n"
        "  func.func @main() {\n" + "\n".join(b.lines) + "\n    return\n  }\n"
    )
    return text[:-1] + main + "}\n"


def _decode(lines: list[str], types: Sequence[TensorType]) -> list[torch.Tensor]:
    out = []
    pos = 0
    for t in types:
        n = t.numel
        raw = [int(x) for x in lines[pos:pos + n]]
        pos += n
        if is_float(t.elem):
            bits = FLOAT_BITS[t.elem]
            mask = (1 << bits) - 1
            ints = torch.tensor([(r & mask) - ((r & mask) >> (bits - 1) << bits) for r in raw],
                                dtype={16: torch.int16, 32: torch.int32, 64: torch.int64}[bits])
            vals = ints.view(DTYPE_OF_ELEM[t.elem])
        elif t.elem == "i1":
            vals = torch.tensor([r != 0 for r in raw], dtype=torch.bool)
        else:
            vals = torch.tensor(raw, dtype=DTYPE_OF_ELEM[t.elem])
        out.append(vals.reshape(t.shape))
    return out


def run_with_mlir_runner(prog: ImportedProgram, inputs: Sequence[torch.Tensor], *, timeout: float = 600) -> list[torch.Tensor]:
    """Lowers ``prog`` with the call's inputs and runs it under ``mlir-runner``; returns the results."""
    runner = find_mlir_runner()
    if runner is None:
        raise FileNotFoundError("mlir-runner not found (set MLIR_RUNNER)")
    llvm = lower_to_llvm(runner_module(prog, inputs))
    libs = [str(LLVM_LIB / "libmlir_c_runner_utils.so"), str(LLVM_LIB / "libmlir_runner_utils.so")]
    rt = find_runtime_lib("libmoe_cpu_runtime.so")
    if rt:
        libs.append(rt)
    with tempfile.NamedTemporaryFile("w", suffix=".mlir", delete=False) as f:
        f.write(llvm)
        path = f.name
    try:
        proc = driver.run_process(
            [runner, path, "-e", "main", "-entry-point-result=void", f"-shared-libs={','.join(libs)}"],
            timeout=timeout)
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        raise MoERuntimeError(f"mlir-runner failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    if errors:
        raise MoERuntimeError("\n".join(errors))
    lines = [l.strip() for l in proc.stdout.splitlines() if l.strip()]
    return _decode(lines, prog.results)


# ----------------------------------------------------------------------------------------------------------------
# compile()
# ----------------------------------------------------------------------------------------------------------------


class CompiledModel:
    """A model compiled by MoE-MLIR; call it like the model (same positional tensor inputs, same outputs).

    Attributes:
        program: the imported program (``program.text`` is the MLIR given to moe-opt).
        backend: ``"executor"`` or ``"runner"``.
    """

    def __init__(self, program: ImportedProgram, backend: str, out_spec: Any = None,
                 executor: Optional[ExecutorLibrary] = None) -> None:
        self.program = program
        self.backend = backend
        self.out_spec = out_spec
        self._executor = executor
        self._handle: Optional[int] = None
        if backend == "executor":
            assert executor is not None
            self._handle = executor.compile(program.text)

    def __del__(self) -> None:
        if self._handle is not None and self._executor is not None:
            try:
                self._executor.destroy(self._handle)
            except Exception:
                pass

    @property
    def mlir(self) -> str:
        return self.program.text

    def _inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        user = [a for a in self.program.args if a.kind == "user_input"]
        if len(args) != len(user):
            raise TypeError(f"expected {len(user)} tensor inputs, got {len(args)}")
        by_name = dict(zip([a.name for a in user], args))
        out = []
        for spec in self.program.args:
            t = by_name[spec.name] if spec.kind == "user_input" else self.program.param_values[spec.name]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"input '{spec.name}' must be a tensor, got {type(t).__name__}")
            want = TensorType.of(t.shape, t.dtype)
            if want != spec.type:
                raise ValueError(f"input '{spec.name}' is {want}, the compiled function takes {spec.type}")
            out.append(t.detach().to("cpu").contiguous())
        return out

    def run(self, *args: torch.Tensor) -> list[torch.Tensor]:
        """Runs the function; returns all results (flat list, buffer mutations included)."""
        refuse_gradients(args)
        inputs = self._inputs(args)
        if self.backend == "runner":
            return run_with_mlir_runner(self.program, inputs)
        outs = [torch.empty(t.shape, dtype=DTYPE_OF_ELEM[t.elem]) for t in self.program.results]
        assert self._executor is not None and self._handle is not None
        self._executor.call(self._handle, self.program.func_name, inputs, outs)
        return outs

    def __call__(self, *args: torch.Tensor) -> Any:
        outs = self.run(*args)
        user = [o for o, k in zip(outs, self.program.result_kinds) if k == "user_output"]
        if self.out_spec is not None:
            return torch.utils._pytree.tree_unflatten(user, self.out_spec)
        return user[0] if len(user) == 1 else tuple(user)


def compile_cpu(model: torch.nn.Module, example_args: Sequence[Any], *, backend: str = "auto",
                params: str = "constant", raise_idioms: bool = True, func_name: str = "forward") -> CompiledModel:
    """The ``target="cpu"`` path of :func:`moe_mlir.backends.whole_graph.compile_whole_graph` (see the module doc)."""
    ep = export_program(model, example_args)
    out_spec = ep.call_spec.out_spec if ep.call_spec is not None else None
    prog = import_exported_program(ep, func_name=func_name, params=params, raise_idioms=raise_idioms)
    verify(prog.text)
    executor = None
    if backend in ("auto", "executor"):
        executor = ExecutorLibrary.find()
        if executor is None and backend == "executor":
            raise FileNotFoundError(
                "the execution API (libmoe_compiler.so or libMoEExecutorC.so) was not found; build it or set MOE_EXECUTOR_LIB, "
                "or use backend='runner'"
            )
        backend = "executor" if executor is not None else "runner"
    elif backend != "runner":
        raise ValueError(f"backend must be 'auto', 'executor' or 'runner', got {backend!r}")
    if backend == "runner" and find_mlir_runner() is None:
        raise FileNotFoundError("mlir-runner not found (set MLIR_RUNNER)")
    if backend == "runner":
        lower_to_llvm(prog.text)  # fail now, not at the first call
    return CompiledModel(prog, backend, out_spec=out_spec, executor=executor)
