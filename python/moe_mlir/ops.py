"""Torch custom ops for the six ops of the ``moe`` dialect, with eager reference implementations.

Every op is registered with :func:`torch.library.custom_op` as ``moe::<name>`` so that ``torch.export`` and FX keep
it as one opaque node (``torch.ops.moe.<name>``), which the importer maps to the dialect op of the same name. The
operand order, attribute names and defaults are those of ``shared/spec/DIALECT.md`` and ``include/MoE/IR/MoEOps.td``;
enum attributes are plain strings (``mode="probs"``).

The eager kernels are the *reference semantics* of the dialect (the op descriptions in MoEOps.td, which the C++
libtorch reference tests follow too):

* device-agnostic torch code (CPU and CUDA), f16/bf16 inputs upcast, everything accumulated in f32;
* ties in any top-k/argmin break to the lowest index, NaN ranks above every number in a top-k;
* masked (``-inf``) logits get no probability and a fully masked row yields zeros, never NaN;
* index operands out of range raise :class:`ValueError` (the compiled code reports a run-time error).

Validation mirrors the verifier (same rules, messages naming the operand and the rule) and runs in the fake kernels
too, so ``torch.export`` rejects a bad call at trace time.

Autograd: ``topk_renorm``, ``similarity_inform``, ``attention_posterior`` and ``hyper_router`` are differentiable
(gradients through the selected values only, none through indices or the head choice); the backward recomputes the
reference formulation under autograd. ``mad_dispersion`` and ``adjacency_update`` are stop-gradient (003 §5.10,
004 §1.2).
"""

from __future__ import annotations

import contextvars
import math
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

__all__ = [
    "topk_renorm",
    "similarity_inform",
    "attention_posterior",
    "mad_dispersion",
    "adjacency_update",
    "hyper_router",
    "OP_NAMES",
]

#: The dialect ops, in DIALECT.md order; ``torch.ops.moe.<name>`` exists for each.
OP_NAMES: tuple[str, ...] = (
    "topk_renorm",
    "similarity_inform",
    "attention_posterior",
    "mad_dispersion",
    "adjacency_update",
    "hyper_router",
)

TOPK_MODES = ("logits", "probs")
HEAD_SELECTS = ("min_entropy", "all")
NORMALIZES = ("feature", "expert", "global")
MEASURES = ("mad", "variance")
EMPTIES = ("identity", "raw")
ADJ_NORMS = ("row", "col", "none")

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)
_NEG_INF = float("-inf")
_IN_BACKWARD: contextvars.ContextVar[bool] = contextvars.ContextVar("moe_in_backward", default=False)


# ----------------------------------------------------------------------------------------------------------------
# Validation (the verifier's rules; also run by the fake kernels)
# ----------------------------------------------------------------------------------------------------------------


def _fail(op: str, msg: str) -> None:
    raise ValueError(f"moe.{op}: {msg}")


def _check_float(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"moe.{op}: '{name}' must be f32, f16 or bf16, got {t.dtype}")


def _check_index(op: str, name: str, t: Tensor) -> None:
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"moe.{op}: '{name}' must be i32 or i64, got {t.dtype}")


