"""Your router, fused (docs/YourRouter.md): a router written from scratch in PyTorch, what backend "moe" makes of
it, and its speed against eager and inductor, measured in this run.

    .venv/bin/python examples/your_router.py            # prints every section of docs/YourRouter.md
    .venv/bin/python examples/your_router.py --quick    # fewer rounds
    .venv/bin/python examples/your_router.py --check    # sections 1-3 only (python/tests/test_routing_raising.py)

The router is nobody's model: a clamped tanh/sigmoid mix as its score (no kernel library has it), a selection bias
that only chooses (DeepSeek-V3's auxiliary-loss-free balancing), top-k, renormalized and scaled weights. Nothing
in it mentions moe_mlir: torch.compile(backend="moe") raises its routing to one moe.route whose score region is
the PyTorch expression (frontend/raising.py), the CPU kernel inlines the region and the backward kernel
(moe.route_grad) differentiates it symbolically.

Public API only: ``import moe_mlir`` (it registers the backend and ``torch.ops.moe.*``), ``torch.compile(...,
backend="moe")``, ``moe_mlir.find_moe_opt`` / ``moe_mlir.run_moe_opt``, the ``MOE_KERNEL_RECORD`` variable (the
kernel keys a process builds, one a line) and ``moe-opt --kernel-key`` (the module of a kernel key).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

import torch

import moe_mlir
from moe_mlir.profiling import interleaved_times, ops_run


class ClampedMixRouter(torch.nn.Module):
    """score = max(0.5 tanh(z) + sigmoid(2z)^2, 0.05) of the logits z; the k best of score + bias; the weights
    are the chosen scores over their sum, times 1.7."""

    def __init__(self, hidden: int, experts: int, k: int):
        super().__init__()
        self.k = k
        self.proj = torch.nn.Linear(hidden, experts, bias=False)
        self.register_buffer("bias", torch.linspace(-0.2, 0.2, experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.route(self.proj(x))

    def route(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.clamp(0.5 * torch.tanh(z) + torch.sigmoid(2.0 * z) ** 2, min=0.05)
        idx = torch.topk(scores + self.bias, self.k, dim=-1).indices
        w = scores.gather(1, idx)
        return w / w.sum(-1, keepdim=True) * 1.7, idx


def _same(a, b) -> float:
    """Largest weight difference after sorting each row's picks by expert (top-k order is not the contract)."""
    (w, i), (w2, i2) = a, b
    o, o2 = i.argsort(-1), i2.argsort(-1)
    assert torch.equal(i.gather(-1, o), i2.gather(-1, o2)), "different experts"
    return float((w.gather(-1, o) - w2.gather(-1, o2)).abs().max())


def main(argv: list[str] | None = None) -> str:
    """Prints the sections; returns the kernel's module text (the tests read it)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true", help="no timing: sections 1-3")
    args = ap.parse_args(argv)
    rounds = 5 if args.quick else 15
    torch.manual_seed(0)
    H, E, k = 512, 64, 6
    router = ClampedMixRouter(H, E, k)
    record = tempfile.NamedTemporaryFile(suffix=".keys", delete=False).name
    os.environ["MOE_KERNEL_RECORD"] = record
    print(f"MoE-MLIR {moe_mlir.__version__}, PyTorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}")

    # 1. Compile and check against eager, forward and backward.
    route_moe = torch.compile(router.route, backend="moe")
    z = torch.randn(4096, E)
    got = route_moe(z)
    diff = _same(got, router.route(z))
    assert diff <= 1e-6, diff
    print(f"\n## 1. Same answer as eager\nmax weight difference at T = 4096: {diff:.1e}")
    zz, ze = z.clone().requires_grad_(), z.clone().requires_grad_()
    cot = torch.randn(E)
    w, i = route_moe(zz)
    (w * cot[i]).sum().backward()
    w, i = router.route(ze)
    (w * cot[i]).sum().backward()
    torch.testing.assert_close(zz.grad, ze.grad, atol=1e-5, rtol=1e-4)
    print(f"gradient of the logits: max difference {float((zz.grad - ze.grad).abs().max()):.1e}")

    # 2. What the compiled call runs: raising made the routing one torch.ops.moe.route.
    ops = ops_run(lambda: route_moe(z), namespaces=("moe", "aten"))
    print("\n## 2. The ops one compiled call runs (torch.profiler)")
    for name, n in sorted(ops.items()):
        print(f"{name} x{n}")
    assert ops["moe::route"] >= 1, ops

    # 3. The kernel's MLIR (moe-opt --kernel-key builds the module the kernel cache compiles for a recorded key) and
    # what the CPU lowering makes of the score.
    keys = [line for line in open(record).read().splitlines() if line.startswith("route|")]
    moe_opt = moe_mlir.find_moe_opt()
    module = subprocess.run([moe_opt, f"--kernel-key={keys[0]}"], input="", text=True, capture_output=True,
                            check=True).stdout
    print("\n## 3. The op (the kernel's module for that call)\n```mlir")
    print(module.strip())
    print("```")
    lowered = moe_mlir.run_moe_opt(module, ["--convert-moe-to-cpu"], moe_opt=moe_opt)
    math_ops = sorted({line.split("=")[1].split()[0] for line in lowered.splitlines()
                       if "= math." in line or "= arith.maximumf" in line})
    print(f"\nconvert-moe-to-cpu: {len(lowered.splitlines())} lines; the score's math inlined in the kernel: "
          f"{', '.join(math_ops)}")

    if args.check:
        return module
    # 4. Speed, from the logits (the gate GEMM is the same matmul in every implementation), then the module.
    route_ind = torch.compile(router.route, backend="inductor")
    print(f"\n## 4. Speed (fastest / median of {rounds} interleaved rounds, ms; load average "
          f"{os.getloadavg()[0]:.1f})\n")
    print("| T | pass | eager | inductor | moe | x eager (fastest) | x inductor (fastest) |\n|---|---|---|---|---|---|---|")
    for T in (16, 64, 4096, 16384):
        z = torch.randn(T, E)

        def step(fn):
            def run():
                zz = z.clone().requires_grad_()
                w, i = fn(zz)
                w.sum().backward()
            return run

        for name, fns in (("forward", {"eager": lambda: router.route(z), "inductor": lambda: route_ind(z),
                                       "moe": lambda: route_moe(z)}),
                          ("fwd + bwd", {"eager": step(router.route), "inductor": step(route_ind),
                                         "moe": step(route_moe)})):
            ms = interleaved_times(fns, rounds)
            cell = {b: f"{ms[b][0]:.3f} / {ms[b][1]:.3f}" for b in ms}
            print(f"| {T} | {name} | {cell['eager']} | {cell['inductor']} | {cell['moe']} | "
                  f"{ms['eager'][0] / ms['moe'][0]:.2f}x | {ms['inductor'][0] / ms['moe'][0]:.2f}x |")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    return module


if __name__ == "__main__":
    main()
