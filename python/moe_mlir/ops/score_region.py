"""A PyTorch elementwise function as the ``score`` region of ``moe.route`` (``scoring="custom:<region>"``).

``custom_scoring(fn)`` traces ``fn`` (one tensor in, one tensor out, elementwise: DeepSeek-V4's
``ACT2FN[config.scoring_func]``, e.g. ``sqrtsoftplus``) with ``make_fx`` on a 0-d f32 tensor into ATen ops and
writes them as the region's arith/math ops (MoERoutingOps.td, "Custom scores")::

    from moe_mlir.ops import custom_scoring
    scoring = custom_scoring(lambda x: torch.sqrt(torch.nn.functional.softplus(x)))
    w, idx = torch.ops.moe.route(logits, bias, 8, scoring, renormalize=True)

The kernels inline the region (CPU, GPU, portable) and the backward kernel differentiates it (moe.route_grad). ATen
ops without a region op are expanded: ``sigmoid`` as ``1 / (1 + exp(-x))``, ``softplus`` as
``log1p(exp(-|x|)) + max(x, 0)`` (beta 1; torch's threshold branch returns x where this rounds to x in f32),
``silu``, ``relu``, ``clamp``, ``reciprocal``, integer and half powers as products, ``sqrt``/``rsqrt``. An op
outside the list raises a ValueError naming it.

``scoring_of(fn)`` is ``custom_scoring`` for a user's callable (``moe_mlir.route(..., scoring=fn)``): the trace
checked on a vector of logits (a function that branches on a value traces to another one) and kept per function.
"""

from __future__ import annotations

import collections
import math
import struct
import types
from typing import Any, Callable

import torch
from torch import Tensor

from ..reference.routing import CUSTOM_PREFIX
from ..reference.score_region import eval_score_region, parse_score_region

__all__ = ["score_region", "custom_scoring", "scoring_of", "SCORE_ATEN_OPS"]

aten = torch.ops.aten


def _const_text(v: float) -> str:
    v32 = struct.unpack("<f", struct.pack("<f", v))[0]
    if math.isfinite(v32):
        return f"{v32:.9e}"
    return "0x" + struct.pack(">f", v32).hex().upper()


class _Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.n = 0
        self.consts: dict[float, str] = {}

    def emit(self, text: str, type_: str = "f32") -> str:
        name = f"%{self.n}"
        self.n += 1
        self.lines.append(f"{name} = {text} : {type_}")
        return name

    def const(self, v: float) -> str:
        key = struct.unpack("<f", struct.pack("<f", float(v)))[0]
        if key not in self.consts or math.isnan(key):
            self.consts[key] = self.emit(f"arith.constant {_const_text(key)}")
        return self.consts[key]

    def op(self, name: str, *args: str) -> str:
        return self.emit(f"{name} {', '.join(args)}")

    def cmp(self, pred: str, a: str, b: str) -> str:
        return self.emit(f"arith.cmpf {pred}, {a}, {b}")

    # Expansions of the ATen ops that have no region op.
    def sigmoid(self, a: str) -> str:
        one = self.const(1.0)
        return self.op("arith.divf", one, self.op("arith.addf", one, self.op("math.exp", self.op("arith.negf", a))))

    def softplus(self, a: str, beta: float) -> str:
        x = a if beta == 1.0 else self.op("arith.mulf", a, self.const(beta))
        soft = self.op("math.log1p", self.op("math.exp", self.op("arith.negf", self.op("math.absf", x))))
        r = self.op("arith.addf", soft, self.op("arith.maximumf", x, self.const(0.0)))
        return r if beta == 1.0 else self.op("arith.divf", r, self.const(beta))

    def power(self, a: str, p: float) -> str:
        if p == 0.5:
            return self.op("math.sqrt", a)
        if p == -0.5:
            return self.op("math.rsqrt", a)
        if p == int(p) and 1 <= abs(p) <= 4:
            r = a
            for _ in range(int(abs(p)) - 1):
                r = self.op("arith.mulf", r, a)
            return r if p > 0 else self.op("arith.divf", self.const(1.0), r)
        return self.op("math.powf", a, self.const(p))


_CMP = {aten.gt: "ogt", aten.ge: "oge", aten.lt: "olt", aten.le: "ole", aten.eq: "oeq", aten.ne: "une"}
_UNARY = {aten.exp: "math.exp", aten.exp2: "math.exp2", aten.log: "math.log", aten.log1p: "math.log1p",
          aten.sqrt: "math.sqrt", aten.rsqrt: "math.rsqrt", aten.tanh: "math.tanh", aten.abs: "math.absf",
          aten.erf: "math.erf", aten.neg: "arith.negf", aten.floor: "math.floor", aten.ceil: "math.ceil"}
