"""torch.ops.moe.* against independent, deliberately naive formulations written from the op descriptions
(MoEOps.td / DIALECT.md): Python loops in float64, one row / one token / one cluster at a time.

Tolerances: the kernels accumulate in f32, the oracles in f64; 1e-5 relative + 1e-6 absolute covers f32 rounding of
the sums involved (K, N <= 16); f16/bf16 inputs are compared after rounding the *inputs* (the ops upcast them
exactly), so the same tolerance applies.
"""

from __future__ import annotations

import math
import itertools

import pytest
import torch

import moe_mlir  # noqa: F401

NAN, INF = float("nan"), float("inf")
ATOL, RTOL = 1e-6, 1e-5


def close(actual: torch.Tensor, expected, atol: float = ATOL, rtol: float = RTOL) -> None:
    exp = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual.detach().double().cpu(), exp, atol=atol, rtol=rtol, equal_nan=True)


# ================================================================================================================
# topk_renorm
# ================================================================================================================


def oracle_topk_renorm(scores: torch.Tensor, k: int, mode: str, renormalize: bool):
    x = scores.double().reshape(-1, scores.shape[-1]).tolist()
    W, I = [], []
    for row in x:
        K = len(row)
        # NaN first, then descending value, then lowest index.
        order = sorted(range(K), key=lambda j: (0 if math.isnan(row[j]) else 1,
                                                0.0 if math.isnan(row[j]) else -row[j], j))[:k]
        sel = [row[j] for j in order]
        if mode == "logits":
            vals = sel if renormalize else row
            if all(v == -INF for v in vals):
                probs = [0.0] * len(vals)
            else:
                m = max(vals) if not any(math.isnan(v) for v in vals) else NAN
                ex = [math.exp(v - m) if not math.isnan(v - m) else NAN for v in vals]
                s = sum(ex)
                probs = [e / s for e in ex]
            w = probs if renormalize else [probs[j] for j in order]
        else:
            if renormalize:
                s = sum(sel)
                w = [0.0] * k if s == 0 else [v / s for v in sel]
            else:
                w = sel
        W.append(w)
        I.append(order)
    shape = (*scores.shape[:-1], k)
    return torch.tensor(W, dtype=torch.float64).reshape(shape), torch.tensor(I, dtype=torch.int64).reshape(shape)


TOPK_CASES = {
    "random": lambda: torch.randn(6, 16),
    "ties_all": lambda: torch.zeros(3, 8),
    "ties_partial": lambda: torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0], [5.0, 5.0, 1.0, 1.0, 5.0]]),
    "nan": lambda: torch.tensor([[1.0, NAN, 3.0, INF, 3.0], [NAN, NAN, 0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0, NAN]]),
    "masked_rows": lambda: torch.tensor([[-INF] * 5, [0.5, -INF, 2.0, -INF, -INF], [-INF, -INF, -INF, -INF, 1.0]]),
    "pos_inf": lambda: torch.tensor([[INF, 0.0, 1.0, 2.0], [INF, INF, 0.0, 0.0]]),
    "one_row": lambda: torch.randn(1, 7),
    "leading_dims": lambda: torch.randn(2, 3, 6),
    "probs_zero_sum": lambda: torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.7, 0.0, 0.3, 0.0]]),
    "K1": lambda: torch.randn(4, 1),
    "empty_rows": lambda: torch.randn(0, 5),
}


@pytest.mark.parametrize("case", list(TOPK_CASES))
@pytest.mark.parametrize("mode,renorm", [("logits", True), ("logits", False), ("probs", True), ("probs", False)])
def test_topk_renorm_matches_oracle(case, mode, renorm, device):
    torch.manual_seed(0)
    x = TOPK_CASES[case]()
    if mode == "probs" and case in ("random", "leading_dims", "one_row"):
        x = torch.softmax(x, -1)
    for k in sorted({1, min(2, x.shape[-1]), x.shape[-1]}):
        w, i = torch.ops.moe.topk_renorm(x.to(device), k, mode, renorm)
        ew, ei = oracle_topk_renorm(x, k, mode, renorm)
        assert w.dtype == torch.float32 and i.dtype == torch.int32
        assert w.shape == ew.shape and w.device.type == device
        assert torch.equal(i.cpu().long(), ei), f"k={k}: indices {i.tolist()} != {ei.tolist()}"
        close(w, ew)
        assert ((i >= 0) & (i < x.shape[-1])).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_topk_renorm_half_inputs_upcast(dtype, device):
    torch.manual_seed(1)
    x = torch.randn(5, 12).to(dtype)
    w, i = torch.ops.moe.topk_renorm(x.to(device), 3)
    ew, ei = oracle_topk_renorm(x.float(), 3, "logits", True)  # the rounded inputs, exactly upcast
    assert w.dtype == torch.float32
    assert torch.equal(i.cpu().long(), ei)
    close(w, ew)


