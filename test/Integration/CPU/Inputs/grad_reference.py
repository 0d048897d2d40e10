#!/usr/bin/env python3
"""Generates test/Integration/CPU/grad_ops.mlir: the backward ops (moe.similarity_inform_grad, also from the saved p and lse of moe.similarity_inform_fwd,
moe.topk_renorm_grad, moe.hyper_router_grad, moe.attention_posterior_grad) on small literal inputs, run through the
fast kernels and the portable lowering, checked against float64 gradients of an independent dense formulation (torch
autograd of softmax(q uᵀ/tau) e, of the top-k gate, of w2 · relu(w1 · emb + b1) + b2 and of the attention
posterior of 000 Lemma 1 / eq 13-17, written here from DIALECT.md; not the package's code).

    .venv/bin/python test/Integration/CPU/Inputs/grad_reference.py > test/Integration/CPU/grad_ops.mlir
    .venv/bin/python test/Integration/CPU/Inputs/grad_reference.py bad_head \
        > test/Integration/CPU/attention_posterior_grad_bad_head.mlir

Numbers: the kernels accumulate long sums in f32 in another order, so each printed value is matched to 4
to a tolerance of 2e-4 relative plus 2e-6 of the largest magnitude of its tensor (the printed number must start
with one of the prefixes of the numbers within it); values below 1e-4 in magnitude are matched as 0 or a number below 1e-4 of either sign (printed in scientific notation).
"""

import math

import torch

torch.set_default_dtype(torch.float64)


def prefix_regex(c):
    """A printed number that starts with the digits of `c`; printing drops trailing zeros, so "0.30270" also
    matches "0.3027" exactly."""
    if "." not in c:
        return c + "(\\.[0-9]*)?"
    stripped = c.rstrip("0")
    zeros = c[len(stripped):]
    head = stripped.rstrip(".").replace(".", "\\.")
    if not zeros:
        return head + "[0-9]*"
    rest = c[len(stripped.rstrip(".")):].replace(".", "\\.")
    return head + "(" + rest + "[0-9]*)?"


def pattern(x, scale):
    """Any printed value within 2e-4 relative + 2e-6 of the tensor's largest magnitude (`scale`) of x: the
    prefixes (truncated at the tolerance's decade) of the numbers in [x - tol, x + tol]."""
    if abs(x) < 1e-4:
        # 0, or a small number (printed in scientific notation below 1e-4)
        return "{{-?(0|[0-9.]+e-[0-9]+)}}"
    sign = "-" if x < 0 else ""
    a = abs(x)
    tol = 2e-4 * a + 2e-6 * scale
    step = 10.0 ** math.floor(math.log10(tol))
    decimals = max(0, -int(math.floor(math.log10(step))))
    lo, hi = int(math.floor((a - tol) / step)), int(math.floor((a + tol) / step))
    cands = sorted({"%.*f" % (decimals, n * step) for n in range(max(lo, 0), hi + 1)})
    alts = "|".join(sign + prefix_regex(c) for c in cands)
    return "{{(" + alts + ")}}"


def lines_for(name, t):
    out = [f"// CHECK: rank = {t.dim()} offset = {{{{[0-9]+}}}} sizes = [{', '.join(str(s) for s in t.shape)}]"]
    rows = t.reshape(-1, t.shape[-1])
    scale = float(t.abs().max()) if t.numel() else 0.0
    per = t.shape[-2] if t.dim() == 3 else None
    for r, row in enumerate(rows):
        tag = "CHECK-NEXT" if not (per and r and r % per == 0) else "CHECK"
        out.append(f"// {tag}: {{{{^ *\\[+}}}}" + ", ".join(pattern(float(x), scale) for x in row) + "]")
    return out


def lit(t, elem="f32"):
    def fmt(x):
        return "[" + ", ".join(fmt(y) for y in x) + "]" if isinstance(x, list) else repr(float(x))
    if t.dtype == torch.bool:
        def fmtb(x):
            return "[" + ", ".join(fmtb(y) for y in x) + "]" if isinstance(x, list) else ("true" if x else "false")
        return f"dense<{fmtb(t.tolist())}>"
    return f"dense<{fmt(t.tolist())}>"


