"""The examples a user starts from (examples/README.md), run as the user runs them, without their timing sections:
each asserts its own numbers against eager; these tests add what the example's reader is told it shows.
(examples/your_router.py: test_routing_raising.py; training/: test_training.py; expert_parallel/:
test_expert_parallel.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("model", ["deepseek_v3"])  # its grouped, biased router: moe.route; Qwen3-MoE: test_hf_models.py
def test_hf_causal_lm(model: str):
    """A transformers MoE causal LM under backend="moe": greedy generation gives eager's tokens with the routing
    raised (a moe op per MoE layer and generated token), and a training step eager's loss and gradients."""
    torch._dynamo.reset()
    out = _load("hf_causal_lm").main(["--check", "--model", model, "--new-tokens", "4"])
    layers = 2
    assert sum(out["ops"].values()) == 2 * layers, out["ops"]  # a generation of 2 tokens: 2 calls of each layer
    assert abs(out["losses"]["moe"] - out["losses"]["eager"]) <= 1e-4 * abs(out["losses"]["eager"])
    assert out["grad_rel"] <= 1e-3


def _run(args: list[str], timeout: int = 600) -> str:
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_balance_example():
    """examples/training/balance.py: the load-balancing loss un-collapses a router that starts on two of eight
    experts (the example exits 1 unless only the balanced run ends below its target max/mean load)."""
    out = _run([str(EXAMPLES / "training" / "balance.py"), "--steps", "100"])
    assert "max/mean" in out


def test_expert_parallel_example():
    """examples/expert_parallel/train_qwen3_moe.py under torchrun (2 ranks, gloo, a free port): the sharded
    transformers Qwen3-MoE trains two steps, every rank printing a finite mean loss."""
    out = _run(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(EXAMPLES / "expert_parallel" / "train_qwen3_moe.py"), "--steps", "2"])
    assert "2 ranks" in out and "nan" not in out.lower(), out