def test_topk_renorm_fully_masked_row_gives_zeros_and_first_indices():
    w, i = torch.ops.moe.topk_renorm(torch.full((2, 6), -INF), 3)
    assert torch.equal(w, torch.zeros(2, 3))
    assert i.tolist() == [[0, 1, 2], [0, 1, 2]]


def test_topk_renorm_equivalence_softmax_topk_renorm():
    """App. A.3: softmax(TopK(r)) == TopK_Renormalize(softmax(r))."""
    r = torch.randn(32, 16)
    a = torch.ops.moe.topk_renorm(r, 4, "logits", True)
    b = torch.ops.moe.topk_renorm(torch.softmax(r, -1), 4, "probs", True)
    torch.testing.assert_close(a[0], b[0], atol=1e-6, rtol=1e-5)
    assert torch.equal(a[1], b[1])


def test_topk_renorm_gradient_matches_plain_autograd():
    torch.manual_seed(2)
    x = torch.randn(6, 9, requires_grad=True)
    w, i = torch.ops.moe.topk_renorm(x, 3)
    g = torch.randn_like(w)
    (w * g).sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    ref = torch.softmax(torch.gather(x2, -1, i.long()), -1)
    (ref * g).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.parametrize(
    "args,msg",
    [
        ((torch.randn(3, 4), 0), r"'k' \(0\) must be in \[1, 4\]"),
        ((torch.randn(3, 4), 5), r"'k' \(5\) must be in \[1, 4\]"),
        ((torch.randn(3, 4), 2, "prob"), r"'mode' must be one of"),
    ],
)
def test_topk_renorm_validation(args, msg):
    with pytest.raises(ValueError, match=msg):
        torch.ops.moe.topk_renorm(*args)
    with pytest.raises(TypeError, match="f32, f16 or bf16"):
        torch.ops.moe.topk_renorm(torch.arange(6).reshape(2, 3), 1)


# ================================================================================================================
# similarity_inform
# ================================================================================================================


def oracle_similarity(u, e, ws=None, key_mask=None, tau=1.0, causal=False):
    B, N, D = u.shape
    K = e.shape[2]
    u, e = u.double(), e.double()
    W = torch.eye(D, dtype=torch.float64) if ws is None else ws.double()
    out = torch.zeros(B, N, K, dtype=torch.float64)
    for b in range(B):
        for i in range(N):
            keys = [j for j in range(N) if (not causal or j <= i) and (key_mask is None or bool(key_mask[b, j]))]
            if not keys:
                continue
            logits = [float(u[b, i] @ W @ u[b, j]) / tau for j in keys]
            if any(math.isnan(l) for l in logits):
                out[b, i] = NAN
                continue
            m = max(logits)
            ex = [math.exp(l - m) for l in logits]
            s = sum(ex)
            for j, x in zip(keys, ex):
                out[b, i] += (x / s) * e[b, j]
    return out


