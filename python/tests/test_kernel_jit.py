"""The in-process kernel compiler and loader (libmoe_compiler.so through moe_mlir.runtime.jit): what it builds runs,
and every bad input is an error that says what went wrong, never a crash."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

import moe_mlir  # noqa: F401  (registers the ops)
from moe_mlir.runtime import cache, jit
from moe_mlir.runtime.locate import find_runtime_lib

pytestmark = pytest.mark.skipif(jit.library_path() is None, reason="libmoe_compiler.so is not built")

RUNTIME = find_runtime_lib("libmoe_kernel_runtime.so")

# A function the JIT can call without the memref ABI: f(x) = 2x + 1 on i64.
SCALAR = """
func.func @twice_plus_one(%x: i64) -> i64 attributes {llvm.emit_c_interface} {
  %c1 = arith.constant 1 : i64
  %c2 = arith.constant 2 : i64
  %m = arith.muli %x, %c2 : i64
  %r = arith.addi %m, %c1 : i64
  return %r : i64
}
"""
TO_LLVM = "convert-arith-to-llvm,convert-func-to-llvm,reconcile-unrealized-casts"


def test_compiled_object_loads_and_runs(tmp_path: Path):
    seconds = jit.compile_object(SCALAR, TO_LLVM, tmp_path / "f.o")
    assert set(seconds) == set(jit.STAGES) and all(s >= 0 for s in seconds.values()), seconds
    assert (tmp_path / "f.o").read_bytes()[:4] == b"\x7fELF"
    addr = jit.load_object(tmp_path / "f.o", "twice_plus_one")
    f = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(addr)
    assert [f(v) for v in (0, 20, -3)] == [1, 41, -5]
    # Each load links a copy of its own (another device's kernel, the same file): another address, same code.
    again = jit.load_object(tmp_path / "f.o", "twice_plus_one")
    assert again != addr and ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(again)(5) == 11


def test_a_kernel_for_a_target_below_the_host_links_compiler_rt(tmp_path: Path):
    """f32 -> bf16 on x86-64-v3 (no AVX-512 BF16) calls compiler-rt's __truncsfbf2, which glibc's libgcc may lack:
    the JIT links it from the archive beside the runtime."""
    mlir = f"""
module {{
  func.func @kernel(%s: tensor<?x8xf32>) -> tensor<?x8xbf16> {{
    %c0 = arith.constant 0 : index
    %n = tensor.dim %s, %c0 : tensor<?x8xf32>
    %e = tensor.empty(%n) : tensor<?x8xbf16>
    %r = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                          iterator_types = ["parallel", "parallel"]}} ins(%s : tensor<?x8xf32>) outs(%e : tensor<?x8xbf16>) {{
    ^bb0(%a: f32, %b: bf16):
      %t = arith.truncf %a : f32 to bf16
      linalg.yield %t : bf16
    }} -> tensor<?x8xbf16>
    return %r : tensor<?x8xbf16>
  }}
}}"""
    pipeline = "canonicalize,moe-lower-to-llvm{target-cpu=x86-64-v3 results-to-out-params=true}"
    jit.compile_object(mlir, pipeline, tmp_path / "trunc.o", "x86-64-v3")
    assert b"__truncsfbf2" in (tmp_path / "trunc.o").read_bytes()
    with pytest.raises(jit.JitError, match="__truncsfbf2"):
        jit.load_object(tmp_path / "trunc.o", "_mlir_ciface_kernel", [RUNTIME])
    archive = jit.builtins_archive()
    assert archive is not None
    assert jit.load_object(tmp_path / "trunc.o", "_mlir_ciface_kernel", [RUNTIME], [archive])


@pytest.mark.parametrize("mlir, pipeline, message", [
    ("func.func @f( {", TO_LLVM, "cannot parse the module"),
    ("(((" * 20000, TO_LLVM, "nested deeper than"),
    (SCALAR, "no-such-pass", "does not refer to a registered pass"),
    (SCALAR, "canonicalize", "translation to LLVM IR failed"),
    ("func.func @f(%x: tensor<4xf32>) { moe.nope %x : tensor<4xf32>\n return }", TO_LLVM,
     "cannot parse the module"),
])
def test_compile_errors_are_diagnostics(tmp_path: Path, mlir: str, pipeline: str, message: str):
    with pytest.raises(jit.JitError, match=message):
        jit.compile_object(mlir, pipeline, tmp_path / "x.o")
    assert not (tmp_path / "x.o").exists()


def test_unknown_target_cpu_is_an_error(tmp_path: Path):
    with pytest.raises(jit.JitError, match="unknown target-cpu 'pentium-z'"):
        jit.compile_object(SCALAR, TO_LLVM, tmp_path / "x.o", target_cpu="pentium-z")


def test_load_errors_are_diagnostics(tmp_path: Path):
    with pytest.raises(jit.JitError, match="cannot read"):
        jit.load_object(tmp_path / "missing.o", "f")
    (tmp_path / "junk.o").write_bytes(b"not an object file at all")
    with pytest.raises(jit.JitError, match="junk.o"):
        jit.load_object(tmp_path / "junk.o", "f")
    jit.compile_object(SCALAR, TO_LLVM, tmp_path / "f.o")
    with pytest.raises(jit.JitError, match="no_such_symbol"):
        jit.load_object(tmp_path / "f.o", "no_such_symbol")
    with pytest.raises(jit.JitError, match="cannot load /no/such/lib.so"):
        jit.load_object(tmp_path / "f.o", "twice_plus_one", ["/no/such/lib.so"])


def test_a_kernel_with_an_unresolved_call_names_it(tmp_path: Path):
    mlir = """
func.func private @moe_not_defined_anywhere(i64) -> i64
func.func @f(%x: i64) -> i64 {
  %r = call @moe_not_defined_anywhere(%x) : (i64) -> i64
  return %r : i64
}
"""
    jit.compile_object(mlir, TO_LLVM, tmp_path / "u.o")
    with pytest.raises(jit.JitError, match="moe_not_defined_anywhere"):
        jit.load_object(tmp_path / "u.o", "f")


def test_a_cached_kernel_object_runs_the_op(tmp_path: Path, monkeypatch):
    """The torch op path end to end on a fresh cache: one object file per kernel, no shared object."""
    monkeypatch.setenv("MOE_KERNEL_CACHE", str(tmp_path))
    x = torch.randn(9, 24, generator=torch.Generator().manual_seed(3))
    w, i = torch.ops.moe.topk_renorm(x * 1.5, 5)
    ref_w, ref_i = torch.softmax(x * 1.5, -1).topk(5, dim=-1)
    assert torch.equal(i.long(), ref_i)
    torch.testing.assert_close(w, ref_w / ref_w.sum(-1, keepdim=True))
    assert list(tmp_path.glob("*.o")) and not list(tmp_path.glob("*.so"))
