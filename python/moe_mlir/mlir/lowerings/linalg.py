"""Linear algebra: matmuls, batched matmuls, linear layers.

Entries of :data:`moe_mlir.mlir.table.LOWERINGS` (:mod:`moe_mlir.mlir.lowerings`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING


from ..builder import Builder, TensorType, Value
from ..table import lowering

if TYPE_CHECKING:  # pragma: no cover
    from ..importer import FxImporter


# ----------------------------------------------------------------------------------------------------------------
# Linear algebra
# ----------------------------------------------------------------------------------------------------------------


@lowering("aten::linear.default")
def _linear(imp: FxImporter, node, a: dict) -> Value:
    x, w, bias = a["input"], a["weight"], a.get("bias")
    out = imp.out_type()
    lead = x.type.shape[:-1]
    x2 = imp.reshape(x, (math.prod(lead), x.type.shape[-1])) if x.type.rank != 2 else x
    wt = imp.transpose(w, [1, 0]) if w.type.rank == 2 else imp.reshape(w, (w.type.shape[0], 1))
    y = imp.matmul2d(x2, wt, imp.acc_elem(out.elem))
    if bias is not None:
        acc = y.type.elem
        y = imp.elementwise(y.type.with_elem(out.elem), [y, bias], acc, lambda b, v: b.binary("add", v[0], v[1], acc))
    else:
        y = imp.cast(y, out.elem)
    return imp.reshape(y, out.shape)


@lowering("aten::mm.default", "aten::bmm.default", "aten::matmul.default")
def _mm(imp: FxImporter, node, a: dict) -> Value:
    return imp.matmul(a["self"], a["other"] if "other" in a else a["mat2"], imp.out_type())


@lowering("aten::addmm.default", "aten::baddbmm.default")
def _addmm(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    x, y = (a["mat1"], a["mat2"]) if "mat1" in a else (a["batch1"], a["batch2"])
    beta, alpha = a.get("beta", 1), a.get("alpha", 1)
    acc = imp.acc_elem(out.elem)
    p = imp.matmul(x, y, out.with_elem(acc))

    def fn(b: Builder, v: list[str]) -> str:
        m = v[0] if alpha == 1 else b.binary("mul", v[0], b.const(alpha, acc), acc)
        c = v[1] if beta == 1 else b.binary("mul", v[1], b.const(beta, acc), acc)
        return b.binary("add", m, c, acc)

    return imp.elementwise(out, [p, a["self"]], acc, fn)


@lowering("aten::einsum.default")
def _einsum(imp: FxImporter, node, a: dict) -> Value:
    eq = a["equation"].replace(" ", "")
    operands = list(a["tensors"])
    out = imp.out_type()
    if "->" not in eq:
        raise NotImplementedError("einsum without an explicit output ('->')")
    lhs, rhs = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise NotImplementedError(f"einsum '{eq}' with {len(operands)} operands")
    # Expand '...' into fresh letters.
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
    ell_rank = max((v.type.rank - (len(t) - 3) for t, v in zip(terms, operands) if "..." in t), default=0)
    ell = "".join(free[:ell_rank])
    terms = [t.replace("...", ell[len(ell) - (v.type.rank - (len(t) - 3)):]) if "..." in t else t
             for t, v in zip(terms, operands)]
    rhs = rhs.replace("...", ell)
    if len(operands) == 1:
        raise NotImplementedError("single-operand einsum")
    cur, cur_t = operands[0], terms[0]
    for i in range(1, len(operands)):
        nxt, nxt_t = operands[i], terms[i]
        if i == len(operands) - 1:
            res = rhs
        else:  # keep every letter still needed later
            later = set(rhs).union(*[set(t) for t in terms[i + 1:]])
            res = "".join(dict.fromkeys(c for c in cur_t + nxt_t if c in later))
        sizes = {**dict(zip(cur_t, cur.type.shape)), **dict(zip(nxt_t, nxt.type.shape))}
        t = out if i == len(operands) - 1 else TensorType(tuple(sizes[c] for c in res), out.elem)
        cur, cur_t = imp.contract(cur, nxt, cur_t, nxt_t, res, t), res
    return cur
