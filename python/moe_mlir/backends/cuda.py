"""``moe_mlir.compile(model, example_args, target="cuda")``: routing on the moe GPU kernels, the rest in PyTorch CUDA.

What runs where
---------------
``convert-moe-to-gpu`` (``moe-opt --moe-lower-to-nvvm``) lowers *moe ops* only: every dialect op has a fused CUDA
kernel, but the linalg/tensor/arith code the importer prints for the rest of a model (attention, layer norms, the
expert MLPs, the combine) has no GPU lowering in this project, and compiling it through the upstream
linalg -> GPU mapping would produce naive one-thread-per-element loops that cuBLAS/cuDNN-backed eager PyTorch beats
by orders of magnitude. So the GPU target *splits* the graph:

1. ``torch.export`` (the same :func:`~moe_mlir.mlir.importer.export_program` as the CPU target: eval mode, the importer's
   decomposition table) and :func:`~moe_mlir.frontend.raising.raise_routing_idioms`, so that plain-torch routing (softmax ->
   topk -> renormalize, ``softmax(U Uᵀ/τ) E``) becomes moe ops exactly as on the CPU target;
2. :class:`torch.fx.passes.infra.partitioner.CapabilityBasedPartitioner` groups the ``torch.ops.moe.*`` nodes (and
   the ``getitem`` of their tuple results) into maximal connected *GPU partitions*; everything else stays ATen;
3. each partition is re-exported and printed by the importer as one ``func.func @<func_name>_gpu<i>`` whose
   arguments are the partition's tensor inputs and whose results are its outputs. Its operands are therefore
   always function arguments, i.e. *device memory* at run time (never ``arith.constant`` weights, which
   convert-moe-to-gpu would lower to host globals the kernels cannot read: the weights a routing op needs, e.g.
   HyperRouter's hypernetwork, are graph inputs of the partition);
4. all partition functions go into one module, ``moe-opt --moe-fuse-routing --canonicalize`` fuses a mixing op
   with the top-k gate that consumes it (``moe.similarity_inform_topk``...: possible because adjacent moe ops land
   in one partition), ``--convert-moe-to-gpu`` is tried first to report an op without a GPU kernel by name, then
   the CUDA recipe of every CUDA product, :func:`moe_mlir.runtime.driver.build_cuda_library`, builds
   ``lib<name>.so`` in process (moe-lower-to-nvvm, LLVM, lld against ``libmoe_cuda_runtime.so``). All of this
   happens at compile time and needs no GPU;
5. at call time the rewritten FX graph (``torch.device`` arguments retargeted to the inputs' CUDA device) runs
   eagerly on CUDA tensors, and each partition node calls ``_mlir_ciface_<fn>`` of the library through
   :mod:`ctypes` with device memref descriptors, on PyTorch's *current stream* (``moeGpuSetStream``; on the legacy
   default stream, whose handle 0 the runtime cannot adopt, after synchronizing it), then copies the device
   results into PyTorch tensors and frees them with ``moeGpuFree``. The compiled host code waits for its stream
   at the end of each op, so a partition call is synchronous.

Weights are the model's tensors at compile time (no copy; a CUDA model's weights are used in place, a CPU model's
are copied to the device at the first call on it). The model runs under ``torch.no_grad()`` (inference: with grad
mode on, an input that requires grad is refused; train with the default path), on one device: the one its kernels
were loaded on at the first call. The library is loaded at the first call (or :meth:`CudaCompiledModel.load`): that
is where a missing driver or device is reported (:class:`CudaUnavailableError`). A CPU tensor passed to the
compiled model raises :class:`ValueError`; a missing tool of the GPU build raises :class:`GpuToolchainError`; a moe
op the GPU lowering refuses raises :class:`~moe_mlir.runtime.driver.MoEOptError` with moe-opt's diagnostic.

:meth:`CudaCompiledModel.run_split_on_cpu` runs the *same split* on the CPU (the eager part on CPU tensors, each
partition's MLIR through the CPU execution API): a check of the partitioning, the argument/result plumbing and the
device retargeting that needs no GPU.

Environment: ``$MOE_GPU_CHIP`` (default chip when no device is visible; else the device's ``sm_XY``),
``$MOE_CUDA_TOOLKIT`` (default ``/usr/local/cuda``), ``$MOE_COMPILER`` (path of libmoe_compiler.so),
``$MOE_GPU_CACHE_DIR`` (where built libraries are kept, keyed by a hash of the module, the chip and the toolchain;
default ``gpu-libraries`` in the compiler driver's cache, :func:`moe_mlir.runtime.driver.cache_dir`).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.fx as fx
from torch.export.graph_signature import InputKind, OutputKind

from ..mlir.builder import TensorType
from ..runtime import abi, driver
from ..runtime.driver import GpuToolchain, GpuToolchainError, find_gpu_toolchain
from ..runtime.locate import find_moe_opt
from ..runtime import cuda as moe_cuda
from ..frontend.partitioning import split_routing
from ..mlir.importer import ImportedProgram, export_program, import_exported_program

__all__ = [
    "GpuToolchainError",
    "CudaUnavailableError",
    "CudaCompiledModel",
    "GpuPartition",
    "compile_cuda",
    "split_routing",
    "build_gpu_library",
    "find_gpu_toolchain",
    "default_chip",
]

REPO_ROOT = Path(__file__).resolve().parents[3]


class CudaUnavailableError(RuntimeError):
    """The model was compiled for CUDA but cannot run here: no CUDA driver, no device, or the kernels could not
    be loaded on this device."""


# ----------------------------------------------------------------------------------------------------------------
# Tools (the one CUDA recipe and its toolchain: moe_mlir.runtime.driver)
# ----------------------------------------------------------------------------------------------------------------


def default_chip() -> str:
    """``sm_XY`` of the current CUDA device, else ``$MOE_GPU_CHIP``, else ``sm_90`` (H100/H200)."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return os.environ.get("MOE_GPU_CHIP", "sm_90")


