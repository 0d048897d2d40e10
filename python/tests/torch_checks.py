"""What the torch.ops.moe.* tests share: comparing an op's outputs with the references, seeded generators, and the
devices a test runs the kernels on (test_torch_ops.py, test_torch_ops_cuda.py, test_zero_sized.py)."""

from __future__ import annotations

import os

import pytest
import torch

from moe_mlir import ops
from moe_mlir.runtime import cache, extension

NAN, INF = float("nan"), float("inf")

#: The CPU tests' f32 tolerances: the kernels and the references sum in another order.
ATOL, RTOL = 2e-6, 2e-5


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def same(ours, ref, atol: float = ATOL, rtol: float = RTOL, device: str | None = None) -> None:
    """``ours`` (a tensor or a tuple, on ``device`` when given) equals ``ref`` (on the CPU): as many outputs, the
    same shapes and dtypes, floats within the tolerances (NaN where the reference has NaN), integers exactly. On
    CUDA it synchronizes first and reads the index errors the kernels recorded (moe_mlir.runtime.cuda)."""
    ours = ours if isinstance(ours, tuple) else (ours,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(ours) == len(ref)
    if device == "cuda":
        from moe_mlir.runtime import cuda as moe_cuda

        torch.cuda.synchronize()
        moe_cuda.check_errors()
    for o, r in zip(ours, ref):
        if device is not None:
            assert o.device.type == device, o.device
        o = o.cpu()
        assert o.shape == r.shape, (o.shape, r.shape)
        assert o.dtype == r.dtype, (o.dtype, r.dtype)
        if o.is_floating_point():
            torch.testing.assert_close(o, r, atol=atol, rtol=rtol, equal_nan=True)
        else:
            assert torch.equal(o, r), (o, r)


def ran_kernel(op: str, dev: str) -> bool:
    """Our kernel of ``op`` ran on ``dev`` (the references leave no key)."""
    on = (lambda k: "|device=cuda:" in k) if dev == "cuda" else (lambda k: "|device=" not in k)
    return any(k.startswith(op + "|") and on(k) for k in cache.stats.keys)


def to(device: str, *ts):
    """``ts`` moved to ``device`` (None stays None), as a tuple."""
    return tuple(None if t is None else t.to(device) for t in ts)


#: Without this mark a test needs only what its device needs (test_torch_ops_cuda.py runs on a GPU machine that
#: has the prebuilt CUDA kernels and no LLVM to compile CPU ones).
needs_cpu_kernels = pytest.mark.skipif(
    not ops.kernels_available(),
    reason=f"compiled kernels unavailable: {ops._KERNELS_UNAVAILABLE} (build the project: cmake --build build)",
)
needs_cuda_kernels = pytest.mark.skipif(
    extension.cuda_unavailable is not None,
    reason=f"the CUDA kernels of torch.ops.moe.* are unavailable: {extension.cuda_unavailable}",
)


def device_param(device: str):
    """``device`` as a pytest parameter, skipped with the reason when its kernels are unavailable."""
    return pytest.param(device, marks=needs_cuda_kernels if device == "cuda" else needs_cpu_kernels, id=device)


def cuda_wanted() -> bool:
    """CUDA joins the CPU: when a GPU is present, or when MOE_TEST_DEVICE=cuda asks for it (then a missing GPU or
    missing CUDA kernels is a skip with the reason, not a silent absence)."""
    return torch.cuda.is_available() or os.environ.get("MOE_TEST_DEVICE") == "cuda"


def use_cpu_target(monkeypatch, cpu: str, threads: int) -> None:
    """The CPU kernels compiled for `cpu` (an x86-64 level, or ``native``) with `threads` workers from now on: fresh
    in-process kernel tables (the extension's and the cache's), so that no later call gets a kernel of another
    target; skips the test when this CPU lacks the level's instructions. Callers clear the tables again at the end
    (``extension.clear_kernels()``)."""
    from moe_mlir.runtime import cache

    monkeypatch.setenv("MOE_TARGET_CPU", cpu)
    monkeypatch.setenv("MOE_NUM_THREADS", str(threads))
    try:
        cache.target_cpu()
    except cache.CompileError as e:  # the CPU lacks the level's instructions: nothing to run them on
        pytest.skip(str(e))
    monkeypatch.setattr(cache, "_loaded", {})
    extension.clear_kernels()


def init_hf_module(m: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded random weights (and DeepSeek's selection bias) for an HF module built from a tiny config; eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        for name, b in m.named_buffers():
            if "e_score_correction_bias" in name:
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return m.eval()


def tiny_moe_causal_lm(name: str, hidden: int, **config) -> torch.nn.Module:
    """A two-layer ``mixtral``, ``qwen3_moe`` or ``olmoe`` causal LM from transformers (4 heads, 2 KV heads, 8 experts
    of width 16, top-2, ``output_router_logits=True``; ``config`` adds vocab_size, router_aux_loss_coef, ...) with
    seeded random weights (``init_hf_module``, seed ``len(name)``); eval mode."""
    from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM, Qwen3MoeConfig,
                              Qwen3MoeForCausalLM)

    common = dict(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  num_experts_per_tok=2, output_router_logits=True, **config)
    if name == "mixtral":
        model = MixtralForCausalLM(MixtralConfig(intermediate_size=16, num_local_experts=8, **common))
    elif name == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(moe_intermediate_size=16, intermediate_size=64, num_experts=8,
                                                   head_dim=8, norm_topk_prob=True, **common))
    else:
        model = OlmoeForCausalLM(OlmoeConfig(intermediate_size=16, num_experts=8, norm_topk_prob=False, **common))
    return init_hf_module(model, seed=len(name))


def same_expert_sets(w: torch.Tensor, i: torch.Tensor, w_ref: torch.Tensor, i_ref: torch.Tensor) -> None:
    """Top-k weights and indices equal a reference's as sets per row (HF's routers use topk(sorted=False), so the
    slot order is not part of the contract): both sorted by expert index, then indices equal, weights close."""
    def by_index(w, i):
        o = i.argsort(-1)
        return w.gather(-1, o), i.gather(-1, o)

    (w, i), (w_ref, i_ref) = by_index(w, i), by_index(w_ref, i_ref)
    assert torch.equal(i, i_ref)
    torch.testing.assert_close(w, w_ref, atol=1e-6, rtol=1e-5)
