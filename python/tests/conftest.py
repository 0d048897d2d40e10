"""Shared fixtures: devices, moe-opt discovery and a FileCheck-like helper."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterable

# Test the package next to these tests, not whichever checkout an editable install of the venv points at.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
if _PACKAGE_ROOT not in sys.path:
    sys.path.insert(0, _PACKAGE_ROOT)

import pytest  # noqa: E402

# The helpers the torch-op tests share assert too: show the values when they fail.
pytest.register_assert_rewrite("torch_checks")
import torch  # noqa: E402

import moe_mlir  # noqa: E402,F401  (registers torch.ops.moe.*)
from moe_mlir.runtime.locate import find_mlir_runner, find_moe_opt  # noqa: E402
from torch_checks import cuda_wanted, device_param  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def _own_raised_cache(tmp_path, monkeypatch):
    """Each test starts with an empty cache of raised graphs (moe_mlir.backends.raised_cache): its compiles take the
    user's cold path (trace, raise, the graph rebuilt from its entry), and no test is served a graph another test
    raised (with other monkeypatched parts). test_raised_cache.py checks the warm path."""
    from moe_mlir.backends import raised_cache

    monkeypatch.setattr(raised_cache, "_directory", lambda: tmp_path / "raised")


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(params=[device_param("cpu")] + ([device_param("cuda")] if cuda_wanted() else []))
def dev(request) -> str:
    """The device the kernels of torch.ops.moe.* run on (the references on the CPU): the CPU, and CUDA when
    wanted (torch_checks.cuda_wanted). test_torch_ops_cuda.py overrides it (and `cuda`) to run the tests that take
    them on one device."""
    return request.param


@pytest.fixture(params=[device_param("cuda") if cuda_wanted() else
                        pytest.param("cuda", marks=pytest.mark.skip(reason="CUDA behaviour: no GPU "
                                                                    "(MOE_TEST_DEVICE=cuda asks for it)"))])
def cuda(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def moe_opt() -> str:
    path = find_moe_opt()
    if path is None:
        pytest.skip("moe-opt not found: build it (cmake --build build) or set MOE_OPT to check the printed MLIR")
    return path


def run_moe_opt(moe_opt: str, text: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([moe_opt, *args, "-"], input=text, capture_output=True, text=True, timeout=600)


def assert_verifies(moe_opt: str, text: str, *args: str) -> str:
    """moe-opt parses and verifies ``text`` (and runs ``args``); returns its output."""
    proc = run_moe_opt(moe_opt, text, *args)
    assert proc.returncode == 0, f"moe-opt {' '.join(args)} rejected the module:\n{proc.stderr[:4000]}"
    return proc.stdout


def filecheck(text: str, patterns: Iterable[str]) -> None:
    """A tiny FileCheck: each regex must match, in order, at or after the previous match."""
    pos = 0
    for pat in patterns:
        m = re.compile(pat, re.M).search(text, pos)
        assert m is not None, f"pattern {pat!r} not found after offset {pos}"
        pos = m.end()


def lowering_available(moe_opt: str) -> bool:
    """Whether moe-opt lowers a moe op to LLVM (the CPU lowering may land after the dialect)."""
    probe = """
func.func @f(%x: tensor<3x5xf32>) -> tensor<3x2xf32> {
  %r:2 = "moe.topk_renorm"(%x) {k = 2 : i64} : (tensor<3x5xf32>) -> (tensor<3x2xf32>, tensor<3x2xi32>)
  return %r#0 : tensor<3x2xf32>
}
"""
    return run_moe_opt(moe_opt, probe, "--moe-lower-to-llvm").returncode == 0


@pytest.fixture(scope="session")
def runner(moe_opt: str) -> str:
    if find_mlir_runner() is None:
        pytest.skip("mlir-runner not found (set MLIR_RUNNER)")
    if not lowering_available(moe_opt):
        pytest.skip(f"{moe_opt} cannot lower moe ops with --moe-lower-to-llvm yet")
    return moe_opt
