#!/usr/bin/env python3
"""Independent numpy references of the moe ops, written from the formulas of
shared/spec/DIALECT.md and the op descriptions in MoEOps.td (float64, dense,
no streaming: nothing here shares code or structure with the lowering).

`python3 reference.py <op>` prints the FileCheck lines of test/Integration/CPU/<op>.mlir for
the inputs written in that test (the same literals are repeated below).
Each printed number becomes a regex alternation of every 6-significant-digit
string within a relative 4e-6 of the float64 value, which absorbs the f32
rounding of the compiled code without accepting a wrong answer.
"""

import math
import re
import sys

import numpy as np

np.seterr(all="ignore")
NAN, INF = float("nan"), float("inf")

# ----------------------------------------------------------------------------
# FileCheck helpers
# ----------------------------------------------------------------------------


def number_pattern(x, integer=False):
    if integer:
        return str(int(x))
    if math.isnan(x):
        return "{{-?nan}}"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0.0:
        return "{{-?0}}"
    tol = 4e-6 * abs(x)
    step = 10.0 ** (math.floor(math.log10(abs(x))) - 6)
    n = int(tol / step) + 1
    cands = sorted({"%.6g" % (x + k * step) for k in range(-n, n + 1)})
    assert len(cands) < 60, (x, cands)
    if len(cands) == 1:
        return "{{" + re.escape(cands[0]) + "}}"
    return "{{(" + "|".join(re.escape(c) for c in cands) + ")}}"


def checks(arr, integer=False, prefix="CHECK"):
    """The lines printMemrefF32/I32 prints for `arr` (rank 1..3)."""
    arr = np.asarray(arr, dtype=np.float64)
    # The offset is not checked: a result may be a strided view of a buffer.
    lines = ["// %s: rank = %d offset = {{[0-9]+}} sizes = [%s]" %
             (prefix, arr.ndim, ", ".join(str(s) for s in arr.shape))]
    rows = arr.reshape(-1, arr.shape[-1]) if arr.ndim > 1 else arr[None]
    for row in rows:
        lines.append("// %s-NEXT: {{^ *\\[+}}%s]" % (prefix, ", ".join(number_pattern(x, integer) for x in row)))
    # Rank 3 prints a blank line between the matrices; CHECK-NEXT would see it.
    if arr.ndim == 3:
        out, per = [lines[0]], arr.shape[1]
        for r, line in enumerate(lines[1:]):
            if r and r % per == 0:
                line = line.replace("-NEXT:", ":", 1)
            out.append(line)
        lines = out
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# References (DIALECT.md §1–§6, MoEOps.td descriptions)
# ----------------------------------------------------------------------------


def topk_renorm(scores, k, mode="logits", renormalize=True):
    s = np.asarray(scores, dtype=np.float64)
    lead, K = s.shape[:-1], s.shape[-1]
    rows = s.reshape(-1, K)
    W, I = [], []
    for x in rows:
        # NaN first (lowest index among NaNs), then descending value, lowest index on ties.
        order = sorted(range(K), key=lambda c: (0, 0.0, c) if math.isnan(x[c]) else (1, -x[c], c))
        sel = order[:k]
        v = x[sel]
        if mode == "logits":
            m = v[0] if renormalize else np.max(x)  # np.max propagates NaN
            if m == -INF:
                w = np.zeros(k)
            elif renormalize:
                w = np.exp(v - m) / np.sum(np.exp(v - m))
            else:
                w = np.exp(v - m) / np.sum(np.exp(x - m))
        else:
            if renormalize:
                tot = np.sum(v)
                w = np.zeros(k) if tot == 0 else v / tot
            else:
                w = v
        W.append(w)
        I.append(sel)
    return np.array(W).reshape(*lead, k), np.array(I).reshape(*lead, k)


def softmax_rows_masked(L):
    """softmax over the last axis; a row of all -inf gives 0."""
    out = np.zeros_like(L)
    for idx in np.ndindex(L.shape[:-1]):
        row = L[idx]
        if np.all(row == -INF):
            continue
        m = np.max(row)
        ex = np.exp(row - m)
        out[idx] = ex / ex.sum()
    return out


