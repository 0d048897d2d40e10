"""Dense linalg through moe-lower-to-llvm (the execution API) against numpy float64, in every configuration.

  python check_dense.py <build dir>

Each case is a small static-shape function written the way the importer writes it (linalg.matmul with a
fill, batch matmul and attention contractions as linalg.generic, elementwise chains with broadcasts, row
reductions); sizes are not multiples of the register tiles where it matters (tails), include N = 1 rows and
columns, and inputs include ties, +-Inf and NaN. Every case is compiled and run with the dense strategy +
BLAS, the dense strategy alone, and plain loops, on 1 and 2 threads (MOE_DENSE / MOE_BLAS / MOE_NUM_THREADS are
read by each compilation), and compared with numpy: |ours - ref| <= 1e-4 * (1 + |ref|) elementwise, NaN where
numpy has NaN. Prints one line per case and configuration and exits 1 on the first mismatch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))
os.environ["MOE_BUILD_DIR"] = sys.argv[1]

from bench.ours import BoundCall, Executor, numpy_buf  # noqa: E402


def t(shape):
    return "tensor<" + "x".join(map(str, shape)) + "xf32>"


def generic(res, maps, kinds, ins, out, body):
    """`%res = linalg.generic` with indexing maps `maps` and iterator kinds `kinds`; `ins`: the (value, type) pairs
    read, `out`: the (init, type) written; `body`: the block's lines after ^bb0 (its arguments %a0, %a1, ... for
    `ins`, then %o; the last line's result %y is yielded)."""
    args = ", ".join(f"%a{i}: f32" for i in range(len(ins))) + ", %o: f32"
    lines = "\n".join(f"    {line}" for line in body)
    return f"""  %{res} = linalg.generic {{indexing_maps = [{', '.join(maps)}],
      iterator_types = [{', '.join(f'"{k}"' for k in kinds)}]}}
      ins({', '.join(v for v, _ in ins)} : {', '.join(ty for _, ty in ins)}) outs({out[0]} : {out[1]}) {{
  ^bb0({args}):
{lines}
    linalg.yield %y : f32
  }} -> {out[1]}"""


def zero_filled(out):
    """The importer's accumulator: %f, a zero-filled tensor of shape `out` (and %z, %e)."""
    return f"""  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {t(out)}
  %f = linalg.fill ins(%z : f32) outs(%e : {t(out)}) -> {t(out)}"""


def named_matmul(op, a, b, out, ref):
    """`op` (linalg.matmul, linalg.batch_matmul) of %a [a] and %b [b] into a zero-filled [out]."""
    return (f"""func.func @f(%a: {t(a)}, %b: {t(b)}) -> {t(out)} {{
{zero_filled(out)}
  %m = {op} ins(%a, %b : {t(a)}, {t(b)}) outs(%f : {t(out)}) -> {t(out)}
  return %m : {t(out)}
}}""", [a, b], out, ref)


def contraction(a, b, out, maps, iterators, ref):
    """out = sum of %lhs [a] times %rhs [b] over the reduction dimensions: a linalg.generic with a mulf/addf body
    into a zero-filled [out], as the importer writes einsums; `maps`: the three indexing maps' results (lhs, rhs,
    out) over the loop dimensions `iterators` (name, kind)."""
    dims = ", ".join(d for d, _ in iterators)
    return (f"""func.func @f(%lhs: {t(a)}, %rhs: {t(b)}) -> {t(out)} {{
{zero_filled(out)}
{generic("r", [f"affine_map<({dims}) -> ({m})>" for m in maps], [k for _, k in iterators],
         [("%lhs", t(a)), ("%rhs", t(b))], ("%f", t(out)),
         ["%p = arith.mulf %a0, %a1 : f32", "%y = arith.addf %o, %p : f32"])}
  return %r : {t(out)}
}}""", [a, b], out, ref)


def matmul(M, N, K):
    return named_matmul("linalg.matmul", (M, K), (K, N), (M, N), lambda a, b: a @ b)


def linear_bias_relu(M, N, K):
    """x @ W^T + b, relu: the importer's linear (a transpose of the weight, a matmul, a broadcast add)."""
    return (f"""func.func @f(%x: {t((M, K))}, %w: {t((N, K))}, %bias: {t((N,))}) -> {t((M, N))} {{
  %et = tensor.empty() : {t((K, N))}
  %wt = linalg.transpose ins(%w : {t((N, K))}) outs(%et : {t((K, N))}) permutation = [1, 0]
{zero_filled((M, N))}
  %m = linalg.matmul ins(%x, %wt : {t((M, K))}, {t((K, N))}) outs(%f : {t((M, N))}) -> {t((M, N))}
  %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>,
      affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}}
      ins(%m, %bias : {t((M, N))}, {t((N,))}) outs(%e : {t((M, N))}) {{
  ^bb0(%p: f32, %q: f32, %o: f32):
    %s = arith.addf %p, %q : f32
    %y = arith.maximumf %s, %z : f32
    linalg.yield %y : f32
  }} -> {t((M, N))}
  return %r : {t((M, N))}
}}""", [(M, K), (N, K), (N,)], (M, N), lambda x, w, b: np.maximum(x @ w.T + b, 0))


