"""Instructions per call of torch.ops.moe.topk_renorm / route on CPU tensors against plain torch ops of the same shape.

Run under callgrind (the commands: bench/results/host-path-2026-11-30-fake-driver.md): each phase is N calls between cg_begin and cg_end of
libcgctl.so, one dump per phase; `callgrind_annotate --inclusive=yes` of a dump names the pieces (the dispatcher, our
op, its Key and lookup, at::empty, the CPU kernel). The kernels are compiled and loaded before the first phase.
"""
import ctypes
import os
import sys

import torch

import moe_mlir.ops  # noqa: F401  (registers torch.ops.moe.* and loads libmoe_torch.so)

N = int(os.environ.get("CALLS", "2000"))
cg = ctypes.CDLL(sys.argv[1])
torch.manual_seed(0)
x = torch.randn(1, 64)
logits = torch.randn(1, 256)
bias = torch.randn(256)

PHASES = {
    "empty_loop": lambda: None,
    "moe_topk_renorm": lambda: torch.ops.moe.topk_renorm(x, 8, "logits", True),
    "torch_topk": lambda: torch.topk(x, 8),
    "torch_ops_aten_topk": lambda: torch.ops.aten.topk(x, 8),
    "moe_route_dsv3": lambda: torch.ops.moe.route(logits, bias, 8, "sigmoid", "score_then_topk", 8, 4, "top2_sum",
                                                  True, 2.5),
}
for f in PHASES.values():  # compile/load the kernels, warm the caches
    for _ in range(50):
        f()
for name, f in PHASES.items():
    cg.cg_begin()
    for _ in range(N):
        f()
    cg.cg_end(name.encode())
print("done", N)
