"""torch.ops.moe.* on CUDA tensors: the device suite of test_torch_ops.py (every test there that takes ``dev`` or
``cuda``, and the same of test_routing_ops.py: moe.route and moe.dispatch_plan, and of test_balance_ops.py: the
router losses, and of test_cuda_graphs.py: every op, forward and backward, and a
transformers MoE block under backend "moe", captured in a CUDA graph and replayed) on one device, our GPU kernels (lib/Runtime/Torch/TorchCudaOps.cpp, the CUDA kernels of
moe_mlir.runtime.cache) against moe_mlir.reference (computed on CPU copies).

Covers: every op and fused form (random and adversarial inputs: ties, NaN, -inf rows, masks, N = 1, k = K, zero
tokens, f16/bf16; head_select='all', which has no GPU kernel, runs the reference), several token counts served by one
kernel, non-contiguous inputs, a side stream, a call captured in a CUDA graph (no host synchronization, no allocation
of the outputs by the kernel), index errors read after a synchronization (moe_mlir.runtime.cuda.check_errors),
gradients, and that the kernels (not the references) ran.

Skipped, with the reason, without a CUDA device or without the CUDA kernels (an extension built without the CUDA
runtime, no moe-opt and no $MOE_KERNEL_PREBUILT). scripts/gpu-check.sh runs it on a lent GPU (step torch-ops), after
running it here with MOE_TEST_DEVICE=cpu (the same calls on the CPU kernels, the CUDA-only tests skipped) under
$MOE_KERNEL_RECORD to learn which kernels to build ahead of time for the GPU machine, which has no LLVM. This file
runs on that machine by name: it needs only the CUDA kernels (no CPU kernel, no moe-opt).
"""

from __future__ import annotations

import inspect
import os

import pytest

import test_balance_ops as balance_suite
import test_cuda_graphs as graph_suite
import test_routing_ops as routing_suite
import test_torch_ops as suite
from torch_checks import device_param

#: "cuda", or "cpu" to record the kernels the CUDA run needs (scripts/gpu-check.sh).
DEV = os.environ.get("MOE_TEST_DEVICE", "cuda")


@pytest.fixture(params=[device_param(DEV)])
def dev(request) -> str:
    return request.param


@pytest.fixture(params=[device_param("cuda") if DEV == "cuda" else pytest.param(
    "cuda", marks=pytest.mark.skip(reason="CUDA behaviour (MOE_TEST_DEVICE=cpu records kernels only)"))])
def cuda(request) -> str:
    return request.param


# The device suites, collected here too (this file's `dev` and `cuda` fixtures override test_torch_ops.py's).
for _suite in (suite, routing_suite, balance_suite, graph_suite):
    globals().update({name: test for name, test in vars(_suite).items()
                      if name.startswith("test_") and {"dev", "cuda"} & set(inspect.signature(test).parameters)})
