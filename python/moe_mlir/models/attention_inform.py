"""Attention-Inform SMoE block (Mutual-Inform §3.2, Lemma 1, eq 15-17).

Router: ``e = softmax(W u + b)``, then ``p`` = the attention posterior of the lowest-entropy head mixing ``e``
(``moe.attention_posterior``, the head means from the block's own attention: its pre-softmax ``scores``, per-head
values ``v`` and out-projection ``wo``), then TopM_Renormalize on ``p``.

``use_custom_ops=False`` computes the same in plain PyTorch (the reference formulas of 000 §2): handy as an eager
cross-check; it imports too, but as generic linalg (no idiom is raised to ``moe.attention_posterior``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from .common import AttentionOutput, SMoEBlock, gate_topk_probs

__all__ = ["AttentionInformBlock", "example"]


class AttentionInformBlock(SMoEBlock):
    """Args: d_model, n_heads, num_experts (K), k (M), d_ff, sigma (> 0), head_select ("min_entropy" | "all"),
    causal, use_custom_ops, return_routing."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, num_experts: int = 8, k: int = 2, d_ff: int = 64,
                 sigma: float = 1.0, head_select: str = "min_entropy", causal: bool = False,
                 use_custom_ops: bool = True, return_routing: bool = False) -> None:
        super().__init__(d_model, n_heads, num_experts, k, d_ff, causal=causal, return_routing=return_routing)
        self.sigma, self.head_select, self.use_custom_ops = sigma, head_select, use_custom_ops
        self.gate = nn.Linear(d_model, num_experts)

    def mix(self, u: Tensor, attn: AttentionOutput) -> Tensor:
        e = torch.softmax(self.gate(u), dim=-1)
        if self.use_custom_ops:
            p, _ = torch.ops.moe.attention_posterior(attn.scores, u, attn.v, attn.wo, e, self.sigma,
                                                     self.head_select, None)
            return p
        return _plain_min_entropy_posterior(attn.scores, u, attn.v, attn.wo, e, self.sigma)

    def route(self, u: Tensor, attn: AttentionOutput) -> tuple[Tensor, Tensor]:
        return gate_topk_probs(self.mix(u, attn), self.k, True, self.use_custom_ops)


def _plain_min_entropy_posterior(scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, sigma: float) -> Tensor:
    """eq 15-17 in plain torch (no masked rows: this block's attention masks at most the causal future)."""
    B, H, N, Nk = scores.shape
    D = wo.shape[0]
    log_a = torch.log_softmax(scores, -1)
    ent = -(log_a.exp() * torch.where(torch.isinf(log_a), torch.zeros_like(log_a), log_a)).sum(-1).mean(-1)  # [B,H]
    head = torch.argmin(ent, dim=-1)  # [B]
    sel = torch.nn.functional.one_hot(head, H).to(scores.dtype)  # [B,H]: gathers the head without indexing
    s_h = torch.einsum("bh,bhij->bij", sel, scores)
    v_h = torch.einsum("bh,bhjc->bjc", sel, v)
    wo_h = torch.einsum("bh,dhc->bdc", sel, wo.reshape(D, H, -1))
    m = H * torch.einsum("bjc,bdc->bjd", v_h, wo_h)  # [B,Nk,D]
    z = s_h + (torch.matmul(u, m.transpose(-1, -2)) - 0.5 * (m * m).sum(-1).unsqueeze(1)) / (sigma * sigma)
    return torch.matmul(torch.softmax(z, -1), e)


def example(batch: int = 2, seq: int = 8, **kw) -> tuple[AttentionInformBlock, tuple[Tensor]]:
    torch.manual_seed(0)
    m = AttentionInformBlock(**kw).eval()
    return m, (torch.randn(batch, seq, m.d_model),)
