"""The custom score of ``moe.route`` (``scoring="custom:<region body>"``) evaluated with torch ops.

The region body is the MLIR text of the ``score`` region of ``moe.route`` (MoERoutingOps.td, "Custom scores"): one
block ``^bb0(%x: f32):`` of elementwise scalar arith/math ops ending in ``moe.yield %s : f32``.
:func:`parse_score_region` reads it into a list of :class:`ScoreOp` (the same op list as the dialect's verifier, MoE/IR/ScoreRegion.h, with its
messages), and :func:`eval_score_region` evaluates it on a tensor elementwise, differentiably, in the tensor's dtype:
the reference the kernels are tested against, and what ``route``'s fallbacks run.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

__all__ = ["ScoreOp", "parse_score_region", "eval_score_region", "SCORE_OPS", "STEP_OPS"]

#: The ops a score region may hold (MoE/IR/ScoreRegion.h) and how many operands each takes.
SCORE_OPS: dict[str, int] = {
    "arith.constant": 0, "arith.addf": 2, "arith.subf": 2, "arith.mulf": 2, "arith.divf": 2, "arith.negf": 1,
    "arith.maximumf": 2, "arith.minimumf": 2, "arith.cmpf": 2, "arith.select": 3, "math.exp": 1, "math.exp2": 1,
    "math.log": 1, "math.log1p": 1, "math.sqrt": 1, "math.rsqrt": 1, "math.tanh": 1, "math.absf": 1,
    "math.powf": 2, "math.erf": 1, "math.floor": 1, "math.ceil": 1, "math.round": 1,
}
#: Accepted in the forward; moe.route_grad rejects them (their derivative is zero almost everywhere).
STEP_OPS = frozenset({"math.floor", "math.ceil", "math.round"})

_CMPF = {
    "oeq": lambda a, b: a == b, "ogt": lambda a, b: a > b, "oge": lambda a, b: a >= b, "olt": lambda a, b: a < b,
    "ole": lambda a, b: a <= b, "one": lambda a, b: (a != b) & ~a.isnan() & ~b.isnan(),
    "ord": lambda a, b: ~a.isnan() & ~b.isnan(), "ueq": lambda a, b: (a == b) | a.isnan() | b.isnan(),
    "ugt": lambda a, b: ~(a <= b), "uge": lambda a, b: ~(a < b), "ult": lambda a, b: ~(a >= b),
    "ule": lambda a, b: ~(a > b), "une": lambda a, b: a != b, "uno": lambda a, b: a.isnan() | b.isnan(),
    "true": lambda a, b: torch.ones_like(a, dtype=torch.bool),
    "false": lambda a, b: torch.zeros_like(a, dtype=torch.bool),
}

_VALUE = r"%[A-Za-z0-9_.$\-]+"
_OP_START = re.compile(rf"({_VALUE}(?::\d+)?)\s*=\s*\"?([a-z_]+\.[a-z0-9_]+)\"?|(moe\.yield)")
_HEADER = re.compile(rf"^\s*\{{?\s*\^[A-Za-z0-9_]+\s*\(\s*({_VALUE})\s*:\s*([a-z0-9]+)\s*\)\s*:")


@dataclass(frozen=True)
class ScoreOp:
    """One op of a score region: ``result = name(operands)``, ``predicate`` for cmpf, ``value`` for a constant."""

    result: str
    name: str
    operands: tuple[str, ...]
    predicate: str = ""
    value: float = 0.0


def _fail(msg: str):
    raise ValueError(f"moe.route: {msg}")


def _parse_float(text: str) -> float:
    text = text.strip()
    if text.lower().startswith("0x"):
        return struct.unpack(">f", int(text, 16).to_bytes(4, "big"))[0]
    return float(text)


@lru_cache(maxsize=256)
def parse_score_region(body: str) -> tuple[str, tuple[ScoreOp, ...], str]:
    """``(argument, ops, yielded value)`` of a score region's text, checked with the verifier's rules."""
    if "|" in body:
        _fail("the 'score' region text must not contain '|' (it is part of the kernel key)")
    head = _HEADER.match(body)
    if not head:
        _fail("the 'score' region must start with one f32 block argument, the logit: '^bb0(%x: f32):', got "
              f"{body[:60]!r}")
    arg, arg_type = head.group(1), head.group(2)
    if arg_type != "f32":
        _fail(f"the 'score' region must have one f32 argument (the logit), but it has type {arg_type}")
    rest = body[head.end():].rstrip().removesuffix("}")
    starts = list(_OP_START.finditer(rest))
    if rest[:starts[0].start()].strip() if starts else rest.strip():
        _fail(f"cannot read the 'score' region at {rest.strip()[:40]!r}")
    types = {arg: "f32"}  # the value types: f32, or i1 for a comparison
    ops: list[ScoreOp] = []
    yielded = None
    for m, nxt in zip(starts, starts[1:] + [None]):
        chunk = rest[m.end():nxt.start() if nxt else len(rest)]
        if yielded is not None:
            _fail("moe.yield must be the last op of the 'score' region")
        if m.group(3):
            vals = re.findall(_VALUE, chunk)
            if len(vals) != 1 or not chunk.strip().endswith("f32"):
                _fail(f"moe.yield takes one f32 value, got {chunk.strip()!r}")
            yielded = vals[0]
            if yielded not in types:
                _fail(f"moe.yield uses undefined value {yielded}")
            if types[yielded] != "f32":
                _fail(f"moe.yield takes the f32 score, but {yielded} is {types[yielded]}")
            continue
        result, name = m.group(1), m.group(2)
        if name not in SCORE_OPS:
            _fail(f"'{name}' is not allowed in the 'score' region: it holds elementwise scalar f32 arith/math ops "
                  f"only ({', '.join(n.split('.')[1] for n in SCORE_OPS)})")
        body_text, _, type_text = chunk.rpartition(":")
        want = "i1" if name == "arith.cmpf" else "f32"
        if type_text.strip() != "f32":
            _fail(f"'{name}' in the 'score' region has type {type_text.strip()!r}: the region is elementwise on "
                  "scalar f32")
        if name == "arith.constant":
            try:
                value = _parse_float(body_text)
            except ValueError:
                _fail(f"arith.constant: cannot read the f32 value {body_text.strip()!r}")
            ops.append(ScoreOp(result, name, (), value=value))
        else:
            predicate = ""
            if name == "arith.cmpf":
                predicate = body_text.strip().split(",")[0].strip()
                if predicate not in _CMPF:
                    _fail(f"arith.cmpf: unknown predicate {predicate!r}")
            operands = tuple(re.findall(_VALUE, body_text))
            if len(operands) != SCORE_OPS[name]:
                _fail(f"'{name}' takes {SCORE_OPS[name]} operand(s), got {len(operands)}")
            for n, o in enumerate(operands):
                if o not in types:
                    _fail(f"'{name}' uses undefined value {o}")
                want_operand = "i1" if name == "arith.select" and n == 0 else "f32"
                if types[o] != want_operand:
                    _fail(f"'{name}' in the 'score' region has an operand of type {types[o]} ({o}): it takes "
                          f"{want_operand}")
            ops.append(ScoreOp(result, name, operands, predicate=predicate))
        types[result] = want
    if yielded is None:
        _fail("the 'score' region must end in moe.yield of the f32 score")
    return arg, tuple(ops), yielded


def _round_half_away(x: Tensor) -> Tensor:
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


_UNARY = {
    "arith.negf": torch.neg, "math.exp": torch.exp, "math.exp2": torch.exp2, "math.log": torch.log,
    "math.log1p": torch.log1p, "math.sqrt": torch.sqrt, "math.rsqrt": torch.rsqrt, "math.tanh": torch.tanh,
    "math.absf": torch.abs, "math.erf": torch.erf, "math.floor": torch.floor, "math.ceil": torch.ceil,
    "math.round": _round_half_away,
}
_BINARY = {
    "arith.addf": torch.add, "arith.subf": torch.sub, "arith.mulf": torch.mul, "arith.divf": torch.div,
    "arith.maximumf": torch.maximum, "arith.minimumf": torch.minimum, "math.powf": torch.pow,
}


def eval_score_region(body: str, x: Tensor) -> Tensor:
    """The region's score of every element of ``x`` (its dtype; differentiable)."""
    arg, ops, yielded = parse_score_region(body)
    env: dict[str, Tensor] = {arg: x}
    for op in ops:
        a = [env[o] for o in op.operands]
        if op.name == "arith.constant":
            r = torch.tensor(op.value, dtype=x.dtype, device=x.device)
        elif op.name == "arith.cmpf":
            r = _CMPF[op.predicate](a[0], a[1])
        elif op.name == "arith.select":
            r = torch.where(a[0], a[1], a[2])
        elif op.name in _UNARY:
            r = _UNARY[op.name](a[0])
        else:
            r = _BINARY[op.name](a[0], a[1])
        env[op.result] = r
    return env[yielded].expand_as(x)
