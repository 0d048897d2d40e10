"""Reductions, softmax and normalization.

Entries of :data:`moe_mlir.mlir.table.LOWERINGS` (:mod:`moe_mlir.mlir.lowerings`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence, Union

from ..builder import Builder, TensorType, Value, affine_map, identity_map, is_float
from ..table import lowering
from ._common import _dims, _norm_dim
from .elementwise import _as_bool

if TYPE_CHECKING:  # pragma: no cover
    from ..importer import FxImporter


# ----------------------------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------------------------


@lowering("aten::sum.dim_IntList", "aten::sum.default", "aten::mean.dim", "aten::mean.default")
def _sum_mean(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    out = imp.out_type()
    dims = _dims(a.get("dim"), x.type.rank)
    keep = bool(a.get("keepdim", False))
    acc = imp.acc_elem(out.elem)
    r = imp.reduce(x, dims, keep, 0, lambda b, p, v: b.binary("add", p, v, acc), acc)
    if "mean" in node.target._schema.name:
        n = math.prod(x.type.shape[d] for d in dims) if x.type.rank else 1
        r = imp.elementwise(r.type, [r], acc, lambda b, v: b.binary("div", v[0], b.const(float(n), acc), acc))
    return imp.cast(r, out.elem)


@lowering("aten::prod.dim_int", "aten::prod.default")
def _prod(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    out = imp.out_type()
    dims = _dims(a.get("dim"), x.type.rank)
    acc = imp.acc_elem(out.elem)
    r = imp.reduce(x, dims, bool(a.get("keepdim", False)), 1, lambda b, p, v: b.binary("mul", p, v, acc), acc)
    return imp.cast(r, out.elem)


@lowering("aten::amax.default", "aten::amin.default", "aten::max.default", "aten::min.default")
def _amax(imp: FxImporter, node, a: dict) -> Value:
    name = node.target._schema.name.split("::")[1]
    x = a["self"]
    out = imp.out_type()
    dims = _dims(a.get("dim"), x.type.rank)
    e = x.type.elem
    is_max = name in ("amax", "max")
    if is_float(e):
        init = float("-inf") if is_max else float("inf")
    elif e == "i1":
        init = not is_max
    else:
        bits = int(e[1:])
        init = -(1 << (bits - 1)) if is_max else (1 << (bits - 1)) - 1
    # maximumf/minimumf propagate NaN, like torch.amax.
    return imp.reduce(x, dims, bool(a.get("keepdim", False)), init,
                      lambda b, p, v: b.binary("max" if is_max else "min", p, v, e), e)


@lowering("aten::any.dim", "aten::any.dims", "aten::any.default", "aten::all.dim", "aten::all.dims", "aten::all.default")
def _any_all(imp: FxImporter, node, a: dict) -> Value:
    is_any = node.target._schema.name.endswith("any")
    x = _as_bool(imp, a["self"])
    dims = _dims(a.get("dim"), x.type.rank)
    return imp.reduce(x, dims, bool(a.get("keepdim", False)), not is_any,
                      lambda b, p, v: b.binary("or" if is_any else "and", p, v, "i1"), "i1")


@lowering("aten::max.dim", "aten::min.dim", "aten::argmax.default", "aten::argmin.default")
def _arg_reduce(imp: FxImporter, node, a: dict) -> Union[Value, tuple[Value, Value]]:
    name = node.target._schema.name.split("::")[1]
    is_max = name in ("max", "argmax")
    x = a["self"]
    e = x.type.elem
    keep = bool(a.get("keepdim", False))
    dim = a.get("dim")
    if dim is None:  # argmax over the flattened tensor
        x = imp.reshape(x, (x.type.numel,))
        dim = 0
    R = x.type.rank
    d = _norm_dim(dim, R)
    out_shape = [1 if i == d else s for i, s in enumerate(x.type.shape) if keep or i != d]
    out_map = affine_map(R, ["0" if i == d else i for i in range(R) if keep or i != d])
    if is_float(e):
        init = float("-inf") if is_max else float("inf")
    else:
        bits = 1 if e == "i1" else int(e[1:])
        init = (-(1 << (bits - 1)) if is_max else (1 << (bits - 1)) - 1) if e != "i1" else (not is_max)
    vals = imp.b.filled(init, TensorType(tuple(out_shape), e))
    idxs = imp.b.filled(0, TensorType(tuple(out_shape), "i64"))
    its = ["reduction" if i == d else "parallel" for i in range(R)]

    def body(b: Builder, args: list[str]) -> list[str]:
        v, best, bi = args
        i = b.to_int(b.linalg_index(d), "i64")
        better = b.cmp("gt" if is_max else "lt", v, best, e)
        if is_float(e):  # NaN wins (torch.max/argmax propagate NaN), the first NaN stays
            vn = b.isnan(v, e)
            bn = b.isnan(best, e)
            not_bn = b.binary("xor", bn, b.const(True, "i1"), "i1")
            better = b.binary("or", b.binary("and", better, not_bn, "i1"), b.binary("and", vn, not_bn, "i1"), "i1")
        # Strict comparison: ties keep the lowest index.
        return [b.select(better, v, best, e), b.select(better, i, bi, "i64")]

    v, ix = imp.b.generic([(x, identity_map(R))], [(vals, out_map), (idxs, out_map)], its, body)
    if name in ("argmax", "argmin"):
        return ix
    return (v, ix)


def _centered_moments(imp: FxImporter, x: Value, dims: Sequence[int], n: int, keep: bool):
    """``(acc, xf, mean, ss)``: the accumulator type, ``x`` cast to it, its mean over ``dims`` (``n`` elements; dims
    kept) and the sum over ``dims`` of the squared deviations from it (dims kept when ``keep``): the two-pass
    moments of var/std and layer_norm."""
    acc = imp.acc_elem(x.type.elem)
    xf = imp.cast(x, acc)
    s = imp.reduce(xf, dims, True, 0.0, lambda b, p, v: b.binary("add", p, v, acc), acc)
    mean = imp.elementwise(s.type, [s], acc, lambda b, v: b.binary("div", v[0], b.const(float(n), acc), acc))
    sq = imp.elementwise(xf.type, [xf, mean], acc,
                         lambda b, v: (lambda d: b.binary("mul", d, d, acc))(b.binary("sub", v[0], v[1], acc)))
    ss = imp.reduce(sq, dims, keep, 0.0, lambda b, p, v: b.binary("add", p, v, acc), acc)
    return acc, xf, mean, ss


@lowering("aten::var.correction", "aten::var.dim", "aten::std.correction", "aten::std.dim", "aten::var_mean.correction")
def _var(imp: FxImporter, node, a: dict) -> Any:
    name = node.target._schema.name.split("::")[1]
    x = a["self"]
    dims = _dims(a.get("dim"), x.type.rank)
    keep = bool(a.get("keepdim", False))
    corr = a.get("correction")
    if corr is None:
        corr = 1 if a.get("unbiased", True) else 0
    n = math.prod(x.type.shape[d] for d in dims)
    acc, xf, mean, ss = _centered_moments(imp, x, dims, n, keep)
    denom = float(max(n - corr, 0))
    var = imp.elementwise(ss.type, [ss], acc, lambda b, v: b.binary("div", v[0], b.const(denom, acc), acc))
    if name == "std":
        var = imp.elementwise(var.type, [var], acc, lambda b, v: b.unary("sqrt", v[0], acc))
    if name == "var_mean":
        m = mean if keep else imp.reshape(mean, var.type.shape)
        return (imp.cast(var, x.type.elem), imp.cast(m, x.type.elem))
    return imp.cast(var, imp.out_type().elem)


@lowering("aten::logsumexp.default")
def _logsumexp(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    dims = _dims(a.get("dim"), x.type.rank)
    keep = bool(a.get("keepdim", False))
    acc = imp.acc_elem(x.type.elem)
    xf = imp.cast(x, acc)
    mx = imp.reduce(xf, dims, True, float("-inf"), lambda b, p, v: b.binary("max", p, v, acc), acc)

    # A slice of all -inf has max -inf: subtract 0 there instead so the result is -inf, not NaN (as torch).
    def shifted(b: Builder, v: list[str]) -> str:
        m = v[1]
        fin = b.cmp("ne", b.unary("abs", m, acc), b.const(float("inf"), acc), acc)
        m = b.select(fin, m, b.const(0.0, acc), acc)
        return b.unary("exp", b.binary("sub", v[0], m, acc), acc)

    ex = imp.elementwise(xf.type, [xf, mx], acc, shifted)
    s = imp.reduce(ex, dims, keep, 0.0, lambda b, p, v: b.binary("add", p, v, acc), acc)
    m2 = mx if keep else imp.reshape(mx, s.type.shape)

    def fin(b: Builder, v: list[str]) -> str:
        m = v[1]
        isfin = b.cmp("ne", b.unary("abs", m, acc), b.const(float("inf"), acc), acc)
        m = b.select(isfin, m, b.const(0.0, acc), acc)
        return b.binary("add", b.unary("log", v[0], acc), m, acc)

    return imp.elementwise(imp.out_type(), [s, m2], acc, fin)


# ----------------------------------------------------------------------------------------------------------------
# Softmax, normalization
# ----------------------------------------------------------------------------------------------------------------


@lowering("aten::softmax.int", "aten::_softmax.default", "aten::log_softmax.int", "aten::_log_softmax.default")
def _softmax(imp: FxImporter, node, a: dict) -> Value:
    log = "log_softmax" in node.target._schema.name
    return imp.softmax(a["self"], a["dim"], imp.out_type().elem, log=log)


@lowering("aten::layer_norm.default", "aten::native_layer_norm.default")
def _layer_norm(imp: FxImporter, node, a: dict) -> Any:
    x = a["input"]
    nshape = list(a["normalized_shape"])
    w, bias = a.get("weight"), a.get("bias")
    eps = float(a["eps"])
    R = x.type.rank
    dims = list(range(R - len(nshape), R))
    n = math.prod(nshape)
    acc, xf, mean, ss = _centered_moments(imp, x, dims, n, True)
    rstd = imp.elementwise(
        ss.type, [ss], acc,
        lambda b, v: b.unary("rsqrt", b.binary("add", b.binary("div", v[0], b.const(float(n), acc), acc),
                                                b.const(eps, acc), acc), acc),
    )
    operands: list[Any] = [xf, mean, rstd]
    if w is not None:
        operands.append(w)
    if bias is not None:
        operands.append(bias)
    out_elem = x.type.elem

    def fn(b: Builder, v: list[str]) -> str:
        y = b.binary("mul", b.binary("sub", v[0], v[1], acc), v[2], acc)
        i = 3
        if w is not None:
            y = b.binary("mul", y, v[i], acc)
            i += 1
        if bias is not None:
            y = b.binary("add", y, v[i], acc)
        return y

    y = imp.elementwise(x.type.with_elem(out_elem), operands, acc, fn)
    if node.target._schema.name.endswith("native_layer_norm"):
        return (y, imp.cast(mean, imp.out_type(1).elem), imp.cast(rstd, imp.out_type(2).elem))
    return y