def similarity_inform(u, e, tau=1.0, ws=None, causal=False, key_mask=None):
    u = np.asarray(u, np.float64)
    e = np.asarray(e, np.float64)
    B, N, D = u.shape
    q = u if ws is None else u @ np.asarray(ws, np.float64)
    L = np.einsum("bid,bjd->bij", q, u) / tau
    if causal:
        L = np.where(np.tril(np.ones((N, N), bool))[None], L, -INF)
    if key_mask is not None:
        L = np.where(np.asarray(key_mask, bool)[:, None, :], L, -INF)
    return softmax_rows_masked(L) @ e


def attention_posterior(scores, u, v, wo, e, sigma=1.0, head_select="min_entropy", head_scale=None):
    scores = np.asarray(scores, np.float64)
    u, v, wo, e = (np.asarray(t, np.float64) for t in (u, v, wo, e))
    B, H, N, Nk = scores.shape
    Dh = v.shape[3]
    D = wo.shape[0]
    scale = H if head_scale is None else head_scale
    s2 = sigma * sigma
    # m[b,h,j,:] = scale * v[b,h,j,:] @ wo[:, h*Dh:(h+1)*Dh].T
    m = scale * np.einsum("bhjc,dhc->bhjd", v, wo.reshape(D, H, Dh))
    ll = (np.einsum("bid,bhjd->bhij", u, m) - 0.5 * (m * m).sum(-1)[:, :, None, :]) / s2
    if head_select == "min_entropy":
        heads = []
        for b in range(B):
            means = []
            for h in range(H):
                ents = []
                for i in range(N):
                    row = scores[b, h, i]
                    if np.all(row == -INF):
                        continue
                    A = softmax_rows_masked(row[None])[0]
                    ent = -sum(a * math.log(a) for a in A if a > 0)
                    if np.any(np.isnan(row)):
                        ent = NAN
                    ents.append(ent)
                means.append(np.mean(ents) if ents else 0.0)
            # argmin: NaN is the minimum, lowest head on ties
            nan_h = [h for h in range(H) if math.isnan(means[h])]
            heads.append(nan_h[0] if nan_h else int(np.argmin(means)))
        p = np.zeros((B, N, e.shape[2]))
        for b in range(B):
            h = heads[b]
            z = np.where(scores[b, h] == -INF, -INF, scores[b, h] + ll[b, h])
            p[b] = softmax_rows_masked(z) @ e[b]
        return p, np.array(heads)
    # all heads: H'[i,h] = softmax_h(logsumexp_j(log_softmax(s)_j + ll_j))
    p = np.zeros((B, N, e.shape[2]))
    for b in range(B):
        for i in range(N):
            zs, ps = [], []
            for h in range(H):
                row = scores[b, h, i]
                if np.all(row == -INF):
                    continue
                logA = row - (np.max(row) + np.log(np.sum(np.exp(row - np.max(row)))))
                z = np.where(row == -INF, -INF, logA + ll[b, h, i])
                zm = np.max(z)
                zs.append(zm + np.log(np.sum(np.exp(z - zm))))
                ps.append(softmax_rows_masked(z[None])[0] @ e[b])
            if zs:
                zs = np.array(zs)
                hp = np.exp(zs - zs.max())
                hp /= hp.sum()
                p[b, i] = sum(w * q for w, q in zip(hp, ps))
    return p, np.full(B, -1)


def mad_dispersion(x, assign, E, eps=1e-4, clip=10.0, normalize="feature", measure="mad", empty="identity"):
    x = np.asarray(x, np.float64)
    T, D = x.shape
    counts = np.zeros(E, int)
    s = np.zeros((E, D))
    for k in range(E):
        members = [t for t in range(T) if assign[t] == k]  # out-of-range: in no cluster
        counts[k] = len(members)
        if not members:
            continue
        mu = x[members].mean(0)
        dev = x[members] - mu
        s[k] = np.abs(dev).mean(0) if measure == "mad" else (dev * dev).mean(0)
    W = 1.0 / (s + eps)
    inc = counts >= 2 if empty == "identity" else np.ones(E, bool)
    if clip > 0 and inc.any():
        W = np.minimum(W, clip * W[inc].mean())
    if inc.any():
        if normalize == "feature":
            W = W / W[inc].mean(0, keepdims=True)
        elif normalize == "expert":
            W = W / W.mean(1, keepdims=True)
        else:
            W = W / W[inc].mean()
    W[~inc] = 1.0
    return W, counts


