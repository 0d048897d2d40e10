"""The in-process kernel compiler (libmoe_compiler.so through moe_mlir.runtime.compiler): what it builds loads and
runs, and every bad input is an error that says what went wrong, never a crash."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
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


#: One key of every kernel-key op (recorded from the torch-op tests), the seeds of the mutations below.
SEED_KEYS = [
    'adjacency_update|beta=0.8|norm=row|include_self=1|in:a:f32:6x6|in:idx:i32:?x3',
    'apply_capacity|num_experts=8|capacity=0|drop=position|in:indices:i32:?x2|in:weights:f32:?x2',
    'attention_posterior|sigma=0.8|head_select=min_entropy|head_scale=none|in:scores:f32:?x3x?x?|in:u:f32:?x?x8|in:v:f32:?x3x?x4|in:wo:f32:8x12|in:e:f32:?x?x6',
    'attention_posterior_backward|sigma=0.8|head_select=min_entropy|head_scale=none|in:scores:f32:?x3x?x?|in:u:f32:?x?x8|in:v:f32:?x3x?x4|in:wo:f32:8x12|in:e:f32:?x?x6|in:head:i32:?|in:grad_p:f32:?x?x6',
    'attention_posterior_topk|k=1|renormalize=1|sigma=0.8|head_select=min_entropy|head_scale=none|in:scores:f32:?x3x?x?|in:u:f32:?x?x8|in:v:f32:?x3x?x4|in:wo:f32:8x12|in:e:f32:?x?x6',
    'bias_update|rate=0.0010000000474974513|in:bias:f32:1|in:counts:i32:1',
    'dispatch_plan|num_experts=8|block_size=1|in:indices:i32:?x8',
    'hyper_router|num_experts=3|in:emb:f32:8|in:w1:f32:5x8|in:b1:f32:5|in:w2:f32:21x5|in:b2:f32:21',
    'hyper_router_backward|num_experts=4|weight_grads=1|in:grad_w:f32:4x20|in:grad_b:f32:4|in:emb:f32:24|in:w1:f32:40x24|in:b1:f32:40|in:w2:f32:84x40|in:b2:f32:84',
    'mad_dispersion|num_experts=5|eps=0.001|clip=0|normalize=feature|measure=mad|empty=identity|in:tokens:f32:?x12|in:assign:i64:?',
    'route|k=8|scoring=sigmoid|order=score_then_topk|n_group=8|topk_group=4|group_score=top2_sum|renormalize=1|routed_scaling_factor=2.5|in:logits:f32:?x256|in:bias:f32:256',
    'route_backward|scoring=sigmoid|renormalize=0|routed_scaling_factor=2.5|in:logits:f32:?x256|in:indices:i32:?x8|in:grad_w:f32:?x8',
    'router_stats_backward|in:logits:f32:?x8|in:weight_sum:f32:scalar|in:grad_mean_probs:f32:8',
    'router_stats_fwd|top_k=2|in:logits:f32:?x8',
    'router_z_loss|in:logits:f32:?x8',
    'router_z_loss_backward|in:logits:f32:?x8|in:grad:f32:scalar',
    'sequence_balance_loss|in:scores:f32:?x?x8|in:indices:i64:?x?x2',
    'sequence_balance_loss_backward|in:scores:f32:?x?x12|in:indices:i64:?x?x3|in:grad:f32:scalar',
    'similarity_inform|tau=0.7|causal=0|in:u:f32:?x?x8|in:e:f32:?x?x6',
    'similarity_inform_backward|tau=0.5|causal=1|in:u:f32:?x?x12|in:e:f32:?x?x6|in:grad_p:f32:?x?x6|in:p:f32:?x?x6|in:lse:f32:?x?',
    'similarity_inform_fwd|tau=0.5|causal=1|in:u:f32:?x?x12|in:e:f32:?x?x6',
    'similarity_inform_topk|k=1|renormalize=1|tau=0.7|causal=0|in:u:f32:?x?x8|in:e:f32:?x?x6',
    'topk_renorm|k=1|mode=logits|renormalize=1|in:scores:f32:?x16',
    'topk_renorm_backward|mode=logits|renormalize=1|in:scores:f32:?x8|in:indices:i32:?x3|in:grad_w:f32:?x3',
]

FUZZ = r"""
import random
import sys

from moe_mlir.runtime import keys

seeds = sys.argv[2:]
rng = random.Random(int(sys.argv[1]))
alphabet = "|:=x?0123456789-.abcdefghijklmnopqrstuvwxyz_%^(){}<>\"' \n"
built = failed = 0
for _ in range(1500):
    k = rng.choice(seeds)
    for _ in range(rng.randint(1, 4)):
        what, p = rng.randrange(5), rng.randrange(len(k) + 1)
        parts = k.split("|")
        if what == 0:
            k = k[:p] + k[p + 1:]
        elif what == 1:
            k = k[:p] + rng.choice(alphabet) + k[p:]
        elif what == 2:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(parts))
            k = "|".join(parts)
        elif what == 3 and len(parts) > 1:
            del parts[rng.randrange(1, len(parts))]
            k = "|".join(parts)
        else:
            k = k.replace(rng.choice(["1", "2", "8", "?"]), rng.choice(["0", "-1", "99999999999", "4294967296", "?", ""]), 1)
    try:
        keys.kernel_module(k)
        built += 1
    except keys.KeyBuildError as e:
        assert str(e).strip(), repr(k)
        failed += 1
# Keys that once crashed it, or would: no capacity (result 7 missing), brackets nested past the parser's stack.
for k in ["apply_capacity|num_experts=8|drop=position|in:indices:i32:?x2|in:weights:f32:?x2",
          "route|k=1|scoring=custom:^bb0(%x: f32): %y = " + '"arith.addf"(%x, %x) ({' * 30000 + "|in:logits:f32:?x4",
          "route|k=1|in:logits:" + "vector<" * 30000 + "f32:?x4",
          "route|k=1|scoring=custom:" + "(" * 100000 + "|in:logits:f32:?x4"]:
    try:
        keys.kernel_module(k)
        raise AssertionError("built " + k[:80])
    except keys.KeyBuildError as e:
        assert "kernel key" in str(e) or "malformed" in str(e), str(e)[:300]
print(built, failed)
"""


def test_kernel_keys_build_their_op_or_fail_with_a_diagnostic():
    """A kernel key is the compiler's input (include/MoE/IR/KernelKeys.td): 1500 mutations of a key of every op
    (characters dropped or inserted, attributes and inputs repeated or dropped, sizes made 0, -1, 2^32 or dynamic)
    each build their module or fail with a diagnostic, in a child process that must not crash; so do the keys that
    crashed it (an apply_capacity key without a capacity: its kept result 7 did not exist; brackets nested deeper
    than the parser's stack in a custom score or an element type)."""
    env = dict(os.environ, PYTHONPATH=str(Path(moe_mlir.__file__).parents[1]))
    p = subprocess.run([sys.executable, "-c", FUZZ, "7", *SEED_KEYS], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    built, failed = map(int, p.stdout.split())
    assert built > 50 and failed > 500, p.stdout  # both outcomes are exercised