def _probs(*shape):
    return torch.softmax(torch.randn(*shape), -1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_ws,with_mask", [(False, False), (True, False), (False, True), (True, True)])
def test_similarity_inform_matches_oracle(causal, with_ws, with_mask, device):
    torch.manual_seed(3)
    B, N, D, K = 2, 7, 5, 4
    u, e = torch.randn(B, N, D), _probs(B, N, K)
    ws = torch.randn(D, D) * 0.3 if with_ws else None
    mask = torch.rand(B, N) > 0.3 if with_mask else None
    if with_mask:
        mask[1] = False  # a sequence with every key masked: every row is zero
        mask[0, 0] = False  # causal: row 0 of sequence 0 has no key left
    dev = lambda t: None if t is None else t.to(device)
    p = torch.ops.moe.similarity_inform(dev(u), dev(e), dev(ws), dev(mask), 0.7, causal)
    assert p.dtype == torch.float32 and p.shape == (B, N, K)
    close(p, oracle_similarity(u, e, ws, mask, 0.7, causal))
    if with_mask:
        assert torch.equal(p[1].cpu(), torch.zeros(N, K))


def test_similarity_inform_single_token_is_identity():
    u, e = torch.randn(3, 1, 4), _probs(3, 1, 5)
    torch.testing.assert_close(torch.ops.moe.similarity_inform(u, e), e)


def test_similarity_inform_large_tau_averages():
    u, e = torch.randn(1, 6, 4), _probs(1, 6, 3)
    p = torch.ops.moe.similarity_inform(u, e, None, None, 1e8)
    torch.testing.assert_close(p, e.mean(1, keepdim=True).expand_as(e), atol=1e-6, rtol=1e-5)


def test_similarity_inform_nan_propagates_only_through_mixed_keys():
    u, e = torch.randn(1, 4, 3), _probs(1, 4, 2)
    e_nan = e.clone()
    e_nan[0, 3, 0] = NAN
    # causal: rows 0..2 never mix key 3
    p = torch.ops.moe.similarity_inform(u, e_nan, None, None, 1.0, True)
    assert not torch.isnan(p[0, :3]).any()
    assert torch.isnan(p[0, 3, 0]) and not torch.isnan(p[0, 3, 1])
    # a masked key's NaN does not leak either
    mask = torch.tensor([[True, True, True, False]])
    u_nan = u.clone()
    u_nan[0, 3] = NAN
    p = torch.ops.moe.similarity_inform(u_nan, e_nan, None, mask)
    assert not torch.isnan(p[0, :3]).any()
    close(p[0, :3], oracle_similarity(u, e, None, mask)[0, :3])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_similarity_inform_half_inputs(dtype):
    u, e = torch.randn(2, 5, 4).to(dtype), _probs(2, 5, 3).to(dtype)
    close(torch.ops.moe.similarity_inform(u, e), oracle_similarity(u.float(), e.float()))


def test_similarity_inform_gradients_flow_to_u_and_e():
    u = torch.randn(1, 5, 3, requires_grad=True)
    e = _probs(1, 5, 4).requires_grad_(True)
    torch.ops.moe.similarity_inform(u, e, None, None, 0.5).sum(-1).pow(2).sum().backward()
    u2, e2 = u.detach().clone().requires_grad_(True), e.detach().clone().requires_grad_(True)
    (torch.softmax(u2 @ u2.transpose(-1, -2) / 0.5, -1) @ e2).sum(-1).pow(2).sum().backward()
    torch.testing.assert_close(u.grad, u2.grad)
    torch.testing.assert_close(e.grad, e2.grad)


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(tau=0.0), r"'tau' \(0.0\) must be finite and > 0"),
        (dict(tau=float("inf")), r"'tau' \(inf\) must be finite and > 0"),
        (dict(e=torch.rand(2, 6, 3)), r"dimension 1 of 'e' \(N = 6\) must equal dimension 1 of 'u' \(N = 5\)"),
        (dict(ws=torch.rand(3, 4)), r"dimension 0 of 'ws' \(D = 3\) must equal dimension 2 of 'u' \(D = 4\)"),
        (dict(u=torch.rand(5, 4)), r"'u' must have rank 3"),
    ],
)
def test_similarity_inform_validation(kw, msg):
    args = dict(u=torch.rand(2, 5, 4), e=torch.rand(2, 5, 3), ws=None, key_mask=None, tau=1.0, causal=False)
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        torch.ops.moe.similarity_inform(**args)


# ================================================================================================================
# attention_posterior
# ================================================================================================================


