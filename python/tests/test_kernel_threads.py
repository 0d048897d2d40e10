"""Which threads run a CPU kernel of torch.ops.moe.* (lib/Runtime/Torch/TorchOps.cpp, callCpuKernel).

A call asks for torch's OpenMP team as ATen's own ops do: only when its work exceeds ATen's grain (32768 elements);
a smaller call (a decode step's router) runs every task of its kernel on the calling thread, so it never waits for a
team member to be scheduled. What the test can see without timing: libgomp starts the team's threads at the first
parallel region, so a process whose small calls opened no region has no team thread until its first large call.
The results are the same bits on either path (each worker of a kernel computes fixed items).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from torch_checks import needs_cpu_kernels

PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])

pytestmark = needs_cpu_kernels

_SCRIPT = textwrap.dedent("""
    import os, torch
    import moe_mlir, moe_mlir.reference as R
    torch.set_num_threads(2)
    threads = lambda: len(os.listdir("/proc/self/task"))
    g = torch.Generator().manual_seed(0)
    big = torch.randn(4096, 64, generator=g)       # 4096 x 64 scores: 2^18 elements, a team's work
    big[7, :] = 0.5                                 # a row of ties: lowest indices first on every path
    small = big[:8].clone()                         # 8 x 64 scores: a decode-size call
    bias = torch.randn(64, generator=g)
    calls = {
        "topk_renorm": lambda s: torch.ops.moe.topk_renorm(s, 8),
        "route": lambda s: torch.ops.moe.route(s, bias, 8, "sigmoid", "score_then_topk", 8, 4, "top2_sum", True,
                                               2.5),
        "topk_renorm_backward": lambda s: torch.ops.moe.topk_renorm_backward(
            torch.ones(s.shape[0], 8), s, torch.ops.moe.topk_renorm(s, 8)[1]),
    }
    for f in calls.values():                        # kernels compiled or loaded before counting threads
        f(small)
    before = threads()
    got_small = {name: f(small) for name, f in calls.items()}
    after_small = threads()
    got_big = {name: f(big) for name, f in calls.items()}
    after_big = threads()
    same = all(torch.equal(a, b[:8]) for name in calls
               for a, b in zip(torch.utils._pytree.tree_leaves(got_small[name]),
                               torch.utils._pytree.tree_leaves(got_big[name])))
    ref = R.topk_renorm(small, 8, "logits", True)
    exact = torch.equal(got_small["topk_renorm"][1], ref[1].to(torch.int32))
    print(before, after_small, after_big, int(same), int(exact))
""")


def test_small_calls_run_on_the_caller_large_ones_on_the_team():
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, OMP_NUM_THREADS="2", MOE_NUM_THREADS="2")
    p = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    before, after_small, after_big, same, exact = map(int, p.stdout.split())
    assert after_small == before, "a call below ATen's grain started a thread (an OpenMP region)"
    assert after_big == after_small + 1, "a call above the grain did not run on torch's OpenMP team"
    assert same == 1, "rows of a small (caller-only) call differ from the same rows of a large (team) call"
    assert exact == 1
