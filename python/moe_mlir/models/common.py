"""The parts every seed model shares: multi-head attention, the expert bank, the gate helpers and the block.

A block is pre-LN: ``h = x + MHA(LN1(x))``, ``u = LN2(h)``, ``y = h + MoE(u)``. The MoE evaluates every expert on
every token and combines with a dense gate matrix (zero outside the selected experts): the same values as a sparse
dispatch, with static shapes only, so the whole block exports and imports. The routers differ only in how they
produce ``(weights [T, k], indices [T, k])`` from ``u``.

Every router takes ``use_custom_ops``: True routes through ``torch.ops.moe.*`` (the dialect ops, 1:1); False writes
the same maths in plain PyTorch, in the idioms :mod:`moe_mlir.frontend.raising` recognizes, so that the importer still
produces the ``moe`` ops without the model knowing about them.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .. import ops as _ops  # noqa: F401  (torch.ops.moe.*)
from ..reference.routing import apply_capacity as _reference_capacity

__all__ = ["MultiHeadAttention", "AttentionOutput", "Experts", "gate_topk", "gate_topk_probs", "router_aux_loss",
           "SMoEBlock"]


class AttentionOutput:
    """What an attention layer exposes to a router (Attention-Inform needs all of it)."""

    def __init__(self, out: Tensor, scores: Tensor, v: Tensor, wo: Tensor) -> None:
        self.out = out  # [B, N, D]
        self.scores = scores  # [B, H, N, N] pre-softmax logits (-inf = masked)
        self.v = v  # [B, H, N, Dh]
        self.wo = wo  # [D, H*Dh]


class MultiHeadAttention(nn.Module):
    """Plain multi-head self-attention written out (scores are needed by Attention-Inform).

    Args:
        d_model: D. n_heads: H (D divisible by H). causal: mask keys j > i with ``-inf``.
    """

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, bias: bool = False) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.h, self.dh, self.causal = n_heads, d_model // n_heads, causal
        self.q = nn.Linear(d_model, d_model, bias=bias)
        self.k = nn.Linear(d_model, d_model, bias=bias)
        self.v = nn.Linear(d_model, d_model, bias=bias)
        self.o = nn.Linear(d_model, d_model, bias=False)  # no bias: the head means of eq 1 stay exact

    def forward(self, x: Tensor) -> AttentionOutput:
        """x: ``[B, N, D]``."""
        B, N, D = x.shape

        def heads(t: Tensor) -> Tensor:  # [B, N, D] -> [B, H, N, Dh]
            return t.reshape(B, N, self.h, self.dh).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh)
        if self.causal:
            mask = torch.ones(N, N, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        a = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(a, v).transpose(1, 2).reshape(B, N, D)
        return AttentionOutput(self.o(ctx), scores, v, self.o.weight)


class Experts(nn.Module):
    """E two-layer ReLU FFN experts ``D -> F -> D``, evaluated densely and combined by a gate.

    Parameters: ``w1 [E, D, F]``, ``b1 [E, F]``, ``w2 [E, F, D]``, ``b2 [E, D]``.
    """

    def __init__(self, num_experts: int, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        s1, s2 = 1.0 / math.sqrt(d_model), 1.0 / math.sqrt(d_ff)
        self.w1 = nn.Parameter(torch.empty(num_experts, d_model, d_ff).uniform_(-s1, s1))
        self.b1 = nn.Parameter(torch.zeros(num_experts, d_ff))
        self.w2 = nn.Parameter(torch.empty(num_experts, d_ff, d_model).uniform_(-s2, s2))
        self.b2 = nn.Parameter(torch.zeros(num_experts, d_model))

    def forward(self, u: Tensor, weights: Tensor, indices: Tensor) -> Tensor:
        """u: ``[T, D]``; weights, indices: ``[T, k]`` -> ``[T, D]``: ``Σ_s weights[t,s] · E_{indices[t,s]}(u_t)``."""
        gates = (F.one_hot(indices.long(), self.num_experts).to(u.dtype) * weights.to(u.dtype).unsqueeze(-1)).sum(1)
        h = torch.relu(torch.einsum("td,edf->etf", u, self.w1) + self.b1.unsqueeze(1))
        y = torch.einsum("etf,efd->etd", h, self.w2) + self.b2.unsqueeze(1)  # [E, T, D]
        return torch.einsum("te,etd->td", gates, y)


def gate_topk(logits: Tensor, k: int, use_custom_ops: bool) -> tuple[Tensor, Tensor]:
    """TopK-then-softmax gate on router logits (eq 2; ``moe.topk_renorm`` logits mode): (weights, indices)."""
    if use_custom_ops:
        return torch.ops.moe.topk_renorm(logits, k, "logits", True)
    val, idx = torch.topk(logits, k, dim=-1)
    return torch.softmax(val, dim=-1), idx


def gate_topk_probs(p: Tensor, k: int, renormalize: bool, use_custom_ops: bool) -> tuple[Tensor, Tensor]:
    """Top-k of probabilities, renormalized by the kept sum (TopM_Renormalize, 000 eq 11/17) or raw (004 eq 8)."""
    if use_custom_ops:
        return torch.ops.moe.topk_renorm(p, k, "probs", renormalize)
    val, idx = torch.topk(p, k, dim=-1)
    if renormalize:
        val = val / val.sum(-1, keepdim=True)
    return val, idx


def router_aux_loss(logits: Tensor, k: int, balance_loss_coef: float, z_loss_coef: float,
                    use_custom_ops: bool) -> Tensor:
    """``balance_loss_coef · L_balance + z_loss_coef · L_z`` of router logits ``[..., E]`` (an f32 scalar).

    ``L_balance`` is Switch's load-balancing loss ``E · Σ_e f_e · P_e`` (``f_e`` the fraction of tokens whose top-k
    holds e, ``P_e`` the mean softmax probability; transformers' ``load_balancing_loss_func``; ``moe.load_balancing_loss``),
    ``L_z`` ST-MoE's router z-loss ``mean_t logsumexp(logits_t)²`` (``moe.router_z_loss``). ``use_custom_ops=False``
    writes both in the idioms :mod:`moe_mlir.frontend.raising_losses` raises to those ops.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    E = flat.shape[-1]
    loss = flat.new_zeros((), dtype=torch.float32)
    if balance_loss_coef:
        if use_custom_ops:
            balance = torch.ops.moe.load_balancing_loss(flat, k)
        else:
            p = torch.softmax(flat.float(), dim=-1)
            f = F.one_hot(torch.topk(p, k, dim=-1).indices, E).float().mean(0)  # [k, E]: Σ over k is f
            balance = torch.sum(f * p.mean(0).unsqueeze(0)) * E
        loss = loss + balance_loss_coef * balance
    if z_loss_coef:
        z = torch.ops.moe.router_z_loss(flat) if use_custom_ops else torch.logsumexp(flat.float(), -1).pow(2).mean()
        loss = loss + z_loss_coef * z
    return loss