def adjacency_update(a, idx, beta=0.9, norm="row", include_self=True):
    a = np.asarray(a, np.float64)
    E = a.shape[0]
    S = np.zeros((len(idx), E), int)
    for t, row in enumerate(idx):
        for j in row:
            if 0 <= j < E:
                S[t, j] = 1
    C = (S.T @ S).astype(np.float64)
    if not include_self:
        np.fill_diagonal(C, 0)
    if norm == "row":
        tot = C.sum(1, keepdims=True)
        C = np.where(tot == 0, 0, C / np.where(tot == 0, 1, tot))
    elif norm == "col":
        tot = C.sum(0, keepdims=True)
        C = np.where(tot == 0, 0, C / np.where(tot == 0, 1, tot))
    return beta * a + (1 - beta) * C


def hyper_router(emb, w1, b1, w2, b2, E):
    h = np.maximum(np.asarray(w1, np.float64) @ np.asarray(emb, np.float64) + b1, 0)
    out = (np.asarray(w2, np.float64) @ h + b2).reshape(E, -1)
    return out[:, :-1], out[:, -1]


# ----------------------------------------------------------------------------
# Test-file generation: `python3 reference.py <op>` writes the whole test
# ----------------------------------------------------------------------------

SPECIAL = {"f32": {"nan": "0x7FC00000", "inf": "0x7F800000", "-inf": "0xFF800000"}}


def lit(x, elem):
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    if elem.startswith("i"):
        return str(int(x))
    x = float(x)
    if math.isnan(x):
        return SPECIAL[elem]["nan"]
    if math.isinf(x):
        return SPECIAL[elem]["inf" if x > 0 else "-inf"]
    s = repr(x)
    if "e" in s and "." not in s.split("e")[0]:
        s = s.replace("e", ".0e")
    return s


def dense(arr, elem):
    arr = np.asarray(arr, dtype=object)
    if arr.ndim == 0:
        return lit(arr.item(), elem)
    return "[" + ", ".join(dense(a, elem) for a in arr) + "]"


def ttype(shape, elem):
    return "tensor<" + "".join(("?" if s is None else str(s)) + "x" for s in shape) + elem + ">"


class TestFile:
    def __init__(self, header):
        self.header = header
        self.cases = []
        self.n = 0

    def case(self, title, body, checks):
        self.n += 1
        marker = 9000 + self.n
        self.cases.append((title, marker, body, checks))
        return "c%d" % self.n

    def render(self):
        out = [self.header.rstrip(), ""]
        out += ["func.func private @printMemrefF32(tensor<*xf32>)",
                "func.func private @printMemrefI32(tensor<*xi32>)",
                "func.func private @printI64(i64)",
                "func.func private @printNewline()", ""]
        for i, (title, marker, body, chk) in enumerate(self.cases, 1):
            out.append("// %s" % title)
            out.append("// CHECK-LABEL: {{^}}%d" % marker)
            out.append(chk)
            out.append("func.func @case%d() {" % i)
            out.append("  %%marker = arith.constant %d : i64" % marker)
            out.append("  call @printI64(%marker) : (i64) -> ()")
            out.append("  call @printNewline() : () -> ()")
            out.append(body.rstrip())
            out.append("  return")
            out.append("}")
            out.append("")
        out.append("func.func @main() {")
        for i in range(1, len(self.cases) + 1):
            out.append("  call @case%d() : () -> ()" % i)
        out.append("  return")
        out.append("}")
        return "\n".join(out) + "\n"


class Body:
    def __init__(self):
        self.lines = []
        self.k = 0

    def const(self, arr, elem, shape=None):
        self.k += 1
        arr = np.asarray(arr)
        shape = list(arr.shape) if shape is None else shape
        name = "%%in%d" % self.k
        self.lines.append("  %s = arith.constant dense<%s> : %s" % (name, dense(arr, elem), ttype(shape, elem)))
        return name, ttype(shape, elem)

    def cast(self, value, ty, newty):
        if ty == newty:
            return value
        self.k += 1
        name = "%%cast%d" % self.k
        self.lines.append("  %s = tensor.cast %s : %s to %s" % (name, value, ty, newty))
        return name

    def line(self, text):
        self.lines.append("  " + text)

    def show(self, value, ty, elem="f32"):
        self.k += 1
        name = "%%show%d" % self.k
        self.lines.append("  %s = tensor.cast %s : %s to tensor<*x%s>" % (name, value, ty, elem))
        fn = "printMemrefF32" if elem == "f32" else "printMemrefI32"
        self.lines.append("  call @%s(%s) : (tensor<*x%s>) -> ()" % (fn, name, elem))

    def text(self):
        return "\n".join(self.lines)


