"""One ``torch.ops.moe.*`` call on CUDA tensors, as its compiled host code and the runtime drive the CUDA driver.

Real CUDA kernels (built here by the kernel cache: moe-lower-to-nvvm, ptxas, the fatbin in the host object) run
against the fake driver of test/GPU/runtime/FakeCuda.cpp (python/tests/cuda_host_calls.py, in a subprocess so that
the fake ``libmoe_cuda_runtime.so`` is the one its kernels bind to). What a steady-state call may ask of the driver
is what a CUDA graph captures and what keeps a decode step's host cost down: for each kernel one function lookup and
one launch, stream-ordered allocations freed in the same call, asynchronous memsets and copies, all on the caller's
(PyTorch's) stream; never a synchronization, a blocking allocation or copy, a stream or module of its own, or a
context switch while PyTorch's context is current.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import cuda_host_calls as probe  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("MOE_BUILD_DIR", ROOT / "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
FAKE_RUNTIME = BUILD / "lib" / "fake-cuda" / "libmoe_cuda_runtime.so"

#: What a steady-state call may ask of the driver.
CAPTURABLE = {"cuModuleGetFunction", "cuLaunchKernel", "cuLaunchKernelEx", "cuMemAllocAsync", "cuMemFreeAsync",
              "cuMemsetD32Async", "cuMemsetD16Async", "cuMemcpyAsync"}
#: Once per process and device, at the first call: the stream-ordered pool's release threshold and the device's
#: error word (a blocking allocation and memset, before any capture can have begun).
FIRST_CALL_ONLY = {"cuDeviceGetDefaultMemPool", "cuMemPoolSetAttribute", "cuMemAlloc", "cuMemsetD32"}


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> dict[str, dict]:
    assert FAKE_RUNTIME.is_file(), (f"{FAKE_RUNTIME} is missing: it is built with the project when the CUDA toolkit "
                                    "is present (cmake --build build), which the test command's set-up installs")
    env = dict(os.environ, MOE_CUDA_RUNTIME=str(FAKE_RUNTIME), MOE_GPU_CHIP="sm_90",
               MOE_KERNEL_CACHE=str(tmp_path_factory.mktemp("kernels")), MOE_BUILD_DIR=str(BUILD),
               PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    env.pop("MOE_KERNEL_PREBUILT", None)
    out = subprocess.run([sys.executable, str(Path(probe.__file__)), "--repeat", "200"], env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["case"]: r for r in rows}


def test_every_case_was_probed(probed):
    assert sorted(probed) == sorted(c.name for c in probe.CASES)


@pytest.mark.parametrize("case", probe.CASES, ids=lambda c: c.name)
def test_a_call_is_capturable_and_lean(probed, case):
    r = probed[case.name]
    assert r["driver_error"] == ""
    # Loading the kernel's library loads its module once; calls never load one again.
    assert r["load"].count("cuModuleLoadData") == 1, r["load"]
    steady = collections.Counter(r["steady"])
    assert set(steady) <= CAPTURABLE, f"not capturable or not needed per call: {set(steady) - CAPTURABLE}"
    assert steady["cuLaunchKernel"] + steady["cuLaunchKernelEx"] == case.launches
    # The host code MLIR emits asks for its function at every launch: the first call looks each up (one per launch,
    # and one per launch over an empty grid, topk_renorm's unpicked kernel, which the runtime skips); later calls
    # take them from the runtime's cache (MoECudaRuntime.cpp, FunctionCacheEntry).
    assert collections.Counter(r["first"])["cuModuleGetFunction"] == (case.lookups or case.launches), r["first"]
    assert steady["cuModuleGetFunction"] == 0, r["steady"]
    assert steady["cuMemAllocAsync"] == steady["cuMemFreeAsync"], "scratch outlives the call"
    # dispatch_plan: its scratch is one allocation and its kernels write every entry themselves (no memsets).
    assert steady["cuMemAllocAsync"] == case.allocs, r["steady"]
    assert steady["cuMemsetD32Async"] + steady["cuMemsetD16Async"] == case.memsets, r["steady"]
    # Everything on the caller's stream: ordered after the producers of the inputs, before their consumers.
    assert r["streams"] == [r["ambient_stream"]]
    # The first call may add the once-per-device set-up, nothing else.
    first = collections.Counter(r["first"])
    assert set(first) <= CAPTURABLE | FIRST_CALL_ONLY, set(first) - CAPTURABLE - FIRST_CALL_ONLY


def test_no_context_switch_under_pytorchs_context(probed):
    # PyTorch keeps its (the primary) context current on the threads that call the ops: the runtime must not push
    # and pop one around every driver call.
    for r in probed.values():
        assert "cuCtxPushCurrent" not in r["steady"] and "cuCtxPopCurrent" not in r["steady"], r["case"]
