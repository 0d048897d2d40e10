"""Elementwise arithmetic, copies, casts and no-ops: ``linalg.generic`` bodies of arith/math ops.

Entries of :data:`moe_mlir.mlir.table.LOWERINGS` (:mod:`moe_mlir.mlir.lowerings`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

from ..builder import Builder, TensorType, Value, identity_map, is_float
from ..table import lowering, op_key
from ._common import _compute_elem

if TYPE_CHECKING:  # pragma: no cover
    from ..importer import FxImporter


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