RUN = ("// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \\\n"
       "// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s\n")
RUN_ERR = ("// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \\\n"
           "// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime 2>&1 >/dev/null \\\n"
           "// RUN:   | FileCheck %s --check-prefix=ERR\n")
GENERATED = ("// Generated by `python3 Inputs/reference.py {op}`: the expected numbers come from the\n"
             "// float64 numpy reference of DIALECT.md in that script (not from our lowering).\n")


def gen_topk():
    f = TestFile(RUN + "\n" + GENERATED.format(op="topk_renorm"))

    def add(title, scores, k, elem="f32", mode="logits", renorm=True, dyn=None):
        scores = np.asarray(scores, np.float64)
        b = Body()
        v, ty = b.const(scores, elem)
        shape = list(scores.shape)
        dshape = [None if dyn and i in dyn else s for i, s in enumerate(shape)]
        v = b.cast(v, ty, ttype(dshape, elem))
        out_shape = dshape[:-1] + [k]
        attrs = "k(%d)" % k + ("" if mode == "logits" else " mode(%s)" % mode) + ("" if renorm else " renormalize(false)")
        b.line("%%w, %%i = moe.topk_renorm %s %s : %s -> %s, %s" % (
            v, attrs, ttype(dshape, elem), ttype(out_shape, "f32"), ttype(out_shape, "i32")))
        b.show("%w", ttype(out_shape, "f32"))
        b.show("%i", ttype(out_shape, "i32"), "i32")
        w, i = topk_renorm(scores, k, mode, renorm)
        f.case(title, b.text(), checks(w) + "\n" + checks(i, integer=True))

    logits = [[1, 3, 3, 2], [NAN, 1, NAN, 5], [-INF] * 4, [-INF, 0, -INF, 1], [0.5, -1, 2, 0.25]]
    add("logits, k=2, renormalize: tie (lowest index first), NaN first, fully masked row -> 0 and 0..k-1, "
        "partly masked row; dynamic rows", logits, 2, dyn=[0])
    add("logits, renormalize(false): dense softmax read at the selection", logits, 2, renorm=False)
    probs = [[0.1, 0.4, 0.4, 0.1], [0, 0, 0, 0], [0.2, NAN, 0.5, 0.3], [0.25, 0.25, 0.25, 0.25]]
    add("probs, renormalize: zero sum -> zero weights, NaN selected first", probs, 2, mode="probs")
    add("probs, raw (Symphony combine = raw)", probs, 3, mode="probs", renorm=False)
    add("k = K on a rank-3 bf16 input with two dynamic leading dims",
        [[[0.5, 2, -1, 2]], [[1, 1, 1, 1]]], 4, elem="bf16", dyn=[0, 1])
    add("K = 1: weight 1, masked -> 0, NaN -> NaN", [[2], [-INF], [NAN]], 1)
    add("rank 1, f16 probs", [0.25, 0.5, 0.125, 0.125], 2, elem="f16", mode="probs")
    return f.render()