# ----------------------------------------------------------------------------------------------------------------
# The split
# ----------------------------------------------------------------------------------------------------------------


def _example_of(node: Any) -> torch.Tensor:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        raise NotImplementedError(f"an operand of a moe op is not a tensor with static shape: {node!r}")
    return torch.zeros(tuple(int(s) for s in val.shape), dtype=val.dtype)


def _retarget(gm: fx.GraphModule, device: torch.device) -> fx.GraphModule:
    """A copy of ``gm`` (sharing its submodules) where every ``torch.device`` argument is ``device``: the exported
    graph records the tracing device in factory ops and ``_assert_tensor_metadata``."""
    graph = copy.deepcopy(gm.graph)

    def swap(a: Any) -> Any:
        return device if isinstance(a, torch.device) else a

    for node in graph.nodes:
        node.args = fx.node.map_aggregate(node.args, swap)
        node.kwargs = fx.node.map_aggregate(node.kwargs, swap)
    out = fx.GraphModule(gm, graph)
    out.recompile()
    return out


# ----------------------------------------------------------------------------------------------------------------
# The GPU build
# ----------------------------------------------------------------------------------------------------------------


def _cache_root() -> Path:
    """``$MOE_GPU_CACHE_DIR``, else ``gpu-libraries`` in the compiler driver's cache (:func:`driver.cache_dir`)."""
    env = os.environ.get("MOE_GPU_CACHE_DIR")
    return Path(env) if env else driver.cache_dir() / "gpu-libraries"


@dataclass
class GpuBuild:
    """What :func:`build_gpu_library` produced, in ``out_dir``: ``<name>.mlir`` and ``lib<name>.so``. The lowered
    module is not kept (the recipe runs in process): ``moe-opt --moe-lower-to-nvvm="chip=<chip>" <name>.mlir`` prints
    it."""

    library: str  # lib<name>.so: the host code, the device code embedded (a gpu.binary that its constructor loads)
    out_dir: str
    name: str
    chip: str
    input_mlir: str  # <name>.mlir, the module given to the CUDA recipe (after moe-fuse-routing + canonicalize)


