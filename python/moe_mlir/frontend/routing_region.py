"""Raising by meaning: a routing region, in whatever spelling, replaced by its canonical op once proven equal.

The pattern matchers of :mod:`.raising` recognise the op sequences they were taught; a router written another way
(a serving engine's ``masked_fill(~mask.bool(), -inf)`` on an expanded ``zeros_like(...).scatter_`` mask,
``exp(v - logsumexp(x))`` for a softmax, ``topk(sorted=False)``, SymInt sizes after a dynamic recompile) kept its
answer but lost its kernel. This pass instead asks what the region computes:

1. **Find** (:func:`find_region`): at a last-dim top-k, the routing region is every node between the router's
   logits and the weights and indices the rest of the graph reads, through the ops routing is written with
   (:data:`ROUTING_OPS`: elementwise maths, views, masks built by scatter / one_hot / comparisons, masked_fill /
   where, top-k and sort, gather / take_along_dim, softmax / logsumexp, casts, in-place forms, SymInt
   arithmetic). Its leaves must be the logits (``[..., T, E]``, one tensor), at most one ``[E]`` vector (a
   correction bias), tensors read only for their shape or dtype, and sizes. Its outputs are ``[..., T, k]``: the
   indices (an integer tensor) and at most one weights tensor.
2. **Propose** (:func:`candidates`): the canonical forms the region may be, from its hints (a ``[T, G, E/G]`` view
   gives the groups, a top-k over ``G`` the kept groups, a scalar ``mul`` the scaling...): ``moe.topk_renorm``
   (softmax, logits or probs mode) and ``moe.route`` (sigmoid / softmax / a custom elementwise score; score then
   choose or choose then score; groups by max or top-2 sum; bias; renormalisation; scaling).
3. **Check** (:func:`check`): the region is replayed on random and adversarial inputs (ties, ±inf, a fully ``-inf``
   row, tiny and large scales; random biases: the rewrite must hold for every bias, it is a buffer that training
   updates) and compared with each candidate's reference (:mod:`moe_mlir.reference`), forward and backward; the
   first candidate equal wherever the region is finite wins. Ties may name other experts of equal score (any is a
   valid top-k); a region that sorts (``sorted=True``) must give the same order.
4. **Emit**: the op before the first reader of the region's outputs, in the grad mode the weights were computed
   in; the outputs' readers take its results (cast back to their dtypes); the region's nodes no one else reads are
   erased.

A region that does not become an op says why on the ``moe_mlir.raising`` logger (INFO; ``MOE_MLIR_LOG_RAISING=1``
prints it to stderr), and in the ``misses`` list :func:`raise_by_meaning` fills (``CompiledGraph.misses``).
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
import torch.fx as fx

from .fx_match import FLOATS, is_call, new_node, tensor_val
from . import fx_scores
from .fx_scores import TopK, _custom_scoring_of, _is_probability_mix, _same_values

aten = torch.ops.aten
moe = torch.ops.moe

__all__ = ["ROUTING_OPS", "Region", "Miss", "find_region", "candidates", "check", "raise_by_meaning",
           "report_misses", "logger"]

logger = logging.getLogger("moe_mlir.raising")
if os.environ.get("MOE_MLIR_LOG_RAISING", "") not in ("", "0"):
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler())

_P = aten  # overload packets below
#: The ops a routing region may be written with (overload packets; operator.* for tuples and SymInt arithmetic).
ROUTING_OPS: frozenset = frozenset({
    # elementwise maths and comparisons
    _P.add, _P.sub, _P.rsub, _P.mul, _P.div, _P.neg, _P.exp, _P.exp2, _P.log, _P.log1p, _P.expm1, _P.sqrt,
    _P.rsqrt, _P.reciprocal, _P.pow, _P.square, _P.abs, _P.tanh, _P.sigmoid, _P.softplus, _P.relu, _P.silu,
    _P.clamp, _P.clamp_min, _P.clamp_max, _P.maximum, _P.minimum, _P.where, _P.masked_fill, _P.masked_fill_,
    _P.gt, _P.ge, _P.lt, _P.le, _P.eq, _P.ne, _P.isinf, _P.isnan, _P.isfinite, _P.logical_not, _P.logical_and,
    _P.logical_or, _P.bitwise_not, _P.bitwise_and, _P.bitwise_or, _P.add_, _P.sub_, _P.mul_, _P.div_,
    # row functions and reductions
    _P.softmax, _P._softmax, _P.log_softmax, _P._log_softmax, _P.logsumexp, _P.sum, _P.amax, _P.max, _P.topk,
    _P.sort,
    # selection, masks
    _P.gather, _P.take_along_dim, _P.index_select, _P.scatter, _P.scatter_, _P.scatter_add, _P.scatter_add_,
    _P.index_put, _P.index_put_, _P.one_hot, _P.fill_, _P.zero_,
    # views and copies
    _P.view, _P._unsafe_view, _P.reshape, _P.expand, _P.unsqueeze, _P.squeeze, _P.flatten, _P.unflatten,
    _P.slice, _P.select, _P.narrow, _P.contiguous, _P.clone, _P.alias, _P.detach, _P._to_copy, _P.to,
    _P.type_as, _P.lift_fresh_copy, _P.repeat_interleave,
    # created from a shape (the tensor argument read for its shape, dtype and device only)
    _P.zeros_like, _P.ones_like, _P.full_like, _P.empty_like, _P.new_zeros, _P.new_ones, _P.new_full,
    _P.new_empty, _P.zeros, _P.ones, _P.full, _P.scalar_tensor, _P.arange,
    # sizes
    _P.sym_size,
})
_PYTHON_OPS = frozenset({operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
                         operator.truediv, operator.mod, operator.neg})
#: Ops whose first tensor argument is read for its shape, dtype and device alone.
_META_FIRST = frozenset({_P.zeros_like, _P.ones_like, _P.full_like, _P.empty_like, _P.new_zeros, _P.new_ones,
                         _P.new_full, _P.new_empty, _P.sym_size})
_INTS = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8)


def _packet(n: fx.Node) -> Any:
    return getattr(n.target, "overloadpacket", n.target)


def _is_routing_op(n: Any) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and (
        _packet(n) in ROUTING_OPS or n.target in _PYTHON_OPS)


def _mutates(n: fx.Node) -> bool:
    """An in-place ATen op (its first argument is written)."""
    name = getattr(n.target, "__name__", "")
    return n.op == "call_function" and _packet(n) in ROUTING_OPS and name.split(".")[0].endswith("_") \
        and not name.startswith("_")


def _same_size(a: Any, b: Any) -> bool:
    """Two sizes equal for every binding of their symbols (SymInts compared as expressions: no guard added)."""
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        ea = a.node.expr if isinstance(a, torch.SymInt) else a
        eb = b.node.expr if isinstance(b, torch.SymInt) else b
        try:
            return bool((ea - eb) == 0)
        except TypeError:
            return False
    return a == b


def _static(d: Any) -> Any:
    """``d`` as an int where it is one (a SymInt specialized, or replaced by a number), else as it is."""
    if isinstance(d, torch.SymInt):
        v = d.node.maybe_as_int()
        return int(v) if v is not None else d
    return d


def _experts(d: Any) -> int:
    """The number of experts (or a top-k's k), an int: a symbolic one (``torch.compile(dynamic=True)`` marks the logits' last dim
    too) is specialized to the value it was traced with, a guard Dynamo installs with the graph (the kernels are
    built per E anyway; another E recompiles)."""
    d = _static(d)
    if isinstance(d, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import guard_int

        if not d.node.has_hint():
            raise Miss("the number of experts is data-dependent")
        d = guard_int(d)
    return int(d)


def _same_shape(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(_same_size(x, y) for x, y in zip(a, b))


def _topk_parts(n: fx.Node) -> Optional[TopK]:
    """fx_scores' top-k, a symbolic k specialized as the experts' number is (a k that cannot be: not a top-k)."""
    try:
        return fx_scores._topk_parts(n, k_of=_experts)
    except Miss:
        return None


class Miss(Exception):
    """Why a top-k's region is not raised (one line)."""


