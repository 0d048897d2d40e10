"""Expert dispatch through ``moe.dispatch_plan``: HF transformers' sparse-MoE experts without the per-expert loop.

HF ``transformers`` (5.x) writes the experts of Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3, gpt-oss... as an
``Experts`` module decorated with ``@use_experts_implementation``: its forward looks up
``config._experts_implementation`` in ``transformers.integrations.moe.ExpertsInterface`` (``"eager"``, the default,
is the ``one_hot`` / ``where`` / ``index_add_`` loop over the experts hit; it is data-dependent, so Dynamo breaks the
graph at its ``nonzero`` and recompiles per expert). This module adds the implementation ``"moe"``:

1. ``torch.ops.moe.dispatch_plan(top_k_index, E)`` (integer-valued, static output sizes: no graph break) gives the
   per-expert offsets, the ``(token, slot)`` assignments stably sorted by expert and its inverse permutation;
2. the token rows are gathered once in that order, and each projection is **one grouped GEMM**
   (:func:`grouped_mm`: ``torch.ops.moe_mlir.grouped_mm``, an opaque op: on the CPU a loop over the experts that
   have rows, one ``mm`` per contiguous slice; on CUDA one padded batched GEMM (``bmm`` over ``[E, max rows, K]``)
   unless the routing is too skewed for padding, where the loop's 2E launches per layer dominated whole-model
   prefill on an H100 (bench/results/models-2026-11-24-h100.md); ``torch.nn.functional.grouped_mm`` on CUDA in bf16,
   where torch has it) — on this project's CPU the loop measured faster than torch's CPU
   ``torch.nn.functional.grouped_mm`` (one run on the loaded 2-core machine, 2 threads, E=128, D=2048, 2I=1536,
   f32: 1.8 s vs 2.8 s at T=64, 2.3 s vs 3.1 s at T=1024, same results bit for bit);
3. the module's own gate (``_apply_gate``: SiLU(gate)·up, gpt-oss's clamped GLU...) or activation, its biases
   and its post-expert norm, then the routing weights, row-wise, as HF's eager code applies them;
4. a deterministic un-permute: each token's k rows are read back through the inverse order, in increasing expert
   order (the order in which eager's ``index_add_`` accumulates them), and summed: no scatter, no atomics.

Steps 2-4 stream several ``[T*k, D]``-sized intermediates through memory (270 MB each for Qwen3-MoE at T=4096),
which cost more than eager's per-expert loop saves. So on CPU, for the gates it can compute itself (:data:`GATES`:
HF's default SiLU GLU, gpt-oss's clamped GLU; no post-expert norm), the experts run instead as :func:`expert_mlp`
(``torch.ops.moe_mlir.expert_mlp``): one opaque op over the experts with rows, each expert's rows gathered,
projected with BLAS on the weight slices, gated, weighted and summed into the output in eager's order, in scratch
buffers reused across experts, so they stay in cache. On f32/f64 it is the torch extension's kernel
(lib/Runtime/Torch/ExpertOps.cpp: the experts spread over torch's threads, no per-expert torch call: at E = 256 the
Python loop's ~7 calls per expert were most of a whole model's decode); its Python loop (``index_add_`` per
expert) is the reference and the path of other dtypes. Steps 2-4 remain for other gates, a post-expert norm and
CUDA.

Everything is differentiable w.r.t. the hidden states, the expert weights (and biases) and the routing weights
(autograd of the torch ops used; ``grouped_mm`` has a registered backward, an opaque op chosen like its forward);
the plan is integer-valued. Under ``torch.compile`` the whole expert computation is one graph (no data-dependent control flow
in Python).

Which models use it (see the README, "HF experts through the dispatch plan"):

* :func:`register` adds ``"moe"`` to HF's ``ExpertsInterface`` (HF's extension point; idempotent): then
  ``config._experts_implementation = "moe"`` / ``from_pretrained(..., experts_implementation="moe")`` /
  ``model.set_experts_implementation("moe")`` select it, in eager and under any ``torch.compile`` backend;
* :func:`use_moe_experts` selects it for a model within a ``with`` block (and restores the previous choice);
* ``moe_mlir.compile(model)`` selects it for each call of the compiled model only (the user's model object and its
  configs are left as they were between calls; a module whose config names another implementation than HF's
  defaults, :data:`SWITCHED`, keeps it).

Expert parallelism (``_is_expert_parallel``: sentinel indices) is not handled: such modules run HF's eager code.

The package: :mod:`.gemm` (the grouped GEMMs), :mod:`.mlp` (the fused per-expert MLP), :mod:`.dispatch`
(the whole expert computation), :mod:`.hf` (transformers' experts modules), :mod:`.common` (what they share).
"""

from __future__ import annotations

from .dispatch import dispatch_experts
from .gemm import grouped_mm, hf_grouped_mm_target
from .hf import (IMPLEMENTATION, SelectedExperts, hf_experts_forward, hf_experts_modules, is_hf_experts, register,
                 use_moe_experts)
from .mlp import GATES, expert_mlp

__all__ = ["grouped_mm", "hf_grouped_mm_target", "expert_mlp", "GATES", "dispatch_experts", "hf_experts_forward",
           "register", "is_hf_experts", "hf_experts_modules", "use_moe_experts", "SelectedExperts", "IMPLEMENTATION"]