def build_gpu_library(mlir_text: str, *, name: str = "moe_gpu", chip: Optional[str] = None,
                      fmt: Optional[str] = None, out_dir: Optional[str] = None,
                      toolchain: Optional[GpuToolchain] = None) -> GpuBuild:
    """Builds ``lib<name>.so`` from a module of tensor functions holding moe ops only (their tensor arguments are
    device memory at run time) with the CUDA recipe (:func:`driver.build_cuda_library`, in process; its pipeline's
    defaults: results allocated by the library, a wait at return), the device code in the format ``fmt`` (default:
    the toolchain's, else ``fatbin``). Cached by content unless ``out_dir`` is given.

    Raises:
        GpuToolchainError: a library or tool is missing. MoEOptError: moe-opt rejected the module or an op has no
        GPU lowering (the message is moe-opt's diagnostic, naming the op). CompileError (a RuntimeError): the CUDA
        recipe failed (its diagnostics).
    """
    from ..runtime.driver import MoEOptError, run_moe_opt

    tc = toolchain or find_gpu_toolchain(fmt=fmt or "fatbin")
    if fmt is not None and fmt != tc.fmt:
        raise ValueError(f"format {fmt!r} asked of a toolchain found for {tc.fmt!r}")
    moe_opt = find_moe_opt()
    if moe_opt is None:
        raise GpuToolchainError("the GPU build cannot run; missing:\n  - moe-opt (build it: ninja -C <build> moe-opt, "
                                "or set MOE_OPT)")
    chip = chip or default_chip()
    fused = run_moe_opt(mlir_text, ["--moe-fuse-routing", "--canonicalize"], moe_opt=moe_opt)
    try:
        run_moe_opt(fused, ["--convert-moe-to-gpu"], moe_opt=moe_opt)
    except MoEOptError as e:
        raise MoEOptError(f"the routing subgraph cannot be lowered to GPU kernels (convert-moe-to-gpu); compile "
                          f"with target='cpu' instead.\n{e}") from None
    if out_dir is None:
        key = driver.digest(fused, name, chip, tc.toolkit, *tc.stamps(), length=24)
        out = _cache_root() / key
        if (out / f"lib{name}.so").is_file() and (out / f"{name}.mlir").is_file():
            return GpuBuild(str(out / f"lib{name}.so"), str(out), name, chip, str(out / f"{name}.mlir"))
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=key + ".", dir=out.parent))
    else:
        out = work = Path(out_dir)
        work.mkdir(parents=True, exist_ok=True)
    try:
        (work / f"{name}.mlir").write_text(fused)
        driver.build_cuda_library(fused, work / f"lib{name}.so", chip, tc,
                                  what=f"building the GPU library of the routing subgraphs for {chip}")
    except BaseException:
        if work != out:
            shutil.rmtree(work, ignore_errors=True)
        raise
    if work != out:  # publish atomically into the cache (another process may have published it first)
        driver.publish(work, out)
    return GpuBuild(str(out / f"lib{name}.so"), str(out), name, chip, str(out / f"{name}.mlir"))


# ----------------------------------------------------------------------------------------------------------------
# Run time: the CUDA runtime and the library
# ----------------------------------------------------------------------------------------------------------------


def _cuda_runtime(runtime_dir: str) -> "moe_cuda.CudaRuntime":
    """The process's CUDA runtime (:mod:`moe_mlir.runtime.cuda`: loaded once, RTLD_GLOBAL, so that the compiled
    libraries bind to it), from ``runtime_dir`` at the first load."""
    cuda_path = os.path.join(runtime_dir, "libmoe_cuda_runtime.so")
    for p in (os.path.join(runtime_dir, "libmoe_cpu_runtime.so"), cuda_path):
        if not os.path.isfile(p):
            raise GpuToolchainError(f"{p} is missing: build moe_cpu_runtime and moe_cuda_runtime")
    try:
        return moe_cuda.runtime(cuda_path)
    except OSError as e:
        raise CudaUnavailableError(
            f"the CUDA runtime of moe-mlir could not be loaded ({e}); target='cuda' needs the NVIDIA driver "
            "(libcuda.so.1) and a GPU: run on a machine with one, or compile with target='cpu'"
        ) from None


