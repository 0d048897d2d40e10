"""ACMoE (Tight Clusters Make Specialized Experts, 003 §1.3-1.6): a two-layer SMoE stack.

Layer 1 is a standard SMoE (TopK-then-softmax on ``W u + b``); its top-1 expert per token is the cluster assignment
``k*`` of layer 2, whose AC router scales every token by the per-cluster feature weights
``W = moe.mad_dispersion(u, k*)`` (1 / MAD, clipped, mean 1) before the dot product with the normalized expert
embeddings (003 eq 8, the authors' LM code): ``logits[t] = (u_t ⊙ W[k*_t]) · normalize(emb)ᵀ``. Statistics use the
layer's own input (the code's choice; the paper writes h^{l-1}) over all tokens of the batch. Experts see the
unscaled ``u`` (eq 9). Under ``torch.distributed`` in training mode, the batch is the global one: the statistics of
every data-parallel rank are summed (:func:`moe_mlir.distributed.mad_dispersion`), so every rank routes with the
same, bit-identical weights.

``use_custom_ops=False`` computes the weights with the plain-torch reference formulation (one-hot matmuls, no custom
op); it imports as generic linalg.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .. import distributed
from ..reference import _mad_dispersion_ref
from .common import AttentionOutput, SMoEBlock

__all__ = ["StandardSMoEBlock", "ACMoEBlock", "ACMoEStack", "example"]


class StandardSMoEBlock(SMoEBlock):
    """Switch/GLaM-style SMoE: linear router and TopK-then-softmax gate; optionally Switch's expert capacity
    (``capacity_factor``, ``capacity_drop``: :class:`SMoEBlock`)."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, num_experts: int = 8, k: int = 2, d_ff: int = 64,
                 causal: bool = False, use_custom_ops: bool = True, return_routing: bool = False,
                 balance_loss_coef: float = 0.0, z_loss_coef: float = 0.0, capacity_factor: Optional[float] = None,
                 capacity_drop: str = "position") -> None:
        super().__init__(d_model, n_heads, num_experts, k, d_ff, causal=causal, return_routing=return_routing,
                         balance_loss_coef=balance_loss_coef, z_loss_coef=z_loss_coef,
                         capacity_factor=capacity_factor, capacity_drop=capacity_drop)
        self.use_custom_ops = use_custom_ops
        self.gate = nn.Linear(d_model, num_experts)

    def route(self, u: Tensor, attn: AttentionOutput) -> tuple[Tensor, Tensor]:
        return self.gate_logits(self.gate(u))


class ACMoEBlock(SMoEBlock):
    """The adaptive-clustering layer; ``forward(x, assign)`` takes the previous layer's top-1 experts ``[B, N]``."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, num_experts: int = 8, k: int = 2, d_ff: int = 64,
                 eps: float = 1e-4, clip: float = 10.0, normalize: str = "feature", measure: str = "mad",
                 empty: str = "identity", causal: bool = False, use_custom_ops: bool = True,
                 return_routing: bool = False, balance_loss_coef: float = 0.0, z_loss_coef: float = 0.0) -> None:
        super().__init__(d_model, n_heads, num_experts, k, d_ff, causal=causal, return_routing=return_routing,
                         balance_loss_coef=balance_loss_coef, z_loss_coef=z_loss_coef)
        self.use_custom_ops = use_custom_ops
        self.attrs = dict(eps=eps, clip=clip, normalize=normalize, measure=measure, empty=empty)
        self.expert_emb = nn.Parameter(torch.randn(num_experts, d_model) * 0.02)
        self._assign: Tensor | None = None

    def dispersion_weights(self, tokens: Tensor, assign: Tensor) -> Tensor:
        """``W [E, D]`` from tokens ``[T, D]`` and clusters ``[T]``; a constant (no gradient, 003 §5.10)."""
        a = self.attrs
        if self.training and distributed.active():  # data parallel: the statistics of the global batch
            return distributed.mad_dispersion(tokens.detach(), assign, self.num_experts, **a)[0]
        if self.use_custom_ops:
            w, _ = torch.ops.moe.mad_dispersion(tokens.detach(), assign, self.num_experts, a["eps"], a["clip"],
                                                a["normalize"], a["measure"], a["empty"])
            return w
        w, _ = _mad_dispersion_ref(tokens.detach(), assign, self.num_experts, a["eps"], a["clip"], a["normalize"],
                                   a["measure"], a["empty"])
        return w

    def route(self, u: Tensor, attn: AttentionOutput) -> tuple[Tensor, Tensor]:
        assert self._assign is not None, "ACMoEBlock.forward needs the previous layer's assignment"
        B, N, D = u.shape
        uf = u.reshape(B * N, D)
        assign = self._assign.reshape(B * N)
        w = self.dispersion_weights(uf, assign)
        scaled = uf * torch.index_select(w, 0, assign)
        emb = F.normalize(self.expert_emb, dim=1, eps=1e-4)
        logits = torch.matmul(scaled, emb.t()).reshape(B, N, self.num_experts)
        return self.gate_logits(logits)

    def forward(self, x: Tensor, assign: Tensor):  # type: ignore[override]
        self._assign = assign
        try:
            return super().forward(x)
        finally:
            self._assign = None


class ACMoEStack(nn.Module):
    """Layer 1 (standard SMoE) then layer 2 (ACMoE on layer 1's top-1 clusters). ``forward(x) -> y`` ``[B,N,D]``
    (or ``(y, (w1, idx1), (w2, idx2))`` with ``return_routing``). ``balance_loss_coef`` (the paper's recipe: 0.01
    for pre-training, 0.1 for fine-tuning, 003 App. C) and ``z_loss_coef`` apply to both layers' routers;
    :attr:`aux_loss` is their sum after a forward."""

    def __init__(self, d_model: int = 32, n_heads: int = 4, num_experts: int = 8, k: int = 2, d_ff: int = 64,
                 causal: bool = False, use_custom_ops: bool = True, return_routing: bool = False,
                 balance_loss_coef: float = 0.0, z_loss_coef: float = 0.0, **ac) -> None:
        super().__init__()
        self.d_model = d_model
        self.return_routing = return_routing
        losses = dict(balance_loss_coef=balance_loss_coef, z_loss_coef=z_loss_coef)
        self.layer1 = StandardSMoEBlock(d_model, n_heads, num_experts, k, d_ff, causal=causal,
                                        use_custom_ops=use_custom_ops, return_routing=True, **losses)
        self.layer2 = ACMoEBlock(d_model, n_heads, num_experts, k, d_ff, causal=causal,
                                 use_custom_ops=use_custom_ops, return_routing=True, **losses, **ac)

    @property
    def aux_loss(self) -> Tensor:
        """Both layers' auxiliary losses (see :class:`~moe_mlir.models.common.SMoEBlock`)."""
        return self.layer1.aux_loss + self.layer2.aux_loss

    def forward(self, x: Tensor):
        y1, w1, idx1 = self.layer1(x)
        top1 = idx1[..., 0]  # sorted: the argmax (ties -> lowest index)
        y2, w2, idx2 = self.layer2(y1, top1)
        if self.return_routing:
            return y2, (w1, idx1), (w2, idx2)
        return y2


def example(batch: int = 2, seq: int = 8, **kw) -> tuple[ACMoEStack, tuple[Tensor]]:
    torch.manual_seed(0)
    m = ACMoEStack(**kw).eval()
    return m, (torch.randn(batch, seq, m.d_model),)