def ttype(t, elem):
    return "tensor<" + "x".join(str(s) for s in t.shape) + "x" + elem + ">"


def case_head(fn, marker):
    """The first lines of a case's function: it prints its marker (the case's CHECK-LABEL) and a newline."""
    return [f"func.func @{fn}() {{", f"  %marker = arith.constant {marker} : i64",
            "  call @printI64(%marker) : (i64) -> ()", "  call @printNewline() : () -> ()"]


def checks_head(fn, marker, what):
    """The first CHECK lines of a case: a comment naming it, then its marker as the CHECK-LABEL."""
    return [f"// {fn}: {what}", f"// CHECK-LABEL: {{{{^}}}}{marker}"]


def op_lines(results, op, in_types, out_types):
    """A multi-result op `%r0, %r1, ... = <op>` and its type line."""
    return [f"  {', '.join('%' + n for n in results)} = {op}",
            f"      : {', '.join(in_types)} -> {', '.join(out_types)}"]


def print_f32(name, value, ty):
    """The lines that print the f32 tensor `value` of type `ty` (cast to unranked as %<name>_u)."""
    return [f"  %{name}_u = tensor.cast {value} : {ty} to tensor<*xf32>",
            f"  call @printMemrefF32(%{name}_u) : (tensor<*xf32>) -> ()"]


def print_module(out, cases):
    """Prints the RUN lines `out`, then each case's CHECK lines and function, then @main calling every case."""
    for fn, checks_, body in cases:
        out.append("\n".join(checks_))
        out.append("\n".join(body) + "\n")
    out.append("func.func @main() {\n" + "\n".join(f"  call @{fn}() : () -> ()" for fn, _, _ in cases) +
               "\n  return\n}")
    print("\n".join(out))


POSTERIOR_GRADS = ["ds", "du", "dv", "dwo", "de"]


def posterior_case_start(fn, marker, scores, u, v, wo, e, dp):
    """The head of a moe.attention_posterior_grad case and its operand constants (-inf written as 0xFF800000);
    returns (operands, their tensor types, body)."""
    operands = [("s", scores), ("u", u), ("v", v), ("wo", wo), ("e", e)]
    body = case_head(fn, marker)
    for n, t in operands + [("dp", dp)]:
        body.append(f"  %{n} = arith.constant {lit(t).replace('-inf', '0xFF800000')} : {ttype(t, 'f32')}")
    return operands, [ttype(t, "f32") for _, t in operands], body


def print_posterior_grad(body, n, t, ty):
    """Prints gradient %n (type ty) into body, a rank-4 one [B, H, rows, cols] as [B·H, rows, cols]; returns the
    tensor as printed."""
    shown, name = t, f"%{n}"
    if t.dim() == 4:
        shown = t.reshape(t.shape[0] * t.shape[1], t.shape[2], t.shape[3])
        body.append(f"  %{n}_3 = tensor.collapse_shape %{n} [[0, 1], [2], [3]] : {ty} into {ttype(shown, 'f32')}")
        ty, name = ttype(shown, "f32"), f"%{n}_3"
    body += print_f32(n, name, ty)
    return shown


def similarity_grads(u, e, ws, mask, dp, tau, causal):
    u, e = u.clone().requires_grad_(True), e.clone().requires_grad_(True)
    w = ws.clone().requires_grad_(True) if ws is not None else None
    q = u if w is None else u @ w
    x = q @ u.transpose(-1, -2) / tau
    B, N, _ = u.shape
    valid = torch.ones(B, N, N, dtype=torch.bool)
    if causal:
        valid &= torch.ones(N, N, dtype=torch.bool).tril()
    if mask is not None:
        valid &= mask[:, None, :]
    x = x.masked_fill(~valid, -math.inf)
    s = torch.softmax(x, -1)
    s = torch.where(valid.any(-1, keepdim=True), s, torch.zeros_like(s))
    p = s @ e
    wrt = [u, e] + ([w] if w is not None else [])
    return torch.autograd.grad(p, wrt, dp)