def gen_similarity():
    f = TestFile(RUN + "\n" + GENERATED.format(op="similarity_inform"))

    def add(title, u, e, tau=1.0, ws=None, causal=False, mask=None, elem="f32", dyn=False):
        u = np.asarray(u, np.float64)
        e = np.asarray(e, np.float64)
        B, N, D = u.shape
        K = e.shape[2]
        b = Body()
        uv, uty = b.const(u, elem)
        ev, ety = b.const(e, elem)
        lead = [None, None] if dyn else [B, N]
        uty2, ety2 = ttype(lead + [D], elem), ttype(lead + [K], elem)
        uv, ev = b.cast(uv, uty, uty2), b.cast(ev, ety, ety2)
        opt = ""
        if ws is not None:
            wv, wty = b.const(ws, elem)
            opt += " ws(%s : %s)" % (wv, wty)
        if mask is not None:
            mv, mty = b.const(np.asarray(mask, bool), "i1")
            mty2 = ttype(lead, "i1")
            mv = b.cast(mv, mty, mty2)
            opt += " key_mask(%s : %s)" % (mv, mty2)
        if tau != 1.0:
            opt += " tau(%s)" % lit(tau, "f32")
        if causal:
            opt += " causal(true)"
        pty = ttype(lead + [K], "f32")
        b.line("%%p = moe.similarity_inform %s, %s%s : %s, %s -> %s" % (uv, ev, opt, uty2, ety2, pty))
        b.show("%p", pty)
        p = similarity_inform(u, e, tau, ws, causal, mask)
        f.case(title, b.text(), checks(p))

    u = [[[1, 0], [0.5, 0.5], [0, 1]], [[0.25, -0.5], [1, 1], [-1, 0.5]]]
    e = [[[0.5, 0.25, 0.25], [0.125, 0.75, 0.125], [0, 0, 1]], [[1, 0, 0], [0.25, 0.25, 0.5], [0.5, 0.5, 0]]]
    add("tau = 0.5, no mask", u, e, tau=0.5)
    add("causal + key_mask: row 0 of batch 0 sees only a masked key -> 0; batch 1 fully masked -> 0",
        u, e, causal=True, mask=[[False, True, True], [False, False, False]])
    add("ws given, dynamic B and N", u, e, ws=[[1, 0.5], [-0.5, 2]], dyn=True)
    add("N = 1 (p = e), f16 operands", [[[0.5, 1]]], [[[0.25, 0.75, 0]]], elem="f16")
    add("f16 operands with ws, dynamic B and N", u, e, ws=[[0.5, 0], [1, -1]], elem="f16", dyn=True)
    add("key_mask only", u, e, mask=[[True, False, True], [True, True, False]])
    return f.render()


def gen_attention():
    f = TestFile(RUN + "\n" + GENERATED.format(op="attention_posterior"))

    def add(title, scores, u, v, wo, e, sigma=1.0, head_select="min_entropy", head_scale=None):
        scores, u, v, wo, e = (np.asarray(t, np.float64) for t in (scores, u, v, wo, e))
        b = Body()
        vals = [b.const(t, "f32") for t in (scores, u, v, wo, e)]
        attrs = ""
        if sigma != 1.0:
            attrs += " sigma(%s)" % lit(sigma, "f32")
        if head_select != "min_entropy":
            attrs += " head_select(%s)" % head_select
        if head_scale is not None:
            attrs += " head_scale(%s)" % lit(head_scale, "f32")
        B, H, N, Nk = scores.shape
        K = e.shape[2]
        pty, hty = ttype([B, N, K], "f32"), ttype([B], "i32")
        b.line("%%p, %%head = moe.attention_posterior %s%s : %s -> %s, %s" % (
            ", ".join(n for n, _ in vals), attrs, ", ".join(t for _, t in vals), pty, hty))
        b.show("%p", pty)
        b.show("%head", hty, "i32")
        p, head = attention_posterior(scores, u, v, wo, e, sigma, head_select, head_scale)
        f.case(title, b.text(), checks(p) + "\n" + checks(head, integer=True))

    # B=2, H=2, N=3, Nk=3, D=2, Dh=1 (wo: [D, H*Dh] = [2, 2]).
    ninf = -INF
    scores = [[[[4, 0, 0], [0, 3, ninf], [ninf, ninf, ninf]],      # head 0: peaked; row 2 fully masked
               [[1, 1, 1], [0.5, 0, ninf], [ninf, ninf, ninf]]],   # head 1: flat
              [[[0, 0, 0], [1, 1, 1], [0, ninf, 0]],
               [[2, 0, ninf], [0, 5, 0], [1, 0, 0]]]]
    u = [[[0.5, -0.5], [1, 0], [0, 1]], [[0.25, 0.25], [-1, 0.5], [0.5, 0]]]
    v = [[[[1], [0.5], [-0.5]], [[0.25], [0], [1]]], [[[0.5], [1], [0]], [[-1], [0.5], [0.25]]]]
    wo = [[1, 0.5], [-0.5, 1]]
    e = [[[0.5, 0.5], [1, 0], [0, 1]], [[0.25, 0.75], [0.5, 0.5], [1, 0]]]
    add("min_entropy: head 0 for batch 0, head 1 for batch 1; masked keys, fully masked row -> 0",
        scores, u, v, wo, e)
    add("head_select(all): posterior over heads, head = -1", scores, u, v, wo, e, head_select="all")
    same = [[[[1, 2, 0], [0, 0, 1], [2, 1, 0]]] * 2]
    add("tie between identical heads -> lowest head; sigma = 2, head_scale = 1",
        same, [u[0]], [[[[1], [0.5], [-0.5]]] * 2], wo, [e[0]], sigma=2.0, head_scale=1.0)
    nan_scores = [[[[1, 0, 0], [0, 1, 0], [0, 0, 1]], [[NAN, 0, 0], [0, 1, 0], [1, 1, 1]]]]
    add("NaN mean entropy is the minimum: head 1 wins, its NaN row propagates",
        nan_scores, [u[0]], [v[0]], wo, [e[0]])
    add("N = Nk = 1: p = e", [[[[0.5]], [[2]]]], [[[1, 0]]], [[[[1]], [[2]]]], wo, [[[0.25, 0.75]]])
    return f.render()


