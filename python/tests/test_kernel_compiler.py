"""The in-process kernel compiler (libmoe_compiler.so through moe_mlir.runtime.compiler): what it builds loads and
runs, and every bad input is an error that says what went wrong, never a crash."""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest
import torch

import moe_mlir  # noqa: F401  (registers the ops)
from moe_mlir.runtime import compiler
from moe_mlir.runtime.locate import find_runtime_lib

pytestmark = pytest.mark.skipif(compiler.library_path() is None, reason="libmoe_compiler.so is not built")

RUNTIME = find_runtime_lib("libmoe_kernel_runtime.so")

# A function callable without the memref ABI: f(x) = 2x + 1 on i64.
SCALAR = """
func.func @twice_plus_one(%x: i64) -> i64 {
  %c1 = arith.constant 1 : i64
  %c2 = arith.constant 2 : i64
  %m = arith.muli %x, %c2 : i64
  %r = arith.addi %m, %c1 : i64
  return %r : i64
}
"""
TO_LLVM = "convert-arith-to-llvm,convert-func-to-llvm,reconcile-unrealized-casts"


def _load(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)


def test_compiled_shared_object_loads_and_runs(tmp_path: Path):
    seconds = compiler.compile_kernel(SCALAR, TO_LLVM, tmp_path / "f.so")
    assert set(seconds) == set(compiler.STAGES) and all(s >= 0 for s in seconds.values()), seconds
    assert (tmp_path / "f.so").read_bytes()[:4] == b"\x7fELF"
    assert not list(tmp_path.glob("*.o")), "the intermediate object was left behind"
    f = _load(tmp_path / "f.so").twice_plus_one
    f.restype, f.argtypes = ctypes.c_int64, [ctypes.c_int64]
    assert [f(v) for v in (0, 20, -3)] == [1, 41, -5]


def test_a_kernel_for_a_target_below_the_host_links_compiler_rt(tmp_path: Path):
    """f32 -> bf16 on x86-64-v3 (no AVX-512 BF16) calls compiler-rt's __truncsfbf2, which glibc's libgcc may lack:
    the link takes it from the archive beside the runtime, so the shared object defines it."""
    mlir = """
module {
  func.func @kernel(%s: tensor<?x8xf32>) -> tensor<?x8xbf16> {
    %c0 = arith.constant 0 : index
    %n = tensor.dim %s, %c0 : tensor<?x8xf32>
    %e = tensor.empty(%n) : tensor<?x8xbf16>
    %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                         iterator_types = ["parallel", "parallel"]} ins(%s : tensor<?x8xf32>) outs(%e : tensor<?x8xbf16>) {
    ^bb0(%a: f32, %b: bf16):
      %t = arith.truncf %a : f32 to bf16
      linalg.yield %t : bf16
    } -> tensor<?x8xbf16>
    return %r : tensor<?x8xbf16>
  }
}"""
    pipeline = "canonicalize,moe-lower-to-llvm{target-cpu=x86-64-v3 results-to-out-params=true}"
    archive = compiler.builtins_archive()
    assert archive is not None
    compiler.compile_kernel(mlir, pipeline, tmp_path / "trunc.so", "x86-64-v3",
                            link_args=[f"-L{Path(RUNTIME).parent}", "-lmoe_kernel_runtime", archive])
    dyn = subprocess.run(["readelf", "--dyn-syms", "-W", str(tmp_path / "trunc.so")], capture_output=True,
                         text=True).stdout
    assert "_mlir_ciface_kernel" in dyn and "__truncsfbf2" not in dyn, dyn  # linked in, nothing left undefined
    assert ctypes.CDLL(str(tmp_path / "trunc.so"), mode=os.RTLD_NOW | os.RTLD_LOCAL)._mlir_ciface_kernel


@pytest.mark.parametrize("mlir, pipeline, message", [
    ("func.func @f( {", TO_LLVM, "cannot parse the module"),
    ("(((" * 20000, TO_LLVM, "nested deeper than"),
    (SCALAR, "no-such-pass", "does not refer to a registered pass"),
    (SCALAR, "canonicalize", "translation to LLVM IR failed"),
    ("func.func @f(%x: tensor<4xf32>) { moe.nope %x : tensor<4xf32>\n return }", TO_LLVM,
     "cannot parse the module"),
])
def test_compile_errors_are_diagnostics(tmp_path: Path, mlir: str, pipeline: str, message: str):
    with pytest.raises(compiler.CompilerLibraryError, match=message):
        compiler.compile_kernel(mlir, pipeline, tmp_path / "x.so")
    assert not list(tmp_path.iterdir())


