#!/usr/bin/env python3
"""References of moe.route and moe.dispatch_plan (MoERoutingOps.td), and the
generator of test/Integration/CPU/route.mlir and dispatch_plan.mlir:
`python3 routing_reference.py route > ../route.mlir` (also `dispatch_plan`, `route_dispatch_plan`).

The scores are PyTorch's (torch.softmax / torch.sigmoid in float32, then
`+ bias` in float32, as the models compute them), the selection is written
out from the op's rules (NaN first, descending, lowest index on ties; groups
by the sum of their top two or their max), the weights are float64. The
dispatch plan is a stable argsort (numpy) plus vLLM's block padding, written
from its description. When transformers is installed, the DeepSeek-V3 cases
are also checked against HF's DeepseekV3TopkRouter (the generation fails if
they disagree). The FileCheck helpers are those of reference.py.
"""

import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import Body, TestFile, checks, ttype  # noqa: E402

NAN, INF = float("nan"), float("inf")


def rank_key(v, i):
    return (0, 0.0, i) if math.isnan(v) else (1, -v, i)


def top(values, k, allowed=None):
    cand = [i for i in range(len(values)) if allowed is None or allowed[i]]
    return sorted(cand, key=lambda i: rank_key(values[i], i))[:k]


def score_f32(x, scoring):
    t = torch.tensor(np.asarray(x, dtype=np.float32))
    if scoring == "softmax":
        out = torch.softmax(t, dim=-1)
        # A row whose every logit is -inf scores 0 (torch gives NaN).
        full_mask = torch.isneginf(t).all(dim=-1, keepdim=True)
        out = torch.where(full_mask, torch.zeros_like(out), out)
    elif scoring == "sigmoid":
        out = torch.sigmoid(t)
    else:
        out = t
    return out.numpy()


def route(x, k, bias=None, scoring="softmax", order="score_then_topk", n_group=1, topk_group=1,
          group_score="top2_sum", renormalize=False, scale=1.0):
    x = np.asarray(x, dtype=np.float32)
    T, E = x.shape
    score_first = order == "score_then_topk"
    s = score_f32(x, scoring) if score_first else x
    c = s if bias is None else (torch.tensor(s) + torch.tensor(np.asarray(bias, np.float32))).numpy()
    W, I = [], []
    for t in range(T):
        row = [float(v) for v in c[t]]
        allowed = None
        if n_group > 1:
            size = E // n_group
            gs = []
            for g in range(n_group):
                part = row[g * size:(g + 1) * size]
                vals = [part[i] for i in top(part, 2)]
                if group_score == "top2_sum":
                    gs.append(float(np.float32(vals[0]) + np.float32(vals[1])))
                else:
                    gs.append(vals[0])
            kept = set(top(gs, topk_group))
            allowed = [i // size in kept for i in range(E)]
        idx = top(row, k, allowed)
        if score_first:
            w = np.array([s[t][i] for i in idx], dtype=np.float64)
        else:
            sel = np.array([x[t][i] for i in idx], dtype=np.float64)
            if scoring == "softmax":
                m = np.max(sel) if not np.isnan(sel).any() else NAN
                w = np.zeros(k) if m == -INF else np.exp(sel - m) / np.sum(np.exp(sel - m))
            elif scoring == "sigmoid":
                w = 1.0 / (1.0 + np.exp(-sel))
            else:
                w = sel
        if renormalize:
            total = np.sum(w)
            w = np.zeros(k) if total == 0 else w / total
        W.append(w * scale)
        I.append(idx)
    return np.array(W).reshape(T, k), np.array(I, dtype=np.int64).reshape(T, k)


def hf_deepseek_check(x, bias, k, n_group, topk_group, scale):
    """HF's DeepseekV3TopkRouter on the same logits (identity router weight)."""
    try:
        from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    except ImportError:
        return
    x = np.asarray(x, dtype=np.float32)
    T, E = x.shape
    cfg = DeepseekV3Config(hidden_size=E, n_routed_experts=E, num_experts_per_tok=k, n_group=n_group,
                           topk_group=topk_group, norm_topk_prob=True, routed_scaling_factor=scale)
    cfg.num_local_experts = E
    router = DeepseekV3TopkRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.eye(E))
        router.e_score_correction_bias.copy_(torch.tensor(np.asarray(bias, np.float32)))
        out = router(torch.tensor(x))
    hw, hi = out[1].double().numpy(), out[2].numpy()
    w, i = route(x, k, bias, "sigmoid", n_group=n_group, topk_group=topk_group, renormalize=True, scale=scale)
    for t in range(T):
        order = np.argsort(hi[t], kind="stable")
        assert sorted(hi[t].tolist()) == sorted(i[t].tolist()), ("HF disagrees", t, hi[t], i[t])
        mine = dict(zip(i[t].tolist(), w[t].tolist()))
        for j in order:
            assert abs(mine[int(hi[t][j])] - hw[t][j]) <= 1e-5 * max(1.0, abs(hw[t][j])), ("HF weight", t)