class SMoEBlock(nn.Module):
    """A pre-LN transformer block whose FFN is an SMoE; subclasses implement :meth:`route`.

    ``forward(x)`` with x ``[B, N, D]`` returns ``y`` ``[B, N, D]``, or ``(y, weights, indices)`` (``[B, N, k]``)
    when ``return_routing`` is set.

    Auxiliary losses (the papers' training recipes: ACMoE 0.01 for its Switch/GLaM backbones, 0.1 for fine-tuning;
    ST-MoE's z-loss 1e-3): with ``balance_loss_coef`` or ``z_loss_coef`` non-zero, a router with logits (the
    standard, ACMoE and HyperRouter gates) leaves ``aux_loss`` = :func:`router_aux_loss` of the batch's logits after
    each forward, to be added to the training loss; it is a zero scalar otherwise.

    Expert capacity (Switch Transformer, GShard): with ``capacity_factor`` set, each expert keeps at most
    ``capacity_of(B·N, k, E, capacity_factor)`` of the batch's assignments, claimed in the ``capacity_drop`` order
    (``"position"`` or ``"probability"``, :func:`moe_mlir.ops.apply_capacity`); a dropped assignment gets weight 0
    (the token passes through the residual only), and :attr:`dropped` holds the per-expert counts of the last forward.
    """

    def __init__(self, d_model: int, n_heads: int, num_experts: int, k: int, d_ff: int, causal: bool = False,
                 return_routing: bool = False, balance_loss_coef: float = 0.0, z_loss_coef: float = 0.0,
                 capacity_factor: Optional[float] = None, capacity_drop: str = "position") -> None:
        super().__init__()
        if not 1 <= k <= num_experts:
            raise ValueError(f"k ({k}) must be in [1, {num_experts}]")
        for name, c in (("balance_loss_coef", balance_loss_coef), ("z_loss_coef", z_loss_coef)):
            if not (c >= 0 and math.isfinite(c)):
                raise ValueError(f"{name} ({c}) must be a finite number >= 0")
        if capacity_factor is not None and not (capacity_factor >= 0 and math.isfinite(capacity_factor)):
            raise ValueError(f"capacity_factor ({capacity_factor}) must be a finite number >= 0")
        if capacity_drop not in ("position", "probability"):
            raise ValueError(f"capacity_drop must be 'position' or 'probability', got {capacity_drop!r}")
        self.capacity_factor, self.capacity_drop = capacity_factor, capacity_drop
        self.dropped: Optional[Tensor] = None
        self.d_model, self.num_experts, self.k = d_model, num_experts, k
        self.return_routing = return_routing
        self.balance_loss_coef, self.z_loss_coef = float(balance_loss_coef), float(z_loss_coef)
        self.aux_loss: Tensor = torch.zeros(())
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, causal=causal)
        self.ln2 = nn.LayerNorm(d_model)
        self.experts = Experts(num_experts, d_model, d_ff)

    def route(self, u: Tensor, attn: AttentionOutput) -> tuple[Tensor, Tensor]:
        """u: ``[B, N, D]`` -> (weights ``[B, N, k]``, indices ``[B, N, k]``)."""
        raise NotImplementedError

    def gate_logits(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """The TopK-then-softmax gate on the router's ``logits``; records :attr:`aux_loss` from them."""
        if self.balance_loss_coef or self.z_loss_coef:
            self.aux_loss = router_aux_loss(logits, self.k, self.balance_loss_coef, self.z_loss_coef,
                                            getattr(self, "use_custom_ops", True))
        return gate_topk(logits, self.k, getattr(self, "use_custom_ops", True))

    def apply_capacity(self, w: Tensor, idx: Tensor) -> Tensor:
        """The gate weights ``[B, N, k]`` with the assignments over the experts' capacity set to 0 (unchanged
        without ``capacity_factor``); records :attr:`dropped`."""
        if self.capacity_factor is None:
            return w
        T = w.shape[0] * w.shape[1]
        capacity = _ops.capacity_of(T, self.k, self.num_experts, self.capacity_factor)
        args = (idx.reshape(T, -1), w.reshape(T, -1), self.num_experts, capacity, self.capacity_drop)
        if getattr(self, "use_custom_ops", True):
            kept, self.dropped = torch.ops.moe.apply_capacity(*args)
        else:
            kept, self.dropped = _reference_capacity(*args)
        return kept.reshape(w.shape)

    def forward(self, x: Tensor):
        B, N, D = x.shape
        attn = self.attn(self.ln1(x))
        h = x + attn.out
        u = self.ln2(h)
        w, idx = self.route(u, attn)
        w = self.apply_capacity(w, idx)
        y = h + self.experts(u.reshape(B * N, D), w.reshape(B * N, -1), idx.reshape(B * N, -1)).reshape(B, N, D)
        if self.return_routing:
            return y, w, idx
        return y