@dataclass
class Region:
    """A routing region at one top-k (see the module doc)."""

    topk: fx.Node
    k: int
    #: The number of experts (specialized where it was symbolic: ``dynamic=True`` marks every size).
    E: int
    logits: fx.Node
    #: The ``[E]`` float vector leaf, if any (a correction bias).
    bias: Optional[fx.Node]
    #: Leaves read for their shape, dtype or device alone; size leaves (SymInt nodes outside the region).
    meta_leaves: list[fx.Node]
    size_leaves: list[fx.Node]
    #: Constant tensors (``get_attr``) the region reads, by node.
    constants: dict[fx.Node, torch.Tensor]
    #: The region's nodes, in graph order.
    nodes: list[fx.Node]
    #: Outputs read outside the region: integer ones (the indices) and at most one float one (the weights).
    index_outputs: list[fx.Node]
    weights_output: Optional[fx.Node]
    #: Whether every top-k the indices come from sorts (then the order of the outputs is part of the meaning).
    ordered: bool
    hints: dict[str, Any] = field(default_factory=dict)


def _backward(roots: list[fx.Node], stop: set[fx.Node]) -> tuple[dict[fx.Node, None], set[fx.Node], set[fx.Node]]:
    """(the routing ops ``roots`` are computed by, with the in-place ops that write them; the leaves they reach:
    nodes that are not routing ops, or in ``stop``; the leaves read for their shape, dtype and device alone)."""
    inside: dict[fx.Node, None] = {}
    leaves: set[fx.Node] = set()
    meta: set[fx.Node] = set()
    work = list(roots)
    while work:
        n = work.pop()
        if n in inside or n in leaves:
            continue
        if n in stop or not _is_routing_op(n):
            leaves.add(n)
            continue
        inside[n] = None
        if len(inside) > 256:
            raise Miss("the region has over 256 nodes")
        args = n.all_input_nodes
        if _packet(n) in _META_FIRST and n.args and isinstance(n.args[0], fx.Node):
            meta.add(n.args[0])
            args = [a for a in n.args[1:] if isinstance(a, fx.Node)] + \
                [a for a in n.kwargs.values() if isinstance(a, fx.Node)]
        work.extend(args)
        # ``mask.scatter_(1, idx, 1)`` writes ``mask``, whose later readers name ``mask``, not the scatter_.
        work.extend(u for u in n.users if _mutates(u) and u.args and u.args[0] is n)
    return inside, leaves, meta - set(inside) - leaves


def _keeps_rows(v: torch.Tensor, lead: tuple, k: int) -> bool:
    """``v`` is ``[lead..., k]``, ``[lead..., 1]`` or ``[lead...]``: the top-k's rows, reduced or not."""
    if v.dim() < len(lead) or not _same_shape(tuple(v.shape[:len(lead)]), lead):
        return False
    rest = tuple(v.shape[len(lead):])
    return rest in ((), (1,)) or (len(rest) == 1 and _same_size(rest[0], k))


#: Where a ``minimal`` region may read the chosen indices: as the index of a gather, or cast / viewed.
_INDEX_READS = {aten.gather: 2, aten.take_along_dim: 1}