@dataclass
class GpuPartition:
    """One routing subgraph compiled for the GPU: ``func.func @<fn>`` of the library."""

    name: str  # the submodule of the split graph
    fn: str
    program: ImportedProgram  # its MLIR (before moe-fuse-routing)
    single: bool  # the submodule returns one tensor (not a tuple)
    result_types: list[TensorType] = field(default_factory=list)


class _PartitionCall(torch.nn.Module):
    """Replaces a GPU submodule in the split graph: calls the compiled function on CUDA tensors, or (under
    :meth:`CudaCompiledModel.run_split_on_cpu`) the partition's CPU-compiled module on CPU tensors."""

    def __init__(self, owner: "CudaCompiledModel", part: GpuPartition) -> None:
        super().__init__()
        self._owner = [owner]  # a list: not a registered submodule
        self.part = part
        self._cpu: Any = None

    def forward(self, *args: torch.Tensor) -> Any:
        owner = self._owner[0]
        if all(a.device.type == "cuda" for a in args):
            outs = owner._call_gpu(self.part, list(args))
        elif all(a.device.type == "cpu" for a in args) and owner._cpu_check:
            if self._cpu is None:
                from .cpu import CompiledModel, ExecutorLibrary

                ex = ExecutorLibrary.find()
                self._cpu = CompiledModel(self.part.program, "executor" if ex else "runner", executor=ex)
            outs = self._cpu.run(*args)
        else:
            devs = sorted({str(a.device) for a in args})
            raise ValueError(f"GPU partition '{self.part.fn}' got tensors on {', '.join(devs)}: it runs on CUDA "
                             "tensors only")
        return outs[0] if self.part.single else tuple(outs)


# ----------------------------------------------------------------------------------------------------------------
# The compiled model
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _InputSpec:
    name: str
    kind: str  # "user_input" | "parameter" | "buffer" | "constant"
    type: TensorType
    value: Optional[torch.Tensor] = None  # weights (the model's tensors)


