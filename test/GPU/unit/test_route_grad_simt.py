"""moe.route_grad's GPU kernel (lib/Conversion/MoEToGPU/RouteGrad.cpp) as moe-opt emits it, run without a GPU: each
case is lowered with `moe-opt --convert-moe-to-gpu --mlir-print-op-generic` and its gpu.func executed by simt.py with
the block's threads in lockstep (the barrier between the block zeroing its rows and the threads adding their picks
is real), then compared with autograd of the float64 reference (moe_mlir.reference.routing.route_weights). Rows:
random logits, -inf/+inf/NaN-free adversarial values, a repeated expert (accumulates), an index out of range (read
clamped, never written), a partial last block, bf16 logits. Needs moe-opt ($MOE_OPT, else build/bin/moe-opt).
"""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))
import simt  # noqa: E402

torch = pytest.importorskip("torch")
MOE_OPT = simt.find_moe_opt() or pytest.skip("no moe-opt ($MOE_OPT, build/bin)", allow_module_level=True)

from moe_mlir.reference.routing import route_weights  # noqa: E402

BLOCK = 128
SQRTSOFTPLUS = """^bb0(%v: f32):
    %zero = arith.constant 0.000000e+00 : f32
    %a = math.absf %v : f32
    %n = arith.negf %a : f32
    %e = math.exp %n : f32
    %l = math.log1p %e : f32
    %m = arith.maximumf %v, %zero : f32
    %sp = arith.addf %l, %m : f32
    %r = math.sqrt %sp : f32
    moe.yield %r : f32"""


def lower(E, k, dtype, scoring, renormalize, scale):
    region = f" score {{\n{SQRTSOFTPLUS}\n  }}" if scoring == "custom" else ""
    text = (f"func.func @f(%x: tensor<?x{E}x{dtype}>, %i: tensor<?x{k}xi32>, %dw: tensor<?x{k}xf32>) "
            f"-> tensor<?x{E}xf32> {{\n"
            f"  %d = moe.route_grad %x, %i dw(%dw : tensor<?x{k}xf32>) scoring({scoring}) "
            f"renormalize({str(renormalize).lower()}) routed_scaling_factor({scale!r}){region}\n"
            f"      : tensor<?x{E}x{dtype}>, tensor<?x{k}xi32> -> tensor<?x{E}xf32>\n"
            f"  return %d : tensor<?x{E}xf32>\n}}\n")
    return simt.lower(MOE_OPT, text)


def run(text, x, idx, dw, E):
    body = simt.parse(text, "route_grad_0")
    T = x.shape[0]
    out = np.full((T, E), np.nan, np.float32)  # every entry must be written (zeroed or a gradient)
    mem = simt.Memory()
    for a in (x, idx, dw, out):
        mem.add(a, None)
    simt.run_kernel(body, [x, idx, dw, out], BLOCK, -(-T // BLOCK), mem, lockstep=True)
    return out


def bf16_bits(x):
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


# (E, k, dtype, scoring, renormalize, scale)
CASES = [
    (64, 8, "f32", "sigmoid", True, 2.5),
    (40, 20, "f32", "sigmoid", False, 1.0),
    (256, 8, "bf16", "custom", True, 1.5),
    (12, 12, "f32", "none", True, 0.5),
]


@pytest.mark.parametrize("E,k,dtype,scoring,renormalize,scale", CASES,
                         ids=[f"E{c[0]}_k{c[1]}_{c[2]}_{c[3]}_{'renorm' if c[4] else 'plain'}" for c in CASES])
def test_kernel_equals_reference(E, k, dtype, scoring, renormalize, scale):
    rng = np.random.default_rng(E + k)
    T = 133                                            # a full block and a partial one
    x32 = rng.standard_normal((T, E)).astype(np.float32)
    x32[3] = rng.integers(-2, 3, E)                   # ties and zeros
    x32[4] *= 30.0                                    # saturated scores
    idx = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32)
    idx[0, 1] = idx[0, 0]                             # a repeated expert accumulates
    idx[1, 1:] = 1 + rng.permutation(E - 1)[:k - 1]   # row 1 never picks expert 0 ...
    idx[1, 0] = E + 3                                 # ... but reads it for this out-of-range pick
    dw = rng.standard_normal((T, k)).astype(np.float32)
    if dtype == "bf16":
        x = bf16_bits(x32)
        xref = torch.from_numpy((x.astype(np.uint32) << 16).view(np.float32)).double()
    else:
        x, xref = x32, torch.from_numpy(x32).double()
    got = torch.from_numpy(run(lower(E, k, dtype, scoring, renormalize, scale), x, idx, dw, E)).double()
    ref_idx = torch.from_numpy(idx).long()
    ref_idx[1, 0] = 0                                 # the kernel's clamped read
    score = "custom:" + SQRTSOFTPLUS if scoring == "custom" else scoring
    xr = xref.clone().requires_grad_(True)
    w = route_weights(xr, ref_idx, score, "score_then_topk", renormalize, scale)
    (want,) = torch.autograd.grad(w.double(), xr, torch.from_numpy(dw).double())
    # Expert 0 of row 1 is reached only through the bad pick, whose gradient is never written.
    want[1, 0] = 0.0
    assert not torch.isnan(got).any(), "an entry left unwritten"
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