def oracle_attention_posterior(scores, u, v, wo, e, sigma=1.0, head_select="min_entropy", head_scale=None):
    """Lemma 1 with the Gaussian density written directly (float64; the (2π)^{-D/2} factor cancels)."""
    B, H, N, Nk = scores.shape
    D, Dh, K = wo.shape[0], v.shape[3], e.shape[2]
    s, u, v, wo, e = scores.double(), u.double(), v.double(), wo.double(), e.double()
    hs = H if head_scale is None else head_scale
    p = torch.zeros(B, N, K, dtype=torch.float64)
    heads = []
    for b in range(B):
        m = [[hs * (v[b, h, j] @ wo[:, h * Dh:(h + 1) * Dh].T) for j in range(Nk)] for h in range(H)]

        def prior(h, i):
            row = s[b, h, i].tolist()
            if all(x == -INF for x in row):
                return None
            mx = max(row) if not any(math.isnan(x) for x in row) else NAN
            ex = [math.exp(x - mx) for x in row]
            z = sum(ex)
            return [x / z for x in ex]

        def dens(h, i, j):
            d = u[b, i] - m[h][j]
            return math.exp(-float(d @ d) / (2 * sigma * sigma))

        if head_select == "min_entropy":
            means = []
            for h in range(H):
                ents = []
                for i in range(N):
                    a = prior(h, i)
                    if a is None:
                        continue
                    ents.append(-sum(x * math.log(x) for x in a if x > 0) if not any(math.isnan(x) for x in a) else NAN)
                means.append(sum(ents) / len(ents) if ents else 0.0)
            nan = [h for h in range(H) if math.isnan(means[h])]
            hstar = nan[0] if nan else min(range(H), key=lambda h: (means[h], h))
            heads.append(hstar)
            for i in range(N):
                a = prior(hstar, i)
                if a is None:
                    continue
                w = [a[j] * dens(hstar, i, j) for j in range(Nk)]
                z = sum(w)
                for j in range(Nk):
                    p[b, i] += w[j] / z * e[b, j]
        else:
            heads.append(-1)
            for i in range(N):
                per_head, mass = [], []
                for h in range(H):
                    a = prior(h, i)
                    if a is None:
                        per_head.append(None)
                        mass.append(0.0)
                        continue
                    w = [a[j] * dens(h, i, j) for j in range(Nk)]
                    z = sum(w)
                    per_head.append([x / z for x in w])
                    mass.append(z / H)
                tot = sum(mass)
                if tot == 0:
                    continue
                for h in range(H):
                    if per_head[h] is None:
                        continue
                    for j in range(Nk):
                        p[b, i] += mass[h] / tot * per_head[h][j] * e[b, j]
    return p, torch.tensor(heads, dtype=torch.int64)


def _attn_inputs(B=2, H=3, N=5, Nk=5, D=4, Dh=2, K=3, scale=0.5, seed=4):
    torch.manual_seed(seed)
    scores = torch.randn(B, H, N, Nk) * 2
    u = torch.randn(B, N, D) * scale
    v = torch.randn(B, H, Nk, Dh) * scale
    wo = torch.randn(D, H * Dh) * scale
    e = _probs(B, Nk, K)
    return scores, u, v, wo, e


@pytest.mark.parametrize("head_select", ["min_entropy", "all"])
@pytest.mark.parametrize("variant", ["random", "causal", "masked_rows", "nk_ne_n", "one_token", "one_head"])
def test_attention_posterior_matches_oracle(head_select, variant, device):
    kw = {}
    if variant == "nk_ne_n":
        kw = dict(N=3, Nk=6)
    elif variant == "one_token":
        kw = dict(N=1, Nk=1)
    elif variant == "one_head":
        kw = dict(H=1, Dh=4)
    scores, u, v, wo, e = _attn_inputs(**kw)
    if variant == "causal":
        N = scores.shape[2]
        scores = scores.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), -INF)
    if variant == "masked_rows":
        scores[0, :, 1, :] = -INF  # query 1 of batch 0 sees nothing in any head
        scores[1, 0, :, :] = -INF  # head 0 of batch 1 has no valid row: mean entropy 0 -> selected
    args = [t.to(device) for t in (scores, u, v, wo, e)]
    p, head = torch.ops.moe.attention_posterior(*args, 1.3, head_select)
    ep, eh = oracle_attention_posterior(scores, u, v, wo, e, 1.3, head_select)
    assert p.dtype == torch.float32 and head.dtype == torch.int32
    assert head.cpu().long().tolist() == eh.tolist()
    close(p, ep, atol=1e-5)
    if variant == "masked_rows":
        assert torch.equal(p[0, 1].cpu(), torch.zeros(e.shape[2]))
        if head_select == "min_entropy":
            assert head[1].item() == 0


def test_attention_posterior_ties_pick_lowest_head():
    scores, u, v, wo, e = _attn_inputs(H=3)
    scores[:, 1] = scores[:, 0]
    scores[:, 2] = scores[:, 0]  # identical heads
    _, head = torch.ops.moe.attention_posterior(scores, u, v, wo, e)
    assert head.tolist() == [0, 0]


def test_attention_posterior_nan_entropy_counts_as_minimum():
    scores, u, v, wo, e = _attn_inputs(H=3)
    scores[0, 2, 0, 1] = NAN
    p, head = torch.ops.moe.attention_posterior(scores, u, v, wo, e)
    assert head[0].item() == 2
    assert torch.isnan(p[0, 0]).all()


def test_attention_posterior_head_scale_and_small_sigma_stay_finite():
    scores, u, v, wo, e = _attn_inputs()
    p, _ = torch.ops.moe.attention_posterior(scores, u, v, wo, e, 0.05, "min_entropy", 1.0)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:2]))
    ep, _ = oracle_attention_posterior(scores, u, v, wo, e, 1.0, "min_entropy", 1.0)
    close(torch.ops.moe.attention_posterior(scores, u, v, wo, e, 1.0, "min_entropy", 1.0)[0], ep, atol=1e-5)


