"""A small builder that prints MLIR text (there are no MLIR Python bindings in the distro).

It knows just enough of ``func``, ``arith``, ``math``, ``tensor``, ``linalg`` and ``scf`` to print what the importer
lowers to: types (:class:`TensorType`), SSA values (:class:`Value`), scalar arithmetic inside ``linalg.generic``
bodies (:class:`Builder` methods taking element types) and the structured ops. Everything printed is in the custom
assembly of upstream dialects, except the ``moe`` ops, which the importer prints in the generic form (the contract
of DIALECT.md).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence, Union

import torch

from ..runtime import abi
from ..runtime.abi import DTYPE_OF_ELEM

FLOAT_TYPES = ("f16", "bf16", "f32", "f64")
INT_BITS = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64}
FLOAT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}


def is_float(elem: str) -> bool:
    return elem in FLOAT_TYPES


def mlir_elem(dtype: torch.dtype) -> str:
    """:func:`moe_mlir.runtime.abi.mlir_elem` (the one dtype table), failing as a lowering does
    (``NotImplementedError``: the importer's error then names the op)."""
    try:
        return abi.mlir_elem(dtype)
    except TypeError:
        raise NotImplementedError(f"dtype {dtype} has no MLIR element type in this importer") from None


@dataclass(frozen=True)
class TensorType:
    """A static ranked tensor type."""

    shape: tuple[int, ...]
    elem: str

    @staticmethod
    def of(shape: Iterable[int], dtype: Union[torch.dtype, str]) -> "TensorType":
        return TensorType(tuple(int(s) for s in shape), dtype if isinstance(dtype, str) else mlir_elem(dtype))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def with_elem(self, elem: str) -> "TensorType":
        return TensorType(self.shape, elem)

    def with_shape(self, shape: Iterable[int]) -> "TensorType":
        return TensorType(tuple(shape), self.elem)

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.elem}>"


@dataclass(frozen=True)
class Value:
    """An SSA value of tensor type."""

    name: str
    type: TensorType

    def __str__(self) -> str:
        return self.name


# ----------------------------------------------------------------------------------------------------------------
# Literals
# ----------------------------------------------------------------------------------------------------------------


def float_bits(value: float, elem: str) -> int:
    """The IEEE bit pattern of ``value`` rounded to ``elem`` (round-to-nearest-even, as torch does)."""
    dt = DTYPE_OF_ELEM[elem]
    t = torch.tensor([value], dtype=torch.float64).to(dt)
    raw = t.view({16: torch.int16, 32: torch.int32, 64: torch.int64}[FLOAT_BITS[elem]]).item()
    return raw & ((1 << FLOAT_BITS[elem]) - 1)


def format_float(value: float, elem: str) -> str:
    """A float literal of type ``elem``: decimal for finite f32/f64 (exact round trip), hex bits otherwise."""
    value = float(value)
    if elem in ("f32", "f64") and math.isfinite(value):
        if elem == "f32":
            value = struct.unpack("<f", struct.pack("<f", value))[0]
            return f"{value:.9e}"
        return f"{value:.17e}"
    width = FLOAT_BITS[elem] // 4
    return f"0x{float_bits(value, elem):0{width}X}"


def format_scalar(value: Union[bool, int, float], elem: str) -> str:
    if elem == "i1":
        return "true" if bool(value) else "false"
    if is_float(elem):
        return format_float(value, elem)
    v = int(value)
    bits = INT_BITS[elem]
    v = (v + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))  # wrap like a torch cast
    return str(v)


def dense_literal(t: torch.Tensor, elem: str) -> str:
    """``dense<...>`` for a tensor: a splat when all entries are equal, else raw little-endian hex (exact)."""
    t = t.detach().cpu().contiguous()
    flat = t.reshape(-1)
    if flat.numel() > 0 and bool((flat == flat[0]).all()) and not (t.is_floating_point() and torch.isnan(flat).any()):
        return f"dense<{format_scalar(flat[0].item(), elem)}>"
    if elem == "i1" or flat.numel() == 0:
        return f"dense<{_nested_list(t, elem)}>"
    data = t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.uint8 else t.numpy().tobytes()
    return f'dense<"0x{data.hex().upper()}">'


def _nested_list(t: torch.Tensor, elem: str) -> str:
    if t.dim() == 0:
        return format_scalar(t.item(), elem)
    return "[" + ", ".join(_nested_list(s, elem) for s in t) + "]"


def affine_map(n_dims: int, results: Sequence[Union[int, str]]) -> str:
    """``affine_map<(d0, d1) -> (d1, 0)>``: ``results`` holds dim numbers or literal expressions."""
    dims = ", ".join(f"d{i}" for i in range(n_dims))
    res = ", ".join(f"d{r}" if isinstance(r, int) else r for r in results)
    return f"affine_map<({dims}) -> ({res})>"


def identity_map(n: int) -> str:
    return affine_map(n, list(range(n)))