def _reads_indices_as_values(u: fx.Node, closure: dict) -> bool:
    """``u`` reads an integer result of the region other than as a gather's index or through a cast or view
    (``indices == E``: what the code after the routing does with the choice)."""
    if _packet(u) in (aten._to_copy, aten.to, aten.view, aten.reshape, aten._unsafe_view):
        return False
    for i, a in enumerate(u.args):
        v = tensor_val(a) if isinstance(a, fx.Node) else None
        if a in closure and v is not None and v.dtype in _INTS and _INDEX_READS.get(_packet(u)) != i:
            return True
    return False


def _forward_outputs(tk: fx.Node, lead: tuple, k: int, derivable, minimal: Any = False) -> dict[fx.Node, None]:
    """The routing ops from the top-k's results that keep the ``[lead..., k]`` shape or reduce it to ``[lead...,
    1]`` / ``[lead...]`` (gathers, renormalisation, scaling, casts), each computable from the region's leaves.
    ``minimal``: only the ops that weigh the choice, not those that read the chosen indices as values (Zaya's
    skip expert masked after the top-k stays the graph's), each other operand computed without the top-k;
    ``"first"``: only the first weights (the gather, the top-k's values), what follows them left to the graph (a
    renormalization by a dynamic epsilon)."""
    closure: dict[fx.Node, None] = {tk: None}
    work = [tk]
    while work:
        n = work.pop()
        for u in n.users:
            if u in closure or not _is_routing_op(u):
                continue
            if u.target is operator.getitem:
                closure[u] = None
                work.append(u)
                continue
            val = u.meta.get("val")
            vals = list(val) if isinstance(val, (tuple, list)) else [val]  # max.dim's (values, indices)...
            if not vals or not all(isinstance(v, torch.Tensor) and _keeps_rows(v, lead, k) for v in vals):
                continue
            if not all(a in closure or derivable(a) for a in u.all_input_nodes):
                continue
            if minimal and (_reads_indices_as_values(u, closure) or any(
                    a not in closure and tk in _ancestors(a) for a in u.all_input_nodes)):
                continue
            if minimal == "first" and any(a is not tk and a in closure and tensor_val(a) is not None
                                          and tensor_val(a).dtype in FLOATS for a in u.all_input_nodes):
                continue  # the weights as first gathered: what the graph does with them after stays its own
            closure[u] = None
            work.append(u)
    return closure


def _ancestors(n: fx.Node, limit: int = 512) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    work = [n]
    while work and len(seen) < limit:
        cur = work.pop()
        if cur not in seen:
            seen.add(cur)
            work.extend(cur.all_input_nodes)
    return seen


def _vector_like(v: torch.Tensor, E: int) -> bool:
    """``[E]``, or ``[1, ..., 1, E]`` (a bias kept as a ``[1, E]`` parameter: Ernie-4.5's)."""
    return v.dtype in FLOATS and v.dim() >= 1 and _same_size(v.shape[-1], E) and all(
        _static(d) == 1 for d in v.shape[:-1])


def _logits_of(x: fx.Node, E: int) -> fx.Node:
    """Where the routing starts: the one ``[..., T, E]`` tensor the choice ``x`` is computed from by routing ops.
    An op that also reads something routing cannot take as an input (a dynamic float: ``logits * multiplier``
    under ``dynamic=True``; another tensor) is where the logits start instead."""
    stop: set[fx.Node] = set()
    for _ in range(8):
        inside, leaves, _ = _backward([x], stop)
        bad = [n for n in leaves if n not in stop and not _routing_input(n, E)]
        if not bad:
            break
        stop |= {u for n in bad for u in n.users if u in inside}
    rows = [n for n in leaves if (v := tensor_val(n)) is not None and v.dim() >= 2 and _same_size(v.shape[-1], E)
            and v.dtype in FLOATS and n.op != "get_attr"]
    if len(rows) > 1:  # one token's logits are [1, E], as a [1, E] bias is: the bias is the parameter
        rows = [n for n in rows if not _vector_like(tensor_val(n), E)] or [n for n in rows if n.op != "placeholder"]
    if len(rows) != 1:
        raise Miss(f"the choice reads {len(rows)} [..., T, {E}] tensors, not one (the logits)")
    return rows[0]


def _routing_input(n: fx.Node, E: int) -> bool:
    """``n`` may be an input of a routing region: a float tensor (the logits, a vector, a constant) or a size
    known at compile time."""
    v, val = tensor_val(n), n.meta.get("val")
    if v is not None:
        return v.dtype in FLOATS and (v.dim() >= 2 and _same_size(v.shape[-1], E) or _vector_like(v, E)
                                      or n.op == "get_attr")
    return isinstance(val, int) or isinstance(val, torch.SymInt) and val.node.has_hint()