def topk_grad(scores, k, mode, renormalize, dw):
    x = scores.clone().requires_grad_(True)
    idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    sel = torch.gather(x, -1, idx)
    if mode == "logits":
        w = torch.softmax(sel, -1) if renormalize else torch.gather(torch.softmax(x, -1), -1, idx)
    else:
        w = sel / sel.sum(-1, keepdim=True) if renormalize else sel
    return idx, torch.autograd.grad(w, x, dw)[0]


def hyper_grads(emb, w1, b1, w2, b2, E, dw, db):
    ts = [t.clone().requires_grad_(True) for t in (emb, w1, b1, w2, b2)]
    out = (ts[3] @ torch.relu(ts[1] @ ts[0] + ts[2]) + ts[4]).reshape(E, -1)
    return torch.autograd.grad([out[:, :-1], out[:, -1]], ts, [dw, db])


def masked_softmax(z, dim=-1):
    dead = (z == -math.inf).all(dim, keepdim=True)
    return torch.where(dead, torch.zeros_like(z), torch.softmax(z.masked_fill(dead, 0.0), dim))


def posterior_grads(scores, u, v, wo, e, head, sigma, hsel, head_scale, dp):
    """000 Lemma 1, eq 13-17 at the given head (min_entropy; no gradient through the choice) or over all heads."""
    ts = [t.clone().requires_grad_(True) for t in (scores, u, v, wo, e)]
    sc, uu, vv, ww, ee = ts
    B, H, N, Nk = scores.shape
    Dh = v.shape[3]
    c = float(H) if head_scale is None else head_scale
    m = c * torch.einsum("bhjc,dhc->bhjd", vv, ww.reshape(ww.shape[0], H, Dh))
    ll = (torch.einsum("bid,bhjd->bhij", uu, m) - 0.5 * (m * m).sum(-1)[:, :, None, :]) / sigma ** 2
    masked = scores == -math.inf
    if hsel == "min_entropy":
        b = torch.arange(B)
        z = (sc[b, head] + ll[b, head]).masked_fill(masked[b, head], -math.inf)
        p = masked_softmax(z) @ ee
    else:
        dead = masked.all(-1, keepdim=True)
        log_prior = torch.log_softmax(sc.masked_fill(dead, 0.0), -1)
        z = (log_prior + ll).masked_fill(masked, -math.inf)
        post = masked_softmax(z)
        head_post = masked_softmax(torch.logsumexp(z.masked_fill(dead, 0.0), -1).masked_fill(dead[..., 0],
                                                                                               -math.inf), 1)
        p = (head_post[..., None] * post).sum(1) @ ee
    return torch.autograd.grad(p, ts, dp)


RUN = """// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | mlir-runner -O3 -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime,%mlir_async_runtime | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s
// CSE between the portable lowering and bufferization must not merge two loops' scratch tensors:
// RUN: moe-opt %s --convert-moe-to-linalg --cse --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main \\
// RUN:   -entry-point-result=void -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime | FileCheck %s

// Generated by `python3 Inputs/grad_reference.py` (the backward ops through the fast kernels, on two workers,
// and through the portable lowering alone, against float64 autograd of a dense formulation written in that
// script). Do not edit by hand.

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printI64(i64)
func.func private @printNewline()
"""


