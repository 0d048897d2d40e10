"""Torch custom ops for the ``moe`` dialect: ``torch.ops.moe.<name>`` for the six seed-router ops (``OP_NAMES``), the
two fused forms, the routing ops (``route``, ``dispatch_plan``), the load-balancing and capacity ops, and the
backward ops their autograd calls.

Every op is registered with :func:`torch.library.custom_op` as ``moe::<name>`` so that ``torch.export`` and FX keep
it as one opaque node (``torch.ops.moe.<name>``), which the importer maps to the dialect op of the same name. The
operand order, attribute names and defaults are those of ``shared/spec/DIALECT.md`` and ``include/MoE/IR/MoEOps.td``;
enum attributes are plain strings (``mode="probs"``). The fused forms (``similarity_inform_topk``,
``attention_posterior_topk``, MoEFusedOps.td) take the mixing op's operands, then ``k``, then its attributes, then
``renormalize``.

Kernels: on CPU tensors the ops run the compiled moe kernels through the C++ extension ``libmoe_torch.so``
(``lib/Runtime/Torch``; the token-like dimensions are dynamic, kernels are cached in memory and on disk by
:mod:`moe_mlir.runtime.cache`). On CUDA tensors the ops with CUDA kernels (``TorchOps.def``'s ``CudaKernels``) run
them (``lib/Runtime/Torch/TorchCudaOps.cpp``, registered once the CUDA runtime of :mod:`moe_mlir.runtime.cuda`
loads). Otherwise (another device, an op without a CUDA kernel, the CUDA runtime absent, or on CPU tensors the
extension or the compiler unavailable: then a one-time warning says why) they run the eager references of
:mod:`moe_mlir.reference`, which define the semantics:

* f16/bf16 inputs upcast, everything accumulated in f32;
* ties in any top-k/argmin break to the lowest index, NaN ranks above every number in a top-k;
* masked (``-inf``) logits get no probability and a fully masked row yields zeros, never NaN;
* index operands out of range raise :class:`ValueError`.

Validation is the op verifier (include/MoE/IR, run on the call's kernel key with its sizes by
:mod:`moe_mlir.runtime.verify`): the fake kernels run it, so ``torch.export`` rejects a bad call at trace time, and
so do the eager fallback and the C++ kernels (through the kernel cache, before anything is allocated).

Autograd: ``topk_renorm``, ``similarity_inform``, ``attention_posterior``, ``hyper_router`` and the fused forms are
differentiable (gradients through the selected values only, none through indices or the head choice).
``mad_dispersion`` and ``adjacency_update`` are stop-gradient (003 §5.10, 004 §1.2). The backward of

* ``similarity_inform``: ``torch.ops.moe.similarity_inform_backward`` (the dialect's ``moe.similarity_inform_grad``:
  a flash-style kernel, O(N) memory, on the CPU and on CUDA; the autograd's forward is
  ``torch.ops.moe.similarity_inform_fwd``, which returns ``p`` and ``lse`` for the backward to read (called
  directly, without them, the backward recomputes them); the eager fallback is the reference's closed form);
* ``topk_renorm``: ``torch.ops.moe.topk_renorm_backward`` (``moe.topk_renorm_grad``: the closed form of
  :func:`moe_mlir.reference._topk_renorm_backward_ref` on the saved indices, O(rows·K), no recompute; CPU and
  CUDA kernels);
* ``similarity_inform_topk``: both of the above; the autograd's forward is ``similarity_inform_fwd`` then
  ``topk_renorm`` (the fused kernel's bits; ``p`` and ``lse`` saved, O(N) memory);
* ``hyper_router``: ``torch.ops.moe.hyper_router_backward`` (``moe.hyper_router_grad``: the closed form of
  :func:`moe_mlir.reference._hyper_router_backward_ref`; every operand's gradient, so a frozen hypernetwork still
  passes gradient to ``emb``);
* ``attention_posterior``: ``torch.ops.moe.attention_posterior_backward`` (``moe.attention_posterior_grad``: at the
  forward's chosen head, the posterior log-sum-exp recomputed, the key tiles streamed; beyond ``d_scores`` itself,
  O(N) memory; the eager fallback is the dense closed form
  :func:`moe_mlir.reference._attention_posterior_backward_ref`);
* ``attention_posterior_topk``: ``p`` recomputed by the forward kernel, then ``topk_renorm_backward`` and
  ``attention_posterior_backward`` (as ``similarity_inform_topk``).

The autograd of these six ops is C++ (``lib/Runtime/Torch/Autograd.cpp``, at AutogradCPU/AutogradCUDA: no Python per
call); the Python ``setup_context``/``backward`` pairs below (``_PYTHON_AUTOGRAD``) are registered only when the
extension does not load, so that an op has one autograd either way. No backward is differentiable again: double
backward raises ``moe.<op>: double backward is not supported`` (C++) or PyTorch's "no autograd formula" error
(Python fallback).

The package, by concern: :mod:`.topk` (``topk_renorm``), :mod:`.mixing` (``similarity_inform``,
``attention_posterior``), :mod:`.seed_routers` (``mad_dispersion``, ``adjacency_update``, ``hyper_router``),
:mod:`.fused` (the fused forms), :mod:`.routing` (``route``, ``dispatch_plan``); each holds its ops' calls of the
op verifier, fake kernels and Python autograd. :mod:`._checks` holds the index-value checks of the eager fallback, :mod:`._autograd` the
autograd helpers, :mod:`.loading` the extension's loading and the tables the op modules fill.
"""

