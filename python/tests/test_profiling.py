"""moe_mlir.profiling, what the examples and benches time and count with (no timing is asserted: only the shape of
the answer and the ops counted)."""

from __future__ import annotations

import torch

import moe_mlir  # noqa: F401 - registers torch.ops.moe
from moe_mlir.profiling import interleaved_runs, interleaved_times, ops_run


def test_interleaved_rounds_call_each_function_once_a_round_after_a_warm_up():
    calls = {"a": 0, "b": 0}

    def bump(k):
        calls[k] += 1

    times = interleaved_runs({"a": lambda: bump("a"), "b": lambda: bump("b")}, rounds=3)
    assert calls == {"a": 4, "b": 4}
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    fastest, median = interleaved_times({"a": lambda: None}, rounds=5)["a"]
    assert 0 <= fastest <= median


def test_ops_run_counts_the_ops_of_the_namespaces_asked_for():
    logits = torch.randn(8, 16)

    def route():
        return torch.ops.moe.topk_renorm(torch.softmax(logits, -1), 2)

    assert ops_run(route) == {"moe::topk_renorm": 1}
    both = ops_run(route, namespaces=("moe", "aten"))
    assert both["moe::topk_renorm"] == 1 and both["aten::softmax"] == 1