def batch_matmul(B, M, N, K):
    return named_matmul("linalg.batch_matmul", (B, M, K), (B, K, N), (B, M, N), lambda a, b: a @ b)


def attention_scores(B, H, N, D):
    """q k^T per head, as a generic contraction (K transposed through the indexing map)."""
    q, s = (B, H, N, D), (B, H, N, N)
    return contraction(q, q, s, ["b, h, m, k", "b, h, n, k", "b, h, m, n"],
                       [("b", "parallel"), ("h", "parallel"), ("m", "parallel"), ("n", "parallel"),
                        ("k", "reduction")], lambda a, b: a @ np.swapaxes(b, -1, -2))


def expert_up(T, E, D, F):
    """h[e, t, f] = sum_d u[t, d] * w[e, d, f]: the importer's expert einsum `td,edf->etf`, a batch of GEMMs whose
    left operand is shared by every expert (BLAS-sized: one cblas_sgemm per expert and thread tile)."""
    return contraction((T, D), (E, D, F), (E, T, F), ["t, d", "e, d, f", "e, t, f"],
                       [("e", "parallel"), ("t", "parallel"), ("f", "parallel"), ("d", "reduction")],
                       lambda a, b: np.einsum("td,edf->etf", a, b))


def gate_combine(T, E, D):
    """y[t, d] = sum_e g[t, e] * x[e, t, d]: a contraction with t in all three operands."""
    return contraction((T, E), (E, T, D), (T, D), ["t, e", "e, t, d", "t, d"],
                       [("t", "parallel"), ("d", "parallel"), ("e", "reduction")],
                       lambda g, x: np.einsum("te,etd->td", g, x))


def softmax(R, C):
    """max, exp(x - max), sum, divide with keepdim reductions (tensor<Rx1xf32>), as the importer writes it."""
    x, r = t((R, C)), t((R, 1))
    red = "affine_map<(d0, d1) -> (d0, 0)>"
    idm = "affine_map<(d0, d1) -> (d0, d1)>"
    rows, cols = ["parallel", "reduction"], ["parallel", "parallel"]
    return (f"""func.func @f(%x: {x}) -> {x} {{
  %ninf = arith.constant 0xFF800000 : f32
  %z = arith.constant 0.0 : f32
  %er = tensor.empty() : {r}
  %fm = linalg.fill ins(%ninf : f32) outs(%er : {r}) -> {r}
{generic("m", [idm, red], rows, [("%x", x)], ("%fm", r), ["%y = arith.maximumf %a0, %o : f32"])}
  %e = tensor.empty() : {x}
{generic("ex", [idm, red, idm], cols, [("%x", x), ("%m", r)], ("%e", x),
         ["%d = arith.subf %a0, %a1 : f32", "%y = math.exp %d : f32"])}
  %fs = linalg.fill ins(%z : f32) outs(%er : {r}) -> {r}
{generic("s", [idm, red], rows, [("%ex", x)], ("%fs", r), ["%y = arith.addf %a0, %o : f32"])}
{generic("q", [idm, red, idm], cols, [("%ex", x), ("%s", r)], ("%e", x), ["%y = arith.divf %a0, %a1 : f32"])}
  return %q : {x}
}}""", [(R, C)], (R, C), lambda a: np.exp(a - a.max(-1, keepdims=True)) / np.exp(
        a - a.max(-1, keepdims=True)).sum(-1, keepdims=True))


