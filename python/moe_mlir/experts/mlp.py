"""``moe_mlir::expert_mlp``: the fused per-expert MLP on the CPU (each expert's rows gathered, both projections,
the gate and the routing weight applied and accumulated while its rows are in cache), with its backward."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import common
from .common import _spans

__all__ = ["expert_mlp", "GATES"]


# ----------------------------------------------------------------------------------------------------------------
# The fused per-expert MLP (CPU): each expert's rows gathered, both projections, gate and routing weight applied
# and accumulated while its rows are in cache
# ----------------------------------------------------------------------------------------------------------------

#: The gates :func:`expert_mlp` computes itself: ``"silu_glu"``: ``silu(h[:, :I]) * h[:, I:]`` (HF's default
#: ``_apply_gate`` with a SiLU ``act_fn``: Qwen3-MoE, Mixtral, OLMoE, DeepSeek-V3); ``"clamped_glu"``: gpt-oss's
#: interleaved, clamped GLU, ``(clamp(u, -limit, limit) + 1) * g' * sigmoid(alpha * g')`` with
#: ``g' = clamp(g, max=limit)``, ``g = h[:, 0::2]``, ``u = h[:, 1::2]``.
GATES = ("silu_glu", "clamped_glu")


def _check_mlp(x: Tensor, token: Tensor, offsets: Tensor, row_weight: Tensor, w1: Tensor, b1: Optional[Tensor],
               w2: Tensor, b2: Optional[Tensor], gate: str) -> None:
    if gate not in GATES:
        raise ValueError(f"expert_mlp: gate must be one of {GATES}, got {gate!r}")
    if x.dim() != 2 or w1.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"expert_mlp: x must be [T, D], w1 [E, 2I, D] and w2 [E, N, I], got {list(x.shape)}, "
                         f"{list(w1.shape)}, {list(w2.shape)}")
    E, N1, D = w1.shape
    if D != x.shape[1] or N1 % 2 or w2.shape[0] != E or w2.shape[2] != N1 // 2:
        raise ValueError(f"expert_mlp: w1 {list(w1.shape)} and w2 {list(w2.shape)} do not fit x {list(x.shape)} "
                         f"(w1 [E, 2I, D], w2 [E, N, I])")
    if token.dim() != 1 or row_weight.shape != token.shape:
        raise ValueError(f"expert_mlp: token and row_weight must be [S], got {list(token.shape)} and "
                         f"{list(row_weight.shape)}")
    if offsets.dim() != 1 or offsets.shape[0] != E + 1:
        raise ValueError(f"expert_mlp: offsets must be [E+1] = [{E + 1}], got {list(offsets.shape)}")
    for name, b, n in (("b1", b1, N1), ("b2", b2, w2.shape[1])):
        if b is not None and list(b.shape) != [E, n]:
            raise ValueError(f"expert_mlp: {name} must be [{E}, {n}], got {list(b.shape)}")
    # The dtypes: TypeError (the torch ops' policy, moe_mlir/ops/_checks.py).
    for name, t in (("token", token), ("offsets", offsets)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"expert_mlp: {name} must be int32 or int64, got {t.dtype}")
    if not row_weight.is_floating_point():
        raise TypeError(f"expert_mlp: row_weight must be floating-point, got {row_weight.dtype}")
    if any(t is not None and t.dtype != x.dtype for t in (w1, w2, b1, b2)):
        raise TypeError(f"expert_mlp: the weights and biases must have the dtype of x ({x.dtype})")


def _linear_into(out: Tensor, x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    """``F.linear(x, w, b)`` (the same BLAS call: ``x @ w.T``, ``addmm`` with a bias) written into ``out``."""
    if b is None:
        return torch.mm(x, w.t(), out=out)
    return torch.addmm(b, x, w.t(), out=out)


def _gate_into(out: Tensor, tmp: Tensor, h: Tensor, gate: str, alpha: float, limit: float) -> Tensor:
    """The gate of ``h`` [n, 2I] into ``out`` [n, I] (``tmp``: scratch [n, I]), the operations HF applies."""
    if gate == "silu_glu":
        i = out.shape[1]
        torch.ops.aten.silu.out(h[:, :i], out=out)
        return out.mul_(h[:, i:])
    torch.clamp(h[:, 0::2], max=limit, out=out)  # gpt-oss: gate = clamp(g, max=limit)
    torch.mul(out, alpha, out=tmp)
    torch.sigmoid(tmp, out=tmp)
    out.mul_(tmp)  # glu = gate * sigmoid(gate * alpha)
    torch.clamp(h[:, 1::2], min=-limit, max=limit, out=tmp)
    return out.mul_(tmp.add_(1))  # (up + 1) * glu


def _gate_backward(h: Tensor, grad: Tensor, gate: str, alpha: float, limit: float) -> Tensor:
    """d gate(h) / d h applied to ``grad`` [n, I]: [n, 2I] (clamp's gradient as torch's: 1 inside the open range,
    0 at and beyond the bounds)."""
    dh = torch.empty_like(h)
    if gate == "silu_glu":
        i = grad.shape[1]
        g, u = h[:, :i], h[:, i:]
        s = torch.sigmoid(g)
        dh[:, i:] = grad * torch.nn.functional.silu(g)
        dh[:, :i] = grad * u * s * (1 + g * (1 - s))
        return dh
    g, u = h[:, 0::2], h[:, 1::2]
    gc = g.clamp(max=limit)
    s = torch.sigmoid(gc * alpha)
    dh[:, 1::2] = torch.where((u > -limit) & (u < limit), grad * (gc * s), 0)
    dh[:, 0::2] = torch.where(g < limit, grad * (u.clamp(-limit, limit) + 1) * (s + gc * alpha * s * (1 - s)), 0)
    return dh


@torch.library.custom_op("moe_mlir::expert_mlp", mutates_args=())
def _expert_mlp_op(x: Tensor, token: Tensor, offsets: Tensor, row_weight: Tensor, w1: Tensor, b1: Optional[Tensor],
                   w2: Tensor, b2: Optional[Tensor], gate: str, alpha: float, limit: float) -> Tensor:
    _check_mlp(x, token, offsets, row_weight, w1, b1, w2, b2, gate)
    if token.numel() and int(offsets[-1]) != token.shape[0]:
        raise ValueError(f"expert_mlp: offsets[-1] = {int(offsets[-1])} must equal the number of rows "
                         f"{token.shape[0]}")
    if common._native_mlp(x):
        return torch.ops.moe_mlir.expert_mlp_cpu(x, token, offsets, row_weight, w1, b1, w2, b2, gate, alpha, limit)
    out = x.new_zeros((x.shape[0], w2.shape[1]))
    spans = list(_spans(offsets))
    rows = max((b - a for _, a, b in spans), default=0)
    i = w2.shape[2]
    # One set of buffers for all experts (sized for the largest): each expert's rows stay in cache from the
    # gather to the accumulation, and nothing is allocated per expert.
    xb, hb = x.new_empty((rows, x.shape[1])), x.new_empty((rows, w1.shape[1]))
    ab, tb, yb = x.new_empty((rows, i)), x.new_empty((rows, i)), x.new_empty((rows, w2.shape[1]))
    for e, a, b in spans:
        n, tok = b - a, token[a:b]
        xe = torch.index_select(x, 0, tok, out=xb[:n])
        h = _linear_into(hb[:n], xe, w1[e], None if b1 is None else b1[e])
        act = _gate_into(ab[:n], tb[:n], h, gate, alpha, limit)
        y = _linear_into(yb[:n], act, w2[e], None if b2 is None else b2[e])
        # HF's order: the routing weight on the expert's output, then index_add_ in increasing expert order
        # (index_add_ on CPU adds the rows one after the other: deterministic).
        out.index_add_(0, tok, y.mul_(row_weight[a:b, None]))
    return out


@_expert_mlp_op.register_fake
def _(x, token, offsets, row_weight, w1, b1, w2, b2, gate, alpha, limit):
    _check_mlp(x, token, offsets, row_weight, w1, b1, w2, b2, gate)
    return x.new_empty((x.shape[0], w2.shape[1]))


@torch.library.custom_op("moe_mlir::expert_mlp_backward", mutates_args=())
def _expert_mlp_backward_op(grad: Tensor, x: Tensor, token: Tensor, offsets: Tensor, row_weight: Tensor, w1: Tensor,
                            b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor], gate: str, alpha: float,
                            limit: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`expert_mlp` w.r.t. x, row_weight, w1, b1, w2, b2 (each expert's forward recomputed;
    the bias gradients are empty ``[0]`` tensors where there is no bias)."""
    if common._native_mlp(x) and int(offsets[-1]) == token.shape[0]:
        return torch.ops.moe_mlir.expert_mlp_backward_cpu(grad, x, token, offsets, row_weight, w1, b1, w2, b2, gate,
                                                          alpha, limit)
    grad_x, grad_rw = torch.zeros_like(x), torch.zeros_like(row_weight)
    grad_w1, grad_w2 = torch.zeros(w1.shape, dtype=w1.dtype), torch.zeros(w2.shape, dtype=w2.dtype)
    grad_b1 = torch.zeros((w1.shape[0], w1.shape[1]) if b1 is not None else (0,), dtype=x.dtype)
    grad_b2 = torch.zeros((w2.shape[0], w2.shape[1]) if b2 is not None else (0,), dtype=x.dtype)
    for e, a, b in _spans(offsets):
        tok = token[a:b]
        xe, ge = x[tok], grad[tok]
        h = torch.nn.functional.linear(xe, w1[e], None if b1 is None else b1[e])
        act = _gate_into(torch.empty(h.shape[0], w2.shape[2], dtype=h.dtype), torch.empty(h.shape[0], w2.shape[2],
                         dtype=h.dtype), h, gate, alpha, limit)
        y = torch.nn.functional.linear(act, w2[e], None if b2 is None else b2[e])
        grad_rw[a:b] = (ge * y).sum(1).to(grad_rw.dtype)
        dy = ge * row_weight[a:b, None].to(ge.dtype)
        torch.mm(dy.t(), act, out=grad_w2[e])
        if b2 is not None:
            grad_b2[e] = dy.sum(0)
        dh = _gate_backward(h, dy @ w2[e], gate, alpha, limit)
        torch.mm(dh.t(), xe, out=grad_w1[e])
        if b1 is not None:
            grad_b1[e] = dh.sum(0)
        grad_x.index_add_(0, tok, dh @ w1[e])
    return grad_x, grad_rw, grad_w1, grad_b1, grad_w2, grad_b2