def test_unknown_target_cpu_is_an_error(tmp_path: Path):
    with pytest.raises(compiler.CompilerLibraryError, match="unknown target-cpu 'pentium-z'"):
        compiler.compile_kernel(SCALAR, TO_LLVM, tmp_path / "x.so", target_cpu="pentium-z")


def test_link_errors_are_diagnostics(tmp_path: Path):
    with pytest.raises(compiler.CompilerLibraryError, match="unable to find library -lno_such_runtime"):
        compiler.compile_kernel(SCALAR, TO_LLVM, tmp_path / "x.so", link_args=["-lno_such_runtime"])
    with pytest.raises(compiler.CompilerLibraryError, match="unknown argument"):
        compiler.compile_kernel(SCALAR, TO_LLVM, tmp_path / "x.so", link_args=["--no-such-flag"])
    with pytest.raises(compiler.CompilerLibraryError, match="cannot write|cannot open"):
        compiler.compile_kernel(SCALAR, TO_LLVM, tmp_path / "missing-dir" / "x.so")
    # The linker runs again after its errors (lld's state is reset per call).
    compiler.compile_kernel(SCALAR, TO_LLVM, tmp_path / "ok.so")
    assert _load(tmp_path / "ok.so").twice_plus_one


def test_a_kernel_with_an_unresolved_call_fails_to_load_naming_it(tmp_path: Path):
    mlir = """
func.func private @moe_not_defined_anywhere(i64) -> i64
func.func @f(%x: i64) -> i64 {
  %r = call @moe_not_defined_anywhere(%x) : (i64) -> i64
  return %r : i64
}
"""
    compiler.compile_kernel(mlir, TO_LLVM, tmp_path / "u.so")
    with pytest.raises(OSError, match="moe_not_defined_anywhere"):
        ctypes.CDLL(str(tmp_path / "u.so"), mode=os.RTLD_NOW | os.RTLD_LOCAL)


def test_a_cached_kernel_runs_the_op(tmp_path: Path, monkeypatch):
    """The torch op path end to end on a fresh cache: one shared object per kernel. (E = 37, k = 7: a configuration
    no other test asks for, so this process has not loaded its kernel before.)"""
    monkeypatch.setenv("MOE_KERNEL_CACHE", str(tmp_path))
    x = torch.randn(9, 37, generator=torch.Generator().manual_seed(3))
    w, i = torch.ops.moe.topk_renorm(x * 1.5, 7)
    ref_w, ref_i = torch.softmax(x * 1.5, -1).topk(7, dim=-1)
    assert torch.equal(i.long(), ref_i)
    torch.testing.assert_close(w, ref_w / ref_w.sum(-1, keepdim=True))
    assert len(list(tmp_path.glob("*.so"))) == 1 and not list(tmp_path.glob("*.o"))


def test_constructors_run_when_the_shared_object_loads(tmp_path: Path):
    """A CUDA kernel loads its device code from a constructor: the object puts constructors in .init_array, which the
    dynamic loader runs (in .ctors they would need crtbegin, which no kernel links)."""
    mlir = """
llvm.mlir.global internal @flag(0 : i64) : i64
llvm.func @set_flag() {
  %a = llvm.mlir.addressof @flag : !llvm.ptr
  %c = llvm.mlir.constant(7 : i64) : i64
  llvm.store %c, %a : i64, !llvm.ptr
  llvm.return
}
llvm.mlir.global_ctors ctors = [@set_flag], priorities = [65535 : i32], data = [#llvm.zero]
llvm.func @get_flag() -> i64 {
  %a = llvm.mlir.addressof @flag : !llvm.ptr
  %v = llvm.load %a : !llvm.ptr -> i64
  llvm.return %v : i64
}
"""
    compiler.compile_kernel(mlir, "canonicalize", tmp_path / "ctor.so")
    get = _load(tmp_path / "ctor.so").get_flag
    get.restype = ctypes.c_int64
    assert get() == 7