def gen_mad():
    f = TestFile(RUN + RUN_ERR + "\n" + GENERATED.format(op="mad_dispersion"))

    def add(title, x, assign, E, aelem="i32", eps=1e-4, clip=10.0, normalize="feature", measure="mad",
            empty="identity", errors=()):
        x = np.asarray(x, np.float64)
        T, D = x.shape
        b = Body()
        xv, xty = b.const(x, "f32")
        av, aty = b.const(np.asarray(assign), aelem)
        xty2, aty2 = ttype([None, D], "f32"), ttype([None], aelem)
        xv, av = b.cast(xv, xty, xty2), b.cast(av, aty, aty2)
        attrs = "num_experts(%d)" % E
        if eps != 1e-4:
            attrs += " eps(%s)" % lit(eps, "f32")
        if clip != 10.0:
            attrs += " clip(%s)" % lit(clip, "f32")
        for name, val, dflt in (("normalize", normalize, "feature"), ("measure", measure, "mad"),
                                ("empty", empty, "identity")):
            if val != dflt:
                attrs += " %s(%s)" % (name, val)
        wty, cty = ttype([E, D], "f32"), ttype([E], "i32")
        b.line("%%w, %%counts = moe.mad_dispersion %s, %s %s : %s, %s -> %s, %s" % (
            xv, av, attrs, xty2, aty2, wty, cty))
        b.show("%w", wty)
        b.show("%counts", cty, "i32")
        w, c = mad_dispersion(x, assign, E, eps, clip, normalize, measure, empty)
        chk = checks(w) + "\n" + checks(c, integer=True)
        for pos, val in errors:
            chk += ("\n// ERR: error: moe.mad_dispersion: 'assign' element %d is %d, outside [0, %d); "
                    "the element was skipped" % (pos, val, E))
        f.case(title, b.text(), chk)

    x = [[1, 2], [3, 2], [0, 1], [1, 1], [2, 4], [5, 5], [2, 2]]
    assign = [0, 0, 1, 1, 1, 2, 0]  # cluster 3 empty, cluster 2 a singleton
    add("defaults (mad, feature, identity, clip 10): empty and singleton clusters -> 1; "
        "cluster 0's constant feature 1 hits the clip", x, assign, 4)
    add("empty(raw): the authors' code, empty/singleton clusters enter every statistic", x, assign, 4, empty="raw")
    add("variance, normalize(expert), no clip", x, assign, 4, measure="variance", normalize="expert", clip=0.0)
    add("normalize(global), raw, clip 2, eps 0.5", x, assign, 4, normalize="global", empty="raw", clip=2.0, eps=0.5)
    add("out-of-range assign (i64): tokens 3 and 5 are skipped and reported", x, [0, 0, 1, 7, 1, -1, 1], 4,
        aelem="i64", errors=[(3, 7), (5, -1)])
    add("every cluster below 2 tokens (identity): all ones", [[1, 2], [3, 4]], [0, 1], 3)
    return f.render()


