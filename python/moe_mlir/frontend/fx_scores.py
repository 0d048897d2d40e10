"""What the routing rewrites share about scores and weights on aten FX graphs: a softmax's dim, a last-dim top-k, an
elementwise score chain and its custom score region, a weights chain (gather, renormalization, scaling), values
seen through casts (:mod:`.raising`, :mod:`.routing_region`, :mod:`.raising_replay`)."""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.fx as fx

from .fx_match import FLOATS, is_call, tensor_val, through_views

aten = torch.ops.aten

_SOFTMAX = (aten.softmax.int, aten._softmax.default)
_DIV = (aten.div.Tensor, aten.div_.Tensor)
_MATMUL = (aten.matmul.default, aten.bmm.default)
_PRODUCTS = _MATMUL + (aten.mm.default,)


def _last_dim(node: fx.Node, dim: Any) -> bool:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not isinstance(dim, int):
        return False
    return dim % max(val.dim(), 1) == val.dim() - 1


def _softmax_dim(n: fx.Node) -> Optional[int]:
    if n.op == "call_function" and n.target in _SOFTMAX:
        dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        if n.target == aten._softmax.default and len(n.args) > 2 and n.args[2]:
            return None  # half_to_float
        if n.target == aten.softmax.int:
            dtype = n.args[2] if len(n.args) > 2 else n.kwargs.get("dtype")
            if dtype not in (None, torch.float32):
                return None  # a softmax computed in a narrower type than the moe op's f32
        return dim
    return None


class TopK(NamedTuple):
    """A last-dim, ``largest``, floating-point ``topk`` with an int ``k``; ``values`` and ``indices`` are its
    ``getitem`` users (None where there is none)."""
    x: fx.Node
    k: int
    sorted: bool
    values: Optional[fx.Node]
    indices: Optional[fx.Node]


def _topk_parts(n: fx.Node, k_of: Optional[Callable[[Any], int]] = None) -> Optional[TopK]:
    """``n`` as a :class:`TopK`, or None. ``k_of`` turns a symbolic ``k`` (``dynamic=True`` makes a constant k an
    input too) into an int, or raises; without it such a top-k is not one."""
    if not is_call(n, (aten.topk.default,)):
        return None
    args = list(n.args) + [None] * (6 - len(n.args))
    x, k = args[0], args[1]
    if k_of is not None and isinstance(k, fx.Node) and isinstance(k.meta.get("val"), torch.SymInt):
        k = k_of(k.meta["val"])
    dim = args[2] if args[2] is not None else n.kwargs.get("dim", -1)
    largest = args[3] if args[3] is not None else n.kwargs.get("largest", True)
    srt = args[4] if args[4] is not None else n.kwargs.get("sorted", True)
    xv = tensor_val(x)
    if xv is None or xv.dim() < 1 or xv.dtype not in FLOATS or not largest or not isinstance(k, int):
        return None
    if not _last_dim(x, dim):
        return None
    got = {u.args[1]: u for u in n.users if u.target is operator.getitem}
    return TopK(x, int(k), bool(srt), got.get(0), got.get(1))


def _is_probability_mix(x: fx.Node) -> bool:
    """``softmax(l, -1) · A`` (a matrix product whose left factor is a last-dim softmax; the views a decomposed
    ``matmul`` adds are looked through): mixed probabilities such as SymphonySMoE's gate ``G = softmax(logits) · Aᵀ``,
    whose top-k the dialect takes in probs mode. (Any top-k is that op; the check keeps raising to routing gates.)"""
    prod = through_views(x)
    if not isinstance(prod, fx.Node) or prod.op != "call_function" or prod.target not in _PRODUCTS:
        return False
    s = through_views(prod.args[0])
    if not isinstance(s, fx.Node):
        return False
    dim = _softmax_dim(s)
    return dim is not None and _last_dim(s, dim)


_TO_COPY = (aten._to_copy.default, aten.to.dtype)
#: The largest epsilon in ``w / (w.sum() + eps)`` taken as plain renormalization (HF DeepSeek-V3 adds 1e-20: in f32
#: ``s + 1e-20 == s`` for every sum above ~1e-13).
_RENORM_EPS = 1e-12


def _scoring_of(s: fx.Node, batched: bool = False) -> Optional[tuple[str, fx.Node]]:
    """("sigmoid" | "softmax" | "custom:<region>", logits [T, E] f32) when ``s`` scores logits in f32; with
    ``batched``, logits ``[..., T, E]`` of any rank >= 2 (Zaya's ``[B, T, E]``: :func:`_emit_route` flattens them)."""
    if is_call(s, (aten.sigmoid.default,)):
        x = s.args[0]
    elif _softmax_dim(s) is not None and _last_dim(s, _softmax_dim(s)):
        x = s.args[0]
    else:
        return _custom_scoring_of(s, batched)
    xv = tensor_val(x)
    if xv is None or not _routing_rank(xv, batched) or xv.dtype != torch.float32:
        return None
    return ("sigmoid" if s.target == aten.sigmoid.default else "softmax"), x