@pytest.mark.parametrize(
    "mutate,msg",
    [
        (lambda a: a.update(sigma=-1.0), r"'sigma' \(-1.0\) must be finite and > 0"),
        (lambda a: a.update(head_select="best"), r"'head_select' must be one of"),
        (lambda a: a.update(wo=torch.rand(4, 5)), r"dimension 1 of 'wo' \(5\) must equal H\*Dh = 3\*2 = 6"),
        (lambda a: a.update(e=torch.rand(2, 4, 3)),
         r"dimension 1 of 'e' \(Nk = 4\) must equal dimension 3 of 'scores' \(Nk = 5\)"),
    ],
)
def test_attention_posterior_validation(mutate, msg):
    scores, u, v, wo, e = _attn_inputs()
    a = dict(scores=scores, u=u, v=v, wo=wo, e=e, sigma=1.0, head_select="min_entropy", head_scale=None)
    mutate(a)
    with pytest.raises(ValueError, match=msg):
        torch.ops.moe.attention_posterior(**a)


# ================================================================================================================
# mad_dispersion
# ================================================================================================================


def oracle_mad(tokens, assign, E, eps=1e-4, clip=10.0, normalize="feature", measure="mad", empty="identity"):
    x = tokens.double().tolist()
    a = assign.tolist()
    T, D = tokens.shape
    members = [[t for t in range(T) if a[t] == k] for k in range(E)]
    W = [[0.0] * D for _ in range(E)]
    valid = [len(members[k]) >= 2 if empty == "identity" else True for k in range(E)]
    for k in range(E):
        for q in range(D):
            vals = [x[t][q] for t in members[k]]
            mu = sum(vals) / len(vals) if vals else 0.0
            if measure == "mad":
                s = sum(abs(v - mu) for v in vals) / len(vals) if vals else 0.0
            else:
                s = sum((v - mu) ** 2 for v in vals) / len(vals) if vals else 0.0
            W[k][q] = 1.0 / (s + eps)
    entries = [(k, q) for k in range(E) for q in range(D) if valid[k]]
    if clip > 0 and entries:
        mean_all = sum(W[k][q] for k, q in entries) / len(entries)
        for k, q in entries:
            W[k][q] = min(W[k][q], clip * mean_all)
    if entries:
        if normalize == "feature":
            for q in range(D):
                col = [W[k][q] for k in range(E) if valid[k]]
                m = sum(col) / len(col)
                for k in range(E):
                    if valid[k]:
                        W[k][q] /= m
        elif normalize == "expert":
            for k in range(E):
                if valid[k]:
                    m = sum(W[k]) / D
                    W[k] = [w / m for w in W[k]]
        else:
            m = sum(W[k][q] for k, q in entries) / len(entries)
            for k, q in entries:
                W[k][q] /= m
    for k in range(E):
        if not valid[k]:
            W[k] = [1.0] * D
    return torch.tensor(W, dtype=torch.float64), torch.tensor([len(m) for m in members])


@pytest.mark.parametrize("normalize", ["feature", "expert", "global"])
@pytest.mark.parametrize("measure", ["mad", "variance"])
@pytest.mark.parametrize("empty", ["identity", "raw"])
@pytest.mark.parametrize("clip", [10.0, 0.0, 1.5])
def test_mad_dispersion_matches_oracle(normalize, measure, empty, clip, device):
    torch.manual_seed(5)
    E, T, D = 5, 14, 4
    x = torch.randn(T, D)
    assign = torch.randint(0, 3, (T,))  # clusters 3, 4 empty
    assign[0] = 3  # cluster 3 a singleton
    w, counts = torch.ops.moe.mad_dispersion(x.to(device), assign.to(device), E, 1e-3, clip, normalize, measure, empty)
    ew, ec = oracle_mad(x, assign, E, 1e-3, clip, normalize, measure, empty)
    assert w.dtype == torch.float32 and counts.dtype == torch.int32
    assert counts.cpu().tolist() == ec.tolist()
    close(w, ew, rtol=2e-5)


