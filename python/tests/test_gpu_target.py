"""``moe_mlir.compile(..., target="cuda")`` and ``torch.compile(backend="moe")`` on CUDA inputs
(moe_mlir.backends.cuda).

Without a GPU (every machine of CI) this checks all that needs none:

* the split: moe ops (and only they) form the GPU partitions; adjacent routing ops share one, and
  ``moe-fuse-routing`` turns a mixing op + its top-k gate into the fused op;
* the build: the partitions' module goes through the one CUDA recipe (``driver.build_cuda_library``, in process) to
  ``lib*.so``, which embeds a fatbin with the cubin for the requested chip and exports ``_mlir_ciface_<fn>`` for
  every partition; the torch ops' kernels, built now or ahead of time, come from the same recipe;
* the plumbing: :meth:`CudaCompiledModel.run_split_on_cpu` runs the same split on the CPU (eager ATen part, each
  partition's MLIR through the CPU lowering) and matches eager PyTorch on the five seed-router models;
* the errors: a CPU tensor passed to a CUDA-compiled model, loading without a driver/device, a missing tool, a moe op
  configuration without a GPU kernel; the torch.compile backend's target choice.

The numerical tests on the device (``@needs_cuda``) are SKIPPED, with the reason, when PyTorch sees no CUDA device.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import moe_mlir
from moe_mlir.api import compile
from moe_mlir.backends import cuda as gpu
from moe_mlir.backends.dynamo import moe_backend
from moe_mlir.backends.tools import MoERuntimeError
from moe_mlir.runtime import cache, driver
from moe_mlir.runtime.driver import MoEOptError
from moe_mlir.backends.whole_graph import backend_target
from moe_mlir.frontend.partitioning import is_gpu_node, is_moe_op
from moe_mlir.frontend.raising import raise_routing_idioms
from moe_mlir.mlir.importer import export_program
from moe_mlir.models import acmoe, attention_inform, hyper_router, similarity_inform, symphony

from test_e2e import OneOp, assert_same

MODELS = [similarity_inform, attention_inform, hyper_router, acmoe, symphony]
MODEL_IDS = [m.__name__.split(".")[-1] for m in MODELS]

#: The moe op each model's routing partitions must hold after moe-fuse-routing (the custom-op variants).
EXPECTED_OPS = {
    "similarity_inform": ["moe.similarity_inform_topk"],
    "attention_inform": ["moe.attention_posterior_topk"],
    "hyper_router": ["moe.hyper_router", "moe.topk_renorm"],
    "acmoe": ["moe.topk_renorm", "moe.mad_dispersion"],
    "symphony": ["moe.topk_renorm"],  # adjacency_update runs in training mode only
}

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device visible to PyTorch: the GPU numerical tests "
                                                     "of target='cuda' need one")


@pytest.fixture(scope="session")
def gpu_toolchain(moe_opt, tmp_path_factory):
    """The GPU build's tools (skips naming what is missing), with a private build cache for the session."""
    try:
        tc = gpu.find_gpu_toolchain()
    except gpu.GpuToolchainError as e:
        pytest.skip(str(e))
    proc = subprocess.run([moe_opt, "--help"], capture_output=True, text=True)
    if "moe-lower-to-nvvm" not in proc.stdout:
        pytest.skip(f"{moe_opt} has no --moe-lower-to-nvvm pipeline")
    old = os.environ.get("MOE_GPU_CACHE_DIR")
    os.environ["MOE_GPU_CACHE_DIR"] = str(tmp_path_factory.mktemp("gpu-cache"))
    yield tc
    if old is None:
        os.environ.pop("MOE_GPU_CACHE_DIR", None)
    else:
        os.environ["MOE_GPU_CACHE_DIR"] = old


_compiled: dict[str, tuple] = {}


def compiled_model(mod, chip: str = "sm_90"):
    """(model, args, compiled) of a seed-router model with custom ops, compiled once per session."""
    name = mod.__name__.split(".")[-1]
    if name not in _compiled:
        model, args = mod.example(use_custom_ops=True)
        _compiled[name] = (model, args, compile(model, args, target="cuda", chip=chip))
    return _compiled[name]


def exported_symbols(lib: str) -> str:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not found")
    return subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout


def _moe_aot():
    """tools/moe-aot/moe-aot.py as a module (its fatbin reader, which the GPU check's manifests use)."""
    path = Path(__file__).resolve().parents[2] / "tools" / "moe-aot" / "moe-aot.py"
    spec = importlib.util.spec_from_file_location("moe_aot", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def embedded_device_code(lib: str) -> list[tuple[str, int]]:
    """(kind, sm) of every entry of every fatbin embedded in the shared object ``lib`` (the gpu.binary constant
    its constructor loads), after checking that it is an x86-64 shared object that needs libmoe_cuda_runtime.so."""
    data = Path(lib).read_bytes()
    assert data[:4] == b"\x7fELF" and struct.unpack_from("<HH", data, 16) == (3, 62), f"{lib}: not an x86-64 ET_DYN"
    readelf = shutil.which("readelf")
    if readelf is not None:
        dyn = subprocess.run([readelf, "-d", lib], capture_output=True, text=True, check=True).stdout
        assert "Shared library: [libmoe_cuda_runtime.so]" in dyn, dyn
    aot = _moe_aot()
    magic = struct.pack("<I", aot.FATBIN_MAGIC)
    found, at = [], data.find(magic)
    while at >= 0:
        found += [(e["kind"], e["sm"]) for e in aot.fatbin_entries(data[at:])]
        at = data.find(magic, at + 1)
    return found


# ----------------------------------------------------------------------------------------------------------------
# The split (no tools needed)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mod", MODELS, ids=MODEL_IDS)
def test_split_isolates_moe_ops(mod):
    model, args = mod.example(use_custom_ops=True)
    ep = export_program(model, args)
    raise_routing_idioms(ep.graph_module)
    n_moe = sum(1 for n in ep.graph_module.graph.nodes if n.op == "call_function" and is_moe_op(n.target))
    split, names = gpu.split_routing(ep.graph_module)
    assert names, "no GPU partition"
    inside = 0
    for name in names:
        for node in getattr(split, name).graph.nodes:
            if node.op == "call_function":
                assert is_gpu_node(node), f"{node.format_node()} is not a moe op"
                inside += is_moe_op(node.target)
    assert inside == n_moe
    # Outside the partitions: no moe op left.
    assert not any(n.op == "call_function" and is_moe_op(n.target) for n in split.graph.nodes)


# ----------------------------------------------------------------------------------------------------------------
# The build (CUDA toolkit, no GPU)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mod", MODELS, ids=MODEL_IDS)
def test_cuda_build_has_gpu_binary_and_entry_points(mod, gpu_toolchain):
    name = mod.__name__.split(".")[-1]
    _, _, c = compiled_model(mod)
    assert isinstance(c, gpu.CudaCompiledModel) and c.target == "cuda"
    assert c.partitions and c.build is not None
    mlir = c.mlir
    for op in EXPECTED_OPS[name]:
        assert op + " " in mlir, f"{op} not in the routing module:\n{mlir}"
    # Only moe ops were sent to the GPU build.
    body_ops = {line.split("=", 1)[1].split()[0] for line in mlir.splitlines() if " = " in line}
    assert all(o.startswith("moe.") for o in body_ops), body_ops
    assert ("cubin", 90) in embedded_device_code(c.library)
    syms = exported_symbols(c.library)
    for p in c.partitions:
        assert f" T _mlir_ciface_{p.fn}\n" in syms, f"_mlir_ciface_{p.fn} is not exported by {c.library}"
    undefined = subprocess.run(["nm", "-D", "--undefined-only", c.library], capture_output=True, text=True).stdout
    assert " U mgpuLaunchKernel\n" in undefined, undefined


def test_adjacency_update_builds(gpu_toolchain):
    model, args = OneOp("adjacency_update", 0.9, "row", True), (torch.rand(6, 6), torch.randint(0, 6, (20, 2)))
    c = compile(model, args, target="cuda")
    assert "moe.adjacency_update " in c.mlir
    assert ("cubin", 90) in embedded_device_code(c.library)
    assert " T _mlir_ciface_forward_gpu0\n" in exported_symbols(c.library)


def test_build_is_cached_and_chip_is_honoured(gpu_toolchain, tmp_path):
    model, args = OneOp("topk_renorm", 2), (torch.randn(6, 8),)
    a = compile(model, args, target="cuda", chip="sm_80")
    b = compile(model, args, target="cuda", chip="sm_80")
    assert a.library == b.library  # content-addressed cache
    assert set(embedded_device_code(a.library)) == {("cubin", 80), ("ptx", 80)}
    c = compile(model, args, target="cuda", chip="sm_90", build_dir=str(tmp_path / "out"))
    assert c.library == str(tmp_path / "out" / "libforward_moe_gpu.so") and os.path.isfile(c.library)


def test_every_cuda_product_comes_from_the_one_recipe(gpu_toolchain, tmp_path, monkeypatch):
    """The whole-graph library, a torch op's CUDA kernel built at its first call and the same kernel prebuilt for a
    machine without this compiler are all built by driver.build_cuda_library, in this process: the only process
    started is moe-opt's (the split's fusion and its check), no moe-aot.py, llc or C++ linker. Each is an x86-64
    shared object that needs libmoe_cuda_runtime.so, with the fatbin of its chip embedded and its entry point
    exported; the prebuilt kernel is the first-call kernel, byte for byte."""
    from moe_mlir.runtime.locate import find_runtime_lib

    built, started = [], []
    recipe, run_process = driver.build_cuda_library, driver.run_process

    def record(mlir, dest, chip, tc, **kw):
        built.append((Path(dest).name, chip, tc.fmt, kw.get("options", "")))
        return recipe(mlir, dest, chip, tc, **kw)

    monkeypatch.setattr(driver, "build_cuda_library", record)
    monkeypatch.setattr(driver, "run_process",
                        lambda cmd, *a, **kw: started.append(Path(cmd[0]).name) or run_process(cmd, *a, **kw))
    graph = compile(OneOp("topk_renorm", 2), (torch.randn(6, 8),), target="cuda", chip="sm_80",
                    build_dir=str(tmp_path / "graph"))
    key = "topk_renorm|k=2|mode=logits|renormalize=1|in:scores:f32:?x16"
    assert cache.prebuild_cuda([key], tmp_path / "prebuilt", "sm_90") == 1
    prebuilt = tmp_path / "prebuilt" / (cache.cuda_kernel_name(key, "sm_90") + ".so")
    first_call = tmp_path / "first-call.so"
    runtime = str(Path(find_runtime_lib("libmoe_cuda_runtime.so")).resolve())
    cache.build_cuda(cache.parse_key(key), key, first_call, runtime, "sm_90")

    assert set(started) == {"moe-opt"}, started
    kernel = driver.KERNEL_NVVM_OPTIONS
    assert built == [("libforward_moe_gpu.so", "sm_80", "fatbin", ""), (prebuilt.name, "sm_90", "fatbin", kernel),
                     ("first-call.so", "sm_90", "fatbin", kernel)], built
    for lib, sm, entry in [(graph.library, 80, "forward_gpu0"), (prebuilt, 90, "kernel"), (first_call, 90, "kernel")]:
        assert set(embedded_device_code(str(lib))) == {("cubin", sm), ("ptx", sm)}, lib
        assert f" T _mlir_ciface_{entry}\n" in exported_symbols(str(lib)), lib
    assert prebuilt.read_bytes() == first_call.read_bytes()


# ----------------------------------------------------------------------------------------------------------------
# The same split on the CPU (checks partitioning and plumbing without a GPU)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mod", MODELS, ids=MODEL_IDS)
def test_split_runs_on_cpu_like_eager(mod, gpu_toolchain, runner):
    model, args, c = compiled_model(mod)
    with torch.no_grad():
        assert_same(c.run_split_on_cpu(*args), model(*args))


@pytest.mark.parametrize("mod", MODELS, ids=MODEL_IDS)
def test_plain_torch_routing_is_raised_for_the_gpu(mod, gpu_toolchain, runner):
    model, args = mod.example(use_custom_ops=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c = compile(model, args, target="cuda")
    if not c.partitions:  # a router whose plain-torch form is not raised runs fully eager: said in a warning
        assert any("no moe op" in str(x.message) for x in w)
    with torch.no_grad():
        assert_same(c.run_split_on_cpu(*args), model(*args))


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------


def test_cpu_tensor_is_refused(gpu_toolchain):
    _, args, c = compiled_model(similarity_inform)
    with pytest.raises(ValueError, match=r"input '.*' is on cpu: this model was compiled with target='cuda' and "
                                         r"takes CUDA tensors"):
        c(*args)


@pytest.mark.skipif(HAS_CUDA, reason="checks the error raised where there is no CUDA device")
def test_loading_without_a_device_is_a_clear_error(gpu_toolchain):
    _, _, c = compiled_model(similarity_inform)
    with pytest.raises(gpu.CudaUnavailableError, match=r"NVIDIA driver|no device"):
        c.load()


def test_missing_toolchain_is_named(gpu_toolchain, monkeypatch):
    monkeypatch.setenv("MOE_CUDA_TOOLKIT", "/nonexistent/cuda")
    with pytest.raises(gpu.GpuToolchainError, match=r"ptxas of the CUDA toolkit \(not in /nonexistent/cuda/bin"):
        compile(OneOp("topk_renorm", 2), (torch.randn(4, 8),), target="cuda")
    monkeypatch.delenv("MOE_CUDA_TOOLKIT")
    monkeypatch.setenv("MOE_COMPILER", "/nonexistent/libmoe_compiler.so")
    with pytest.raises(gpu.GpuToolchainError, match=r"libmoe_compiler.so \(build it"):
        compile(OneOp("topk_renorm", 2), (torch.randn(4, 8),), target="cuda")


def test_op_without_gpu_kernel_is_named(gpu_toolchain):
    s, u = torch.randn(2, 3, 5, 5), torch.randn(2, 5, 4)
    v, wo, e = torch.randn(2, 3, 5, 2), torch.randn(4, 6), torch.softmax(torch.randn(2, 5, 3), -1)
    with pytest.raises(MoEOptError, match=r"(?s)cannot be lowered to GPU kernels.*'moe.attention_posterior' op GPU "
                                          r"lowering supports head_select = min_entropy only"):
        compile(OneOp("attention_posterior", 1.3, "all", first_only=True), (s, u, v, wo, e), target="cuda")


def test_target_options_are_checked():
    model, args = OneOp("topk_renorm", 2), (torch.randn(4, 8),)
    with pytest.raises(ValueError, match="target must be 'cpu' or 'cuda'"):
        compile(model, args, target="rocm")
    with pytest.raises(ValueError, match="applies to target='cpu' only"):
        compile(model, args, target="cuda", backend="runner")
    with pytest.raises(ValueError, match="applies to target='cpu' only"):
        compile(model, args, target="cuda", params="argument")
    with pytest.raises(ValueError, match="apply to target='cuda' only"):
        compile(model, args, chip="sm_90")


def test_graph_without_routing_warns(gpu_toolchain):
    class NoRouting(nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match="no moe op"):
        c = compile(NoRouting(), (x,), target="cuda")
    assert c.partitions == [] and c.library is None
    assert_same(c.run_split_on_cpu(x), NoRouting()(x))


# ----------------------------------------------------------------------------------------------------------------
# torch.compile(backend="moe"): the target follows the inputs
# ----------------------------------------------------------------------------------------------------------------


def test_backend_target_follows_the_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        on_gpu = torch.empty(2, 3, device="cuda")
        on_cpu = torch.empty(2, 3)
    assert backend_target([on_cpu]) == "cpu"
    assert backend_target([on_gpu, on_gpu]) == "cuda"
    assert backend_target([]) == "cpu"
    assert backend_target([on_gpu], "cpu") == "cpu"
    with pytest.raises(ValueError, match="several device types"):
        backend_target([on_gpu, on_cpu])
    with pytest.raises(ValueError, match="target must be"):
        backend_target([on_cpu], "tpu")


def test_backend_builds_the_gpu_path_when_asked(gpu_toolchain):
    model, args = hyper_router.example(use_custom_ops=True)
    run = moe_backend(model, list(args), options={"whole_graph": True, "target": "cuda"})
    assert isinstance(run.compiled, gpu.CudaCompiledModel)
    assert [p.fn for p in run.compiled.partitions] == ["forward_gpu0", "forward_gpu1"]


# ----------------------------------------------------------------------------------------------------------------
# On a CUDA device
# ----------------------------------------------------------------------------------------------------------------


def _cuda(x):
    return x.cuda() if isinstance(x, torch.Tensor) else x


def _compiled_on_cuda(mod, use_custom_ops: bool):
    """A seed model's example on the GPU: (model, args, compile(model, args, target="cuda")); the plain-torch
    model's compile warnings are silenced."""
    model, args = mod.example(use_custom_ops=use_custom_ops)
    model = model.cuda().eval()
    args = tuple(_cuda(a) for a in args)
    with warnings.catch_warnings():
        if not use_custom_ops:
            warnings.simplefilter("ignore")
        c = compile(model, args, target="cuda")
    return model, args, c


@needs_cuda
@pytest.mark.parametrize("mod", MODELS, ids=MODEL_IDS)
def test_cuda_model_matches_eager_cuda(mod, gpu_toolchain):
    model, args, c = _compiled_on_cuda(mod, use_custom_ops=True)
    with torch.no_grad():
        want = model(*args)
        got = c(*args)
    got_t = got if isinstance(got, (tuple, list)) else (got,)
    assert all(g.is_cuda for g in got_t)
    assert_same(got, want, atol=1e-4, rtol=1e-4)
    # Twice (buffers freed and reallocated), and in a side stream (the kernels run in the caller's stream).
    side = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(side):
        got2 = c(*args)
    side.synchronize()
    assert_same(got2, want, atol=1e-4, rtol=1e-4)


@needs_cuda
@pytest.mark.parametrize("mod", MODELS, ids=MODEL_IDS)
def test_cuda_plain_torch_model_matches_eager_cuda(mod, gpu_toolchain):
    model, args, c = _compiled_on_cuda(mod, use_custom_ops=False)
    with torch.no_grad():
        assert_same(c(*args), model(*args), atol=1e-4, rtol=1e-4)


@needs_cuda
def test_cuda_moe_op_cases_match_eager(gpu_toolchain):
    from test_e2e import _cases

    for name, model, args in _cases():
        if name.endswith("all-masked"):
            continue  # no GPU kernel (test_op_without_gpu_kernel_is_named)
        args = tuple(_cuda(a) for a in args)
        c = compile(model, args, target="cuda")
        with torch.no_grad():
            assert_same(c(*args), model(*args), atol=1e-4, rtol=1e-4)


@needs_cuda
def test_cuda_runtime_index_error_is_reported(gpu_toolchain):
    m = OneOp("mad_dispersion", 3)
    x, good = torch.randn(5, 2).cuda(), torch.tensor([0, 1, 2, 1, 0]).cuda()
    c = compile(m, (x, good), target="cuda")
    assert_same(c(x, good), m(x, good), atol=1e-4, rtol=1e-4)
    with pytest.raises(MoERuntimeError, match=r"'assign' element 2 is 7, outside \[0, 3\)"):
        c(x, torch.tensor([0, 1, 7, 1, 0]).cuda())


@needs_cuda
def test_torch_compile_picks_the_gpu_path_for_cuda_inputs(gpu_toolchain, monkeypatch):
    built = []
    real = gpu.compile_cuda

    def spy(*a, **k):
        built.append(real(*a, **k))
        return built[-1]

    monkeypatch.setattr(gpu, "compile_cuda", spy)
    torch._dynamo.reset()
    model, args = hyper_router.example(use_custom_ops=True)
    model = model.cuda().eval()
    args = tuple(_cuda(a) for a in args)
    compiled = torch.compile(model, backend="moe", dynamic=False, options={"whole_graph": True})
    with torch.no_grad():
        got = compiled(*args)
        want = model(*args)
    assert built and built[0].partitions
    assert_same(got, want, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# Loading on the right device (issue #14), without a GPU: the runtime, the library and torch.cuda are mocked
# ----------------------------------------------------------------------------------------------------------------


def test_kernels_load_inside_the_device_context(monkeypatch):
    """The library's constructor loads the kernels into the current CUDA context, so load() must run it inside
    ``torch.cuda.device(index)`` (and after mgpuSetDefaultDevice(index)): on cuda:1 the kernels must not land in
    device 0's context."""
    import types

    events: list[tuple] = []
    current = [0]

    class Device:
        def __init__(self, index):
            self.index = index.index if isinstance(index, torch.device) else index

        def __enter__(self):
            self.prev, current[0] = current[0], self.index
            events.append(("enter", self.index))

        def __exit__(self, *exc):
            current[0] = self.prev
            events.append(("exit", self.index))

    rt = types.SimpleNamespace(
        device_count=lambda: 2, take_driver_error=lambda: "",
        rt=types.SimpleNamespace(mgpuSetDefaultDevice=lambda i: events.append(("set_default", i, current[0]))))
    lib = types.SimpleNamespace(_mlir_ciface_forward_gpu0=types.SimpleNamespace())

    def cdll(path, *a, **k):
        events.append(("dlopen", path, current[0]))
        return lib

    monkeypatch.setattr(gpu, "_cuda_runtime", lambda d: rt)
    monkeypatch.setattr(gpu.ctypes, "CDLL", cdll)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", Device)
    part = types.SimpleNamespace(fn="forward_gpu0", name="gpu0")
    build = types.SimpleNamespace(library="/nonexistent/libmoe_gpu.so", chip="sm_90")
    c = gpu.CudaCompiledModel(torch.fx.symbolic_trace(torch.nn.Identity()), [], [], None, [part], build, "/rt")
    c.load(torch.device("cuda", 1))
    assert events == [("enter", 1), ("set_default", 1, 1), ("dlopen", "/nonexistent/libmoe_gpu.so", 1),
                      ("exit", 1)]
    assert c._device_index == 1 and current[0] == 0
    c.load(torch.device("cuda", 1))  # once
    assert len(events) == 4