def find_region(tk: fx.Node, gm: Optional[fx.GraphModule] = None, minimal: Any = False,
                at_input: bool = False) -> Region:
    """The routing region at the top-k ``tk`` (raises :class:`Miss` with the reason when there is none);
    ``minimal``: the smallest one (:func:`_forward_outputs`); ``at_input``: starting at the top-k's own input (a
    choice on scores some other code made: Doge's product keys)."""
    parts = _topk_parts(tk)
    if parts is None:
        raise Miss("not a last-dim largest top-k with a constant k")
    x, k, ordered = parts.x, parts.k, parts.sorted
    E = _experts(tensor_val(x).shape[-1])
    logits = x if at_input else _logits_of(x, E)
    lead = tuple(tensor_val(logits).shape[:-1])
    if not _same_shape(lead, tuple(tensor_val(x).shape[:-1])):
        raise Miss("the top-k's rows are not the logits' rows")

    memo: dict[fx.Node, bool] = {}

    def derivable(n: fx.Node) -> bool:
        """``n`` is computed by routing ops from the logits, a vector, constants and sizes."""
        if n not in memo:
            memo[n] = False
            v = tensor_val(n)
            if n is logits or n.op == "get_attr":
                ok = True
            elif not _is_routing_op(n):
                size = n.meta.get("val")  # a size known at compile time (a data-dependent one is not routing's)
                ok = (v is None and (isinstance(size, int) or isinstance(size, torch.SymInt) and size.node.has_hint())
                      ) or (n.op == "placeholder" and v is not None and _vector_like(v, E))
            elif _packet(n) in _META_FIRST:
                ok = all(derivable(a) for a in n.args[1:] if isinstance(a, fx.Node))
            else:
                ok = all(derivable(a) for a in n.all_input_nodes)
            memo[n] = ok
        return memo[n]

    closure = _forward_outputs(tk, lead, k, derivable, minimal)
    outputs = [n for n in closure if n is not tk and any(u not in closure for u in n.users)]
    index_outputs, weights = [], []
    for n in outputs:
        v = tensor_val(n)
        if v is None or v.dim() != len(lead) + 1 or not _same_size(v.shape[-1], k):
            raise Miss(f"an intermediate of the routing ({n.name}) is read outside it")
        (index_outputs if v.dtype in _INTS else weights).append(n)
    if not index_outputs:
        raise Miss("the top-k's indices are not read")
    if not weights:
        raise Miss("no weights are read from it (a top-k of indices alone is not a router)")
    if len(weights) > 1:
        raise Miss(f"{len(weights)} different weights are read ({', '.join(w.name for w in weights)})")
    inside, leaves, meta_leaves = _backward(index_outputs + weights, {logits})
    leaves.discard(logits)
    bias, size_leaves, constants = None, [], {}
    for leaf in leaves:
        v = tensor_val(leaf)
        is_vector = v is not None and _vector_like(v, E)
        if leaf.op == "get_attr" and gm is not None and not (is_vector and bias is None):
            constants[leaf] = getattr(gm, leaf.target)
        elif v is None:
            if not isinstance(leaf.meta.get("val"), (torch.SymInt, int)):
                raise Miss(f"the region reads {leaf.name}, neither a tensor nor a size")
            size_leaves.append(leaf)
        elif leaf.op in ("placeholder", "get_attr") and is_vector and bias is None:
            bias = leaf  # a parameter or buffer (a get_attr in an exported graph): any value, checked so
        else:
            raise Miss(f"the region reads {leaf.name} {list(v.shape)}: not the logits, an [E] vector or a size")
    for n in inside:
        if _mutates(n) and n.args[0] in leaves | meta_leaves | {logits}:
            raise Miss(f"the region writes its input {n.args[0].name} in place")
    _specialize_sizes(inside, size_leaves, lead)
    position = {n: i for i, n in enumerate(tk.graph.nodes)}
    nodes = sorted(inside, key=position.__getitem__)
    hints = _hints(nodes, E, lead, k)
    hints["probability_mix"] = _is_probability_mix(logits)
    return Region(tk, k, E, logits, bias, sorted(meta_leaves, key=position.__getitem__), size_leaves, constants,
                  nodes, index_outputs, weights[0] if weights else None, ordered, hints)


def _specialize_sizes(nodes, size_leaves: list[fx.Node], lead: tuple) -> None:
    """Specializes the region's symbolic sizes that are not the tokens' (``torch.compile(dynamic=True)`` makes the
    number of groups, the groups kept... inputs too): the region's meaning depends on them, the op takes them as
    constants, and Dynamo installs the guards with the graph."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    tokens = set().union(*[d.node.expr.free_symbols for d in lead if isinstance(d, torch.SymInt)])
    vals = [n.meta.get("val") for n in size_leaves]
    for n in nodes:
        vals += [a.meta.get("val") for a in n.all_input_nodes if a.meta.get("val") is not None]
        vals.append(n.meta.get("val"))
    for v in vals:
        for d in (v.shape if isinstance(v, torch.Tensor) else [v]):
            if isinstance(d, torch.SymInt) and not d.node.expr.free_symbols <= tokens and d.node.has_hint():
                guard_int(d)


def _hints(nodes: list[fx.Node], E: int, lead: tuple, k: int) -> dict[str, Any]:
    """What the region's ops suggest of its canonical form."""
    groups, kept, scales = set(), set(), {1.0}
    for n in nodes:
        v = tensor_val(n)
        last2 = [_static(d) for d in v.shape[-2:]] if v is not None and v.dim() == len(lead) + 2 else []
        if all(isinstance(d, int) for d in last2) and last2 and last2[0] * last2[1] == E and 1 < last2[0] < E:
            groups.add(last2[0])
        parts = _topk_parts(n)
        width = _static(tensor_val(parts.x).shape[-1]) if parts is not None else None
        if isinstance(width, int) and width < E:
            kept.add((width, parts.k))
        if _packet(n) in (aten.mul, aten.div) and len(n.args) > 1:
            c = n.args[1]
            if isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c > 0:
                scales.add(float(c) if _packet(n) is aten.mul else 1.0 / float(c))
    packets = {_packet(n) for n in nodes}
    return {"groups": sorted((g, t) for g, t in kept if g in groups), "scales": sorted(scales),
            "sigmoid": aten.sigmoid in packets,
            "softmax": bool(packets & {aten.softmax, aten._softmax, aten.log_softmax, aten._log_softmax,
                                       aten.logsumexp, aten.exp})}