def dispatch_plan(indices, E, B):
    flat = np.asarray(indices, dtype=np.int64).reshape(-1)
    N = flat.size
    # Out-of-range assignments are left out: their order/inverse entries are -1.
    valid = np.flatnonzero((flat >= 0) & (flat < E))
    counts = np.bincount(flat[valid], minlength=E)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    order = np.full(N, -1)
    order[:valid.size] = valid[np.argsort(flat[valid], kind="stable")]
    inverse = np.full(N, -1)
    inverse[order[:valid.size]] = np.arange(valid.size)
    padded_len = N + E * (B - 1)
    nblocks = -(-padded_len // B)
    padded = np.full(padded_len, N)
    blocks = np.full(nblocks, -1)
    pos = 0
    for e in range(E):
        padded[pos:pos + counts[e]] = order[offsets[e]:offsets[e + 1]]
        size = -(-counts[e] // B) * B
        blocks[pos // B:(pos + size) // B] = e
        pos += size
    return counts, offsets, order, inverse, padded, blocks, np.array([pos])


# ----------------------------------------------------------------------------
# Test files
# ----------------------------------------------------------------------------

RUN = """// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | mlir-runner -O3 -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime,%mlir_async_runtime | FileCheck %s

// Generated by `python3 Inputs/routing_reference.py {op}`: the expected numbers come from the PyTorch/numpy
// reference in that script (not from our lowering).
"""


def attrs_text(k, bias_ty, scoring, order, n_group, topk_group, group_score, renormalize, scale):
    parts = []
    if bias_ty:
        parts.append("bias(%%b : %s)" % bias_ty)
    parts.append("k(%d)" % k)
    if scoring != "softmax":
        parts.append("scoring(%s)" % scoring)
    if order != "score_then_topk":
        parts.append("order(%s)" % order)
    if n_group != 1:
        parts.append("n_group(%d) topk_group(%d)" % (n_group, topk_group))
    if group_score != "top2_sum":
        parts.append("group_score(%s)" % group_score)
    if renormalize:
        parts.append("renormalize(true)")
    if scale != 1.0:
        parts.append("routed_scaling_factor(%r)" % scale)
    return " ".join(parts)


def operand(body, arr, elem):
    """A constant operand; a tensor.empty when it has no rows (T = 0)."""
    if arr.shape[0] == 0:
        ty = ttype(list(arr.shape), elem)
        body.line("%%empty = tensor.empty() : %s" % ty)
        return "%empty", ty
    return body.const(arr, elem)


def route_case(f, title, x, k, bias=None, dynamic=False, dynamic_experts=False, elem="f32", **kw):
    x = np.asarray(x, dtype=np.float32)
    T, E = x.shape
    w, i = route(x, k, bias, **kw)
    body = Body()
    xin, xty = operand(body, x, elem)
    lty = ttype([None if dynamic else T, None if dynamic_experts else E], elem)
    xin = body.cast(xin, xty, lty)
    bias_ty = None
    if bias is not None:
        bname, bias_ty = body.const(np.asarray(bias, np.float32), "f32")
        body.line("%%b = tensor.cast %s : %s to %s" % (bname, bias_ty, bias_ty))
    rows = None if dynamic else T
    wty, ity = ttype([rows, k], "f32"), ttype([rows, k], "i32")
    args = {a: kw.get(a, d) for a, d in [("scoring", "softmax"), ("order", "score_then_topk"), ("n_group", 1),
                                         ("topk_group", 1), ("group_score", "top2_sum"),
                                         ("renormalize", False), ("scale", 1.0)]}
    body.line("%%w, %%i = moe.route %s %s : %s -> %s, %s" % (xin, attrs_text(k, bias_ty, **args), lty, wty, ity))
    body.show("%w", wty)
    body.show("%i", ity, "i32")
    if T == 0:
        chk = ("// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [0, %d]\n"
               "// CHECK: rank = 2 offset = {{[0-9]+}} sizes = [0, %d]" % (k, k))
    else:
        chk = checks(w) + "\n" + checks(i, integer=True)
    f.case(title, "\n".join(body.lines), chk)


def gen_route():
    f = TestFile(RUN.format(op="route"))
    rng = np.random.default_rng(13)
    ties = [[1.0, 3.0, 3.0, 2.0, 0.5, -1.0], [NAN, 1.0, NAN, 5.0, 0.0, 0.0],
            [-INF] * 6, [-INF, 0.0, -INF, 1.0, -INF, -INF], [0.5, -1.0, 2.0, 0.25, 2.0, -3.0]]
    route_case(f, "softmax then top-2 (Mixtral), renormalize: ties, NaN first, fully and partly -inf rows; dynamic T",
               ties, 2, dynamic=True, renormalize=True)
    route_case(f, "softmax, no renormalization (dense softmax read at the selection)", ties, 3)
    route_case(f, "top-k then softmax over the k (gpt-oss)", ties, 2, order="topk_then_score")
    route_case(f, "top-1 then sigmoid (Llama-4)", ties, 1, scoring="sigmoid", order="topk_then_score")
    flip = [[2.0, 1.0, 0.5, -1.0, 0.0, 1.5], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]]
    route_case(f, "sigmoid: the bias flips the choice (expert 2 over 0) but not the weights; renormalize, scale 2.5",
               flip, 2, bias=[0.0, 0.0, 0.9, 0.0, 0.0, -0.5], scoring="sigmoid", renormalize=True, scale=2.5)
    groups = [[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0],   # groups 0 and 2 equal: the lower one is kept
              [0.0, 3.0, 0.0, 2.0, 2.5, 2.5, 0.0, 0.0],   # top2 sums 3, 2, 5, 0: groups 2, 0
              [-INF, -INF, 0.0, 0.0, -INF, 5.0, NAN, 0.0]]
    route_case(f, "groups of 2, top-2 groups by top2_sum: equal group scores, a kept group beats a larger expert",
               groups, 2, scoring="none", n_group=4, topk_group=2)
    route_case(f, "the same groups with T and E dynamic (the group size is computed at run time), bias",
               groups, 3, bias=[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0], scoring="none", n_group=4, topk_group=2,
               dynamic=True, dynamic_experts=True)
    route_case(f, "groups ranked by their max (DeepSeek-V2), softmax, scale 16", groups[:2], 3, n_group=4,
               topk_group=2, group_score="max", scale=16.0)
    route_case(f, "k = E: every expert, in rank order, renormalized sigmoid", flip, 6, scoring="sigmoid",
               renormalize=True)
    route_case(f, "T = 1", [flip[0]], 2, scoring="sigmoid", bias=[0.0, 0.0, 0.9, 0.0, 0.0, -0.5])
    route_case(f, "T = 0", np.zeros((0, 6), np.float32), 2, dynamic=True, renormalize=True)
    route_case(f, "bf16 logits, f32 accumulation", [[0.5, 1.5, -2.0, 1.0]], 2, elem="bf16", renormalize=True)

    ds = rng.standard_normal((3, 256)).astype(np.float32)
    ds_bias = (0.1 * rng.standard_normal(256)).astype(np.float32)
    hf_deepseek_check(ds, ds_bias, 8, 8, 4, 2.5)
    route_case(f, "DeepSeek-V3: E = 256, sigmoid, bias, 8 groups, top-4 groups, top-8, renormalize, scale 2.5",
               ds, 8, bias=ds_bias, scoring="sigmoid", n_group=8, topk_group=4, renormalize=True, scale=2.5)
    kimi = rng.standard_normal((2, 384)).astype(np.float32)
    kimi_bias = (0.1 * rng.standard_normal(384)).astype(np.float32)
    hf_deepseek_check(kimi, kimi_bias, 8, 1, 1, 2.827)
    route_case(f, "Kimi-K2: E = 384, one group, scale 2.827", kimi, 8, bias=kimi_bias, scoring="sigmoid",
               renormalize=True, scale=2.827)
    glm = rng.standard_normal((2, 160)).astype(np.float32)
    glm_bias = (0.1 * rng.standard_normal(160)).astype(np.float32)
    route_case(f, "GLM-4.5: E = 160 (not a power of two), scale 2.5", glm, 8, bias=glm_bias, scoring="sigmoid",
               renormalize=True, scale=2.5)
    route_case(f, "E = 160, softmax top-6 in 8 groups of 20 (DeepSeek-V2 shape)", glm, 6, n_group=8, topk_group=3,
               group_score="max")
    return f.render()


def plan_case(f, title, indices, E, B, elem="i32", dynamic=False):
    idx = np.asarray(indices, dtype=np.int64)
    T, k = idx.shape
    res = dispatch_plan(idx, E, B)
    body = Body()
    iin, ity = operand(body, idx, elem)
    lty = ttype([None if dynamic else T, k], elem)
    iin = body.cast(iin, ity, lty)
    n = None if dynamic else T * k
    padded = None if dynamic else T * k + E * (B - 1)
    blocks = None if dynamic else -(-padded // B)
    tys = [ttype([s], "i32") for s in (E, E + 1, n, n, padded, blocks, 1)]
    battr = "" if B == 1 else " block_size(%d)" % B
    body.line("%%c, %%o, %%ord, %%inv, %%p, %%b, %%n = moe.dispatch_plan %s num_experts(%d)%s : %s -> %s"
              % (iin, E, battr, lty, ", ".join(tys)))
    chk = []
    for name, ty, ref in zip(["%c", "%o", "%ord", "%inv", "%p", "%b", "%n"], tys, res):
        body.show(name, ty, "i32")
        if ref.size == 0:
            chk.append("// CHECK: rank = 1 offset = {{[0-9]+}} sizes = [0]")
        else:
            chk.append(checks(ref, integer=True))
    f.case(title, "\n".join(body.lines), "\n".join(chk))


PLAN_ERR = """// Out-of-range indices are reported on stderr and left out of the plan:
// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime 2>&1 >/dev/null \\
// RUN:   | FileCheck %s --check-prefix=ERR
// ERR: error: moe.dispatch_plan: 'indices' element 1 is 7, outside [0, 4); the element was skipped
// ERR: error: moe.dispatch_plan: 'indices' element 4 is -1, outside [0, 4); the element was skipped
"""


def gen_plan():
    f = TestFile(RUN.format(op="dispatch_plan") + PLAN_ERR)
    rng = np.random.default_rng(7)
    plan_case(f, "stable order: repeated experts keep (token, slot) order; an empty expert; block 1",
              [[2, 0], [0, 2], [2, 1], [3, 0]], 5, 1)
    plan_case(f, "block size 4: padding entries hold N, unused blocks -1; i64 indices; dynamic T",
              [[2, 0], [0, 2], [2, 1], [3, 0], [2, 3]], 5, 4, elem="i64", dynamic=True)
    plan_case(f, "T = 1, k = E", [[3, 1, 0, 2]], 4, 2)
    plan_case(f, "T = 0", np.zeros((0, 2), np.int64), 3, 2, dynamic=True)
    plan_case(f, "out-of-range indices (7 and -1): reported, left out, their order/inverse entries -1",
              [[0, 7], [3, 0], [-1, 3]], 4, 2)
    kimi = np.stack([rng.choice(384, 8, replace=False) for _ in range(6)])
    plan_case(f, "E = 384, k = 8, T = 6, block 16", kimi, 384, 16)
    glm = np.stack([rng.choice(160, 8, replace=False) for _ in range(3)])
    plan_case(f, "E = 160, k = 8, T = 3, block 1", glm, 160, 1)
    return f.render()


def fused_case(f, title, x, k, B, bias=None, **kw):
    """moe.route whose indices feed moe.dispatch_plan over the same E (the CPU pipeline fuses them into one
    kernel: test/Conversion/MoEToCPU/route_dispatch_plan.mlir); T dynamic."""
    x = np.asarray(x, dtype=np.float32)
    T, E = x.shape
    w, i = route(x, k, bias, **kw)
    res = dispatch_plan(i, E, B)
    body = Body()
    xin, xty = operand(body, x, "f32")
    lty = ttype([None, E], "f32")
    xin = body.cast(xin, xty, lty)
    bias_ty = None
    if bias is not None:
        bname, bias_ty = body.const(np.asarray(bias, np.float32), "f32")
        body.line("%%b = tensor.cast %s : %s to %s" % (bname, bias_ty, bias_ty))
    args = {a: kw.get(a, d) for a, d in [("scoring", "softmax"), ("order", "score_then_topk"), ("n_group", 1),
                                         ("topk_group", 1), ("group_score", "top2_sum"),
                                         ("renormalize", False), ("scale", 1.0)]}
    wty, ity = ttype([None, k], "f32"), ttype([None, k], "i32")
    body.line("%%w, %%i = moe.route %s %s : %s -> %s, %s" % (xin, attrs_text(k, bias_ty, **args), lty, wty, ity))
    tys = [ttype([s], "i32") for s in (E, E + 1, None, None, None, None, 1)]
    body.line("%%c, %%o, %%ord, %%inv, %%p, %%bl, %%n = moe.dispatch_plan %%i num_experts(%d) block_size(%d) : %s -> %s"
              % (E, B, ity, ", ".join(tys)))
    body.show("%w", wty)
    body.show("%i", ity, "i32")
    chk = [checks(w), checks(i, integer=True)]
    for name, ty, ref in zip(["%c", "%o", "%ord", "%inv", "%p", "%bl", "%n"], tys, res):
        body.show(name, ty, "i32")
        chk.append(checks(ref, integer=True))
    f.case(title, "\n".join(body.lines), "\n".join(chk))


def gen_fused():
    f = TestFile(RUN.format(op="route_dispatch_plan"))
    rng = np.random.default_rng(29)
    x = rng.standard_normal((70, 16)).astype(np.float32)
    x[3] = -INF
    x[40, 5] = NAN
    x[50:52] = 0.0  # all-equal rows: ties to the lowest index
    bias = (0.1 * rng.standard_normal(16)).astype(np.float32)
    fused_case(f, "DeepSeek-style route (E = 16, 4 groups, top-2 groups, k = 4) feeding a block-4 plan; T = 70 "
               "(three items of 32 rows: the plan's per-item cursors); -inf, NaN and tied rows", x, 4, 4, bias=bias,
               scoring="sigmoid", n_group=4, topk_group=2, renormalize=True, scale=2.5)
    y = rng.integers(-2, 3, (37, 6)).astype(np.float32)
    fused_case(f, "softmax top-2 with many ties, block 1, T = 37", y, 2, 1, renormalize=True)
    return f.render()


if __name__ == "__main__":
    sys.stdout.write({"route": gen_route, "dispatch_plan": gen_plan,
                      "route_dispatch_plan": gen_fused}[sys.argv[1]]())
