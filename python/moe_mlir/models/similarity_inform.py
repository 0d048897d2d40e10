"""Similarity-Inform SMoE block (Mutual-Inform §3.1, eq 5, 8, 11).

Router: ``e = softmax(W u + b)`` (dense, per token), ``p = S e`` with ``S = softmax(u uᵀ / tau)`` over the tokens of
the sequence, then TopM_Renormalize on ``p``. With ``use_custom_ops=False`` the mixing is written as
``softmax(u @ u.transpose(-1, -2) / tau) @ e`` and the gate as ``topk -> v / v.sum``: the importer raises both to
``moe.similarity_inform`` and ``moe.topk_renorm {mode = probs}``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from .common import AttentionOutput, SMoEBlock, gate_topk_probs

__all__ = ["SimilarityInformBlock", "example"]


class SimilarityInformBlock(SMoEBlock):
    """Args: d_model, n_heads, num_experts (K), k (M), d_ff, tau (> 0), causal (mask j > i in S and attention),
    use_custom_ops, return_routing."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, num_experts: int = 8, k: int = 2, d_ff: int = 64,
                 tau: float = 1.0, causal: bool = False, use_custom_ops: bool = True,
                 return_routing: bool = False) -> None:
        super().__init__(d_model, n_heads, num_experts, k, d_ff, causal=causal, return_routing=return_routing)
        if not tau > 0:
            raise ValueError(f"tau ({tau}) must be > 0")
        self.tau, self.causal, self.use_custom_ops = tau, causal, use_custom_ops
        self.gate = nn.Linear(d_model, num_experts)

    def mix(self, u: Tensor) -> Tensor:
        """The mixed routing distribution ``p`` ``[B, N, K]`` (eq 8)."""
        e = torch.softmax(self.gate(u), dim=-1)
        if self.use_custom_ops:
            return torch.ops.moe.similarity_inform(u, e, None, None, self.tau, self.causal)
        logits = torch.matmul(u, u.transpose(-1, -2)) / self.tau
        if self.causal:
            n = u.shape[1]
            mask = torch.ones(n, n, dtype=torch.bool, device=u.device).tril()
            logits = logits.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(logits, dim=-1), e)

    def route(self, u: Tensor, attn: AttentionOutput) -> tuple[Tensor, Tensor]:
        return gate_topk_probs(self.mix(u), self.k, True, self.use_custom_ops)


def example(batch: int = 2, seq: int = 8, **kw) -> tuple[SimilarityInformBlock, tuple[Tensor]]:
    """A small block and an input ``[batch, seq, d_model]`` (deterministic)."""
    torch.manual_seed(0)
    m = SimilarityInformBlock(**kw).eval()
    return m, (torch.randn(batch, seq, m.d_model),)