def main():
    g = torch.Generator().manual_seed(12)
    out = [RUN]
    cases = []
    # similarity_inform_grad: (B, N, D, K, ws, mask, tau, causal)
    sim = [(2, 5, 3, 4, False, False, 0.5, False), (2, 6, 4, 3, True, True, 1.5, True), (1, 1, 2, 3, False, False, 1.0, False)]
    for c, (B, N, D, K, with_ws, with_mask, tau, causal) in enumerate(sim):
        u = (torch.randn(B, N, D, generator=g) * 0.8).to(torch.float32).double()
        e = torch.softmax(torch.randn(B, N, K, generator=g), -1).to(torch.float32).double()
        dp = torch.randn(B, N, K, generator=g).to(torch.float32).double()
        ws = (torch.randn(D, D, generator=g) * 0.5).to(torch.float32).double() if with_ws else None
        mask = None
        if with_mask:
            mask = torch.rand(B, N, generator=g) > 0.3
            mask[1, :] = False  # a fully masked sequence: no gradient
            mask[0, 0] = False  # causal: row 0 of sequence 0 mixes nothing
        grads = similarity_grads(u, e, ws, mask, dp, tau, causal)
        names = ["du", "de"] + (["dws"] if with_ws else [])
        fn = f"sim{c}"
        marker = 9100 + c
        body = case_head(fn, marker)
        body.append(f"  %u = arith.constant {lit(u)} : {ttype(u, 'f32')}")
        body.append(f"  %e = arith.constant {lit(e)} : {ttype(e, 'f32')}")
        body.append(f"  %dp = arith.constant {lit(dp)} : {ttype(dp, 'f32')}")
        opt = ""
        if ws is not None:
            body.append(f"  %ws = arith.constant {lit(ws)} : {ttype(ws, 'f32')}")
            opt += f" ws(%ws : {ttype(ws, 'f32')})"
        if mask is not None:
            body.append(f"  %m = arith.constant {lit(mask)} : {ttype(mask, 'i1')}")
            opt += f" key_mask(%m : {ttype(mask, 'i1')})"
        res_types = [ttype(t, "f32") for t in grads]
        attrs = f"tau({tau}) causal({'true' if causal else 'false'})"
        head = list(body)
        body += op_lines(names, f"moe.similarity_inform_grad %u, %e{opt} dp(%dp : {ttype(dp, 'f32')}) {attrs}",
                         [ttype(u, "f32"), ttype(e, "f32")], res_types)
        what = f"B, N, D, K = {B}, {N}, {D}, {K}; ws {with_ws}, key_mask {with_mask}, tau {tau}, causal {causal}"
        checks_ = checks_head(fn, marker, what)
        for n, t, ty in zip(names, grads, res_types):
            body += print_f32(n, f"%{n}", ty)
            checks_ += lines_for(n, t)
        body += ["  return", "}"]
        cases.append((fn, checks_, body))
        # The same gradients from the training forward's saved p and lse (moe.similarity_inform_fwd).
        saved_fn, saved_marker = f"simsaved{c}", 9110 + c
        p_type, lse_type = ttype(e, "f32"), f"tensor<{B}x{N}xf32>"
        body = [line.replace(f"@{fn}()", f"@{saved_fn}()").replace(f"constant {marker} :", f"constant {saved_marker} :")
                for line in head]
        body += op_lines(["p", "lse"], f"moe.similarity_inform_fwd %u, %e{opt} {attrs}",
                         [ttype(u, "f32"), ttype(e, "f32")], [p_type, lse_type])
        body += op_lines(names, f"moe.similarity_inform_grad %u, %e{opt} dp(%dp : {ttype(dp, 'f32')}) "
                         f"saved(%p, %lse : {p_type}, {lse_type}) {attrs}",
                         [ttype(u, "f32"), ttype(e, "f32")], res_types)
        checks_ = checks_head(saved_fn, saved_marker, what + "; saved(p, lse) from similarity_inform_fwd")
        for n, t, ty in zip(names, grads, res_types):
            body += print_f32(n, f"%{n}", ty)
            checks_ += lines_for(n, t)
        body += ["  return", "}"]
        cases.append((saved_fn, checks_, body))
    # topk_renorm_grad: (rows, K, k, mode, renormalize)
    top = [(3, 6, 2, "logits", True), (3, 6, 2, "logits", False), (3, 6, 3, "probs", True), (2, 5, 5, "probs", False)]
    for c, (R, K, k, mode, renormalize) in enumerate(top):
        s = torch.randn(R, K, generator=g).to(torch.float32).double()
        if mode == "probs":
            s = torch.softmax(s, -1).to(torch.float32).double()
        dw = torch.randn(R, k, generator=g).to(torch.float32).double()
        idx, ds = topk_grad(s, k, mode, renormalize, dw)
        fn = f"topk{c}"
        marker = 9200 + c
        body = case_head(fn, marker) + [
            f"  %s = arith.constant {lit(s)} : {ttype(s, 'f32')}",
            f"  %i = arith.constant dense<{idx.tolist()}> : {ttype(idx, 'i32')}",
            f"  %dw = arith.constant {lit(dw)} : {ttype(dw, 'f32')}",
            f"  %ds = moe.topk_renorm_grad %s, %i dw(%dw : {ttype(dw, 'f32')}) mode({mode}) "
            f"renormalize({'true' if renormalize else 'false'}) : {ttype(s, 'f32')}, {ttype(idx, 'i32')} -> "
            f"{ttype(s, 'f32')}"] + print_f32("ds", "%ds", ttype(s, "f32")) + ["  return", "}"]
        cases.append((fn, checks_head(fn, marker, f"{R} rows, K = {K}, k = {k}, mode {mode}, renormalize {renormalize}")
                      + lines_for("ds", ds), body))
    # hyper_router_grad: (De, Dh, E, D); hidden unit 0 has a = 0 exactly (no gradient through the ReLU there, as
    # PyTorch's relu), unit 1 a < 0, unit 2 a > 0, the others random.
    hyper = [(5, 6, 3, 2), (3, 6, 1, 4)]
    for c, (De, Dh, E, D) in enumerate(hyper):
        f32 = lambda *shape: torch.randn(*shape, generator=g).to(torch.float32).double()
        emb, w1, b1, w2, b2 = f32(De), f32(Dh, De), f32(Dh), f32(E * (D + 1), Dh), f32(E * (D + 1))
        w1[0] = 0.0
        b1[0] = 0.0
        b1[1] = float(torch.tensor(-float(w1[1].abs().sum() * emb.abs().max()) - 1.0, dtype=torch.float32))
        b1[2] = float(torch.tensor(float(w1[2].abs().sum() * emb.abs().max()) + 0.5, dtype=torch.float32))
        dw, db = f32(E, D), f32(E)
        grads = hyper_grads(emb, w1, b1, w2, b2, E, dw, db)
        assert float(grads[2][0]) == 0.0 and float(grads[2][1]) == 0.0
        names = ["demb", "dw1", "db1", "dw2", "db2"]
        operands = [("emb", emb), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]
        fn = f"hyper{c}"
        marker = 9300 + c
        body = case_head(fn, marker)
        for n, t in operands + [("dw", dw), ("db", db)]:
            body.append(f"  %{n} = arith.constant {lit(t)} : {ttype(t, 'f32')}")
        types = [ttype(t, "f32") for _, t in operands]
        body += op_lines(names, f"moe.hyper_router_grad {', '.join('%' + n for n, _ in operands)} "
                         f"dw(%dw : {ttype(dw, 'f32')}) db(%db : {ttype(db, 'f32')}) num_experts({E})", types, types)
        checks_ = checks_head(fn, marker, f"De, Dh, E, D = {De}, {Dh}, {E}, {D}")
        for n, t, ty in zip(names, grads, types):
            # printMemrefF32 prints rank-1 tensors on one line: as rows of [1, n].
            shown = t if t.dim() == 2 else t.reshape(1, -1)
            body += print_f32(n, f"%{n}", ty)
            lines = lines_for(n, shown)
            if t.dim() == 1:
                lines[0] = f"// CHECK: rank = 1 offset = {{{{[0-9]+}}}} sizes = [{t.shape[0]}]"
            checks_ += lines
        body += ["  return", "}"]
        cases.append((fn, checks_, body))
    # attention_posterior_grad: (B, H, N, Nk, Dh, K, head_select, sigma, head_scale); a masked key in one row, a
    # query that sees no key in any head, a row masked in one head only.
    post = [(2, 2, 4, 5, 2, 3, "min_entropy", 0.8, None), (2, 2, 4, 5, 2, 3, "all", 0.8, None),
            (1, 3, 1, 1, 2, 4, "min_entropy", 1.0, 2.0), (1, 2, 35, 33, 3, 2, "min_entropy", 1.5, None)]
    for c, (B, H, N, Nk, Dh, K, hsel, sigma, head_scale) in enumerate(post):
        f32 = lambda *shape: torch.randn(*shape, generator=g).to(torch.float32).double()
        D = H * Dh
        scores = f32(B, H, N, Nk)
        if N > 1:
            scores[0, 0, 1, 2] = -math.inf
            scores[0, :, 0, :] = -math.inf
            scores[B - 1, H - 1, N - 1, :] = -math.inf
        u, v = f32(B, N, D) * 0.5, f32(B, H, Nk, Dh) * 0.5
        wo = f32(D, H * Dh) * 0.4
        e = torch.softmax(f32(B, Nk, K), -1).to(torch.float32).double()
        dp = f32(B, N, K)
        head = torch.tensor([(b + 1) % H for b in range(B)])
        grads = posterior_grads(scores, u, v, wo, e, head, sigma, hsel, head_scale, dp)
        names = POSTERIOR_GRADS
        fn = f"post{c}"
        marker = 9400 + c
        operands, types, body = posterior_case_start(fn, marker, scores, u, v, wo, e, dp)
        opt = ""
        if hsel == "min_entropy":
            body.append(f"  %h = arith.constant dense<{head.tolist()}> : tensor<{B}xi32>")
            opt = f" head(%h : tensor<{B}xi32>)"
        attrs = f" sigma({sigma}) head_select({hsel})" + (f" head_scale({head_scale})" if head_scale else "")
        body += op_lines(names, f"moe.attention_posterior_grad {', '.join('%' + n for n, _ in operands)}{opt} "
                         f"dp(%dp : {ttype(dp, 'f32')}){attrs}", types, types)
        checks_ = checks_head(fn, marker, f"B, H, N, Nk, Dh, K = {B}, {H}, {N}, {Nk}, {Dh}, {K}; {hsel}, "
                                          f"sigma {sigma}, head_scale {head_scale}")
        for n, t, ty in zip(names, grads, types):
            shown = print_posterior_grad(body, n, t, ty)
            checks_ += lines_for(n, shown)
        body += ["  return", "}"]
        cases.append((fn, checks_, body))
    print_module(out, cases)