# ----------------------------------------------------------------------------------------------------------------
# The builder
# ----------------------------------------------------------------------------------------------------------------


class Builder:
    """Accumulates the lines of one function; SSA names are unique in the whole function (regions included)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.indent = 2
        self._counter = 0
        self.loc: Optional[str] = None  # a `loc(...)` suffix for the ops being emitted

    # -- plumbing -------------------------------------------------------------------------------------------------
    def fresh(self, hint: str = "") -> str:
        self._counter += 1
        return f"%{hint}{self._counter}"

    def emit(self, line: str) -> None:
        self.lines.append(" " * self.indent + line)

    def _loc(self) -> str:
        return f" {self.loc}" if self.loc else ""

    def assign(self, rhs: str, hint: str = "") -> str:
        """Emits ``%r = <rhs>`` with a fresh name ``%r`` (prefixed by ``hint``) and returns ``%r``."""
        name = self.fresh(hint)
        self.emit(f"{name} = {rhs}")
        return name

    # -- scalars (usable at function level and inside generic bodies) ---------------------------------------------
    def const(self, value: Union[bool, int, float], elem: str) -> str:
        if elem == "i1":  # the BoolAttr form carries its type
            return self.assign(f"arith.constant {format_scalar(value, elem)}", "c")
        return self.assign(f"arith.constant {format_scalar(value, elem)} : {elem}", "c")

    def const_index(self, value: int) -> str:
        return self.assign(f"arith.constant {int(value)} : index", "c")

    def op(self, text: str, elem: str) -> str:
        """Emits ``%r = <text> : elem`` and returns ``%r``."""
        return self.assign(f"{text} : {elem}")

    def binary(self, kind: str, a: str, b: str, elem: str) -> str:
        f = is_float(elem)
        table = {
            "add": ("arith.addf", "arith.addi"),
            "sub": ("arith.subf", "arith.subi"),
            "mul": ("arith.mulf", "arith.muli"),
            "div": ("arith.divf", "arith.divsi"),
            "max": ("arith.maximumf", "arith.maxsi"),
            "min": ("arith.minimumf", "arith.minsi"),
            "rem": ("arith.remf", "arith.remsi"),
            "and": (None, "arith.andi"),
            "or": (None, "arith.ori"),
            "xor": (None, "arith.xori"),
            "pow": ("math.powf", "math.ipowi"),
        }
        op = table[kind][0 if f else 1]
        if op is None:
            raise NotImplementedError(f"'{kind}' on {elem}")
        if elem == "i1" and kind in ("max",):
            op = "arith.ori"
        if elem == "i1" and kind in ("min", "mul"):
            op = "arith.andi"
        return self.op(f"{op} {a}, {b}", elem)

    def unary(self, kind: str, a: str, elem: str) -> str:
        if kind == "neg":
            if is_float(elem):
                return self.op(f"arith.negf {a}", elem)
            return self.binary("sub", self.const(0, elem), a, elem)
        if kind == "abs":
            return self.op(f"math.absf {a}" if is_float(elem) else f"math.absi {a}", elem)
        if kind == "relu":
            zero = self.const(0, elem)
            if is_float(elem):
                # relu(NaN) = NaN as in torch: select on `a > 0` would drop it, maximumf keeps it.
                return self.op(f"arith.maximumf {a}, {zero}", elem)
            return self.op(f"arith.maxsi {a}, {zero}", elem)
        if kind == "sigmoid":
            one = self.const(1.0, elem)
            e = self.op(f"math.exp {self.op(f'arith.negf {a}', elem)}", elem)
            return self.op(f"arith.divf {one}, {self.op(f'arith.addf {one}, {e}', elem)}", elem)
        if kind == "reciprocal":
            return self.op(f"arith.divf {self.const(1.0, elem)}, {a}", elem)
        if kind == "silu":
            return self.binary("mul", a, self.unary("sigmoid", a, elem), elem)
        simple = {
            "exp": "math.exp", "log": "math.log", "sqrt": "math.sqrt", "rsqrt": "math.rsqrt", "tanh": "math.tanh",
            "erf": "math.erf", "log1p": "math.log1p", "expm1": "math.expm1", "sin": "math.sin", "cos": "math.cos",
            "floor": "math.floor", "ceil": "math.ceil", "log2": "math.log2", "exp2": "math.exp2",
        }
        if kind in simple and is_float(elem):
            return self.op(f"{simple[kind]} {a}", elem)
        raise NotImplementedError(f"'{kind}' on {elem}")

    def cmp(self, pred: str, a: str, b: str, elem: str) -> str:
        """``pred`` in eq, ne, lt, le, gt, ge (torch semantics: ordered except ne, which is true on NaN)."""
        if is_float(elem):
            p = {"eq": "oeq", "ne": "une", "lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge"}[pred]
            return self.assign(f"arith.cmpf {p}, {a}, {b} : {elem}")
        p = {"eq": "eq", "ne": "ne", "lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge"}[pred]
        if elem == "i1":
            p = {"slt": "ult", "sle": "ule", "sgt": "ugt", "sge": "uge"}.get(p, p)
        return self.assign(f"arith.cmpi {p}, {a}, {b} : {elem}")

    def isnan(self, a: str, elem: str) -> str:
        return self.assign(f"arith.cmpf uno, {a}, {a} : {elem}")

    def select(self, c: str, a: str, b: str, elem: str) -> str:
        return self.op(f"arith.select {c}, {a}, {b}", elem)

    def cast(self, a: str, src: str, dst: str) -> str:
        """Scalar conversion with torch semantics (float->int truncates, int/float->bool is `!= 0`)."""
        if src == dst:
            return a
        if dst == "i1":
            zero = self.const(0.0 if is_float(src) else 0, src)
            return self.cmp("ne", a, zero, src)
        if is_float(src) and is_float(dst):
            wider = FLOAT_BITS[dst] > FLOAT_BITS[src] or (src == "bf16" and dst == "f16")
            if {src, dst} == {"f16", "bf16"}:
                mid = self.cast(a, src, "f32")
                return self.cast(mid, "f32", dst)
            op = "arith.extf" if wider else "arith.truncf"
        elif is_float(src):
            op = "arith.fptosi"
        elif is_float(dst):
            op = "arith.uitofp" if src == "i1" else "arith.sitofp"
        else:
            sb, db = INT_BITS[src], INT_BITS[dst]
            op = ("arith.extui" if src == "i1" else "arith.extsi") if db > sb else "arith.trunci"
        return self.assign(f"{op} {a} : {src} to {dst}")

    def index_cast(self, a: str, src: str) -> str:
        return self.assign(f"arith.index_cast {a} : {src} to index")

    def to_int(self, a: str, dst: str) -> str:
        return self.assign(f"arith.index_cast {a} : index to {dst}")

    def linalg_index(self, dim: int) -> str:
        return self.assign(f"linalg.index {dim} : index")

    # -- tensors --------------------------------------------------------------------------------------------------
    def empty(self, t: TensorType) -> Value:
        return Value(self.assign(f"tensor.empty() : {t}"), t)

    def filled(self, value: Union[bool, int, float], t: TensorType) -> Value:
        c = self.const(value, t.elem)
        e = self.empty(t)
        return Value(self.assign(f"linalg.fill ins({c} : {t.elem}) outs({e.name} : {t}) -> {t}{self._loc()}"), t)

    def dense_constant(self, tensor: torch.Tensor, t: TensorType) -> Value:
        return Value(self.assign(f"arith.constant {dense_literal(tensor, t.elem)} : {t}", "cst"), t)

    def generic(
        self,
        inputs: Sequence[tuple[Value, str]],
        outputs: Sequence[tuple[Value, str]],
        iterators: Sequence[str],
        body: Callable[["Builder", list[str]], Union[str, Sequence[str]]],
    ) -> list[Value]:
        """Prints a ``linalg.generic``; ``body(builder, block_args)`` emits the scalar code and returns the
        yielded value(s). ``inputs``/``outputs`` pair values with their indexing maps."""
        maps = ", ".join(m for _, m in list(inputs) + list(outputs))
        its = ", ".join(f'"{i}"' for i in iterators)
        res = self.fresh()
        results = [f"{res}#{i}" for i in range(len(outputs))] if len(outputs) > 1 else [res]
        head = f"{res}:{len(outputs)}" if len(outputs) > 1 else res
        ins = ""
        if inputs:
            ins = (
                f" ins({', '.join(v.name for v, _ in inputs)} : {', '.join(str(v.type) for v, _ in inputs)})"
            )
        outs = f" outs({', '.join(v.name for v, _ in outputs)} : {', '.join(str(v.type) for v, _ in outputs)})"
        self.emit(f"{head} = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{its}]}}{ins}{outs} {{")
        args = [self.fresh("in") for _ in inputs] + [self.fresh("out") for _ in outputs]
        arg_types = [v.type.elem for v, _ in inputs] + [v.type.elem for v, _ in outputs]
        self.emit("^bb0(" + ", ".join(f"{a}: {t}" for a, t in zip(args, arg_types)) + "):")
        self.indent += 2
        saved_loc, self.loc = self.loc, None
        y = body(self, args)
        self.loc = saved_loc
        ys = [y] if isinstance(y, str) else list(y)
        self.emit(f"linalg.yield {', '.join(ys)} : {', '.join(v.type.elem for v, _ in outputs)}")
        self.indent -= 2
        rtypes = ", ".join(str(v.type) for v, _ in outputs)
        self.emit(f"}} -> {rtypes if len(outputs) == 1 else '(' + rtypes + ')'}{self._loc()}")
        return [Value(r, v.type) for r, (v, _) in zip(results, outputs)]