@_expert_mlp_backward_op.register_fake
def _(grad, x, token, offsets, row_weight, w1, b1, w2, b2, gate, alpha, limit):
    def bias(b, w):
        return x.new_empty((w.shape[0], w.shape[1]) if b is not None else (0,))
    return (torch.empty_like(x), torch.empty_like(row_weight), x.new_empty(w1.shape), bias(b1, w1),
            x.new_empty(w2.shape), bias(b2, w2))


def _expert_mlp_setup(ctx, inputs, output):
    x, token, offsets, row_weight, w1, b1, w2, b2, gate, alpha, limit = inputs
    ctx.save_for_backward(x, token, offsets, row_weight, w1, b1, w2, b2)
    ctx.gate = (gate, alpha, limit)
    ctx.has_bias = (b1 is not None, b2 is not None)


def _expert_mlp_backward(ctx, grad):
    x, token, offsets, row_weight, w1, b1, w2, b2 = ctx.saved_tensors
    gx, grw, gw1, gb1, gw2, gb2 = _expert_mlp_backward_op(grad.contiguous(), x, token, offsets, row_weight, w1, b1,
                                                          w2, b2, *ctx.gate)
    return (gx, None, None, grw, gw1, gb1 if ctx.has_bias[0] else None, gw2, gb2 if ctx.has_bias[1] else None,
            None, None, None)