BAD_HEAD_RUN = """// One run of each lowering, its stdout (the gradients) and stderr (the reported head) checked apart:
// RUN: moe-opt %s --moe-lower-to-llvm | mlir-runner -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime > %t.fast.out 2> %t.fast.err
// RUN: FileCheck %s < %t.fast.out && FileCheck %s --check-prefix=ERR < %t.fast.err
// RUN: moe-opt %s --moe-lower-to-llvm=num-threads=2 | mlir-runner -O3 -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime,%mlir_async_runtime 2>/dev/null \\
// RUN:   | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-llvm=cpu-kernels=false | mlir-runner -e main -entry-point-result=void \\
// RUN:   -shared-libs=%mlir_c_runner_utils,%mlir_runner_utils,%moe_cpu_runtime > %t.portable.out 2> %t.portable.err
// RUN: FileCheck %s < %t.portable.out && FileCheck %s --check-prefix=ERR < %t.portable.err

// Generated by `python3 Inputs/grad_reference.py bad_head`: moe.attention_posterior_grad with a chosen head h*
// outside [0, H) in one batch element, through the fast kernel (one and two workers) and the portable lowering.
// The lowerings check h* at run time: the value is reported (stderr, ERR) and that batch element skipped: its
// gradients are exactly 0 (matched as 0 or -0) and it adds nothing to d_wo, so the others' gradients are float64
// autograd of the batch without it (the dense formulation of this script). Do not edit by hand.

func.func private @printMemrefF32(tensor<*xf32>)
func.func private @printI64(i64)
func.func private @printNewline()
"""


