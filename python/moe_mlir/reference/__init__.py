"""Eager reference formulations of the ``moe`` dialect ops, in plain differentiable torch.

These are the *reference semantics* of the dialect (the op descriptions in MoEOps.td, which the C++ libtorch
reference tests follow too): device-agnostic torch code (CPU and CUDA), f16/bf16 inputs upcast, everything
accumulated in f32; ties in any top-k/argmin break to the lowest index, NaN ranks above every number in a top-k;
masked (``-inf``) logits get no probability and a fully masked row yields zeros, never NaN.

``torch.ops.moe.*`` (:mod:`moe_mlir.ops`) run the compiled kernels; these functions are what the tests compare them
against, what the autograd backward recomputes, and what the ops fall back to when the kernels are unavailable. They
do not validate their inputs (the ops do) and do not check index ranges.
"""

from __future__ import annotations

import contextvars
from typing import Optional

import torch
from torch import Tensor

__all__ = [
    "topk_renorm",
    "similarity_inform",
    "similarity_inform_topk",
    "attention_posterior",
    "attention_posterior_topk",
    "mad_dispersion",
    "adjacency_update",
    "hyper_router",
    "similarity_inform_fwd",
    "similarity_inform_backward",
    "topk_renorm_backward",
    "hyper_router_backward",
    "attention_posterior_backward",
]

_NEG_INF = float("-inf")
#: Set while the autograd backward re-runs a reference (the data-dependent fix-up of ``_mix`` is skipped there).
IN_BACKWARD: contextvars.ContextVar[bool] = contextvars.ContextVar("moe_in_backward", default=False)
_IN_BACKWARD = IN_BACKWARD

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
    # The masked rows are zeroed before the softmax too: softmax of all -inf is NaN, and its backward would send
    # NaN (NaN · 0) into the gradient of such a row, which must be zero.
    s = torch.softmax(z.masked_fill(all_masked, 0.0), dim=dim)
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


