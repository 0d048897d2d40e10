"""SymphonySMoE block (004: Alg. 1, eq 6-8).

Gate: ``G = softmax(logits) · Aᵀ`` with the layer's expert co-selection graph ``A`` (a buffer), then top-k of G with
the raw selected values as weights (``moe.topk_renorm {mode = probs, renormalize = false}``). In training mode, after
routing, ``A`` is updated from the base router's top-k (``moe.adjacency_update``: moving average of the row-normalized
co-selection counts); in eval mode it is frozen (a constant of the imported module). Under ``torch.distributed`` the update counts the
co-selections of every data-parallel rank (:mod:`moe_mlir.distributed`): every rank holds the same, bit-identical
``A``, equal to one process's on the concatenated batch. A starts at zero (Alg. 1), so
an untrained block routes with zero weights (every G entry ties; indices 0..k-1).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from .. import distributed
from ..reference import _adjacency_update_ref
from .common import AttentionOutput, SMoEBlock, gate_topk, gate_topk_probs

__all__ = ["SymphonyBlock", "example"]


class SymphonyBlock(SMoEBlock):
    """Args: d_model, n_heads, num_experts (M), k, d_ff, beta (EMA decay in [0, 1]), norm ("row" | "col" | "none"),
    include_self, use_custom_ops, return_routing."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, num_experts: int = 8, k: int = 2, d_ff: int = 64,
                 beta: float = 0.9, norm: str = "row", include_self: bool = True, causal: bool = False,
                 use_custom_ops: bool = True, return_routing: bool = False) -> None:
        super().__init__(d_model, n_heads, num_experts, k, d_ff, causal=causal, return_routing=return_routing)
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta ({beta}) must be in [0, 1]")
        self.beta, self.norm, self.include_self, self.use_custom_ops = beta, norm, include_self, use_custom_ops
        self.gate = nn.Linear(d_model, num_experts)
        self.register_buffer("adjacency", torch.zeros(num_experts, num_experts))  # persistent: in state_dict

    def route(self, u: Tensor, attn: AttentionOutput) -> tuple[Tensor, Tensor]:
        logits = self.gate(u)
        # A_{t-1} snapshot: the update below writes the buffer in place, and backward must see the old graph.
        a_prev = self.adjacency.clone()
        g = torch.matmul(torch.softmax(logits, dim=-1), a_prev.t())
        w, idx = gate_topk_probs(g, self.k, False, self.use_custom_ops)
        if self.training:
            with torch.no_grad():
                flat = logits.detach().reshape(-1, self.num_experts)
                base_idx = gate_topk(flat, self.k, self.use_custom_ops)[1]  # top-k on the BASE logits (l.6)
                if distributed.active():  # data parallel: count the co-selections of every rank's tokens
                    base_idx = distributed.gather_rows(base_idx)
                if self.use_custom_ops:
                    a_next = torch.ops.moe.adjacency_update(a_prev, base_idx, self.beta, self.norm, self.include_self)
                else:
                    a_next = _adjacency_update_ref(a_prev, base_idx, self.beta, self.norm, self.include_self)
                self.adjacency.copy_(a_next)
        return w, idx


def example(batch: int = 2, seq: int = 8, warm_steps: int = 3, **kw) -> tuple[SymphonyBlock, tuple[Tensor]]:
    """A small block whose graph has been updated ``warm_steps`` times (so that routing is not degenerate)."""
    torch.manual_seed(0)
    m = SymphonyBlock(**kw)
    x = torch.randn(batch, seq, m.d_model)
    m.train()
    with torch.no_grad():
        for _ in range(warm_steps):
            m(x)
    return m.eval(), (x,)