def gen_adjacency():
    f = TestFile(RUN + RUN_ERR + "\n" + GENERATED.format(op="adjacency_update"))

    def add(title, a, idx, ielem="i32", beta=0.9, norm="row", include_self=True, errors=(), dyn=False):
        a = np.asarray(a, np.float64)
        E = a.shape[0]
        idx = np.asarray(idx)
        T, k = idx.shape
        b = Body()
        av, aty = b.const(a, "f32")
        iv, ity = b.const(idx, ielem)
        ity2 = ttype([None if dyn else T, k], ielem)
        iv = b.cast(iv, ity, ity2)
        attrs = ""
        if beta != 0.9:
            attrs += " beta(%s)" % lit(beta, "f32")
        if norm != "row":
            attrs += " norm(%s)" % norm
        if not include_self:
            attrs += " include_self(false)"
        b.line("%%next = moe.adjacency_update %s, %s%s : %s, %s -> %s" % (av, iv, attrs, aty, ity2, aty))
        b.show("%next", aty)
        chk = checks(adjacency_update(a, idx, beta, norm, include_self))
        for pos, val in errors:
            chk += ("\n// ERR: error: moe.adjacency_update: 'idx' element %d is %d, outside [0, %d); "
                    "the element was skipped" % (pos, val, E))
        f.case(title, b.text(), chk)

    a = [[0.5, 0.25, 0, 0.25], [0, 1, 0, 0], [0.125, 0.125, 0.5, 0.25], [0.25, 0.25, 0.25, 0.25]]
    idx = [[0, 1], [1, 0], [2, 2], [1, 2]]  # a repeated index counts once; expert 3 never chosen
    add("norm row (default), include_self: expert 3's zero row stays zero", a, idx, dyn=True)
    add("norm col, include_self(false), beta 0.5", a, idx, beta=0.5, norm="col", include_self=False)
    add("norm none (raw counts), beta 0, i64 idx", a, idx, ielem="i64", beta=0.0, norm="none")
    add("out-of-range idx: entries 1 (5) and 2 (-2) are skipped and reported",
        a, [[0, 5], [-2, 1], [2, 1]], errors=[(1, 5), (2, -2)])
    add("k = E = 1", [[0.5]], [[0], [0]], beta=0.25)
    return f.render()


def gen_hyper():
    f = TestFile(RUN + "\n" + GENERATED.format(op="hyper_router"))

    def add(title, emb, w1, b1, w2, b2, E, elem="f32", dyn=False):
        b = Body()
        vals = [b.const(np.asarray(t, np.float64), elem) for t in (emb, w1, b1, w2, b2)]
        if dyn:
            R, Dh = np.asarray(w2).shape
            new = [ttype([None, Dh], elem), ttype([None], elem)]
            vals[3] = (b.cast(vals[3][0], vals[3][1], new[0]), new[0])
            vals[4] = (b.cast(vals[4][0], vals[4][1], new[1]), new[1])
        w, bias = hyper_router(emb, w1, b1, w2, b2, E)
        D = w.shape[1]
        wty = ttype([E, None if dyn else D], "f32")
        bty = ttype([E], "f32")
        b.line("%%w, %%b = moe.hyper_router %s num_experts(%d) : %s -> %s, %s" % (
            ", ".join(n for n, _ in vals), E, ", ".join(t for _, t in vals), wty, bty))
        b.show("%w", wty)
        b.show("%b", bty)
        f.case(title, b.text(), checks(w) + "\n" + checks(bias))

    emb = [1, -0.5]
    w1 = [[1, 0], [0.5, 1], [-1, -1]]   # third hidden unit is negative before ReLU
    b1 = [0, 0.25, 0.5]
    w2 = [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0.5, 0.5, 0.5], [-1, 2, 0], [0.25, 0, -1]]
    b2 = [0, 0.5, 1, 0, -0.5, 0.125]
    add("E = 2, D = 2: relu hidden layer, row-major [E, D+1] split", emb, w1, b1, w2, b2, 2)
    add("bf16 operands, dynamic E*(D+1)", emb, w1, b1, w2, b2, 2, elem="bf16", dyn=True)
    add("E = 3, D = 1", emb, w1, b1, w2, b2, 3)
    return f.render()


GENERATORS = {"topk_renorm": gen_topk, "similarity_inform": gen_similarity,
              "attention_posterior": gen_attention, "mad_dispersion": gen_mad,
              "adjacency_update": gen_adjacency, "hyper_router": gen_hyper}

if __name__ == "__main__":
    sys.stdout.write(GENERATORS[sys.argv[1]]())