_BINARY = {aten.add: "arith.addf", aten.sub: "arith.subf", aten.mul: "arith.mulf", aten.div: "arith.divf",
           aten.maximum: "arith.maximumf", aten.minimum: "arith.minimumf", aten.pow: "math.powf"}
_IDENTITY = {aten.alias, aten.clone, aten.detach, aten._to_copy, aten.view, aten.reshape, aten.lift_fresh_copy}


#: The ATen ops (overload packets) custom_scoring writes as region ops: what frontend/raising.py may fold into a
#: custom score when it raises a router whose score is an elementwise function of its logits.
SCORE_ATEN_OPS: frozenset = frozenset(
    set(_CMP) | set(_UNARY) | set(_BINARY) | _IDENTITY
    | {aten.rsub, aten.reciprocal, aten.sigmoid, aten.silu, aten.softplus, aten.relu, aten.clamp, aten.clamp_min,
       aten.clamp_max, aten.where, aten.square, aten.scalar_tensor})


def _packet(target):
    return getattr(target, "overloadpacket", target)


def score_region(fn: Callable[[Tensor], Tensor]) -> str:
    """The ``score`` region text (one line: ``^bb0(%x: f32): ... moe.yield %r : f32``) of the elementwise ``fn``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    # Through a one-argument lambda: make_fx traces every parameter of fn (F.silu's `inplace` too).
    gm = make_fx(lambda x: fn(x), tracing_mode="real")(torch.zeros((), dtype=torch.float32))
    w = _Writer()
    env: dict[object, str] = {}

    def val(a) -> str:
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (bool, int, float)):
            return w.const(float(a))
        raise ValueError(f"custom_scoring: cannot use the argument {a!r} in a score region")

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise ValueError("custom_scoring: the function must take one tensor, the logits")
    result = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = "%x"
        elif node.op == "get_attr":
            t = getattr(gm, node.target)
            if not (isinstance(t, Tensor) and t.numel() == 1):
                raise ValueError(f"custom_scoring: a tensor constant of shape {list(t.shape)} is not a scalar")
            env[node] = w.const(float(t.reshape(())))
        elif node.op == "call_function":
            env[node] = _lower(w, node, val)
        elif node.op == "output":
            out = node.args[0]
            result = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(result, torch.fx.Node):
        raise ValueError("custom_scoring: the function must return one tensor")
    body = " ".join(w.lines + [f"moe.yield {env[result]} : f32"])
    text = f"^bb0(%x: f32): {body}"
    parse_score_region(text)  # the verifier's rules
    return text


def _lower(w: _Writer, node, val) -> str:
    t = _packet(node.target)
    args, kw = node.args, node.kwargs
    a = [val(x) if not isinstance(x, (list, tuple)) and x is not None else x for x in args]
    if t in _IDENTITY:
        dtype = kw.get("dtype")
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"custom_scoring: a cast to {dtype} is not elementwise f32")
        return a[0]
    if t in _UNARY:
        return w.op(_UNARY[t], a[0])
    if t in (aten.add, aten.sub) and kw.get("alpha", 1) != 1:
        a[1] = w.op("arith.mulf", a[1], w.const(kw["alpha"]))
    if t is aten.pow:
        if isinstance(args[1], (int, float)):
            return w.power(a[0], float(args[1]))
        if isinstance(args[0], (int, float)):
            return w.op("math.powf", a[0], a[1])
    if t in _BINARY:
        return w.op(_BINARY[t], a[0], a[1])
    if t is aten.rsub:
        return w.op("arith.subf", a[1], a[0])
    if t is aten.reciprocal:
        return w.op("arith.divf", w.const(1.0), a[0])
    if t is aten.sigmoid:
        return w.sigmoid(a[0])
    if t is aten.silu:
        return w.op("arith.mulf", a[0], w.sigmoid(a[0]))
    if t is aten.softplus:
        beta = float(args[1]) if len(args) > 1 else float(kw.get("beta", 1.0))
        return w.softplus(a[0], beta)
    if t is aten.relu:
        return w.op("arith.maximumf", a[0], w.const(0.0))
    if t in (aten.clamp, aten.clamp_min, aten.clamp_max):
        lo = args[1] if t is not aten.clamp_max else None
        hi = args[2] if t is aten.clamp and len(args) > 2 else (args[1] if t is aten.clamp_max else None)
        lo, hi = kw.get("min", lo), kw.get("max", hi)
        r = a[0]
        if lo is not None:
            r = w.op("arith.maximumf", r, val(lo))
        if hi is not None:
            r = w.op("arith.minimumf", r, val(hi))
        return r
    if t in _CMP:
        return w.cmp(_CMP[t], a[0], a[1])
    if t is aten.where:
        return w.op("arith.select", a[0], a[1], a[2])
    if t is aten.square:
        return w.op("arith.mulf", a[0], a[0])
    if t is aten.scalar_tensor:  # torch.where(c, 0.05, x)'s scalar
        dtype = kw.get("dtype")
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"custom_scoring: a {dtype} scalar is not f32")
        return w.const(float(args[0]))
    raise ValueError(f"custom_scoring: no score region op for {node.target} (elementwise arith/math ops only)")


def custom_scoring(fn: Callable[[Tensor], Tensor]) -> str:
    """The ``scoring`` argument of ``torch.ops.moe.route`` for the elementwise score ``fn``: ``"custom:<region>"``."""
    return CUSTOM_PREFIX + score_region(fn)


#: Logits a score is checked on after its trace: its function of a vector must be the region's elementwise.
_PROBE = torch.cat([torch.linspace(-8.0, 8.0, 33), torch.tensor([-30.0, -0.5, 0.5, 30.0])])
#: The regions of the callables traced so far (by function code and what it reads, else by the callable itself).
_REGIONS: "collections.OrderedDict[Any, str]" = collections.OrderedDict()
_REGIONS_KEPT = 256


def _region_key(fn: Callable) -> Any:
    """What a callable's region depends on: for a Python function its code, closure values, defaults and the
    globals its code names (a lambda written in a forward is a new object at each call, with the same key); else
    the callable itself. None when that is not hashable (then it is traced at each call)."""
    try:
        if isinstance(fn, types.FunctionType):
            cells = tuple(c.cell_contents for c in fn.__closure__ or ())
            names = tuple(fn.__globals__.get(n) for n in fn.__code__.co_names)
            key: Any = (fn.__code__, cells, fn.__defaults__, names)
        else:
            key = fn
        hash(key)
    except (TypeError, ValueError):  # an unhashable value, an empty closure cell
        return None
    return key


def _trace_score(fn: Callable) -> str:
    """``fn``'s score region, checked to be elementwise: its trace on one f32 logit must compute what ``fn`` computes
    on a vector of logits (a branch on a value or a reduction traces to another function)."""
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        region = score_region(fn)
    except Exception as e:  # make_fx's and score_region's errors: the op it cannot write, a non-tensor result...
        raise ValueError(f"moe.route: scoring={name} is not an elementwise function of the logits that moe.route "
                         f"can compile ({type(e).__name__}: {e})") from e
    try:
        with torch.no_grad():
            expected = fn(_PROBE.clone())
    except Exception as e:
        raise ValueError(f"moe.route: scoring={name} is not elementwise: it fails on a vector of logits "
                         f"({type(e).__name__}: {e})") from e
    got = eval_score_region(region, _PROBE)
    if not (isinstance(expected, Tensor) and expected.shape == _PROBE.shape
            and torch.allclose(got, expected.float(), rtol=1e-4, atol=1e-5, equal_nan=True)):
        raise ValueError(f"moe.route: scoring={name} is not elementwise: on a vector of logits it differs from its "
                         "trace on one logit (a branch on a value, a reduction or a shape-dependent op)")
    return CUSTOM_PREFIX + region


def scoring_of(fn: Callable[[Tensor], Tensor]) -> str:
    """The ``scoring`` argument of ``torch.ops.moe.route`` (``"custom:<region>"``) for the elementwise callable ``fn``
    (:func:`moe_mlir.route`'s ``scoring=``): :func:`custom_scoring`, checked elementwise on a vector of logits (a
    ValueError otherwise) and kept per function, so a lambda written in a forward is traced once. torch.compile
    calls it while tracing and keeps the string as a constant of the graph, guarded on ``fn``."""
    key = _region_key(fn)
    if key is not None and key in _REGIONS:
        _REGIONS.move_to_end(key)
        return _REGIONS[key]
    scoring = _trace_score(fn)
    if key is not None:
        _REGIONS[key] = scoring
        if len(_REGIONS) > _REGIONS_KEPT:
            _REGIONS.popitem(last=False)
    return scoring


# torch.compiler.assume_constant_result(scoring_of), without importing torch._dynamo at `import moe_mlir` (2-3 s
# and sympy: tests/test_import_cost.py): the mark that decorator sets. Dynamo then runs the trace eagerly instead of
# tracing make_fx (tests/test_functional_api.py compiles with fullgraph=True).
scoring_of._dynamo_marked_constant = True  # type: ignore[attr-defined]
