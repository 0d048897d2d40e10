"""Indexing (gathers are ``linalg.generic`` + ``tensor.extract``; scatters are ``scf.for`` nests of ``tensor.insert``)
and ``torch.topk`` through ``moe.topk_renorm``.

Entries of :data:`moe_mlir.mlir.table.LOWERINGS` (:mod:`moe_mlir.mlir.lowerings`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import torch

from ..builder import Builder, TensorType, Value, affine_map, identity_map, is_float
from ..table import lowering, op_key
from ._common import _norm_dim, Scalar

if TYPE_CHECKING:  # pragma: no cover
    from ..importer import FxImporter


# ----------------------------------------------------------------------------------------------------------------
# Indexing: gathers are linalg.generic + tensor.extract; scatters are scf.for nests of tensor.insert
# ----------------------------------------------------------------------------------------------------------------


def _gather_along(imp: FxImporter, x: Value, d: int, idx: Value, idx_map: str) -> Value:
    """``out[c] = x[c with c[d] = clamp(idx[idx_map(c)])]`` over the node's result shape: one linalg.generic reading
    ``idx`` through ``idx_map`` and ``x`` with tensor.extract (gather, index_select)."""
    R = x.type.rank

    def body(b: Builder, args: list[str]) -> str:
        coords = [b.linalg_index(i) for i in range(R)]
        coords[d] = imp.clamp_index(b, b.index_cast(args[0], idx.type.elem), x.type.shape[d])
        return imp.extract(x, coords)

    init = imp.b.empty(imp.out_type())
    return imp.b.generic([(idx, idx_map)], [(init, identity_map(R))], ["parallel"] * R, body)[0]


@lowering("aten::gather.default")
def _gather(imp: FxImporter, node, a: dict) -> Value:
    x, idx = a["self"], a["index"]
    R = x.type.rank
    d = _norm_dim(a["dim"], R)
    return _gather_along(imp, x, d, idx, identity_map(R))


@lowering("aten::index_select.default")
def _index_select(imp: FxImporter, node, a: dict) -> Value:
    x, idx = a["self"], a["index"]
    R = x.type.rank
    d = _norm_dim(a["dim"], R)
    if idx.type.rank == 0:
        idx = imp.reshape(idx, (1,))
    return _gather_along(imp, x, d, idx, affine_map(R, [d]))


@lowering("aten::index.Tensor")
def _index(imp: FxImporter, node, a: dict) -> Value:
    """Advanced indexing ``x[..., idx, ...]`` with one index tensor (or several adjacent ones that broadcast)."""
    x = a["self"]
    indices = list(a["indices"])
    R = x.type.rank
    out = imp.out_type()
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos or pos != list(range(pos[0], pos[-1] + 1)):
        raise NotImplementedError("index.Tensor with non-adjacent index tensors")
    idx_vals: list[Value] = [indices[i] for i in pos]
    for v in idx_vals:
        if v.type.elem == "i1":
            raise NotImplementedError("boolean-mask indexing (data-dependent shape)")
    bshape = tuple(torch.broadcast_shapes(*[v.type.shape for v in idx_vals]))
    p0 = pos[0]
    nb = len(bshape)
    # output dims: x[:p0] + bshape + x[pos[-1]+1:]
    n_out = out.rank
    ins = []
    for v in idx_vals:
        r = v.type.rank
        res = []
        for j, s in enumerate(v.type.shape):
            dd = p0 + nb - r + j
            res.append("0" if (s == 1 and bshape[nb - r + j] != 1) else dd)
        ins.append((v, affine_map(n_out, res)))

    def body(b: Builder, args: list[str]) -> str:
        coords = []
        for i in range(p0):
            coords.append(b.linalg_index(i))
        for k, v in enumerate(idx_vals):
            dim = pos[k]
            coords.append(imp.clamp_index(b, b.index_cast(args[k], v.type.elem), x.type.shape[dim], wrap_negative=True))
        for i in range(pos[-1] + 1, R):
            coords.append(b.linalg_index(p0 + nb + (i - pos[-1] - 1)))
        return imp.extract(x, coords)

    init = imp.b.empty(out)
    return imp.b.generic(ins, [(init, identity_map(n_out))], ["parallel"] * n_out, body)[0]


_REDUCE_INIT = {"sum": 0, "add": 0, "prod": 1, "multiply": 1, "mean": 0, "amax": float("-inf"), "amin": float("inf")}


def _scatter_like(
    imp: FxImporter, self_v: Value, dim: int, index: Value, src: Union[Value, Scalar], reduce: Optional[str],
    include_self: bool, mode: str, alpha: Scalar = 1,
) -> Value:
    """scatter (``mode="scatter"``: index has the iteration shape) and index_add/index_reduce (``mode="index"``:
    index is 1-D along ``dim`` of the source). A write whose index is out of range is skipped (torch raises; the
    compiled code never writes out of bounds)."""
    out_t = self_v.type
    e = out_t.elem
    R = out_t.rank
    d = _norm_dim(dim, R)
    iter_shape = index.type.shape if mode == "scatter" else (src.type.shape if isinstance(src, Value) else None)
    if iter_shape is None:
        raise NotImplementedError("index_* with a scalar source")
    reduce = {"add": "sum", "multiply": "prod"}.get(reduce, reduce)
    if reduce not in (None, "sum", "prod", "mean", "amax", "amin"):
        raise NotImplementedError(f"reduce={reduce!r}")
    acc_e = e
    direct = reduce is None or (reduce == "sum" and include_self)
    carried: list[Value] = [self_v] if direct else [imp.b.filled(_REDUCE_INIT[reduce] if is_float(e) else
                                                                  (0 if reduce in ("sum", "mean") else 1), out_t),
                                                    imp.b.filled(0, out_t.with_elem("i64"))]
    if not direct and reduce in ("amax", "amin") and not is_float(e):
        raise NotImplementedError("integer amax/amin scatter")

    def body(ivs: list[str], accs: list[str]) -> list[str]:
        b = imp.b
        if mode == "scatter":
            raw = imp.extract(index, ivs)
        else:
            raw = imp.extract(index, [ivs[d]] if index.type.rank == 1 else [])
        t = b.index_cast(raw, index.type.elem)
        n = b.const_index(out_t.shape[d])
        zero = b.const_index(0)
        ok = b.assign(f"arith.cmpi ult, {t}, {n} : index")  # unsigned: negative indices fail too
        if isinstance(src, Value):
            val = b.cast(imp.extract(src, ivs), src.type.elem, e)
        else:
            val = b.const(src, e)
        if alpha != 1:
            val = b.binary("mul", val, b.const(alpha, e), e)
        coords = list(ivs)
        coords[d] = t
        results = [b.fresh("if") for _ in accs]
        head = f"{results[0]}:{len(accs)}" if len(accs) > 1 else results[0]
        types = ", ".join(str(v.type) for v in carried)
        b.emit(f"{head} = scf.if {ok} -> ({types}) {{")
        b.indent += 2
        if direct:
            if reduce == "sum":
                val = b.binary("add", imp.extract(Value(accs[0], out_t), coords), val, e)
            new = [imp.insert(val, accs[0], out_t, coords)]
        else:
            old = imp.extract(Value(accs[0], out_t), coords)
            kind = {"sum": "add", "mean": "add", "prod": "mul", "amax": "max", "amin": "min"}[reduce]
            comb = b.binary(kind, old, val, e)
            cnt = imp.extract(Value(accs[1], out_t.with_elem("i64")), coords)
            cnt1 = b.binary("add", cnt, b.const(1, "i64"), "i64")
            new = [imp.insert(comb, accs[0], out_t, coords), imp.insert(cnt1, accs[1], out_t.with_elem("i64"), coords)]
        b.emit(f"scf.yield {', '.join(new)} : {types}")
        b.indent -= 2
        b.emit("} else {")
        b.indent += 2
        b.emit(f"scf.yield {', '.join(accs)} : {types}")
        b.indent -= 2
        b.emit("}")
        return [f"{results[0]}#{i}" for i in range(len(accs))] if len(accs) > 1 else [results[0]]

    res = imp.index_loops(list(iter_shape), carried, body)
    if direct:
        return res[0]
    acc, cnt = res

    def combine(b: Builder, v: list[str]) -> str:
        s, ac, c = v[:3]
        touched = b.cmp("gt", c, b.const(0, "i64"), "i64")
        if reduce == "mean":
            n = c if not include_self else b.binary("add", c, b.const(1, "i64"), "i64")
            tot = ac if not include_self else b.binary("add", ac, s, e)
            nf = b.cast(n, "i64", e)
            r = b.binary("div", tot, nf, e) if is_float(e) else b.binary("div", tot, nf, e)
        elif include_self:
            kind = {"prod": "mul", "amax": "max", "amin": "min", "sum": "add"}[reduce]
            r = b.binary(kind, s, ac, e)
        else:
            r = ac
        return b.select(touched, r, s, e)

    init = imp.b.empty(out_t)
    m = identity_map(R)
    return imp.b.generic([(self_v, m), (acc, m), (cnt, m)], [(init, m)], ["parallel"] * R, combine)[0]


@lowering("aten::scatter.src", "aten::scatter.value", "aten::scatter_add.default", "aten::scatter.reduce",
          "aten::scatter.value_reduce", "aten::scatter_reduce.two")
def _scatter(imp: FxImporter, node, a: dict) -> Value:

    key = op_key(node.target)
    src = a.get("src", a.get("value"))
    reduce = a.get("reduce")
    if key == "aten::scatter_add.default":
        reduce = "sum"
    include_self = a.get("include_self", True)
    return _scatter_like(imp, imp.cast(a["self"], imp.out_type().elem), a["dim"], a["index"], src, reduce,
                         include_self, "scatter")


@lowering("aten::index_add.default", "aten::index_reduce.default", "aten::index_copy.default")
def _index_add(imp: FxImporter, node, a: dict) -> Value:

    key = op_key(node.target)
    src = a.get("source")
    if key == "aten::index_add.default":
        reduce, include_self = "sum", True
    elif key == "aten::index_copy.default":
        reduce, include_self = None, True
    else:
        reduce, include_self = a["reduce"], a.get("include_self", True)
    return _scatter_like(imp, a["self"], a["dim"], a["index"], src, reduce, include_self, "index",
                         alpha=a.get("alpha", 1))


# ----------------------------------------------------------------------------------------------------------------
# top-k
# ----------------------------------------------------------------------------------------------------------------


@lowering("aten::topk.default")
def _topk(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    """``torch.topk`` through ``moe.topk_renorm mode(probs) renormalize(false)``: the selected values, raw.

    Same selection (descending, NaN first; ties to the lowest index, where torch leaves the order unspecified).
    ``largest=False`` negates the scores; another ``dim`` is moved last and back."""
    x = a["self"]
    k = int(a["k"])
    R = x.type.rank
    d = _norm_dim(a.get("dim", -1), R)
    largest = a.get("largest", True)
    vt, it = imp.out_type(0), imp.out_type(1)
    if not is_float(x.type.elem) or x.type.elem == "f64":
        raise NotImplementedError(f"topk of {x.type.elem} (the moe gate takes f32/f16/bf16)")
    if R == 0:
        raise NotImplementedError("topk of a scalar")
    perm = list(range(R))
    if d != R - 1:
        perm[d], perm[R - 1] = perm[R - 1], perm[d]
        x = imp.transpose(x, perm)
    if not largest:
        x = imp.elementwise(x.type, [x], x.type.elem, lambda b, v: b.unary("neg", v[0], x.type.elem))
    sel_shape = x.type.shape[:-1] + (k,)
    w, idx = imp.moe_op(
        "moe.topk_renorm", [x],
        {"k": f"{k} : i64", "mode": "#moe<topk_mode probs>", "renormalize": "false"},
        [TensorType(sel_shape, "f32"), TensorType(sel_shape, "i32")],
    )
    if not largest:
        w = imp.elementwise(w.type, [w], "f32", lambda b, v: b.unary("neg", v[0], "f32"))
    w = imp.cast(w, vt.elem)
    idx = imp.cast(idx, it.elem)
    if d != R - 1:
        w, idx = imp.transpose(w, perm), imp.transpose(idx, perm)
    return (w, idx)