_expert_mlp_op.register_autograd(_expert_mlp_backward, setup_context=_expert_mlp_setup)


def expert_mlp(x: Tensor, token: Tensor, offsets: Tensor, row_weight: Tensor, w1: Tensor, w2: Tensor, gate: str, *,
               b1: Optional[Tensor] = None, b2: Optional[Tensor] = None, alpha: float = 1.0,
               limit: float = float("inf")) -> Tensor:
    """``out[t] = sum_r row_weight[r] * (gate(x[t] @ w1[e].T + b1[e]) @ w2[e].T + b2[e])`` over the rows ``r`` with
    ``token[r] = t``, ``e`` the expert of row ``r`` (rows ``offsets[e]:offsets[e+1]``), in increasing expert order.

    One opaque op (``torch.ops.moe_mlir.expert_mlp``, CPU, with a registered backward that recomputes each expert's
    forward): per expert, the gather of its rows, both projections (BLAS on the weight slices, no copies), the gate
    (:data:`GATES`) and the routing weight, summed into the output in increasing expert order, all in buffers
    reused across experts — nothing of size rows x features but the weighted outputs goes through memory. f32/f64
    run the extension's kernel (experts over torch's threads), other dtypes the Python loop.

    Args:
        x: ``[T, D]``; token: ``[S]`` the token of each expert-sorted row; offsets: ``[E+1]``; row_weight: ``[S]``;
        w1: ``[E, 2I, D]``, w2: ``[E, N, I]`` (``nn.Linear`` layout, any strides); b1: ``[E, 2I]``, b2: ``[E, N]``.
    """
    return _expert_mlp_op(x, token, offsets, row_weight, w1, b1, w2, b2, gate, float(alpha), float(limit))