class CudaCompiledModel:
    """A model compiled with ``target="cuda"``; call it with CUDA tensors (same shapes and dtypes as the example
    inputs). See the module doc for what runs where.

    Attributes:
        partitions: the GPU partitions (one compiled function each), in graph order.
        mlir: the module of partition functions given to the GPU build (after moe-fuse-routing).
        build: the :class:`GpuBuild` (paths of the library and its input module), None without partitions.
        graph: the split FX graph module (ATen nodes + ``call_module`` of the partitions).
    """

    target = "cuda"
    backend = "cuda"

    def __init__(self, graph: fx.GraphModule, inputs: list[_InputSpec], output_kinds: list[str], out_spec: Any,
                 partitions: list[GpuPartition], build: Optional[GpuBuild], runtime_dir: Optional[str]) -> None:
        self.graph = graph
        self.inputs = inputs
        self.output_kinds = output_kinds
        self.out_spec = out_spec
        self.partitions = partitions
        self.build = build
        self._runtime_dir = runtime_dir
        self._runtime: Optional[moe_cuda.CudaRuntime] = None
        self._lib: Any = None
        self._fns: dict[str, Any] = {}
        self._graphs: dict[str, fx.GraphModule] = {}
        self._weights: dict[str, list[torch.Tensor]] = {}
        self._cpu_check = False
        self._device_index: Optional[int] = None
        for p in partitions:
            setattr(graph, p.name, _PartitionCall(self, p))

    @property
    def mlir(self) -> str:
        if self.build is None:
            return ""
        return Path(self.build.input_mlir).read_text()

    @property
    def library(self) -> Optional[str]:
        return self.build.library if self.build else None

    # -- loading --------------------------------------------------------------------------------------------------
    def load(self, device: Optional[torch.device] = None) -> None:
        """Loads the CUDA runtime and the library, whose constructor loads the kernels into the primary context of
        ``device`` (default: PyTorch's current CUDA device, else device 0). The kernels then run on that device
        only: a call with inputs on another device raises :class:`ValueError`.

        Raises:
            CudaUnavailableError: no driver, no device, or the kernels do not load (e.g. built for another chip).
        """
        if self._lib is not None or not self.partitions:
            return
        assert self.build is not None and self._runtime_dir is not None
        rt = _cuda_runtime(self._runtime_dir)
        count = rt.device_count()
        if count <= 0:
            raise CudaUnavailableError("the CUDA driver reports no device: a model compiled with target='cuda' "
                                       "needs an NVIDIA GPU (compile with target='cpu' to run here)")
        if device is None or device.index is None:
            index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        else:
            index = device.index
        if index >= count:
            raise CudaUnavailableError(f"no CUDA device {index} ({count} present)")
        # The library's constructor loads the kernels into the current context: make it device `index`'s, for the
        # runtime (mgpuSetDefaultDevice) and for PyTorch's current device alike (issue #14: loading outside the
        # device context put a second GPU's kernels into device 0's context).
        with torch.cuda.device(index) if torch.cuda.is_available() else contextlib.nullcontext():
            rt.take_driver_error()
            rt.rt.mgpuSetDefaultDevice(index)
            try:
                lib = ctypes.CDLL(self.build.library)
            except OSError as e:
                raise CudaUnavailableError(f"cannot load {self.build.library}: {e}") from None
            err = rt.take_driver_error()
        if err:
            raise CudaUnavailableError(f"the GPU kernels of {self.build.library} (built for {self.build.chip}) did "
                                       f"not load on this device: {err}. Recompile with chip='{default_chip()}'")
        for p in self.partitions:
            fn = getattr(lib, "_mlir_ciface_" + p.fn)
            fn.restype = None
            self._fns[p.fn] = fn
        self._runtime, self._lib, self._device_index = rt, lib, index

    # -- calls ----------------------------------------------------------------------------------------------------
    def _check_inputs(self, args: Sequence[Any], device_type: str) -> torch.device:
        user = [s for s in self.inputs if s.kind == "user_input"]
        if len(args) != len(user):
            raise TypeError(f"expected {len(user)} tensor inputs, got {len(args)}")
        device: Optional[torch.device] = None
        for spec, a in zip(user, args):
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"input '{spec.name}' must be a tensor, got {type(a).__name__}")
            if a.device.type != device_type:
                if device_type == "cuda":
                    raise ValueError(
                        f"input '{spec.name}' is on {a.device}: this model was compiled with target='cuda' and "
                        "takes CUDA tensors (move the inputs with .cuda(), or compile with target='cpu')")
                raise ValueError(f"input '{spec.name}' is on {a.device}, expected a {device_type} tensor")
            if device is None:
                device = a.device
            elif a.device != device:
                raise ValueError(f"inputs on several devices ({device} and {a.device}): put them on one device")
            got = TensorType.of(a.shape, a.dtype)
            if got != spec.type:
                raise ValueError(f"input '{spec.name}' is {got}, the compiled function takes {spec.type}")
        return device or torch.device(device_type)

    def _graph_for(self, device: torch.device) -> fx.GraphModule:
        key = str(device)
        if key not in self._graphs:
            self._graphs[key] = _retarget(self.graph, device)
        return self._graphs[key]

    def _weights_for(self, device: torch.device) -> list[torch.Tensor]:
        key = str(device)
        if key not in self._weights:
            self._weights[key] = [s.value.to(device) for s in self.inputs if s.kind != "user_input"]  # type: ignore
        return self._weights[key]

    def _flat_inputs(self, args: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        weights = iter(self._weights_for(device))
        user = iter(args)
        return [next(user) if s.kind == "user_input" else next(weights) for s in self.inputs]

    def run(self, *args: torch.Tensor) -> list[torch.Tensor]:
        """Runs the graph on CUDA tensors; returns every output (flat, buffer mutations included)."""
        from .tools import refuse_gradients

        refuse_gradients(args)
        device = self._check_inputs(args, "cuda")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        with torch.no_grad(), torch.cuda.device(device):
            self.load(device)  # inside the device context: the kernels load into this device's context
            if self._device_index is not None and device.index != self._device_index:
                raise ValueError(f"the inputs are on {device}, but this model's GPU kernels were loaded on "
                                 f"cuda:{self._device_index} (compile one model per device)")
            gm = self._graph_for(device)
            outs = gm(*self._flat_inputs(args, device))
        return list(outs) if isinstance(outs, (tuple, list)) else [outs]

    def run_split_on_cpu(self, *args: torch.Tensor) -> Any:
        """Runs the same split on CPU tensors (eager ATen part on the CPU, each GPU partition's MLIR compiled for the
        CPU): checks the partitioning without a GPU. Returns what the model returns."""
        device = self._check_inputs(args, "cpu")
        gm = self._graph_for(device)
        self._cpu_check = True
        try:
            with torch.no_grad():
                outs = gm(*self._flat_inputs(args, device))
        finally:
            self._cpu_check = False
        return self._structure(list(outs) if isinstance(outs, (tuple, list)) else [outs])

    def _structure(self, outs: list[torch.Tensor]) -> Any:
        user = [o for o, k in zip(outs, self.output_kinds) if k == "user_output"]
        if self.out_spec is not None:
            return torch.utils._pytree.tree_unflatten(user, self.out_spec)
        return user[0] if len(user) == 1 else tuple(user)

    def __call__(self, *args: torch.Tensor) -> Any:
        return self._structure(self.run(*args))

    def _call_gpu(self, part: GpuPartition, args: list[torch.Tensor]) -> list[torch.Tensor]:
        from .tools import MoERuntimeError

        rt = self._runtime
        assert rt is not None, "load() first"
        device = args[0].device
        ins = [a.contiguous() for a in args]  # identity layouts; kept alive across the call
        descs = [abi.describe(t) for t in ins]
        res, res_descs = abi.result_descriptors([t.rank for t in part.result_types])
        stream = torch.cuda.current_stream(device)
        rt.take_index_error()  # a stale error of an earlier call on this thread is not ours
        rt.rt.mgpuSetDefaultDevice(device.index if device.index is not None else 0)
        if stream.cuda_stream:
            # Kernels, allocations and the final wait run in PyTorch's stream, ordered after the producers.
            rt.rt.moeGpuSetStream(ctypes.c_void_p(stream.cuda_stream))
        else:
            # PyTorch's legacy default stream (handle 0): with no ambient stream the runtime creates a
            # non-blocking stream, which does not wait for the default stream, so wait for the producers here.
            stream.synchronize()
            rt.rt.moeGpuSetStream(None)
        try:
            self._fns[part.fn](ctypes.byref(res), *[ctypes.byref(d) for d in descs])
        finally:
            rt.rt.moeGpuSetStream(None)
        outs = []
        for d, t in zip(res_descs, part.result_types):
            dtype = abi.DTYPE_OF_ELEM[t.elem]
            out = torch.empty(t.shape, dtype=dtype, device=device)
            if t.rank and list(d.sizes) != list(t.shape):
                raise MoERuntimeError(f"{part.fn}: a result has shape {list(d.sizes)}, expected {list(t.shape)}")
            nbytes = out.numel() * out.element_size()
            if nbytes:
                src = (d.aligned or 0) + d.offset * out.element_size()
                rt.rt.mgpuMemcpy(out.data_ptr(), src, nbytes, ctypes.c_void_p(stream.cuda_stream))
            outs.append(out)
        stream.synchronize()  # the copies are done before the results are freed
        keep = {t.data_ptr() for t in ins}
        freed: set[int] = set()
        for d in res_descs:
            p = d.allocated or 0
            if p and p not in keep and p not in freed:
                rt.rt.moeGpuFree(p)
                freed.add(p)
        err = rt.take_driver_error()
        if err:
            raise MoERuntimeError(f"{part.fn}: CUDA driver error: {err}")
        err = rt.take_index_error()
        if err:
            raise MoERuntimeError(err)
        return outs


# ----------------------------------------------------------------------------------------------------------------
# compile(target="cuda")
# ----------------------------------------------------------------------------------------------------------------


def compile_cuda(model: torch.nn.Module, example_args: Sequence[Any], *, raise_idioms: bool = True,
                 func_name: str = "forward", chip: Optional[str] = None, build_dir: Optional[str] = None,
                 fmt: str = "fatbin") -> CudaCompiledModel:
    """The ``target="cuda"`` path of :func:`moe_mlir.compile` (see the module doc). Needs no GPU: the example
    inputs may be CPU tensors (the graph is retargeted to the inputs' CUDA device at call time)."""
    from .tools import verify
    from ..frontend.raising import raise_routing_idioms

    ep = export_program(model, example_args)
    out_spec = ep.call_spec.out_spec if ep.call_spec is not None else None
    gm = ep.graph_module
    if raise_idioms:
        raise_routing_idioms(gm)

    # The signature: weights and user inputs, in placeholder order.
    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs}
    state, constants = ep.state_dict, getattr(ep, "constants", {}) or {}
    inputs: list[_InputSpec] = []
    for ph in (n for n in gm.graph.nodes if n.op == "placeholder"):
        spec = specs.get(ph.name)
        kind = spec.kind if spec is not None else InputKind.USER_INPUT
        if kind == InputKind.USER_INPUT:
            val = ph.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise TypeError(f"user input '{ph.name}' is not a tensor ({type(val).__name__}): only tensor inputs "
                                "are supported")
            inputs.append(_InputSpec(ph.name, "user_input", TensorType.of(val.shape, val.dtype)))
            continue
        if kind in (InputKind.PARAMETER, InputKind.BUFFER):
            value = state.get(spec.target)
            if value is None:
                value = constants.get(spec.target)
        elif kind == InputKind.CONSTANT_TENSOR:
            value = constants.get(spec.target)
        else:
            raise NotImplementedError(f"unsupported input kind {kind} for '{ph.name}'")
        if not isinstance(value, torch.Tensor):
            raise NotImplementedError(f"no tensor value for {kind.name.lower()} '{spec.target}'")
        value = value.detach()  # the model's tensor (no copy): moved to the device at the first call
        inputs.append(_InputSpec(ph.name, kind.name.lower(), TensorType.of(value.shape, value.dtype), value))
    output_kinds = [
        f"buffer_mutation:{s.target}" if s.kind == OutputKind.BUFFER_MUTATION else "user_output"
        for s in sig.output_specs
    ]

    split, names = split_routing(gm)
    partitions: list[GpuPartition] = []
    for i, name in enumerate(names):
        sub = getattr(split, name)
        node = next(n for n in split.graph.nodes if n.op == "call_module" and n.target == name)
        example = [_example_of(a) for a in node.args]
        fn = f"{func_name}_gpu{i}"
        sub_ep = export_program(sub, example, decompose=False)
        prog = import_exported_program(sub_ep, func_name=fn, params="argument", raise_idioms=False)
        out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
        single = not isinstance(out, (tuple, list))
        partitions.append(GpuPartition(name, fn, prog, single, list(prog.results)))

    build = None
    runtime_dir = None
    if partitions:
        bodies = []
        for p in partitions:
            lines = p.program.text.strip().splitlines()
            assert lines[0].strip() == "module {" and lines[-1].strip() == "}", p.program.text[:200]
            bodies.append("\n".join(lines[1:-1]))
        module = "module {\n" + "\n".join(bodies) + "\n}\n"
        verify(module)
        tc = find_gpu_toolchain(fmt=fmt)
        build = build_gpu_library(module, name=f"{func_name}_moe_gpu", chip=chip, fmt=fmt, out_dir=build_dir,
                                  toolchain=tc)
        runtime_dir = tc.runtime_dir
    else:
        warnings.warn("target='cuda': the graph has no moe op (no routing was recognized), so it runs entirely in "
                      "eager PyTorch on the GPU", stacklevel=3)
    return CudaCompiledModel(split, inputs, output_kinds, out_spec, partitions, build, runtime_dir)