# ----------------------------------------------------------------------------------------------------------------
# Candidates and the check
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """A canonical form: ``moe.topk_renorm(x, k, mode, renormalize)`` or ``moe.route(x, bias, k, ...)``."""

    op: str  # "topk_renorm" | "route"
    scoring: str = "softmax"  # route: sigmoid | softmax | custom:...; topk_renorm: "logits" | "probs"
    order: str = "score_then_topk"
    n_group: int = 1
    topk_group: int = 1
    group_score: str = "top2_sum"
    renormalize: bool = False
    scale: float = 1.0

    def reference(self, x: torch.Tensor, bias: Optional[torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        from ..reference import _topk_renorm_ref
        from ..reference.routing import route

        if self.op == "topk_renorm":
            return _topk_renorm_ref(x, k, self.scoring, self.renormalize)
        return route(x, bias, k, self.scoring, self.order, self.n_group, self.topk_group, self.group_score,
                     self.renormalize, self.scale)


def _custom_score(region: Region) -> Optional[str]:
    """A custom score region for the weights' source when it is an elementwise function of the logits."""
    for n in region.nodes:
        if is_call(n, (aten.gather.default, aten.take_along_dim.default)):
            found = _custom_scoring_of(n.args[0], batched=True)
            if found is not None and _same_values(found[1]) is region.logits:  # x or x.float() of f32 x
                return found[0]
    return None


def candidates(region: Region) -> Iterator[Candidate]:
    """The canonical forms to try, the likeliest first."""
    h = region.hints
    biased = region.bias is not None
    if not biased:
        for renorm in (True, False):
            yield Candidate("topk_renorm", "logits", renormalize=renorm)
        yield Candidate("topk_renorm", "probs", renormalize=True)
        if h["probability_mix"]:  # the raw top-k of mixed probabilities: a gate (SymphonySMoE's), not any top-k
            yield Candidate("topk_renorm", "probs", renormalize=False)
    scorings = (["sigmoid"] if h["sigmoid"] else []) + (["softmax"] if h["softmax"] else [])
    scorings += [s for s in ("sigmoid", "softmax") if s not in scorings]
    custom = _custom_score(region)
    if custom is not None:
        scorings.append(custom)  # after the named scores: a sigmoid spelled out is still the sigmoid kernel
    groups = [(g, t, gs) for g, t in h["groups"] for gs in ("top2_sum", "max")] + [(1, 1, "top2_sum")]
    for (g, t, gs), scoring in itertools.product(groups, scorings):
        for order, renorm, scale in itertools.product(_orders(scoring, biased), (True, False), h["scales"]):
            if order == "topk_then_score" and g > 1 or region.k > t * (region.E // g):
                continue
            if not biased and g == 1 and scoring == "softmax" and scale == 1.0:
                continue  # topk_renorm above
            yield Candidate("route", scoring, order, g, t, gs, renorm, scale)


def _orders(scoring: str, biased: bool) -> tuple[str, str]:
    """The orders to try for ``scoring``, the cheaper first where both may hold. An unbiased sigmoid chooses the same
    experts from the logits as from the scores (it is increasing), but for ties among saturated scores (sigmoid(30)
    == sigmoid(40) in f32: either expert is a top-k of the scores, with the same weight and a zero gradient), and
    topk_then_score computes k sigmoids a token where score_then_topk computes E. The check (below) still decides:
    a region that is neither (a bias added to the scores) matches only its own order."""
    if scoring == "sigmoid" and not biased:
        return ("topk_then_score", "score_then_topk")
    return ("score_then_topk", "topk_then_score")


class _Replay:
    """The region run on real tensors: its leaves bound to test inputs, its sizes to the inputs' sizes."""

    def __init__(self, region: Region):
        self.region = region
        lv = tensor_val(region.logits)
        self.symbols: dict[Any, int] = {}
        for d in map(_static, lv.shape):
            if isinstance(d, torch.SymInt):
                expr = d.node.expr
                for s in sorted(expr.free_symbols, key=str):
                    self.symbols.setdefault(s, 5 if not self.symbols else 3)

    def size(self, d: Any) -> int:
        if isinstance(d, torch.SymInt):
            expr = d.node.expr
            if not expr.free_symbols <= set(self.symbols):
                raise Miss(f"a size of the region ({expr}) is not one of the logits' sizes")
            return int(expr.xreplace(self.symbols))
        return int(d)

    def shape(self, n: fx.Node) -> list[int]:
        return [self.size(d) for d in tensor_val(n).shape]

    def run(self, logits: torch.Tensor, bias: Optional[torch.Tensor]) -> dict[fx.Node, Any]:
        r = self.region
        env: dict[fx.Node, Any] = {r.logits: logits}
        if r.bias is not None:
            env[r.bias] = bias.to(tensor_val(r.bias).dtype).reshape(self.shape(r.bias))
        for leaf, value in r.constants.items():
            env[leaf] = value.to(logits.device)
        for leaf in r.meta_leaves:
            v = tensor_val(leaf)
            env[leaf] = torch.zeros(self.shape(leaf), dtype=v.dtype, device=logits.device)
        for leaf in r.size_leaves:
            env[leaf] = self.size(leaf.meta["val"])

        def arg(a: Any) -> Any:
            if isinstance(a, fx.Node):
                return env[a]
            if isinstance(a, torch.SymInt):
                return self.size(a)
            if isinstance(a, torch.device) and a != logits.device:
                return logits.device
            return a

        for n in r.nodes:
            args = fx.node.map_aggregate(n.args, arg)
            kwargs = {key: (logits.device if key == "device" and val is not None else
                            fx.node.map_aggregate(val, arg)) for key, val in n.kwargs.items()}
            env[n] = n.target(*args, **kwargs)
        return env


def _inputs(shape: list[int], E: int, dtype: torch.dtype, device, biased: bool):
    """(name, logits, bias, strict) test cases: ``strict`` ones have no ties, so the choice itself must match."""
    g = torch.Generator().manual_seed(20261129)

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(device)

    def bias():
        return rnd(E, scale=0.5).float() if biased else None

    cases = [("random", rnd(*shape, scale=2.0), bias(), True),
             ("small", rnd(*shape, scale=0.05), bias(), True),
             ("large", rnd(*shape, scale=6.0), bias(), False)]  # a saturated sigmoid ties
    if biased:  # every choice score negative: an exclusion by a 0.0 fill is no longer the op's exclusion
        cases.append(("negative bias", rnd(*shape, scale=2.0), -(rnd(E).abs().float() + 1.5), True))
    # Ties between neighbouring experts (2j, 2j + 1), in one group wherever groups have an even size: any of the
    # two is a valid choice and gives the same weight, and the group scores stay distinct.
    ties, tied_bias = rnd(*shape, scale=2.0), bias()
    ties[..., 1::2] = ties[..., 0:E - E % 2:2]
    if tied_bias is not None:
        tied_bias[1::2] = tied_bias[0:E - E % 2:2]
    cases.append(("ties", ties, tied_bias, False))
    inf = rnd(*shape, scale=2.0)
    flat = inf.view(-1, E)
    flat[:, 1::5] = float("-inf")
    flat[0, :] = float("-inf")
    if flat.shape[0] > 1:
        flat[1, min(2, E - 1)] = float("inf")
    cases.append(("inf", inf, bias(), False))
    return [(name, x.to(dtype), b, strict) for name, x, b, strict in cases]


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), equal_nan=True, **tol)


def _same_routing(region: Region, env: dict, w_ref: torch.Tensor, i_ref: torch.Tensor, strict: bool) -> bool:
    """The candidate's results against the region's, on the rows where the region's weights are finite."""
    E, k = region.E, region.k
    idxs = [env[n].reshape(-1, k).long() for n in region.index_outputs]
    w = env[region.weights_output].reshape(-1, k) if region.weights_output is not None else None
    i_ref = i_ref.reshape(-1, k).long()
    w_ref = w_ref.reshape(-1, k)
    rows = torch.isfinite(w).all(-1) if w is not None else torch.ones(i_ref.shape[0], dtype=torch.bool)
    if w is not None:
        w_ref = w_ref.to(w.dtype)
    for idx in idxs:
        if idx.shape != i_ref.shape:
            return False
        if strict and region.ordered:
            if not torch.equal(idx[rows], i_ref[rows]):
                return False
        elif strict:
            if not torch.equal(idx[rows].sort(-1).values, i_ref[rows].sort(-1).values):
                return False
    if w is None:
        return True
    if strict and region.ordered:
        return _close(w[rows], w_ref[rows], w.dtype)
    if strict:  # any order: the weights each expert gets
        dense = torch.zeros(w.shape[0], E, dtype=torch.float32, device=w.device)
        dense_ref = dense.clone()
        dense.scatter_(1, idxs[0], w.float())
        dense_ref.scatter_(1, i_ref, w_ref.float())
        return _close(dense[rows], dense_ref[rows], w.dtype)
    # Ties: another expert of the same score is as valid; the weights given must be the same.
    return _close(w[rows].float().sort(-1).values, w_ref[rows].float().sort(-1).values, w.dtype)


def _grad_matches(region: Region, replay: _Replay, cand: Candidate, x: torch.Tensor, bias) -> bool:
    """The weights' gradient with respect to the logits, the region's against the candidate's (the cotangent
    given to each expert, not to each slot: the slots' order is free where the region does not sort)."""
    wo = region.weights_output
    E, k = region.E, region.k
    xr = x.detach().clone().requires_grad_(True)
    cot = torch.randn(x.reshape(-1, E).shape, generator=torch.Generator().manual_seed(7)).to(x.device)
    with torch.enable_grad():
        env = replay.run(xr, bias)
        w, idx = env[wo].reshape(-1, k), env[region.index_outputs[0]].reshape(-1, k).long()
        if not w.requires_grad:
            return False  # the region's weights carry no gradient (a detach): the op's would
        w_ref, i_ref = cand.reference(xr.reshape(-1, E), bias, k)
        g, = torch.autograd.grad((w.float() * cot.gather(1, idx)).sum(), xr)
        g_ref, = torch.autograd.grad((w_ref * cot.gather(1, i_ref.long())).sum(), xr)
    return _close(g, g_ref, w.dtype)


def check(region: Region) -> Candidate:
    """The first candidate equal to the region on every test input (forward and the weights' gradient)."""
    replay = _Replay(region)
    lv = tensor_val(region.logits)
    E = region.E
    shape = replay.shape(region.logits)
    device = lv.device if lv.device.type != "meta" else torch.device("cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        device = torch.device("cpu")
    cases = _inputs(shape, E, lv.dtype, device, region.bias is not None)
    with torch.no_grad():
        try:
            envs = [replay.run(x, b) for _, x, b, _ in cases]
        except Miss:
            raise
        except Exception as e:  # noqa: BLE001 - a region that cannot be replayed is not raised
            raise Miss(f"the region cannot be replayed on test inputs ({type(e).__name__}: {e})") from None
    tried = 0
    for cand in candidates(region):
        tried += 1
        ok = True
        for (name, x, b, strict), env in zip(cases, envs):
            try:
                w_ref, i_ref = cand.reference(x.reshape(-1, E), b, region.k)
            except Exception:  # noqa: BLE001 - a candidate the reference rejects (k > kept experts...)
                ok = False
                break
            if not _same_routing(region, env, w_ref, i_ref, strict):
                ok = False
                break
        if ok and _grad_matches(region, replay, cand, cases[0][1], cases[0][2]):
            return cand
    raise Miss(f"none of the {tried} canonical forms tried equals the region on the test inputs")


# ----------------------------------------------------------------------------------------------------------------
# Emission
# ----------------------------------------------------------------------------------------------------------------


def _grad_mode_at(graph: fx.Graph, node: fx.Node) -> Optional[bool]:
    mode = None
    for n in graph.nodes:
        if n is node:
            return mode
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            mode = bool(n.args[0])
    return mode


def _emit(graph: fx.Graph, region: Region, cand: Candidate) -> None:
    position = {n: i for i, n in enumerate(graph.nodes)}
    outs = region.index_outputs + ([region.weights_output] if region.weights_output is not None else [])
    inside = set(region.nodes)
    readers = [u for o in outs for u in o.users if u not in inside]
    if not readers:
        raise Miss("no reader of the routing outside it")
    # Before the first reader, or else at the top-k itself (its readers may run under no_grad, as Symphony's buffer
    # updates do): where the op runs in the grad mode the weights were computed in, and after every input.
    leaves = [region.logits, region.bias, *region.meta_leaves, *region.size_leaves, *region.constants]
    first_input = max(position[n] for n in leaves if n is not None)
    want = _grad_mode_at(graph, region.weights_output) if region.weights_output is not None else None
    anchors = [a for a in (min(readers, key=position.__getitem__), region.topk)
               if position[a] > first_input and (want is None or _grad_mode_at(graph, a) == want)]
    if not anchors:
        raise Miss("its readers run in another grad mode than its weights")
    anchor = anchors[0]
    logits, k = region.logits, region.k
    lv = tensor_val(logits)
    with graph.inserting_before(anchor):
        x = logits
        if lv.dtype != torch.float32 and cand.op == "route":
            x = new_node(graph, aten._to_copy.default, (x,), {"dtype": torch.float32}, like=anchor)
        lead = None
        if lv.dim() > 2 and cand.op == "route":  # route takes [T, E] rows; topk_renorm any [..., E]
            lead = [d if isinstance(d, int) else new_node(graph, aten.sym_size.int, (logits, j), like=anchor)
                    for j, d in enumerate(lv.shape[:-1])]
            x = new_node(graph, aten.reshape.default, (x, [-1, region.E]), like=anchor)
        bias = region.bias
        if bias is not None and tensor_val(bias).dim() != 1:
            bias = new_node(graph, aten.reshape.default, (bias, [region.E]), like=anchor)
        # The indices stay the kernel's int32 and are cast below where the readers take int64, although the op can
        # write int64 (indices_dtype): torch.ops' parser takes more for a call with a dtype argument than inductor's
        # fused cast kernel costs at decode (bench/results/index-dtype-2026-11-30-t2-epyc.md).
        if cand.op == "topk_renorm":
            r = new_node(graph, moe.topk_renorm.default, (x, k, cand.scoring, cand.renormalize), like=anchor)
        else:
            r = new_node(graph, moe.route.default, (x, bias, k, cand.scoring, cand.order, cand.n_group,
                                                   cand.topk_group, cand.group_score, cand.renormalize, cand.scale),
                         like=anchor)
        w = new_node(graph, operator.getitem, (r, 0), like=anchor)
        i = new_node(graph, operator.getitem, (r, 1), like=anchor)
        if lead is not None:
            w = new_node(graph, aten.view.default, (w, lead + [k]), like=anchor)
            i = new_node(graph, aten.view.default, (i, lead + [k]), like=anchor)
        if region.weights_output is not None:
            want = tensor_val(region.weights_output).dtype
            wv = w if want == torch.float32 else new_node(graph, aten._to_copy.default, (w,), {"dtype": want},
                                                          like=anchor)
            region.weights_output.replace_all_uses_with(wv, delete_user_cb=lambda u: u not in inside)
        for o in region.index_outputs:
            want = tensor_val(o).dtype
            iv = i if want == tensor_val(i).dtype else new_node(graph, aten._to_copy.default, (i,), {"dtype": want},
                                                                like=anchor)
            o.replace_all_uses_with(iv, delete_user_cb=lambda u: u not in inside)
    _erase_region(graph, region)


def _erase_region(graph: fx.Graph, region: Region) -> None:
    """Erases the region's nodes nothing outside it reads any more, users first. Liveness, not dead code: an
    in-place write is live exactly when the tensor it writes is (``eliminate_dead_code`` keeps every in-place op,
    which would keep the old top-k alive)."""
    inside = set(region.nodes)
    writers: dict[fx.Node, list[fx.Node]] = {}
    for n in region.nodes:
        if _mutates(n) and n.args[0] in inside:
            writers.setdefault(n.args[0], []).append(n)
    live: set[fx.Node] = set()
    work = [n for n in region.nodes if any(u not in inside for u in n.users)]
    while work:
        n = work.pop()
        if n in live or n not in inside:
            continue
        live.add(n)
        work.extend(n.all_input_nodes)
        work.extend(writers.get(n, []))
    for n in reversed(region.nodes):
        if n not in live:
            graph.erase_node(n)


_SORTS = (aten.sort.default, aten.sort.stable, aten.argsort.default, aten.argsort.stable)


def _arg(n: fx.Node, i: int, name: str, default: Any) -> Any:
    return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)


def _leading_slice(n: fx.Node, last: int) -> Optional[tuple[fx.Node, int]]:
    """(the node, k) when ``n`` takes the first ``k`` entries of the last dim (``x[..., :k]``, ``x[:, :k]``)."""
    full = (None, 0)
    while is_call(n, (aten.slice.Tensor,)):
        dim, start = _arg(n, 1, "dim", 0) % (last + 1), _arg(n, 2, "start", None)
        end, step = _arg(n, 3, "end", None), _arg(n, 4, "step", 1)
        if start not in full or step != 1:
            return None
        if dim == last:
            if isinstance(end, fx.Node) and isinstance(end.meta.get("val"), torch.SymInt):
                try:
                    end = _experts(end.meta["val"])  # a k made an input by dynamic=True
                except Miss:
                    return None
            return (n, end) if isinstance(end, int) and end > 0 else None
        if not (end is None or isinstance(end, int) and end >= 2 ** 62) or len(n.users) != 1:
            return None
        n = next(iter(n.users))
    return None


def sorts_as_topk(graph: fx.Graph) -> int:
    """``sort(x, descending=True)[..., :k]``, ``argsort(x, descending=True)[..., :k]`` and ``x.max(-1,
    keepdim=True)`` (last dim) become ``topk(x, k)``: the same experts, in the same order but among ties (which the dialect breaks to the lowest
    index either way). Returns how many were rewritten."""
    done = 0
    for n in [n for n in graph.nodes if is_call(n, (aten.max.dim,))]:
        # ``v, i = x.max(-1, keepdim=True)`` is the top-1 (its indices read: a choice, not a group score)
        xv = tensor_val(n.args[0])
        keep = _arg(n, 2, "keepdim", False)
        parts = {u.args[1]: u for u in n.users if u.target is operator.getitem}
        if xv is None or xv.dim() < 1 or not keep or _arg(n, 1, "dim", None) % xv.dim() != xv.dim() - 1 \
                or 1 not in parts or len(parts) != len(n.users):
            continue
        with graph.inserting_before(n):
            tk = new_node(graph, aten.topk.default, (n.args[0], 1), like=n)
            for j, u in parts.items():
                u.replace_all_uses_with(new_node(graph, operator.getitem, (tk, j), like=n))
        done += 1
    for n in [n for n in graph.nodes if is_call(n, (aten.argmax.default,))]:
        # ``x.argmax(-1, keepdim=True)``: the top-1's indices
        xv = tensor_val(n.args[0])
        dim = _arg(n, 1, "dim", None)
        if xv is None or xv.dim() < 1 or not isinstance(dim, int) or dim % xv.dim() != xv.dim() - 1 \
                or not _arg(n, 2, "keepdim", False) or xv.dtype not in FLOATS:
            continue
        with graph.inserting_before(n):
            tk = new_node(graph, aten.topk.default, (n.args[0], 1), like=n)
            n.replace_all_uses_with(new_node(graph, operator.getitem, (tk, 1), like=n))
        done += 1
    for n in [n for n in graph.nodes if is_call(n, _SORTS)]:
        x, xv = n.args[0], tensor_val(n.args[0])
        if xv is None or xv.dim() < 1:
            continue
        argsort = n.target in (aten.argsort.default, aten.argsort.stable)
        stable = n.target in (aten.sort.stable, aten.argsort.stable)
        dim = _arg(n, 1, "dim", -1) if not stable else n.kwargs.get("dim", -1)
        desc = _arg(n, 2, "descending", False) if not stable else n.kwargs.get("descending", False)
        if not desc or dim % xv.dim() != xv.dim() - 1:
            continue
        outs = [n] if argsort else list(n.users)
        if not argsort and not all(u.target is operator.getitem for u in outs):
            continue
        # each reader takes the first k (a slice), or all E: the whole sort is the top-E. A symbolic E
        # (dynamic=True) is specialized as the experts' number is everywhere (_experts).
        try:
            E = _experts(xv.shape[-1])
        except Miss:
            continue
        slices = {u: (o, _leading_slice(u, xv.dim() - 1) or (o, E)) for o in outs for u in o.users}
        ks = {min(found[1], E) for _, found in slices.values()}  # a slice past the end takes all E
        if len(ks) != 1 or not slices:
            continue
        with graph.inserting_before(n):
            tk = new_node(graph, aten.topk.default, (x, ks.pop()), like=n)
            part = {0: new_node(graph, operator.getitem, (tk, 0), like=n),
                    1: new_node(graph, operator.getitem, (tk, 1), like=n)}
        for o, (read, _) in slices.values():
            read.replace_all_uses_with(part[1] if argsort else part[o.args[1]])
        done += 1
    if done:
        graph.eliminate_dead_code()
    return done


def _where(n: fx.Node) -> str:
    trace = n.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
    return lines[-1] if lines else n.name


def raise_by_meaning(gm: fx.GraphModule) -> tuple[dict[str, int], dict[fx.Node, str]]:
    """Raises every routing region of ``gm`` that equals a canonical form, the last top-k first (a grouped
    router's group top-k is inside its expert top-k's region). Returns how many of each op were raised, and why
    each other top-k was not (:func:`report_misses` says it for those still in the graph at the end)."""
    graph = gm.graph
    counts = {"route": 0, "topk_renorm": 0}
    misses: dict[fx.Node, str] = {}
    sorts_as_topk(graph)
    for tk in reversed([n for n in graph.nodes if is_call(n, (aten.topk.default,))]):
        if tk not in set(graph.nodes):
            continue  # erased with a region raised before it
        # The whole region first; where it is no canonical form, the region that only weighs the choice (what
        # the code after it does with the indices stays in the graph).
        for at_input, minimal in itertools.product((False, True), (False, True, "first")):
            try:
                region = find_region(tk, gm, minimal, at_input)
                cand = check(region)
                _emit(graph, region, cand)  # (its Miss comes before it changes the graph)
            except Miss as why:
                misses.setdefault(tk, str(why))
                continue
            except Exception as e:  # noqa: BLE001 - a bug here must cost this top-k its raising, not the graph's
                misses.setdefault(tk, f"raising failed ({type(e).__name__}: {e})")
                logger.debug("moe raising failed", exc_info=True)
                continue
            counts[cand.op] += 1
            misses.pop(tk, None)
            break
    return counts, misses


def report_misses(graph: fx.Graph, misses: dict[fx.Node, str]) -> list[str]:
    """One line for each top-k of ``misses`` still in ``graph`` (no other rewrite raised it), logged."""
    alive = set(graph.nodes)
    lines = [f"moe raising: the top-k at {_where(tk)} is not raised: {why}" for tk, why in misses.items()
             if tk in alive]
    for line in lines:
        logger.info(line)
    return lines