def test_mad_dispersion_edge_cases():
    x = torch.randn(6, 3)
    # every token in one cluster, E = 1
    w, c = torch.ops.moe.mad_dispersion(x, torch.zeros(6, dtype=torch.int32), 1)
    close(w, oracle_mad(x, torch.zeros(6, dtype=torch.long), 1)[0])
    assert c.tolist() == [6]
    # only singletons and empties: identity everywhere
    w, c = torch.ops.moe.mad_dispersion(x[:2], torch.tensor([0, 2]), 4)
    assert torch.equal(w, torch.ones(4, 3)) and c.tolist() == [1, 0, 1, 0]
    # no tokens at all
    w, c = torch.ops.moe.mad_dispersion(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), 2)
    assert torch.equal(w, torch.ones(2, 3)) and c.tolist() == [0, 0]
    # constant feature: zero dispersion, weight bounded by the clip
    xc = x.clone()
    xc[:, 0] = 1.0
    w, _ = torch.ops.moe.mad_dispersion(xc, torch.tensor([0, 0, 0, 1, 1, 1]), 2)
    close(w, oracle_mad(xc, torch.tensor([0, 0, 0, 1, 1, 1]), 2)[0])
    # NaN propagates to its cluster and, through the statistics, everywhere
    xn = x.clone()
    xn[0, 0] = NAN
    w, _ = torch.ops.moe.mad_dispersion(xn, torch.tensor([0, 0, 0, 1, 1, 1]), 2)
    assert torch.isnan(w).any()


def test_mad_dispersion_raw_degrades_with_empty_cluster():
    """003 §5.1: with `empty = raw` an empty cluster enters the statistics (W = 1/eps) and shrinks the others."""
    torch.manual_seed(6)
    x, assign = torch.randn(40, 8), torch.randint(0, 3, (40,))
    w_id, _ = torch.ops.moe.mad_dispersion(x, assign, 4, 1e-4, 10.0, "global", "mad", "identity")
    w_raw, _ = torch.ops.moe.mad_dispersion(x, assign, 4, 1e-4, 10.0, "global", "mad", "raw")
    assert w_raw[:3].mean() < w_id[:3].mean()


@pytest.mark.parametrize("bad", [-1, 4, 100])
def test_mad_dispersion_out_of_range_assign_raises(bad):
    assign = torch.tensor([0, 1, bad, 2])
    with pytest.raises(ValueError, match=rf"'assign' holds {bad}, outside \[0, 4\)"):
        torch.ops.moe.mad_dispersion(torch.randn(4, 3), assign, 4)


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(num_experts=0), r"'num_experts' \(0\) must be >= 1"),
        (dict(eps=0.0), r"'eps' \(0.0\) must be finite and > 0"),
        (dict(clip=-1.0), r"'clip' \(-1.0\) must be finite and >= 0 \(0 disables clipping\)"),
        (dict(normalize="row"), r"'normalize' must be one of"),
        (dict(assign=torch.zeros(3, dtype=torch.long)), r"dimension 0 of 'assign' \(T = 3\) must equal"),
    ],
)
def test_mad_dispersion_validation(kw, msg):
    a = dict(tokens=torch.randn(4, 3), assign=torch.zeros(4, dtype=torch.long), num_experts=2)
    a.update(kw)
    with pytest.raises(ValueError, match=msg):
        torch.ops.moe.mad_dispersion(**a)
    with pytest.raises(TypeError, match="'assign' must be i32 or i64"):
        torch.ops.moe.mad_dispersion(torch.randn(4, 3), torch.zeros(4), 2)


# ================================================================================================================
# adjacency_update
# ================================================================================================================


def oracle_adjacency(a, idx, beta=0.9, norm="row", include_self=True):
    E = a.shape[0]
    C = [[0.0] * E for _ in range(E)]
    for row in idx.tolist():
        s = set(row)
        for x in s:
            for y in s:
                if x != y or include_self:
                    C[x][y] += 1
    if norm == "row":
        C = [[c / sum(r) if sum(r) else 0.0 for c in r] for r in C]
    elif norm == "col":
        cols = [sum(C[i][j] for i in range(E)) for j in range(E)]
        C = [[C[i][j] / cols[j] if cols[j] else 0.0 for j in range(E)] for i in range(E)]
    return beta * a.double() + (1 - beta) * torch.tensor(C, dtype=torch.float64)