def _score_chain(s: fx.Node) -> Optional[tuple[fx.Node, list[fx.Node]]]:
    """(x, the nodes from x to ``s`` in graph order) when ``s`` is an elementwise function of the one tensor ``x``
    through ATen ops a score region can hold (ops.score_region.SCORE_ATEN_OPS; other arguments are numbers)."""
    from ..ops.score_region import SCORE_ATEN_OPS

    chain: dict[fx.Node, None] = {}
    leaves: set[fx.Node] = set()
    work = [s]
    while work:
        n = work.pop()
        if n in chain:
            continue
        if n.op != "call_function" or getattr(n.target, "overloadpacket", None) not in SCORE_ATEN_OPS:
            leaves.add(n)
            continue
        chain[n] = None
        if len(chain) > 64:
            return None
        for a in list(n.args) + list(n.kwargs.values()):
            if isinstance(a, fx.Node):
                work.append(a)
            elif isinstance(a, (list, tuple)) or not (a is None or isinstance(a, (bool, int, float, torch.dtype))):
                return None
    if len(leaves) != 1 or not chain:
        return None
    position = {n: i for i, n in enumerate(s.graph.nodes)}
    return next(iter(leaves)), sorted(chain, key=position.__getitem__)


def _routing_rank(v: torch.Tensor, batched: bool) -> bool:
    """Logits ``[T, E]``, or with ``batched`` ``[..., T, E]``."""
    return v.dim() == 2 or (batched and v.dim() > 2)


def _custom_scoring_of(s: fx.Node, batched: bool = False) -> Optional[tuple[str, fx.Node]]:
    """("custom:<region>", logits) when ``s`` is an elementwise score of f32 logits (DeepSeek-V4's
    ``sqrt(softplus(x))``): the chain replayed on a 0-d tensor and traced by ops.custom_scoring."""
    from ..ops.score_region import custom_scoring

    found = _score_chain(s)
    if found is None:
        return None
    x, chain = found
    xv, sv = tensor_val(x), tensor_val(s)
    if xv is None or sv is None or not _routing_rank(xv, batched) or xv.dtype != torch.float32 or sv.shape != xv.shape \
            or sv.dtype != torch.float32:
        return None

    def replay(t: torch.Tensor) -> torch.Tensor:
        env: dict[fx.Node, Any] = {x: t}
        for n in chain:
            args = fx.node.map_arg(n.args, env.__getitem__)
            kwargs = fx.node.map_arg(n.kwargs, env.__getitem__)
            env[n] = n.target(*args, **kwargs)
        return env[s]

    try:
        return custom_scoring(replay), x
    except ValueError:
        return None


def _weights_chain(g: fx.Node) -> tuple[fx.Node, bool, float, list[fx.Node]]:
    """From the gathered weights ``g``: (the final weights node, renormalized?, scale, the chain's nodes, users
    first)."""
    out, renorm, scale, chain = g, False, 1.0, []
    users = list(g.users)
    div = next((u for u in users if u.target in _DIV and u.args[0] is g), None)
    s = next((u for u in users if u.target == aten.sum.dim_IntList), None)
    if div is not None and s is not None and len(users) == 2:
        den = div.args[1]
        keep = s.args[2] if len(s.args) > 2 else s.kwargs.get("keepdim", False)
        dims = s.args[1] if len(s.args) > 1 else s.kwargs.get("dim")
        eps_ok = den is s or (is_call(den, (aten.add.Tensor, aten.add.Scalar)) and den.args[0] is s
                              and isinstance(den.args[1], float) and 0 <= den.args[1] <= _RENORM_EPS
                              and len(den.users) == 1)
        if keep and isinstance(dims, (list, tuple)) and len(dims) == 1 and _last_dim(g, dims[0]) and eps_ok \
                and len(s.users) == 1:
            out, renorm = div, True
            chain = [div, den, s] if den is not s else [div, s]
    users = list(out.users)
    if len(users) == 1 and is_call(users[0], (aten.mul.Tensor, aten.mul.Scalar)) and users[0].args[0] is out:
        f = users[0].args[1]
        if isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) and f > 0:
            out, scale = users[0], float(f)
            chain.insert(0, users[0])
    return out, renorm, scale, chain


def _erase_unused(graph: fx.Graph, nodes: list[fx.Node]) -> None:
    """Erases those of ``nodes`` left without users, users first (in-place ops such as DeepSeek's ``scatter_`` of
    the group mask or ``/=`` of the weights are not dead code for ``eliminate_dead_code``)."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    for n in sorted(set(nodes), key=lambda n: -position.get(n, -1)):
        if n in position and not n.users:
            graph.erase_node(n)


#: Ops that return their operand's values: in the choice (never differentiated: top-k indices have no gradient)
#: ``detach`` and a cast to the dtype it has already are the same scores (Zaya's ``probs.detach().to(float32)``).
_SAME_VALUES = (aten.detach.default, aten.alias.default, aten.to.dtype, aten._to_copy.default)


def _same_values(n: Any) -> Any:
    """``n`` with :data:`_SAME_VALUES` ops that change nothing looked through (a cast only to its own dtype, no
    other argument)."""
    while is_call(n, _SAME_VALUES):
        src = n.args[0]
        sv, nv = tensor_val(src), tensor_val(n)
        if sv is None or nv is None or sv.dtype != nv.dtype or sv.device != nv.device:
            return n
        if n.target in (aten.to.dtype, aten._to_copy.default) and (len(n.args) > 2 or set(n.kwargs) - {"dtype"}):
            return n
        n = src
    return n