def _check_rank(op: str, name: str, t: Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        _fail(op, f"'{name}' must have rank {rank} ({layout}), got shape {list(t.shape)}")


def _check_dim(op: str, name: str, t: Tensor, d: int, expected: int, what: str) -> None:
    if t.shape[d] != expected:
        _fail(op, f"dimension {d} of '{name}' ({t.shape[d]}) must equal {what} ({expected})")


def _check_enum(op: str, attr: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        _fail(op, f"'{attr}' must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")


def _check_positive_finite(op: str, attr: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        _fail(op, f"'{attr}' ({value}) must be > 0 and finite")


def _check_index_range(op: str, name: str, t: Tensor, bound: int) -> None:
    """Raises on any value of ``t`` outside ``[0, bound)`` (a data-dependent check: eager kernels only)."""
    if t.numel() == 0:
        return
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= bound:
        bad = lo if lo < 0 else hi
        _fail(op, f"'{name}' holds {bad}, outside [0, {bound}): the value indexes no expert")


# ----------------------------------------------------------------------------------------------------------------
# Shared numerics
# ----------------------------------------------------------------------------------------------------------------


def _select_desc(x: Tensor, k: int) -> Tensor:
    """Indices (int64) of the ``k`` largest entries of each row of ``x`` ([..., K]), sorted by descending value.

    Ties break to the lowest index and NaN ranks above every number (+inf included): two stable sorts, the second
    (on "is NaN") dominant. ``torch.topk`` documents neither rule.
    """
    nan = torch.isnan(x)
    keyed = torch.where(nan, torch.full_like(x, float("inf")), x)
    order = torch.sort(keyed, dim=-1, descending=True, stable=True).indices
    nan_first = torch.sort(torch.gather(nan, -1, order).to(torch.uint8), dim=-1, descending=True, stable=True).indices
    order = torch.gather(order, -1, nan_first)
    return order[..., :k]


def _masked_softmax(z: Tensor, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` in f32 where a slice whose every entry is ``-inf`` gives zeros instead of NaN."""
    all_masked = (z == _NEG_INF).all(dim=dim, keepdim=True)
    s = torch.softmax(z, dim=dim)
    return torch.where(all_masked, torch.zeros_like(s), s)


def _mix(s: Tensor, e: Tensor, valid: Tensor) -> Tensor:
    """``p[b,i,:] = Σ_{j valid} s[b,i,j] e[b,j,:]`` for s [B,N,Nk] (zero where invalid), e [B,Nk,K], valid [B,N,Nk].

    A plain ``s @ e`` would let a non-finite ``e`` at an excluded key leak in as ``0 · NaN``; the finite part goes
    through the matmul and the (rare) non-finite entries are added back only where their key is valid.
    """
    finite = torch.isfinite(e)
    p = torch.matmul(s, torch.where(finite, e, torch.zeros_like(e)))
    # The fix-up is data-dependent; the backward (traced by AOT autograd) differentiates the finite part only.
    if not _IN_BACKWARD.get() and not bool(finite.all()):
        b, j, k = (~finite).nonzero(as_tuple=True)
        contrib = torch.where(valid[b, :, j], s[b, :, j] * e[b, j, k][:, None], torch.zeros_like(s[b, :, j]))
        # p[b, :, k] += contrib, one row of contributions per non-finite entry
        flat = p.permute(0, 2, 1).reshape(-1, p.shape[1])
        flat = flat.index_add(0, b * p.shape[2] + k, contrib)
        p = flat.reshape(p.shape[0], p.shape[2], p.shape[1]).permute(0, 2, 1).contiguous()
    return p


# ----------------------------------------------------------------------------------------------------------------
# Reference formulations (plain differentiable torch; the custom ops call them)
# ----------------------------------------------------------------------------------------------------------------


def _topk_renorm_ref(scores: Tensor, k: int, mode: str, renormalize: bool) -> tuple[Tensor, Tensor]:
    x = scores.float()
    idx = _select_desc(x.detach(), k)
    sel = torch.gather(x, -1, idx)
    if mode == "logits":
        if renormalize:
            w = _masked_softmax(sel)
        else:
            w = torch.gather(_masked_softmax(x), -1, idx)
    else:
        if renormalize:
            den = sel.sum(-1, keepdim=True)
            zero = den == 0
            w = torch.where(zero, torch.zeros_like(sel), sel / torch.where(zero, torch.ones_like(den), den))
        else:
            w = sel
    return w, idx.to(torch.int32)


def _similarity_inform_ref(
    u: Tensor, e: Tensor, ws: Optional[Tensor], key_mask: Optional[Tensor], tau: float, causal: bool
) -> Tensor:
    B, N, _ = u.shape
    uf, ef = u.float(), e.float()
    q = uf if ws is None else torch.matmul(uf, ws.float())
    logits = torch.matmul(q, uf.transpose(-1, -2)) / tau  # [B,N,N]
    valid = torch.ones(B, N, N, dtype=torch.bool, device=u.device)
    if causal:
        valid = valid & torch.ones(N, N, dtype=torch.bool, device=u.device).tril()
    if key_mask is not None:
        valid = valid & key_mask.bool()[:, None, :]
    logits = logits.masked_fill(~valid, _NEG_INF)
    s = _masked_softmax(logits)
    return _mix(s, ef, valid)


def _head_means(v: Tensor, wo: Tensor, head_scale: float) -> Tensor:
    """``m[b,h,j,:] = head_scale · v[b,h,j,:] · wo[:, h·Dh:(h+1)·Dh]^T``: [B,H,Nk,D]."""
    _, H, _, Dh = v.shape
    D = wo.shape[0]
    return head_scale * torch.einsum("bhjc,dhc->bhjd", v.float(), wo.float().reshape(D, H, Dh))


def _attention_posterior_ref(
    scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, sigma: float, head_select: str,
    head_scale: Optional[float],
) -> tuple[Tensor, Tensor]:
    B, H, N, Nk = scores.shape
    sc, uf, ef = scores.float(), u.float(), e.float()
    m = _head_means(v, wo, float(H) if head_scale is None else head_scale)  # [B,H,Nk,D]
    s2 = sigma * sigma
    ll = (torch.einsum("bid,bhjd->bhij", uf, m) - 0.5 * (m * m).sum(-1)[:, :, None, :]) / s2  # [B,H,N,Nk]
    key_valid = sc != _NEG_INF  # [B,H,N,Nk]
    row_masked = (~key_valid).all(-1)  # [B,H,N]
    if head_select == "min_entropy":
        with torch.no_grad():
            log_a = torch.log_softmax(sc, -1)
            term = torch.where(torch.isneginf(log_a), torch.zeros_like(log_a), log_a.exp() * log_a)
            ent = -term.sum(-1)  # [B,H,N]; NaN rows stay NaN
            ent = torch.where(row_masked, torch.zeros_like(ent), ent)
            n_valid = (~row_masked).sum(-1)  # [B,H]
            mean = ent.sum(-1) / n_valid.clamp_min(1).to(ent.dtype)  # a head with no valid row: 0
            head = _argmin_nan_first(mean)  # [B]
        bidx = torch.arange(B, device=scores.device)
        z = sc[bidx, head] + ll[bidx, head]  # [B,N,Nk]
        valid = key_valid[bidx, head]
        a_post = _masked_softmax(z.masked_fill(~valid, _NEG_INF))
        return _mix(a_post, ef, valid), head.to(torch.int32)
    # head_select == "all": eq 13/14 with the head posterior H'
    log_a = torch.log_softmax(sc, -1).masked_fill(row_masked[..., None], _NEG_INF)
    z = (log_a + ll).masked_fill(~key_valid, _NEG_INF)
    a_post = _masked_softmax(z)  # [B,H,N,Nk]
    h_post = _masked_softmax(torch.logsumexp(z, -1), dim=1)  # [B,H,N]
    valid = key_valid.any(1)  # a key is mixed when some head can see it
    weighted = (h_post[..., None] * a_post).sum(1)  # [B,N,Nk]
    p = _mix(weighted, ef, valid)
    return p, torch.full((B,), -1, dtype=torch.int32, device=scores.device)


def _argmin_nan_first(x: Tensor) -> Tensor:
    """argmin over the last dim: lowest index on ties, and a NaN counts as the minimum (first NaN wins)."""
    nan = torch.isnan(x)
    mn = torch.where(nan, torch.full_like(x, float("inf")), x).min(-1, keepdim=True).values
    cand = torch.where(nan.any(-1, keepdim=True), nan, x == mn)
    return cand.to(torch.uint8).argmax(-1)  # argmax returns the first maximal index


def _mad_dispersion_ref(
    tokens: Tensor, assign: Tensor, num_experts: int, eps: float, clip: float, normalize: str, measure: str,
    empty: str,
) -> tuple[Tensor, Tensor]:
    x = tokens.float()
    E = num_experts
    a = assign.long()
    # One-hot matmuls rather than index_add: deterministic on every device (no atomics).
    onehot = torch.nn.functional.one_hot(a, E).to(torch.float32)  # [T,E]
    counts = onehot.sum(0)  # [E], exact in f32 below 2^24 tokens
    denom = torch.where(counts > 0, counts, torch.ones_like(counts))[:, None]
    mu = torch.matmul(onehot.t(), x) / denom  # empty cluster: 0
    dev = x - mu[a]
    dev = dev.abs() if measure == "mad" else dev * dev
    s = torch.matmul(onehot.t(), dev) / denom  # [E,D]
    w = 1.0 / (s + eps)
    if empty == "identity":
        valid = (counts >= 2)[:, None].expand_as(w)
    else:
        valid = torch.ones_like(w, dtype=torch.bool)
    vf = valid.to(w.dtype)
    # Means over the valid entries only; `where` keeps NaN of excluded rows out of the statistics.
    wv = torch.where(valid, w, torch.zeros_like(w))
    if clip > 0:
        mean_all = wv.sum() / vf.sum().clamp_min(1)
        w = torch.minimum(w, clip * mean_all)
        wv = torch.where(valid, w, torch.zeros_like(w))
    if normalize == "feature":
        scale = wv.sum(0, keepdim=True) / vf.sum(0, keepdim=True).clamp_min(1)
    elif normalize == "expert":
        scale = wv.sum(1, keepdim=True) / vf.sum(1, keepdim=True).clamp_min(1)
    else:
        scale = wv.sum() / vf.sum().clamp_min(1)
    w = w / scale
    w = torch.where(valid, w, torch.ones_like(w))
    return w, counts.to(torch.int32)


def _adjacency_update_ref(a: Tensor, idx: Tensor, beta: float, norm: str, include_self: bool) -> Tensor:
    E = a.shape[0]
    # Indicator S[t,j] = 1[j in idx[t,:]] (a repeated index counts once), counts C = S^T S in f64: exact integers.
    sel = torch.zeros(idx.shape[0], E, dtype=torch.float64, device=a.device)
    sel = sel.scatter(1, idx.long(), 1.0)
    c = torch.matmul(sel.t(), sel)
    if not include_self:
        c = c * (1 - torch.eye(E, dtype=c.dtype, device=c.device))
    if norm == "row":
        d = c.sum(1, keepdim=True)
    elif norm == "col":
        d = c.sum(0, keepdim=True)
    else:
        d = None
    if d is not None:
        c = torch.where(d > 0, c / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(c))
    return beta * a.float() + (1.0 - beta) * c.to(torch.float32)


def _hyper_router_ref(
    emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, num_experts: int
) -> tuple[Tensor, Tensor]:
    hidden = torch.relu(torch.matmul(w1.float(), emb.float()) + b1.float())
    out = (torch.matmul(w2.float(), hidden) + b2.float()).reshape(num_experts, -1)
    return out[:, :-1].clone(), out[:, -1].clone()  # clones: outputs must not alias each other


# ----------------------------------------------------------------------------------------------------------------
# Autograd: recompute the reference under autograd (the kernels are cheap next to the experts)
# ----------------------------------------------------------------------------------------------------------------


def _register_recompute_autograd(op, ref: Callable, n_tensor_args: int, float_outputs: Sequence[int]) -> None:
    """Registers a backward that re-runs ``ref`` with grad enabled and returns the input gradients.

    ``n_tensor_args``: the leading (optional) tensor operands; the rest are attributes. ``float_outputs``: the
    outputs that carry gradients (index outputs do not).
    """

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*[t if isinstance(t, Tensor) else None for t in inputs[:n_tensor_args]])
        ctx.attrs = inputs[n_tensor_args:]
        ctx.present = [isinstance(t, Tensor) for t in inputs[:n_tensor_args]]

    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        leaves = []
        for t, present in zip(saved, ctx.present):
            if present and t.is_floating_point():
                leaves.append(t.detach().requires_grad_(True))
            else:
                leaves.append(t)
        token = _IN_BACKWARD.set(True)
        try:
            with torch.enable_grad():
                outs = ref(*leaves, *ctx.attrs)
                outs = outs if isinstance(outs, tuple) else (outs,)
                want = [(i, t) for i, t in enumerate(leaves) if isinstance(t, Tensor) and t.requires_grad]
                pairs = [(outs[o], grads[o]) for o in float_outputs if grads[o] is not None]
                result: list[Optional[Tensor]] = [None] * len(saved)
                if want and pairs:
                    gs = torch.autograd.grad(
                        [p[0] for p in pairs], [t for _, t in want], [p[1] for p in pairs], allow_unused=True
                    )
                    for (i, t), g in zip(want, gs):
                        result[i] = None if g is None else g.to(t.dtype)
        finally:
            _IN_BACKWARD.reset(token)
        return tuple(result) + (None,) * len(ctx.attrs)

    op.register_autograd(backward, setup_context=setup_context)


# ----------------------------------------------------------------------------------------------------------------
# 1. topk_renorm
# ----------------------------------------------------------------------------------------------------------------


def _validate_topk_renorm(scores: Tensor, k: int, mode: str) -> None:
    _check_float("topk_renorm", "scores", scores)
    if scores.dim() < 1:
        _fail("topk_renorm", "'scores' must have rank >= 1 ([..., K])")
    K = scores.shape[-1]
    if not 1 <= k <= K:
        _fail("topk_renorm", f"'k' ({k}) must be in [1, {K}] (the size of the last dimension of 'scores')")
    _check_enum("topk_renorm", "mode", mode, TOPK_MODES)


@torch.library.custom_op("moe::topk_renorm", mutates_args=())
def topk_renorm(scores: Tensor, k: int, mode: str = "logits", renormalize: bool = True) -> tuple[Tensor, Tensor]:
    """Top-k expert selection with gate weights (``moe.topk_renorm``).

    Args:
        scores: ``[..., K]`` router logits (``mode="logits"``) or probabilities (``mode="probs"``), f32/f16/bf16.
        k: experts per row, ``1 <= k <= K``.
        mode: ``"logits"``: weights = softmax over the k selected logits (``renormalize=True``) or the dense
            softmax read at the selected experts (``False``). ``"probs"``: the selected values divided by their
            sum (``True``; a zero sum gives zero weights) or left raw (``False``).
        renormalize: see ``mode``.

    Returns:
        ``(weights [..., k] f32, indices [..., k] i32)`` sorted by descending score; ties -> lowest index; NaN ranks
        first; a fully ``-inf`` row gives zero weights and indices ``0..k-1``.
    """
    _validate_topk_renorm(scores, k, mode)
    return _topk_renorm_ref(scores, k, mode, renormalize)


@topk_renorm.register_fake
def _(scores: Tensor, k: int, mode: str = "logits", renormalize: bool = True) -> tuple[Tensor, Tensor]:
    _validate_topk_renorm(scores, k, mode)
    shape = (*scores.shape[:-1], k)
    return scores.new_empty(shape, dtype=torch.float32), scores.new_empty(shape, dtype=torch.int32)


_register_recompute_autograd(topk_renorm, _topk_renorm_ref, 1, (0,))


# ----------------------------------------------------------------------------------------------------------------
# 2. similarity_inform
# ----------------------------------------------------------------------------------------------------------------


def _validate_similarity_inform(
    u: Tensor, e: Tensor, ws: Optional[Tensor], key_mask: Optional[Tensor], tau: float
) -> None:
    op = "similarity_inform"
    _check_float(op, "u", u)
    _check_float(op, "e", e)
    _check_rank(op, "u", u, 3, "[B, N, D]")
    _check_rank(op, "e", e, 3, "[B, N, K]")
    _check_dim(op, "e", e, 0, u.shape[0], "dimension 0 of 'u' (B)")
    _check_dim(op, "e", e, 1, u.shape[1], "dimension 1 of 'u' (N)")
    if ws is not None:
        _check_float(op, "ws", ws)
        _check_rank(op, "ws", ws, 2, "[D, D]")
        _check_dim(op, "ws", ws, 0, u.shape[2], "dimension 2 of 'u' (D)")
        _check_dim(op, "ws", ws, 1, u.shape[2], "dimension 2 of 'u' (D)")
    if key_mask is not None:
        if key_mask.dtype != torch.bool:
            raise TypeError(f"moe.{op}: 'key_mask' must be bool (i1), got {key_mask.dtype}")
        _check_rank(op, "key_mask", key_mask, 2, "[B, N]")
        _check_dim(op, "key_mask", key_mask, 0, u.shape[0], "dimension 0 of 'u' (B)")
        _check_dim(op, "key_mask", key_mask, 1, u.shape[1], "dimension 1 of 'u' (N)")
    _check_positive_finite(op, "tau", tau)


@torch.library.custom_op("moe::similarity_inform", mutates_args=())
def similarity_inform(
    u: Tensor,
    e: Tensor,
    ws: Optional[Tensor] = None,
    key_mask: Optional[Tensor] = None,
    tau: float = 1.0,
    causal: bool = False,
) -> Tensor:
    """Similarity-Inform mixing (``moe.similarity_inform``, Mutual-Inform eq 5, 8).

    ``p[b,i,:] = Σ_j S[b,i,j] e[b,j,:]`` with ``S[b,i,:] = softmax_j(u_i^T W_s u_j / tau)`` over the tokens of
    sequence ``b`` (``j = i`` included; ``W_s`` = identity when ``ws`` is None).

    Args:
        u: ``[B, N, D]`` MoE inputs. e: ``[B, N, K]`` router probabilities. ws: optional ``[D, D]``.
        key_mask: optional ``[B, N]`` bool, False keys are excluded. tau: > 0, finite. causal: only ``j <= i``.

    Returns:
        ``p`` ``[B, N, K]`` f32; a row with every key excluded gives zeros; NaN propagates to the rows mixing it.
    """
    _validate_similarity_inform(u, e, ws, key_mask, tau)
    return _similarity_inform_ref(u, e, ws, key_mask, tau, causal)


@similarity_inform.register_fake
def _(u, e, ws=None, key_mask=None, tau=1.0, causal=False):
    _validate_similarity_inform(u, e, ws, key_mask, tau)
    return e.new_empty(e.shape, dtype=torch.float32)


_register_recompute_autograd(similarity_inform, _similarity_inform_ref, 4, (0,))


# ----------------------------------------------------------------------------------------------------------------
# 3. attention_posterior
# ----------------------------------------------------------------------------------------------------------------


def _validate_attention_posterior(
    scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, sigma: float, head_select: str,
    head_scale: Optional[float],
) -> None:
    op = "attention_posterior"
    for name, t in (("scores", scores), ("u", u), ("v", v), ("wo", wo), ("e", e)):
        _check_float(op, name, t)
    _check_rank(op, "scores", scores, 4, "[B, H, N, Nk]")
    _check_rank(op, "u", u, 3, "[B, N, D]")
    _check_rank(op, "v", v, 4, "[B, H, Nk, Dh]")
    _check_rank(op, "wo", wo, 2, "[D, H*Dh]")
    _check_rank(op, "e", e, 3, "[B, Nk, K]")
    B, H, N, Nk = scores.shape
    _check_dim(op, "u", u, 0, B, "dimension 0 of 'scores' (B)")
    _check_dim(op, "u", u, 1, N, "dimension 2 of 'scores' (N)")
    _check_dim(op, "v", v, 0, B, "dimension 0 of 'scores' (B)")
    _check_dim(op, "v", v, 1, H, "dimension 1 of 'scores' (H)")
    _check_dim(op, "v", v, 2, Nk, "dimension 3 of 'scores' (Nk)")
    _check_dim(op, "wo", wo, 0, u.shape[2], "dimension 2 of 'u' (D)")
    _check_dim(op, "wo", wo, 1, H * v.shape[3], "H * Dh")
    _check_dim(op, "e", e, 0, B, "dimension 0 of 'scores' (B)")
    _check_dim(op, "e", e, 1, Nk, "dimension 3 of 'scores' (Nk)")
    _check_positive_finite(op, "sigma", sigma)
    _check_enum(op, "head_select", head_select, HEAD_SELECTS)
    if head_scale is not None and not math.isfinite(head_scale):
        _fail(op, f"'head_scale' ({head_scale}) must be finite")


@torch.library.custom_op("moe::attention_posterior", mutates_args=())
def attention_posterior(
    scores: Tensor,
    u: Tensor,
    v: Tensor,
    wo: Tensor,
    e: Tensor,
    sigma: float = 1.0,
    head_select: str = "min_entropy",
    head_scale: Optional[float] = None,
) -> tuple[Tensor, Tensor]:
    """Attention-Inform mixing through the attention posterior (``moe.attention_posterior``, Lemma 1, eq 13-17).

    Args:
        scores: ``[B, H, N, Nk]`` pre-softmax attention logits (``-inf`` = masked). u: ``[B, N, D]``.
        v: ``[B, H, Nk, Dh]`` per-head values. wo: ``[D, H*Dh]`` out-projection (nn.Linear layout).
        e: ``[B, Nk, K]`` router probabilities of the keys. sigma: > 0, finite.
        head_select: ``"min_entropy"`` (eq 15, the head of lowest mean prior entropy) or ``"all"`` (eq 13).
        head_scale: factor of the head means (default H).

    Returns:
        ``(p [B, N, K] f32, head [B] i32)``; ``head`` is ``-1`` for ``"all"``.
    """
    _validate_attention_posterior(scores, u, v, wo, e, sigma, head_select, head_scale)
    return _attention_posterior_ref(scores, u, v, wo, e, sigma, head_select, head_scale)


@attention_posterior.register_fake
def _(scores, u, v, wo, e, sigma=1.0, head_select="min_entropy", head_scale=None):
    _validate_attention_posterior(scores, u, v, wo, e, sigma, head_select, head_scale)
    B, _, N, _ = scores.shape
    return (
        e.new_empty((B, N, e.shape[2]), dtype=torch.float32),
        e.new_empty((B,), dtype=torch.int32),
    )


_register_recompute_autograd(attention_posterior, _attention_posterior_ref, 5, (0,))


# ----------------------------------------------------------------------------------------------------------------
# 4. mad_dispersion
# ----------------------------------------------------------------------------------------------------------------


def _validate_mad_dispersion(
    tokens: Tensor, assign: Tensor, num_experts: int, eps: float, clip: float, normalize: str, measure: str,
    empty: str,
) -> None:
    op = "mad_dispersion"
    _check_float(op, "tokens", tokens)
    _check_index(op, "assign", assign)
    _check_rank(op, "tokens", tokens, 2, "[T, D]")
    _check_rank(op, "assign", assign, 1, "[T]")
    _check_dim(op, "assign", assign, 0, tokens.shape[0], "dimension 0 of 'tokens' (T)")
    if num_experts < 1:
        _fail(op, f"'num_experts' ({num_experts}) must be >= 1")
    _check_positive_finite(op, "eps", eps)
    if not (math.isfinite(clip) and clip >= 0):
        _fail(op, f"'clip' ({clip}) must be >= 0 and finite (0 disables clipping)")
    _check_enum(op, "normalize", normalize, NORMALIZES)
    _check_enum(op, "measure", measure, MEASURES)
    _check_enum(op, "empty", empty, EMPTIES)


@torch.library.custom_op("moe::mad_dispersion", mutates_args=())
def mad_dispersion(
    tokens: Tensor,
    assign: Tensor,
    num_experts: int,
    eps: float = 1e-4,
    clip: float = 10.0,
    normalize: str = "feature",
    measure: str = "mad",
    empty: str = "identity",
) -> tuple[Tensor, Tensor]:
    """ACMoE adaptive-clustering feature weights (``moe.mad_dispersion``, Tight Clusters Def. 1).

    Args:
        tokens: ``[T, D]``. assign: ``[T]`` i32/i64 in ``[0, num_experts)`` (the previous layer's top-1 expert).
        num_experts: E >= 1. eps: > 0. clip: >= 0 (0 disables). normalize: ``"feature"`` | ``"expert"`` |
        ``"global"``. measure: ``"mad"`` | ``"variance"``. empty: ``"identity"`` | ``"raw"``.

    Returns:
        ``(weights [E, D] f32, counts [E] i32)``.

    Raises:
        ValueError: a value of ``assign`` outside ``[0, num_experts)``.
    """
    _validate_mad_dispersion(tokens, assign, num_experts, eps, clip, normalize, measure, empty)
    _check_index_range("mad_dispersion", "assign", assign, num_experts)
    return _mad_dispersion_ref(tokens, assign, num_experts, eps, clip, normalize, measure, empty)


@mad_dispersion.register_fake
def _(tokens, assign, num_experts, eps=1e-4, clip=10.0, normalize="feature", measure="mad", empty="identity"):
    _validate_mad_dispersion(tokens, assign, num_experts, eps, clip, normalize, measure, empty)
    return (
        tokens.new_empty((num_experts, tokens.shape[1]), dtype=torch.float32),
        tokens.new_empty((num_experts,), dtype=torch.int32),
    )


# ----------------------------------------------------------------------------------------------------------------
# 5. adjacency_update
# ----------------------------------------------------------------------------------------------------------------


def _validate_adjacency_update(a: Tensor, idx: Tensor, beta: float, norm: str) -> None:
    op = "adjacency_update"
    _check_float(op, "a", a)
    _check_index(op, "idx", idx)
    _check_rank(op, "a", a, 2, "[E, E]")
    _check_rank(op, "idx", idx, 2, "[T, k]")
    _check_dim(op, "a", a, 1, a.shape[0], "dimension 0 of 'a' (E; the graph is square)")
    if not (0.0 <= beta <= 1.0):
        _fail(op, f"'beta' ({beta}) must be in [0, 1]")
    _check_enum(op, "norm", norm, ADJ_NORMS)


@torch.library.custom_op("moe::adjacency_update", mutates_args=())
def adjacency_update(
    a: Tensor, idx: Tensor, beta: float = 0.9, norm: str = "row", include_self: bool = True
) -> Tensor:
    """One moving-average update of Symphony's expert graph (``moe.adjacency_update``, Alg. 1 l.3-9, 15-16).

    Args:
        a: ``[E, E]`` the graph. idx: ``[T, k]`` i32/i64, each token's top-k experts on the base logits.
        beta: in ``[0, 1]``. norm: ``"row"`` | ``"col"`` | ``"none"``. include_self: keep the diagonal of C.

    Returns:
        ``a_next = beta·a + (1-beta)·Norm(C)`` ``[E, E]`` f32, ``C = S^T S`` of the indicators
        ``S[t,j] = 1[j in idx[t]]``; an all-zero row/column of C stays zero.

    Raises:
        ValueError: a value of ``idx`` outside ``[0, E)``.
    """
    _validate_adjacency_update(a, idx, beta, norm)
    _check_index_range("adjacency_update", "idx", idx, a.shape[0])
    return _adjacency_update_ref(a, idx, beta, norm, include_self)


@adjacency_update.register_fake
def _(a, idx, beta=0.9, norm="row", include_self=True):
    _validate_adjacency_update(a, idx, beta, norm)
    return a.new_empty(a.shape, dtype=torch.float32)


# ----------------------------------------------------------------------------------------------------------------
# 6. hyper_router
# ----------------------------------------------------------------------------------------------------------------


def _validate_hyper_router(emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, num_experts: int) -> None:
    op = "hyper_router"
    for name, t in (("emb", emb), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)):
        _check_float(op, name, t)
    _check_rank(op, "emb", emb, 1, "[De]")
    _check_rank(op, "w1", w1, 2, "[Dh, De]")
    _check_rank(op, "b1", b1, 1, "[Dh]")
    _check_rank(op, "w2", w2, 2, "[E*(D+1), Dh]")
    _check_rank(op, "b2", b2, 1, "[E*(D+1)]")
    if num_experts < 1:
        _fail(op, f"'num_experts' ({num_experts}) must be >= 1")
    _check_dim(op, "w1", w1, 1, emb.shape[0], "dimension 0 of 'emb' (De)")
    _check_dim(op, "b1", b1, 0, w1.shape[0], "dimension 0 of 'w1' (Dh)")
    _check_dim(op, "w2", w2, 1, w1.shape[0], "dimension 0 of 'w1' (Dh)")
    _check_dim(op, "b2", b2, 0, w2.shape[0], "dimension 0 of 'w2' (E*(D+1))")
    rows = w2.shape[0]
    if rows % num_experts != 0 or rows // num_experts < 1:
        _fail(op, f"dimension 0 of 'w2' ({rows}) must be num_experts * (D+1) = {num_experts} * (D+1) with D >= 0")


@torch.library.custom_op("moe::hyper_router", mutates_args=())
def hyper_router(
    emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, num_experts: int
) -> tuple[Tensor, Tensor]:
    """HyperRouter weight generation (``moe.hyper_router``, eq 2, App. C.1).

    ``out = w2 · relu(w1 · emb + b1) + b2`` reshaped row-major to ``[E, D+1]``.

    Args:
        emb: ``[De]``. w1: ``[Dh, De]``. b1: ``[Dh]``. w2: ``[E*(D+1), Dh]``. b2: ``[E*(D+1)]``. num_experts: E.

    Returns:
        ``(w [E, D] f32, b [E] f32)``: the router matrix and the generated bias.
    """
    _validate_hyper_router(emb, w1, b1, w2, b2, num_experts)
    return _hyper_router_ref(emb, w1, b1, w2, b2, num_experts)


@hyper_router.register_fake
def _(emb, w1, b1, w2, b2, num_experts):
    _validate_hyper_router(emb, w1, b1, w2, b2, num_experts)
    d = w2.shape[0] // num_experts - 1
    return (
        emb.new_empty((num_experts, d), dtype=torch.float32),
        emb.new_empty((num_experts,), dtype=torch.float32),
    )


_register_recompute_autograd(hyper_router, _hyper_router_ref, 5, (0, 1))