from __future__ import annotations

#: The dialect ops, in DIALECT.md order; ``torch.ops.moe.<name>`` exists for each.
OP_NAMES: tuple[str, ...] = (
    "topk_renorm",
    "similarity_inform",
    "attention_posterior",
    "mad_dispersion",
    "adjacency_update",
    "hyper_router",
)

#: The fused forms (MoEFusedOps.td): a mixing op with the probs-mode top-k gate in its epilogue.
FUSED_OP_NAMES: tuple[str, ...] = ("similarity_inform_topk", "attention_posterior_topk")

# The op modules, in registration order (each registers its ops and fills the tables of .loading as it is imported);
# a new module goes before _load_kernels().
from .topk import TOPK_MODES, topk_renorm, topk_renorm_backward  # noqa: E402, F401
from .mixing import (  # noqa: E402, F401
    HEAD_SELECTS,
    attention_posterior,
    attention_posterior_backward,
    similarity_inform,
    similarity_inform_backward,
    similarity_inform_fwd,
)
from .seed_routers import (  # noqa: E402, F401
    ADJ_NORMS,
    EMPTIES,
    MEASURES,
    NORMALIZES,
    adjacency_update,
    hyper_router,
    hyper_router_backward,
    mad_dispersion,
)
from .fused import attention_posterior_topk, similarity_inform_topk  # noqa: E402
from .routing import (  # noqa: E402, F401
    GROUP_SCORES,
    ROUTE_ORDERS,
    ROUTE_SCORINGS,
    ROUTING_OP_NAMES,
    dispatch_plan,
    route,
    route_backward,
)
from .score_region import custom_scoring, score_region, scoring_of  # noqa: E402, F401
from .balance import (  # noqa: E402, F401
    BALANCE_OP_NAMES,
    load_balancing_loss,
    router_stats,
    router_stats_backward,
    router_stats_fwd,
    router_z_loss,
    router_z_loss_backward,
    sequence_balance_loss,
    sequence_balance_loss_backward,
)
from .capacity import CAPACITY_DROPS, CAPACITY_OP_NAMES, apply_capacity, bias_update, capacity_of  # noqa: E402, F401
from . import loading as _loading  # noqa: E402
from .loading import _autograd_call, kernels_available  # noqa: E402, F401

_loading._load_kernels()

__all__ = [
    *OP_NAMES,
    *FUSED_OP_NAMES,
    "similarity_inform_fwd",
    "similarity_inform_backward",
    "topk_renorm_backward",
    "route_backward",
    "custom_scoring",
    "score_region",
    "hyper_router_backward",
    "attention_posterior_backward",
    "OP_NAMES",
    "FUSED_OP_NAMES",
    "kernels_available",
    "route",
    "dispatch_plan",
    "ROUTING_OP_NAMES",
]


def __getattr__(name: str):
    # The loading state (read by tests, bench/ and prebuild as ``ops._KERNELS_UNAVAILABLE`` etc.) lives in .loading.
    if name in ("_KERNELS_UNAVAILABLE", "_EXTENSION_LOADED", "_FALLBACK_WARNED"):
        return getattr(_loading, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