def _similarity_logits(
    u: Tensor, ws: Optional[Tensor], key_mask: Optional[Tensor], tau: float, causal: bool,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """(the masked logits ``u_i^T W_s u_j / tau`` [B,N,N] in f32 (the tests' float64 references: ``dtype``), -inf
    where excluded; the validity mask)."""
    B, N, _ = u.shape
    uf = u.to(dtype)
    q = uf if ws is None else torch.matmul(uf, ws.to(dtype))
    logits = torch.matmul(q, uf.transpose(-1, -2)) / tau  # [B,N,N]
    valid = torch.ones(B, N, N, dtype=torch.bool, device=u.device)
    if causal:
        valid = valid & torch.ones(N, N, dtype=torch.bool, device=u.device).tril()
    if key_mask is not None:
        valid = valid & key_mask.bool()[:, None, :]
    return logits.masked_fill(~valid, _NEG_INF), valid


def _similarity_inform_ref(
    u: Tensor, e: Tensor, ws: Optional[Tensor], key_mask: Optional[Tensor], tau: float, causal: bool
) -> Tensor:
    logits, valid = _similarity_logits(u, ws, key_mask, tau, causal)
    return _mix(_masked_softmax(logits), e.float(), valid)


def _similarity_inform_fwd_ref(
    u: Tensor, e: Tensor, ws: Optional[Tensor], key_mask: Optional[Tensor], tau: float, causal: bool
) -> tuple[Tensor, Tensor]:
    """``(p, lse)``: :func:`_similarity_inform_ref` and the row log-sum-exp of its logits ``[B, N]`` (-inf for a
    row without keys)."""
    logits, valid = _similarity_logits(u, ws, key_mask, tau, causal)
    return _mix(_masked_softmax(logits), e.float(), valid), torch.logsumexp(logits, -1)


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
    dead = row_masked[..., None]  # zeroed first: log_softmax of an all -inf row is NaN, also in its backward
    log_a = torch.log_softmax(sc.masked_fill(dead, 0.0), -1).masked_fill(dead, _NEG_INF)
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
    return _dispersion_weights(s, counts, eps, clip, normalize, empty), counts.to(torch.int32)


def _dispersion_weights(s: Tensor, counts: Tensor, eps: float, clip: float, normalize: str, empty: str) -> Tensor:
    """The weights ``[E, D]`` of ``mad_dispersion`` from the per-cluster dispersions ``s`` ``[E, D]`` (f32) and the
    cluster sizes ``counts`` ``[E]``: ``1/(s + eps)``, clipped and rescaled over the valid clusters. Shared with
    :func:`moe_mlir.distributed.mad_dispersion`, which sums ``s`` over data-parallel ranks first."""
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
    return torch.where(valid, w, torch.ones_like(w))


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


def _similarity_inform_topk_ref(
    u: Tensor, e: Tensor, ws: Optional[Tensor], key_mask: Optional[Tensor], k: int, renormalize: bool, tau: float,
    causal: bool,
) -> tuple[Tensor, Tensor]:
    p = _similarity_inform_ref(u, e, ws, key_mask, tau, causal)
    return _topk_renorm_ref(p, k, "probs", renormalize)


def _attention_posterior_topk_ref(
    scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, k: int, renormalize: bool, sigma: float,
    head_select: str, head_scale: Optional[float],
) -> tuple[Tensor, Tensor, Tensor]:
    p, head = _attention_posterior_ref(scores, u, v, wo, e, sigma, head_select, head_scale)
    w, i = _topk_renorm_ref(p, k, "probs", renormalize)
    return w, i, head


# ----------------------------------------------------------------------------------------------------------------
# Backward references (what torch.ops.moe.<op>_backward compute; their kernels are checked against autograd of the
# forward references above)
# ----------------------------------------------------------------------------------------------------------------


def _similarity_inform_backward_ref(
    grad_p: Tensor, u: Tensor, e: Tensor, ws: Optional[Tensor], key_mask: Optional[Tensor], tau: float, causal: bool,
    p: Optional[Tensor] = None, lse: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(du, de, dws)`` in f32, the closed form of the gradient of :func:`_similarity_inform_ref` (dense, N×N
    memory: the eager fallback of ``torch.ops.moe.similarity_inform_backward``); ``dws`` is ``[0]`` without ``ws``.
    The forward's saved ``p`` and ``lse`` (a kernel's shortcut) are not needed here: ``S`` is rebuilt densely.

    ``S`` the mixing weights, ``dS = dp eᵀ``, ``δ = Σ_j S dS``, ``dX = S (dS − δ) / tau``; ``de = Sᵀ dp``,
    ``dq = dX u``, ``du = dXᵀ q + dq wsᵀ``, ``dws = Σ uᵀ dq``. Like autograd of the reference, a non-finite ``e``
    entry gets no gradient and enters ``dS`` as 0."""
    uf, ef, gp = u.float(), e.float(), grad_p.float()
    q = uf if ws is None else torch.matmul(uf, ws.float())
    s = _masked_softmax(_similarity_logits(u, ws, key_mask, tau, causal)[0])
    finite = torch.isfinite(ef)
    ds = torch.matmul(gp, torch.where(finite, ef, torch.zeros_like(ef)).transpose(-1, -2))
    dx = s * (ds - (s * ds).sum(-1, keepdim=True)) / tau
    de = torch.where(finite, torch.matmul(s.transpose(-1, -2), gp), torch.zeros_like(ef))
    dq = torch.matmul(dx, uf)
    du = torch.matmul(dx.transpose(-1, -2), q)
    if ws is None:
        return du + dq, de, u.new_zeros((0,), dtype=torch.float32)
    du = du + torch.matmul(dq, ws.float().t())
    dws = torch.einsum("bid,bic->dc", uf, dq)
    return du, de, dws


def _topk_renorm_backward_ref(
    grad_w: Tensor, scores: Tensor, indices: Tensor, mode: str, renormalize: bool
) -> Tensor:
    """The gradient (f32, shaped like ``scores``) of :func:`_topk_renorm_ref`'s weights with respect to the scores,
    given the selected ``indices``: through the kept values only (the selection carries none), in closed form
    (O(rows·K), no recompute under autograd).

    * probs, renormalize: ``w = sel / Σ sel`` → ``dsel = (g − <g, w>) / Σ sel`` (0 where the sum is 0);
    * probs, raw: ``dsel = g``;
    * logits, renormalize: ``w = softmax(sel)`` → ``dsel = w (g − <g, w>)`` (a fully masked row has w = 0: 0);
    * logits, raw: ``w = softmax(x)[idx]`` → ``dx = s (G − <G, s>)`` with ``G`` = g scattered to the selected
      experts and ``s = softmax(x)`` (all experts: the normalizer depends on every logit).
    """
    x = scores.float()
    g = grad_w.float()
    idx = indices.long()
    if mode == "logits" and not renormalize:
        s = _masked_softmax(x)
        dense = torch.zeros_like(x).scatter(-1, idx, g)
        return s * (dense - (dense * s).sum(-1, keepdim=True))
    sel = torch.gather(x, -1, idx)
    if mode == "probs":
        if renormalize:
            den = sel.sum(-1, keepdim=True)
            zero = den == 0
            w = torch.where(zero, torch.zeros_like(sel), sel / torch.where(zero, torch.ones_like(den), den))
            dsel = (g - (g * w).sum(-1, keepdim=True)) / torch.where(zero, torch.ones_like(den), den)
            dsel = torch.where(zero, torch.zeros_like(dsel), dsel)
        else:
            dsel = g
    else:
        w = _masked_softmax(sel)
        dsel = w * (g - (g * w).sum(-1, keepdim=True))
    return torch.zeros_like(x).scatter(-1, idx, dsel)


def _hyper_router_backward_ref(
    grad_w: Tensor, grad_b: Tensor, emb: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, num_experts: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(d_emb, d_w1, d_b1, d_w2, d_b2)`` in f32 (operand shapes), the closed form of the gradient of
    :func:`_hyper_router_ref` (``moe.hyper_router_grad``): with ``a = w1·emb + b1``, ``h = relu(a)`` and
    ``dout = [grad_w | grad_b]`` flattened row-major (``[E·(D+1)]``), ``d_b2 = dout``, ``d_w2 = dout ⊗ h``,
    ``da = (w2ᵀ·dout) ⊙ 1[h > 0]`` (a NaN ``a`` passes the gradient, as ``threshold_backward``), ``d_b1 = da``,
    ``d_w1 = da ⊗ emb``, ``d_emb = w1ᵀ·da``. Every gradient is returned: a frozen hypernetwork still passes its
    gradient to ``emb`` (002 §1.10). Float64 operands stay float64 (the closed form's own gradcheck)."""
    acc = torch.float64 if all(t.dtype == torch.float64 for t in (grad_w, grad_b, emb, w1, b1, w2)) else torch.float32
    embf, w1f, w2f = emb.to(acc), w1.to(acc), w2.to(acc)
    h = torch.relu(torch.matmul(w1f, embf) + b1.to(acc))
    dout = torch.cat([grad_w.to(acc).reshape(num_experts, -1), grad_b.to(acc).reshape(num_experts, 1)], 1).reshape(-1)
    da = torch.matmul(dout, w2f)
    da = torch.where(h <= 0, torch.zeros_like(da), da)
    return torch.matmul(da, w1f), torch.outer(da, embf), da, torch.outer(dout, h), dout



def _attention_posterior_backward_ref(
    grad_p: Tensor, scores: Tensor, u: Tensor, v: Tensor, wo: Tensor, e: Tensor, head: Optional[Tensor],
    sigma: float, head_select: str, head_scale: Optional[float],
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(d_scores, d_u, d_v, d_wo, d_e)`` in f32 (operand shapes), the closed form of the gradient of ``p`` of
    :func:`_attention_posterior_ref` (``moe.attention_posterior_grad``; dense, O(H·N·Nk) memory: the eager fallback
    of ``torch.ops.moe.attention_posterior_backward``). ``head`` is the forward's h* (``[B]``) for min_entropy and
    ``None`` for all; nothing flows through it.

    With the head means ``m_hj``, the logits ``z_hij`` (``scores`` + Gaussian term; the log prior for ``all``) and
    ``G_hij`` the mixing weights (the softmax over ``j`` of head h* for min_entropy, the joint softmax over the pairs
    ``(h, j)`` for all: ``H'_hi A'_hij``): ``g = dp eᵀ``, ``δ = <dp, p>``, ``dz = G (g − δ)``; ``d_e = Σ_h Gᵀ dp``,
    ``d_u = Σ_h dz m / σ²``, ``dm = (dzᵀ u − (Σ_i dz) m) / σ²``, ``d_v = c dm W_h``, ``d_wo = c Σ dmᵀ v``,
    ``d_scores = dz`` (all: ``dz − softmax(scores) Σ_j dz``). Like autograd of the reference, a non-finite ``e``
    entry gets no gradient and enters ``g`` as 0. Float64 operands stay float64 (the closed form's gradcheck)."""
    ts = (grad_p, scores, u, v, wo, e)
    acc = torch.float64 if all(t.dtype == torch.float64 for t in ts) else torch.float32
    sc, uf, vf, wof, ef, gp = (t.to(acc) for t in (scores, u, v, wo, e, grad_p))
    B, H, N, Nk = scores.shape
    Dh, D = v.shape[3], wo.shape[0]
    c = float(H) if head_scale is None else head_scale
    w3 = wof.reshape(D, H, Dh)
    m = c * torch.einsum("bhjc,dhc->bhjd", vf, w3)  # [B,H,Nk,D]
    s2 = sigma * sigma
    ll = (torch.einsum("bid,bhjd->bhij", uf, m) - 0.5 * (m * m).sum(-1)[:, :, None, :]) / s2
    key_valid = sc != _NEG_INF
    if head_select == "min_entropy":
        chosen = torch.arange(H, device=sc.device)[None, :] == head.long()[:, None]  # [B,H]
        z = (sc + ll).masked_fill(~key_valid | ~chosen[:, :, None, None], _NEG_INF)
    else:
        dead = (~key_valid).all(-1, keepdim=True)
        log_a = torch.log_softmax(sc.masked_fill(dead, 0.0), -1).masked_fill(dead, _NEG_INF)
        z = (log_a + ll).masked_fill(~key_valid, _NEG_INF)
    # One softmax over the pairs (h, j) per row (min_entropy: only h* is finite).
    G = _masked_softmax(z.transpose(1, 2).reshape(B, N, H * Nk)).reshape(B, N, H, Nk).transpose(1, 2)
    finite = torch.isfinite(ef)
    g = torch.einsum("bik,bjk->bij", gp, torch.where(finite, ef, torch.zeros_like(ef)))  # [B,N,Nk]
    mix = G.sum(1)  # [B,N,Nk]
    delta = (mix * g).sum(-1)  # [B,N]
    dz = G * (g[:, None] - delta[:, None, :, None])
    d_e = torch.where(finite, torch.einsum("bij,bik->bjk", mix, gp), torch.zeros_like(ef))
    d_u = torch.einsum("bhij,bhjd->bid", dz, m) / s2
    dm = (torch.einsum("bhij,bid->bhjd", dz, uf) - dz.sum(2)[..., None] * m) / s2
    d_v = c * torch.einsum("bhjd,dhc->bhjc", dm, w3)
    d_wo = c * torch.einsum("bhjd,bhjc->dhc", dm, vf).reshape(D, H * Dh)
    if head_select == "min_entropy":
        d_scores = dz
    else:
        d_scores = dz - _masked_softmax(sc) * dz.sum(-1, keepdim=True)
    return d_scores, d_u, d_v, d_wo, d_e


# Public names (the argument order of the torch ops).
topk_renorm = _topk_renorm_ref
similarity_inform = _similarity_inform_ref
similarity_inform_topk = _similarity_inform_topk_ref
attention_posterior = _attention_posterior_ref
attention_posterior_topk = _attention_posterior_topk_ref
mad_dispersion = _mad_dispersion_ref
adjacency_update = _adjacency_update_ref
hyper_router = _hyper_router_ref
similarity_inform_fwd = _similarity_inform_fwd_ref
similarity_inform_backward = _similarity_inform_backward_ref
topk_renorm_backward = _topk_renorm_backward_ref
hyper_router_backward = _hyper_router_backward_ref
attention_posterior_backward = _attention_posterior_backward_ref
