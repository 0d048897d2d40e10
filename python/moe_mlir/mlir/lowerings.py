"""The entries of :data:`moe_mlir.mlir.table.LOWERINGS`: one function per ATen (or ``moe``) op family.

Each lowering receives the importer, the FX node and its arguments bound by schema name (FX nodes replaced by
:class:`~moe_mlir.mlir.builder.Value` s) and returns the Value (or tuple of Values) of the node. Result types always
come from the node's ``meta["val"]`` (torch's own shape and dtype inference), so the lowerings only compute.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import torch

from ..runtime.abi import DTYPE_OF_ELEM
from .builder import Builder, TensorType, Value, affine_map, format_float, identity_map, is_float, mlir_elem
from .table import lowering, op_key

if TYPE_CHECKING:  # pragma: no cover
    from .importer import FxImporter

Scalar = Union[bool, int, float]


def _norm_dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _dims(dim: Any, rank: int) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(rank))
    if isinstance(dim, int):
        return [_norm_dim(dim, rank)]
    return sorted({_norm_dim(d, rank) for d in dim})


def _compute_elem(imp: FxImporter, *operands: Any) -> str:
    """The promoted element type of ``operands`` (torch.result_type on the fake values)."""
    vals = []
    for o in operands:
        if isinstance(o, Value):
            vals.append(torch.empty((), dtype=_dtype(o.type.elem)))
        elif o is not None:
            vals.append(o)
    if not vals:
        raise NotImplementedError("no operands")
    dt = vals[0] if isinstance(vals[0], torch.Tensor) else torch.tensor(vals[0])
    for v in vals[1:]:
        dt = torch.empty((), dtype=torch.result_type(dt, v))
    return mlir_elem(dt.dtype)


def _dtype(elem: str) -> torch.dtype:
    return DTYPE_OF_ELEM[elem]


# ----------------------------------------------------------------------------------------------------------------
# Elementwise arithmetic
# ----------------------------------------------------------------------------------------------------------------

_BINARY = {
    "aten::add.Tensor": "add", "aten::add.Scalar": "add",
    "aten::sub.Tensor": "sub", "aten::sub.Scalar": "sub",
    "aten::mul.Tensor": "mul", "aten::mul.Scalar": "mul",
    "aten::div.Tensor": "div", "aten::div.Scalar": "div",
    "aten::maximum.default": "max", "aten::minimum.default": "min",
    "aten::pow.Tensor_Scalar": "pow", "aten::pow.Tensor_Tensor": "pow",
    "aten::remainder.Tensor": "rem", "aten::remainder.Scalar": "rem",
    "aten::fmod.Tensor": "rem", "aten::fmod.Scalar": "rem",
    "aten::logical_and.default": "and", "aten::logical_or.default": "or", "aten::logical_xor.default": "xor",
    "aten::bitwise_and.Tensor": "and", "aten::bitwise_or.Tensor": "or", "aten::bitwise_xor.Tensor": "xor",
}


@lowering(*_BINARY)
def _binary(imp: FxImporter, node, a: dict) -> Value:

    kind = _BINARY[op_key(node.target)]
    x, y = a["self"], a["other"] if "other" in a else a.get("exponent")
    out = imp.out_type()
    alpha = a.get("alpha", 1)
    if kind in ("and", "or", "xor") and op_key(node.target).startswith("aten::logical"):
        return imp.elementwise(out, [_as_bool(imp, x), _as_bool(imp, y)], "i1",
                               lambda b, v: b.binary(kind, v[0], v[1], "i1"))
    comp = out.elem
    if kind == "pow" and isinstance(y, (int, float)) and not isinstance(y, bool) and is_float(comp):
        e = float(y)
        if e == 2.0:
            return imp.elementwise(out, [x], comp, lambda b, v: b.binary("mul", v[0], v[0], comp))
        if e == 0.5:
            return imp.elementwise(out, [x], comp, lambda b, v: b.unary("sqrt", v[0], comp))
        if e == 1.0:
            return imp.cast(x, out.elem)
        if e.is_integer():
            return imp.elementwise(out, [x], comp, lambda b, v: _fpowi(b, v[0], b.const(int(e), "i32"), comp))
    if kind == "pow" and not is_float(comp):
        # math.ipowi has no LLVM lowering in the pipeline: multiply out a constant exponent instead.
        if not isinstance(y, int) or isinstance(y, bool) or y < 0 or y > 64:
            raise NotImplementedError("integer pow with a non-constant or negative exponent")

        def ipow(b: Builder, v: list[str]) -> str:
            result, base, n = b.const(1, comp), v[0], int(y)
            while n:
                if n & 1:
                    result = b.binary("mul", result, base, comp)
                n >>= 1
                if n:
                    base = b.binary("mul", base, base, comp)
            return result

        return imp.elementwise(out, [x], comp, ipow)
    if kind == "rem" and not is_float(comp) and "remainder" in op_key(node.target):
        # Python's modulo on integers: the result takes the sign of the divisor.
        def irem(b: Builder, v: list[str]) -> str:
            r = b.binary("rem", v[0], v[1], comp)
            zero = b.const(0, comp)
            fix = b.binary("and", b.cmp("ne", r, zero, comp),
                           b.binary("xor", b.cmp("lt", r, zero, comp), b.cmp("lt", v[1], zero, comp), "i1"), "i1")
            return b.select(fix, b.binary("add", r, v[1], comp), r, comp)

        return imp.elementwise(out, [x, y], comp, irem)
    if kind == "rem" and is_float(comp) and "remainder" in op_key(node.target):
        # torch.remainder is Python's modulo (sign of the divisor): r = a - floor(a / b) * b
        def fn(b: Builder, v: list[str]) -> str:
            q = b.unary("floor", b.binary("div", v[0], v[1], comp), comp)
            return b.binary("sub", v[0], b.binary("mul", q, v[1], comp), comp)

        return imp.elementwise(out, [x, y], comp, fn)
    if kind == "div" and not is_float(comp):
        raise NotImplementedError("integer true division producing an integer")

    def fn(b: Builder, v: list[str]) -> str:
        rhs = v[1]
        if alpha != 1 and kind in ("add", "sub"):
            rhs = b.binary("mul", rhs, b.const(alpha, comp), comp)
        return b.binary(kind, v[0], rhs, comp)

    rounding = a.get("rounding_mode")
    if rounding is not None:
        raise NotImplementedError(f"div with rounding_mode={rounding!r}")
    return imp.elementwise(out, [x, y], comp, fn)


def _fpowi(b: Builder, x: str, n: str, elem: str) -> str:
    return b.assign(f"math.fpowi {x}, {n} : {elem}, i32")


@lowering("aten::rsub.Scalar", "aten::rsub.Tensor")
def _rsub(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    alpha = a.get("alpha", 1)

    def fn(b: Builder, v: list[str]) -> str:
        x = v[0] if alpha == 1 else b.binary("mul", v[0], b.const(alpha, out.elem), out.elem)
        return b.binary("sub", v[1], x, out.elem)

    return imp.elementwise(out, [a["self"], a["other"]], out.elem, fn)


def _as_bool(imp: FxImporter, x: Any) -> Any:
    if isinstance(x, Value):
        return imp.cast(x, "i1")
    return bool(x)


_UNARY = {
    "aten::neg.default": "neg", "aten::abs.default": "abs", "aten::exp.default": "exp", "aten::log.default": "log",
    "aten::sqrt.default": "sqrt", "aten::rsqrt.default": "rsqrt", "aten::relu.default": "relu",
    "aten::sigmoid.default": "sigmoid", "aten::tanh.default": "tanh", "aten::erf.default": "erf",
    "aten::reciprocal.default": "reciprocal", "aten::silu.default": "silu", "aten::log1p.default": "log1p",
    "aten::expm1.default": "expm1", "aten::sin.default": "sin", "aten::cos.default": "cos",
    "aten::floor.default": "floor", "aten::ceil.default": "ceil", "aten::log2.default": "log2",
    "aten::exp2.default": "exp2",
}


@lowering(*_UNARY)
def _unary(imp: FxImporter, node, a: dict) -> Value:

    kind = _UNARY[op_key(node.target)]
    out = imp.out_type()
    x = a["self"]
    comp = out.elem
    # Transcendentals of f16/bf16 are computed in f32 (as torch's CPU kernels do) and rounded once.
    if comp in ("f16", "bf16") and kind not in ("neg", "abs", "relu"):
        comp = "f32"
    return imp.elementwise(out, [x], comp, lambda b, v: b.unary(kind, v[0], comp))


@lowering("aten::gelu.default")
def _gelu(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    comp = "f64" if out.elem == "f64" else "f32"
    approx = a.get("approximate", "none")

    def fn(b: Builder, v: list[str]) -> str:
        x = v[0]
        half = b.const(0.5, comp)
        one = b.const(1.0, comp)
        if approx == "tanh":
            x3 = b.binary("mul", b.binary("mul", x, x, comp), x, comp)
            inner = b.binary("add", x, b.binary("mul", b.const(0.044715, comp), x3, comp), comp)
            t = b.unary("tanh", b.binary("mul", b.const(math.sqrt(2.0 / math.pi), comp), inner, comp), comp)
        else:
            t = b.unary("erf", b.binary("mul", x, b.const(1.0 / math.sqrt(2.0), comp), comp), comp)
        return b.binary("mul", b.binary("mul", half, x, comp), b.binary("add", one, t, comp), comp)

    return imp.elementwise(out, [a["self"]], comp, fn)


@lowering("aten::clamp.default", "aten::clamp.Tensor", "aten::clamp_min.default", "aten::clamp_max.default",
          "aten::clamp_min.Tensor", "aten::clamp_max.Tensor")
def _clamp(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    lo = a.get("min")
    hi = a.get("max")
    ops: list[Any] = [a["self"]]
    has_lo, has_hi = lo is not None, hi is not None
    if has_lo:
        ops.append(lo)
    if has_hi:
        ops.append(hi)
    comp = out.elem

    def fn(b: Builder, v: list[str]) -> str:
        r = v[0]
        i = 1
        if has_lo:
            r = b.binary("max", r, v[i], comp)
            i += 1
        if has_hi:
            r = b.binary("min", r, v[i], comp)
        return r

    return imp.elementwise(out, ops, comp, fn)


_CMP = {
    "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
}


@lowering(*[f"aten::{c}.{o}" for c in _CMP for o in ("Tensor", "Scalar")])
def _compare(imp: FxImporter, node, a: dict) -> Value:
    pred = node.target._schema.name.split("::")[1]
    out = imp.out_type()
    x, y = a["self"], a["other"]
    comp = _compute_elem(imp, x, y)
    return imp.elementwise(out, [x, y], comp, lambda b, v: b.cmp(pred, v[0], v[1], comp), fn_elem="i1")


@lowering("aten::logical_not.default", "aten::bitwise_not.default")
def _not(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    x = a["self"]
    if out.elem != "i1":
        if "bitwise" in node.target._schema.name:
            return imp.elementwise(out, [x], out.elem, lambda b, v: b.binary("xor", v[0], b.const(-1, out.elem), out.elem))
    return imp.elementwise(out, [_as_bool(imp, x)], "i1", lambda b, v: b.binary("xor", v[0], b.const(True, "i1"), "i1"))


@lowering("aten::isnan.default")
def _isnan(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    if not is_float(x.type.elem):
        return imp.b.filled(False, imp.out_type())
    return imp.elementwise(imp.out_type(), [x], x.type.elem, lambda b, v: b.isnan(v[0], x.type.elem), fn_elem="i1")


@lowering("aten::isinf.default")
def _isinf(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    e = x.type.elem
    if not is_float(e):
        return imp.b.filled(False, imp.out_type())

    def fn(b: Builder, v: list[str]) -> str:
        return b.cmp("eq", b.unary("abs", v[0], e), b.const(float("inf"), e), e)

    return imp.elementwise(imp.out_type(), [x], e, fn, fn_elem="i1")


# `elementwise` would convert the condition to the result type; `where` keeps it i1.
def _where_fixed(imp: FxImporter, out: TensorType, cond: Value, x: Any, y: Any) -> Value:
    tensors = [cond] + [o for o in (x, y) if isinstance(o, Value)]
    ins = [(v, imp.broadcast_map(v.type.shape, out.shape)) for v in tensors]
    init = imp.b.empty(out)

    def body(b: Builder, args: list[str]) -> str:
        it = iter(args)
        c = next(it)
        vals = []
        for o in (x, y):
            if isinstance(o, Value):
                vals.append(b.cast(next(it), o.type.elem, out.elem))
            else:
                vals.append(b.const(o, out.elem))
        return b.select(c, vals[0], vals[1], out.elem)

    return imp.b.generic(ins, [(init, identity_map(out.rank))], ["parallel"] * out.rank, body)[0]


@lowering("aten::where.self", "aten::where.ScalarOther", "aten::where.ScalarSelf", "aten::where.Scalar")
def _where2(imp: FxImporter, node, a: dict) -> Value:
    return _where_fixed(imp, imp.out_type(), _as_bool(imp, a["condition"]), a["self"], a["other"])


@lowering("aten::masked_fill.Scalar", "aten::masked_fill.Tensor")
def _masked_fill2(imp: FxImporter, node, a: dict) -> Value:
    return _where_fixed(imp, imp.out_type(), _as_bool(imp, a["mask"]), a["value"], a["self"])


# ----------------------------------------------------------------------------------------------------------------
# Copies, casts, no-ops
# ----------------------------------------------------------------------------------------------------------------


@lowering("aten::clone.default", "aten::contiguous.default", "aten::alias.default", "aten::detach.default",
          "aten::lift_fresh_copy.default", "aten::_to_copy.default", "aten::to.dtype", "aten::to.dtype_layout",
          "aten::to.device", "aten::type_as.default", "aten::_assert_tensor_metadata.default", "aten::copy.default")
def _copy(imp: FxImporter, node, a: dict) -> Optional[Value]:

    key = op_key(node.target)
    if key == "aten::_assert_tensor_metadata.default":
        return None
    if key == "aten::copy.default":
        return imp.cast(imp.broadcast_to(a["src"], a["self"].type.shape), a["self"].type.elem)
    x = a["self"]
    out = imp.out_type()
    return imp.cast(x, out.elem)


@lowering("aten::dropout.default", "aten::feature_dropout.default", "aten::alpha_dropout.default")
def _dropout(imp: FxImporter, node, a: dict) -> Value:
    if a.get("train"):
        raise NotImplementedError("dropout in training mode (put the model in eval mode before importing)")
    return a["input"]


@lowering("aten::_assert_scalar.default", "aten::sym_constrain_range_for_size.default",
          "aten::_assert_async.msg")
def _ignore(imp: FxImporter, node, a: dict) -> None:
    return None


# ----------------------------------------------------------------------------------------------------------------
# Creation
# ----------------------------------------------------------------------------------------------------------------


@lowering("aten::full.default", "aten::zeros.default", "aten::ones.default", "aten::empty.memory_format",
          "aten::full_like.default", "aten::zeros_like.default", "aten::ones_like.default", "aten::empty_like.default",
          "aten::new_zeros.default", "aten::new_ones.default", "aten::new_full.default", "aten::new_empty.default",
          "aten::scalar_tensor.default", "aten::empty_strided.default")
def _full(imp: FxImporter, node, a: dict) -> Value:
    name = node.target._schema.name.split("::")[1]
    out = imp.out_type()
    if "fill_value" in a and a["fill_value"] is not None:
        v = a["fill_value"]
    elif name.startswith(("ones", "new_ones")):
        v = 1
    elif name == "scalar_tensor":
        v = a["s"]
    else:
        v = 0  # zeros, and `empty` (its contents are unspecified; zeros are as good as any)
    if isinstance(v, Value):
        raise NotImplementedError("a fill value computed at run time")
    return imp.b.filled(v, out)


@lowering("aten::arange.default", "aten::arange.start", "aten::arange.start_step")
def _arange(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    start = a.get("start", 0) if "start" in a else 0
    step = a.get("step", 1) or 1
    comp = out.elem

    def body(b: Builder, args: list[str]) -> str:
        i = b.linalg_index(0)
        iv = b.to_int(i, "i64")
        x = b.cast(iv, "i64", comp)
        return b.binary("add", b.const(start, comp), b.binary("mul", x, b.const(step, comp), comp), comp)

    init = imp.b.empty(out)
    return imp.b.generic([], [(init, identity_map(1))], ["parallel"], body)[0]


@lowering("aten::tril.default", "aten::triu.default")
def _tri(imp: FxImporter, node, a: dict) -> Value:
    upper = "triu" in node.target._schema.name
    x = a["self"]
    k = a.get("diagonal", 0) or 0
    out = imp.out_type()
    R = out.rank

    def body(b: Builder, args: list[str]) -> str:
        r = b.to_int(b.linalg_index(R - 2), "i64")
        c = b.to_int(b.linalg_index(R - 1), "i64")
        d = b.binary("sub", c, r, "i64")
        keep = b.cmp("ge" if upper else "le", d, b.const(k, "i64"), "i64")
        return b.select(keep, args[0], b.const(0, out.elem), out.elem)

    init = imp.b.empty(out)
    return imp.b.generic([(x, identity_map(R))], [(init, identity_map(R))], ["parallel"] * R, body)[0]


@lowering("aten::one_hot.default")
def _one_hot(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    out = imp.out_type()
    R = out.rank

    def body(b: Builder, args: list[str]) -> str:
        c = b.to_int(b.linalg_index(R - 1), x.type.elem)
        return b.cast(b.cmp("eq", args[0], c, x.type.elem), "i1", out.elem)

    init = imp.b.empty(out)
    return imp.b.generic([(x, affine_map(R, list(range(R - 1))))], [(init, identity_map(R))], ["parallel"] * R, body)[0]


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


# ----------------------------------------------------------------------------------------------------------------
# Views and shape manipulation (value semantics: every view is a copy-free reshape or a new tensor)
# ----------------------------------------------------------------------------------------------------------------


@lowering("aten::view.default", "aten::_unsafe_view.default", "aten::reshape.default", "aten::view_copy.default",
          "aten::flatten.using_ints", "aten::unflatten.int", "aten::squeeze.dim", "aten::squeeze.dims",
          "aten::squeeze.default", "aten::unsqueeze.default", "aten::expand_as.default")
def _view(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    x = a["self"]
    if node.target._schema.name.endswith("expand_as"):
        return imp.broadcast_to(x, out.shape)
    return imp.reshape(x, out.shape)


@lowering("aten::permute.default", "aten::transpose.int", "aten::t.default", "aten::permute_copy.default",
          "aten::numpy_T.default")
def _permute(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    R = x.type.rank
    name = node.target._schema.name.split("::")[1]
    if name.startswith("permute"):
        perm = [d % R for d in a["dims"]]
    elif name == "transpose":
        d0, d1 = _norm_dim(a["dim0"], R), _norm_dim(a["dim1"], R)
        perm = list(range(R))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        perm = list(reversed(range(R)))
    return imp.transpose(x, perm)


@lowering("aten::expand.default", "aten::expand_copy.default", "aten::broadcast_to.default")
def _expand(imp: FxImporter, node, a: dict) -> Value:
    return imp.broadcast_to(a["self"], imp.out_type().shape)


@lowering("aten::slice.Tensor", "aten::slice_copy.Tensor", "aten::narrow.default")
def _slice(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    R = x.type.rank
    d = _norm_dim(a.get("dim", 0), R)
    n = x.type.shape[d]
    if node.target._schema.name.endswith("narrow"):
        start = a["start"] % n if a["start"] < 0 else a["start"]
        end, step = start + a["length"], 1
    else:
        start, end, step = a.get("start"), a.get("end"), a.get("step", 1) or 1
        start = 0 if start is None else start
        end = n if end is None else end
        start = max(min(start + n if start < 0 else start, n), 0)
        end = max(min(end + n if end < 0 else end, n), 0)
    out = imp.out_type()
    if out.shape == x.type.shape:
        return x
    offsets = [0] * R
    offsets[d] = start
    strides = [1] * R
    strides[d] = step
    return imp.extract_slice(x, offsets, out.shape, strides)


@lowering("aten::select.int", "aten::select_copy.int")
def _select(imp: FxImporter, node, a: dict) -> Value:
    x = a["self"]
    R = x.type.rank
    d = _norm_dim(a["dim"], R)
    i = a["index"]
    i = i + x.type.shape[d] if i < 0 else i
    offsets = [0] * R
    offsets[d] = i
    sizes = list(x.type.shape)
    sizes[d] = 1
    return imp.extract_slice(x, offsets, sizes, [1] * R, out_t=imp.out_type())


@lowering("aten::cat.default", "aten::concat.default", "aten::stack.default")
def _cat(imp: FxImporter, node, a: dict) -> Value:
    out = imp.out_type()
    tensors = [t for t in a["tensors"] if t.type.numel > 0 or node.target._schema.name.endswith("stack")]
    d = _norm_dim(a.get("dim", 0), out.rank)
    stack = node.target._schema.name.endswith("stack")
    dest = imp.b.empty(out)
    off = 0
    for t in tensors:
        t = imp.cast(t, out.elem)
        if stack:
            shape = list(t.type.shape)
            shape.insert(d, 1)
            t = imp.reshape(t, shape)
        offsets = [0] * out.rank
        offsets[d] = off
        dest = imp.insert_slice(t, dest, offsets)
        off += t.type.shape[d]
    return dest


@lowering("aten::split.Tensor", "aten::split_with_sizes.default", "aten::chunk.default", "aten::unbind.int",
          "aten::split_with_sizes_copy.default")
def _split(imp: FxImporter, node, a: dict) -> tuple:
    x = a["self"]
    R = x.type.rank
    d = _norm_dim(a.get("dim", 0), R)
    vals = node.meta["val"]
    outs = []
    off = 0
    unbind = node.target._schema.name.endswith("unbind")
    for i, v in enumerate(vals):
        t = imp.type_of_val(v, node)
        size = 1 if unbind else t.shape[d]
        offsets = [0] * R
        offsets[d] = off
        sizes = list(x.type.shape)
        sizes[d] = size
        outs.append(imp.extract_slice(x, offsets, sizes, [1] * R, out_t=t))
        off += size
    return tuple(outs)


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


# ----------------------------------------------------------------------------------------------------------------
# The moe ops (torch.ops.moe.*): printed in the generic form of DIALECT.md
# ----------------------------------------------------------------------------------------------------------------


def _f32(x: float) -> str:
    return f"{format_float(x, 'f32')} : f32"


def _bool(x: bool) -> str:
    return "true" if x else "false"


@lowering("moe::topk_renorm.default")
def _moe_topk_renorm(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    attrs = {"k": f"{int(a['k'])} : i64", "mode": f"#moe<topk_mode {a['mode']}>", "renormalize": _bool(a["renormalize"])}
    return tuple(imp.moe_op("moe.topk_renorm", [a["scores"]], attrs, [imp.out_type(0), imp.out_type(1)]))


@lowering("moe::route.default")
def _moe_route(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    """``moe.route`` (MoERoutingOps.td), raised from DeepSeek-V3 / Llama-4 style routers."""
    attrs = {"k": f"{int(a['k'])} : i64", "scoring": f"#moe<scoring {a['scoring']}>",
             "order": f"#moe<order {a['order']}>", "n_group": f"{int(a['n_group'])} : i64",
             "topk_group": f"{int(a['topk_group'])} : i64", "group_score": f"#moe<group_score {a['group_score']}>",
             "renormalize": _bool(a["renormalize"]), "routed_scaling_factor": _f32(a["routed_scaling_factor"])}
    operands = [a["logits"]] + ([a["bias"]] if a.get("bias") is not None else [])
    return tuple(imp.moe_op("moe.route", operands, attrs, [imp.out_type(0), imp.out_type(1)]))


@lowering("moe::dispatch_plan.default")
def _moe_dispatch_plan(imp: FxImporter, node, a: dict) -> tuple[Value, ...]:
    attrs = {"num_experts": f"{int(a['num_experts'])} : i64", "block_size": f"{int(a['block_size'])} : i64"}
    return tuple(imp.moe_op("moe.dispatch_plan", [a["indices"]], attrs, [imp.out_type(j) for j in range(7)]))


@lowering("moe::bias_update.default")
def _moe_bias_update(imp: FxImporter, node, a: dict) -> Value:
    """``moe.bias_update`` (DeepSeek-V3's balancing step): the rate is the op's f32 attribute."""
    return imp.moe_op("moe.bias_update", [a["bias"], a["counts"]], {"rate": _f32(a["rate"])}, [imp.out_type(0)])[0]


# The load-balancing losses (MoEBalanceOps.td): the Switch loss is moe.router_stats (one fused pass) and the
# E-long moe.load_balancing_loss on its results; a token mask of another dtype is cast to f32 (it multiplies).


def _balance_float(imp: FxImporter, v: Value) -> Value:
    return v if v.type.elem in ("f32", "f16", "bf16") else imp.cast(v, "f32")


def _router_stats(imp: FxImporter, a: dict) -> list[Value]:
    x = _balance_float(imp, a["logits"])
    operands = [x]
    if a.get("token_mask") is not None:
        operands.append(_balance_float(imp, a["token_mask"]))
    e = TensorType((x.type.shape[1],), "f32")
    return imp.moe_op("moe.router_stats", operands, {"k": f"{int(a['top_k'])} : i64"}, [e, e, TensorType((), "f32")])


@lowering("moe::router_stats.default")
def _moe_router_stats(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    counts, probs, _ = _router_stats(imp, a)
    return counts, probs


@lowering("moe::load_balancing_loss.default")
def _moe_load_balancing_loss(imp: FxImporter, node, a: dict) -> Value:
    return imp.moe_op("moe.load_balancing_loss", _router_stats(imp, a), {}, [imp.out_type()])[0]


@lowering("moe::router_z_loss.default")
def _moe_router_z_loss(imp: FxImporter, node, a: dict) -> Value:
    return imp.moe_op("moe.router_z_loss", [_balance_float(imp, a["logits"])], {}, [imp.out_type()])[0]


@lowering("moe::sequence_balance_loss.default")
def _moe_sequence_balance_loss(imp: FxImporter, node, a: dict) -> Value:
    return imp.moe_op("moe.sequence_balance_loss", [_balance_float(imp, a["scores"]), a["indices"]], {},
                      [imp.out_type()])[0]


@lowering("moe::similarity_inform.default")
def _moe_similarity_inform(imp: FxImporter, node, a: dict) -> Value:
    operands = [a["u"], a["e"]]
    ws, km = a.get("ws"), a.get("key_mask")
    if ws is not None:
        operands.append(ws)
    if km is not None:
        operands.append(km)
    attrs = {
        "tau": _f32(a["tau"]),
        "causal": _bool(a["causal"]),
        "operandSegmentSizes": f"array<i32: 1, 1, {int(ws is not None)}, {int(km is not None)}>",
    }
    return imp.moe_op("moe.similarity_inform", operands, attrs, [imp.out_type()])[0]


@lowering("moe::attention_posterior.default")
def _moe_attention_posterior(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    attrs = {"sigma": _f32(a["sigma"]), "head_select": f"#moe<head_select {a['head_select']}>"}
    if a.get("head_scale") is not None:
        attrs["head_scale"] = _f32(a["head_scale"])
    operands = [a["scores"], a["u"], a["v"], a["wo"], a["e"]]
    return tuple(imp.moe_op("moe.attention_posterior", operands, attrs, [imp.out_type(0), imp.out_type(1)]))


@lowering("moe::mad_dispersion.default")
def _moe_mad_dispersion(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    attrs = {
        "num_experts": f"{int(a['num_experts'])} : i64",
        "eps": _f32(a["eps"]),
        "clip": _f32(a["clip"]),
        "normalize": f"#moe<normalize {a['normalize']}>",
        "measure": f"#moe<measure {a['measure']}>",
        "empty": f"#moe<empty {a['empty']}>",
    }
    return tuple(imp.moe_op("moe.mad_dispersion", [a["tokens"], a["assign"]], attrs,
                            [imp.out_type(0), imp.out_type(1)]))


@lowering("moe::adjacency_update.default")
def _moe_adjacency_update(imp: FxImporter, node, a: dict) -> Value:
    attrs = {"beta": _f32(a["beta"]), "norm": f"#moe<norm {a['norm']}>", "include_self": _bool(a["include_self"])}
    return imp.moe_op("moe.adjacency_update", [a["a"], a["idx"]], attrs, [imp.out_type()])[0]


@lowering("moe::hyper_router.default")
def _moe_hyper_router(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    attrs = {"num_experts": f"{int(a['num_experts'])} : i64"}
    operands = [a["emb"], a["w1"], a["b1"], a["w2"], a["b2"]]
    return tuple(imp.moe_op("moe.hyper_router", operands, attrs, [imp.out_type(0), imp.out_type(1)]))