def layer_norm(R, C):
    """(x - mean) * rsqrt(var + eps) * w + b over the last dimension."""
    x, r, v = t((R, C)), t((R,)), t((C,))
    idm, row, col = ("affine_map<(d0, d1) -> (d0, d1)>", "affine_map<(d0, d1) -> (d0)>",
                     "affine_map<(d0, d1) -> (d1)>")
    return (f"""func.func @f(%x: {x}, %w: {v}, %b: {v}) -> {x} {{
  %z = arith.constant 0.0 : f32
  %n = arith.constant {float(C):.1f} : f32
  %eps = arith.constant 1.0e-05 : f32
  %er = tensor.empty() : {r}
  %f = linalg.fill ins(%z : f32) outs(%er : {r}) -> {r}
{generic("s", [idm, row], ["parallel", "reduction"], [("%x", x)], ("%f", r), ["%y = arith.addf %a0, %o : f32"])}
{generic("v2", [idm, row, row], ["parallel", "reduction"], [("%x", x), ("%s", r)], ("%f", r),
         ["%mu = arith.divf %a1, %n : f32", "%d = arith.subf %a0, %mu : f32", "%q = arith.mulf %d, %d : f32",
          "%y = arith.addf %q, %o : f32"])}
  %e = tensor.empty() : {x}
{generic("y", [idm, row, row, col, col, idm], ["parallel", "parallel"],
         [("%x", x), ("%s", r), ("%v2", r), ("%w", v), ("%b", v)], ("%e", x),
         ["%mu = arith.divf %a1, %n : f32", "%var = arith.divf %a2, %n : f32", "%ve = arith.addf %var, %eps : f32",
          "%rs = math.rsqrt %ve : f32", "%d = arith.subf %a0, %mu : f32", "%k = arith.mulf %d, %rs : f32",
          "%k2 = arith.mulf %k, %a3 : f32", "%y = arith.addf %k2, %a4 : f32"])}
  return %y : {x}
}}""", [(R, C), (C,), (C,)], (R, C), lambda a, w, b: (a - a.mean(-1, keepdims=True)) / np.sqrt(
        a.var(-1, keepdims=True) + 1e-5) * w + b)


CASES = {
    "matmul_512x256x192": matmul(512, 256, 192),       # BLAS-sized: thread tiles of BLAS calls
    "matmul_100x72x40": matmul(100, 72, 40),           # tails in every dimension
    "matmul_1x64x32": matmul(1, 64, 32),               # one row (decode)
    "matmul_64x1x32": matmul(64, 1, 32),               # one column
    "linear_bias_relu_256x96x128": linear_bias_relu(256, 96, 128),
    "batch_matmul_4x64x48x32": batch_matmul(4, 64, 48, 32),
    "attention_scores_2x4x64x16": attention_scores(2, 4, 64, 16),
    "attention_scores_1x4x128x64": attention_scores(1, 4, 128, 64),  # one batch loop: BLAS-sized
    "expert_up_130x4x128x96": expert_up(130, 4, 128, 96),            # BLAS-sized, broadcast tokens, tails
    "gate_combine_64x8x32": gate_combine(64, 8, 32),
    "softmax_96x300": softmax(96, 300),
    "softmax_1x64": softmax(1, 64),
    "layer_norm_128x1024": layer_norm(128, 1024),
}

CONFIGS = [("blas", "1", "1"), ("codegen", "1", "0"), ("loops", "0", "0")]


def inputs_for(name, shapes, rng):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if name.startswith("softmax_96"):
        x = arrays[0]
        x[0, :] = 3.0                 # a row of ties
        x[1, 5] = np.inf              # +Inf: NaN row (inf - inf), as numpy
        x[2, 7] = -np.inf             # -Inf: a zero probability
        x[3, 9] = np.nan              # NaN propagates
    if name.startswith("matmul_100"):
        arrays[0][4, 3] = np.nan
        arrays[1][2, 5] = np.inf
    return arrays


def main() -> int:
    rng = np.random.default_rng(20261122)
    failures = 0
    for name, (mlir, shapes, out_shape, ref_fn) in CASES.items():
        ins = inputs_for(name, shapes, rng)
        with np.errstate(all="ignore"):
            ref = ref_fn(*[a.astype(np.float64) for a in ins])
        for threads in ("1", "2"):
            for cfg, dense, blas in CONFIGS:
                os.environ.update({"MOE_DENSE": dense, "MOE_BLAS": blas, "MOE_NUM_THREADS": threads})
                exe = Executor()
                handle, _ = exe.compile(mlir)
                out = np.full(out_shape, 12345.0, dtype=np.float32)
                BoundCall(exe, handle, "f", [numpy_buf(a) for a in ins], [numpy_buf(out)])()
                exe.lib.moeExecDestroy(handle)
                o = out.astype(np.float64)
                nan_ok = np.array_equal(np.isnan(o), np.isnan(ref))
                fin = ~np.isnan(ref)
                with np.errstate(all="ignore"):
                    close = np.all((o[fin] == ref[fin]) | (np.abs(o[fin] - ref[fin]) <= 1e-4 * (1 + np.abs(ref[fin]))))
                ok = nan_ok and close
                with np.errstate(all="ignore"):
                    err = np.nanmax(np.where(np.isfinite(ref), np.abs(o - ref), 0)) if o.size else 0.0
                print(f"{name} {cfg} threads={threads}: {'ok' if ok else 'MISMATCH'} max_err={err:.2e}")
                failures += not ok
    print(f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