def lines_for_skipped(name, t, skipped):
    """lines_for, with the entries where `skipped` holds matched as exactly 0 (or -0)."""
    out = lines_for(name, t)
    rows, skip_rows = t.reshape(-1, t.shape[-1]), skipped.reshape(-1, t.shape[-1])
    scale = float(t.abs().max()) if t.numel() else 0.0
    per = t.shape[-2] if t.dim() == 3 else None
    for r, (row, skip) in enumerate(zip(rows, skip_rows)):
        tag = "CHECK-NEXT" if not (per and r and r % per == 0) else "CHECK"
        out[1 + r] = (f"// {tag}: {{{{^ *\\[+}}}}" +
                      ", ".join("{{-?0}}" if sk else pattern(float(x), scale) for x, sk in zip(row, skip)) + "]")
    return out


def main_bad_head():
    g = torch.Generator().manual_seed(37)
    out = [BAD_HEAD_RUN]
    cases = []
    # (B, H, N, Nk, Dh, K, sigma, heads): h* = H in element 0 (N, Nk within one tile); h* = -1 in element 1 of
    # three, with masked keys and N, Nk past the 16-row and 32-key tiles.
    bad = [(2, 2, 4, 5, 2, 3, 0.8, [2, 1]), (3, 3, 17, 33, 2, 4, 1.5, [2, -1, 0])]
    for c, (B, H, N, Nk, Dh, K, sigma, heads) in enumerate(bad):
        f32 = lambda *shape: torch.randn(*shape, generator=g).to(torch.float32).double()
        D = H * Dh
        scores = f32(B, H, N, Nk)
        scores[B - 1, :, 0, 2] = -math.inf
        u, v = f32(B, N, D) * 0.5, f32(B, H, Nk, Dh) * 0.5
        wo = f32(D, H * Dh) * 0.4
        e = torch.softmax(f32(B, Nk, K), -1).to(torch.float32).double()
        dp = f32(B, N, K)
        head = torch.tensor(heads)
        keep = (head >= 0) & (head < H)
        kept = [t[keep] for t in (scores, u, v)] + [wo, e[keep]]
        sub = posterior_grads(*kept, head[keep], sigma, "min_entropy", None, dp[keep])
        grads = []
        for t, like in zip(sub, (scores, u, v, wo, e)):
            if t.shape == like.shape:  # d_wo: no batch dimension
                grads.append(t)
                continue
            full = torch.zeros(like.shape, dtype=t.dtype)
            full[keep] = t
            grads.append(full)
        names = POSTERIOR_GRADS
        fn = f"bad_head{c}"
        marker = 9700 + c
        operands, types, body = posterior_case_start(fn, marker, scores, u, v, wo, e, dp)
        body.append(f"  %h = arith.constant dense<{head.tolist()}> : tensor<{B}xi32>")
        body += op_lines(names, f"moe.attention_posterior_grad {', '.join('%' + n for n, _ in operands)} "
                         f"head(%h : tensor<{B}xi32>) dp(%dp : {ttype(dp, 'f32')}) sigma({sigma})", types, types)
        checks_ = checks_head(fn, marker, f"B, H, N, Nk, Dh, K = {B}, {H}, {N}, {Nk}, {Dh}, {K}; sigma {sigma}; "
                                          f"h* = {heads}")
        b_bad = int((~keep).nonzero()[0])
        checks_.append(f"// ERR: error: moe.attention_posterior_grad: 'head' element {b_bad} is {heads[b_bad]}, "
                       f"outside [0, {H}); the batch element was skipped (its gradients are 0)")
        for n, t, ty in zip(names, grads, types):
            skipped = torch.zeros(t.shape, dtype=torch.bool)
            if n != "dwo":
                skipped[~keep] = True
            shown = print_posterior_grad(body, n, t, ty)
            checks_ += lines_for_skipped(n, shown, skipped.reshape(shown.shape))
        body += ["  return", "}"]
        cases.append((fn, checks_, body))
    print_module(out, cases)


if __name__ == "__main__":
    import sys

    main_bad_head() if sys.argv[1:] == ["bad_head"] else main()