@pytest.mark.parametrize("norm", ["row", "col", "none"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("beta", [0.9, 0.0, 1.0])
def test_adjacency_update_matches_oracle(norm, include_self, beta, device):
    torch.manual_seed(7)
    E = 6
    a = torch.rand(E, E)
    idx = torch.randint(0, E - 1, (20, 2))  # expert E-1 never chosen: its row/column of C is zero
    idx[0] = torch.tensor([2, 2])  # a repeated index counts once
    out = torch.ops.moe.adjacency_update(a.to(device), idx.to(device), beta, norm, include_self)
    assert out.dtype == torch.float32
    close(out, oracle_adjacency(a, idx, beta, norm, include_self))


def test_adjacency_update_symphony_test_vector():
    """004 §2: the paper-derived test vector (M=4, k=2, N=5, beta=0.9, A_0=0)."""
    L = torch.tensor([[2.0, 1, 0, -1], [0.5, 2.5, 1.5, 0], [1, 0, 3, 2], [3, -1, 0, 2], [0, 1, 2, -0.5]])
    idx0 = torch.ops.moe.topk_renorm(L, 2)[1]
    a1 = torch.ops.moe.adjacency_update(torch.zeros(4, 4), idx0, 0.9)
    rownorm = torch.tensor([[.5, .25, 0, .25], [1 / 6, .5, 1 / 3, 0], [0, 1 / 3, .5, 1 / 6], [.25, 0, .25, .5]])
    torch.testing.assert_close(a1, 0.1 * rownorm)
    g = torch.softmax(L, -1) @ a1.t()
    w, idx = torch.ops.moe.topk_renorm(g, 2, "probs", False)
    assert idx.tolist() == [[0, 1], [1, 2], [2, 3], [0, 3], [2, 1]]
    torch.testing.assert_close(w, torch.tensor([[.038919, .025481], [.040698, .033492], [.037212, .030121],
                                                [.041543, .031086], [.040138, .034052]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.ops.moe.adjacency_update(a1, idx0, 0.9).sum(1), torch.full((4,), 0.19))
    torch.testing.assert_close(torch.ops.moe.adjacency_update(torch.zeros(4, 4), idx0, 0.9, "col"), a1.t())


def test_adjacency_update_k_equals_e_and_empty_batch():
    a = torch.rand(3, 3)
    out = torch.ops.moe.adjacency_update(a, torch.tensor([[0, 1, 2], [2, 0, 1]]), 0.5)
    close(out, 0.5 * a.double() + 0.5 / 3)
    out = torch.ops.moe.adjacency_update(a, torch.zeros(0, 2, dtype=torch.int32), 0.5)
    close(out, 0.5 * a.double())


@pytest.mark.parametrize("bad", [-1, 4])
def test_adjacency_update_out_of_range_idx_raises(bad):
    with pytest.raises(ValueError, match=rf"'idx' holds {bad}, outside \[0, 4\)"):
        torch.ops.moe.adjacency_update(torch.zeros(4, 4), torch.tensor([[0, 1], [bad, 2]]))


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(beta=1.5), r"'beta' \(1.5\) must be in \[0.0, 1.0\]"),
        (dict(beta=-0.1), r"'beta' \(-0.1\) must be in \[0.0, 1.0\]"),
        (dict(norm="sym"), r"'norm' must be one of"),
        (dict(a=torch.zeros(4, 3)), r"dimension 1 of 'a' \(E = 3\) must equal dimension 0 of 'a' \(E = 4\)"),
        (dict(idx=torch.zeros(4, dtype=torch.long)), r"'idx' must have rank 2"),
    ],
)
def test_adjacency_update_validation(kw, msg):
    a = dict(a=torch.zeros(4, 4), idx=torch.zeros(5, 2, dtype=torch.long))
    a.update(kw)
    with pytest.raises(ValueError, match=msg):
        torch.ops.moe.adjacency_update(**a)


# ================================================================================================================
# hyper_router
# ================================================================================================================


def oracle_hyper(emb, w1, b1, w2, b2, E):
    h = [max(0.0, sum(w1[r][c] * emb[c] for c in range(len(emb))) + b1[r]) for r in range(len(b1))]
    out = [sum(w2[r][c] * h[c] for c in range(len(h))) + b2[r] for r in range(len(b2))]
    D = len(out) // E - 1
    w = [[out[e * (D + 1) + d] for d in range(D)] for e in range(E)]
    b = [out[e * (D + 1) + D] for e in range(E)]
    return torch.tensor(w, dtype=torch.float64).reshape(E, D), torch.tensor(b, dtype=torch.float64)


@pytest.mark.parametrize("E,D", [(4, 3), (1, 5), (3, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hyper_router_matches_oracle(E, D, dtype, device):
    torch.manual_seed(8)
    De, Dh = 5, 6
    ts = [torch.randn(De), torch.randn(Dh, De), torch.randn(Dh), torch.randn(E * (D + 1), Dh), torch.randn(E * (D + 1))]
    ts = [t.to(dtype) for t in ts]
    w, b = torch.ops.moe.hyper_router(*[t.to(device) for t in ts], E)
    ew, eb = oracle_hyper(*[t.double().tolist() for t in ts], E)
    assert w.shape == (E, D) and b.shape == (E,) and w.dtype == torch.float32
    close(w, ew, atol=1e-4)
    close(b, eb, atol=1e-4)


def test_hyper_router_gradient_reaches_embedding_only_through_frozen_net():
    emb = torch.randn(3, requires_grad=True)
    w1, b1, w2, b2 = torch.randn(4, 3), torch.randn(4), torch.randn(2 * 6, 4), torch.randn(12)
    w, b = torch.ops.moe.hyper_router(emb, w1, b1, w2, b2, 2)
    (w.sum() + 2 * b.sum()).backward()
    e2 = emb.detach().clone().requires_grad_(True)
    out = (w2 @ torch.relu(w1 @ e2 + b1) + b2).view(2, 6)
    (out[:, :5].sum() + 2 * out[:, 5].sum()).backward()
    torch.testing.assert_close(emb.grad, e2.grad)


def test_hyper_router_validation():
    with pytest.raises(ValueError, match=r"dimension 0 of 'w2' \(10\) must be num_experts \* \(D\+1\)"):
        torch.ops.moe.hyper_router(torch.randn(3), torch.randn(4, 3), torch.randn(4), torch.randn(10, 4),
                                   torch.randn(10), 3)
    with pytest.raises(ValueError, match=r"dimension 1 of 'w1' \(De = 2\) must equal dimension 0 of 'emb'"):
        torch.ops.moe.hyper_router(torch.randn(3), torch.randn(4, 2), torch.randn(4), torch.randn(10, 4),
                                   torch.randn(10), 2)


# ================================================================================================================
# opcheck: schema, fake kernels, autograd registration, AOT dispatch
# ================================================================================================================


def _opcheck_samples():
    torch.manual_seed(9)
    sc, u, v, wo, e = _attn_inputs()
    return [
        ("topk_renorm", (torch.randn(4, 6, requires_grad=True), 2), {}),
        ("topk_renorm", (torch.rand(2, 3, 6), 3, "probs", False), {}),
        ("topk_renorm", (torch.randn(5, 4).to(torch.bfloat16), 4), {}),
        ("similarity_inform", (torch.randn(2, 5, 4, requires_grad=True), _probs(2, 5, 3)), {}),
        ("similarity_inform", (torch.randn(2, 5, 4), _probs(2, 5, 3), torch.randn(4, 4), torch.rand(2, 5) > 0.2,
                               0.5, True), {}),
        ("attention_posterior", (sc.requires_grad_(True), u, v, wo, e), {}),
        ("attention_posterior", (sc.detach(), u, v, wo, e, 2.0, "all", 1.0), {}),
        ("mad_dispersion", (torch.randn(12, 4), torch.randint(0, 3, (12,)), 3), {}),
        ("mad_dispersion", (torch.randn(12, 4), torch.randint(0, 3, (12,), dtype=torch.int32), 4, 1e-3, 0.0,
                            "expert", "variance", "raw"), {}),
        ("adjacency_update", (torch.rand(5, 5), torch.randint(0, 5, (7, 2))), {}),
        ("adjacency_update", (torch.rand(5, 5), torch.randint(0, 5, (7, 3), dtype=torch.int32), 0.5, "col", False), {}),
        ("hyper_router", (torch.randn(3, requires_grad=True), torch.randn(4, 3), torch.randn(4), torch.randn(10, 4),
                          torch.randn(10), 2), {}),
    ]


@pytest.mark.parametrize("sample", _opcheck_samples(), ids=lambda s: s[0])
def test_opcheck(sample):
    name, args, kwargs = sample
    op = getattr(torch.ops.moe, name).default
    result = torch.library.opcheck(op, args, kwargs)
    assert all(v == "SUCCESS" for v in result.values()), result


def test_every_dialect_op_is_registered():
    assert set(moe_mlir.ops.OP_NAMES) == {
        "topk_renorm", "similarity_inform", "attention_posterior", "mad_dispersion", "adjacency_update",
        "hyper_router",
    }
    for name in moe_mlir.ops.OP_NAMES:
        assert hasattr(torch.ops.moe, name)


def test_fake_kernels_validate_at_export_time():
    class Bad(torch.nn.Module):
        def forward(self, x):
            return torch.ops.moe.topk_renorm(x, 9)

    with pytest.raises(Exception, match=r"'k' \(9\) must be in \[1, 4\]"):
        torch.export.export(Bad(), (torch.randn(2, 4),))
