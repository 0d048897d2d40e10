"""Raising: rewrite the routing idioms of plain PyTorch models into ``torch.ops.moe.*`` on the FX graph.

Runs on aten-level FX graphs: the exported (and decomposed) graph before printing, so a model that never mentions
our custom ops still compiles to the ``moe`` dialect (and so to its fused kernels), and the pre-dispatch aten graph
of each Dynamo graph in ``torch.compile(backend="moe")`` (:mod:`moe_mlir.backends.dynamo`) before inductor. Shapes
may be symbolic (SymInt token counts); the matchers read ranks and dtypes only. The forms HF code produces are
matched too: ``F.softmax(x, dtype=torch.float)`` (a cast folded into the softmax), the in-place
``v /= v.sum(-1, keepdim=True)`` (``aten.div_``), ``topk(..., sorted=False)`` (any order is a valid answer, the
raised op gives descending order) and ``.to(dtype)`` casts after the weights (kept as they are).

=====================================================  ===========================================================
idiom (FX, after export)                                 becomes
=====================================================  ===========================================================
``softmax(x,-1) -> topk(k) -> v / v.sum(-1, keepdim)``   ``moe.topk_renorm(x, k, mode="logits", renormalize=True)``
``softmax(x,-1) -> topk(k)`` (values used as is)         ``moe.topk_renorm(x, k, mode="logits", renormalize=False)``
``topk(x, k) -> softmax(values, -1)``                    ``moe.topk_renorm(x, k, mode="logits", renormalize=True)``
``topk(p, k) -> v / v.sum(-1, keepdim)``                 ``moe.topk_renorm(p, k, mode="probs", renormalize=True)``
``topk(softmax(x,-1) · A, k)`` (values used as is)       ``moe.topk_renorm(softmax(x,-1) · A, k, mode="probs",
                                                         renormalize=False)`` (SymphonySMoE's gate G, 004 eq 7-8)
``softmax(U·Uᵀ/τ, -1) · E`` (``matmul``/``bmm``)           ``moe.similarity_inform(U, E, tau=τ)``
=====================================================  ===========================================================

Each rewrite is exact for finite inputs (Mutual-Inform App. A.3 proves the first and third equal) with these
differences on degenerate rows, where the dialect's rules apply instead of torch's: ties select the lowest index
(torch leaves it unspecified), a fully ``-inf`` logit row gives zero weights instead of NaN, and in probs mode a
zero sum gives zero weights instead of NaN. Index results are converted back to int64 and weights to the original
dtype, so the rest of the graph is unchanged.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import torch
import torch.fx as fx

from .. import ops as _ops  # noqa: F401

aten = torch.ops.aten
moe = torch.ops.moe

__all__ = ["raise_routing_idioms"]

_SOFTMAX = (aten.softmax.int, aten._softmax.default)
_DIV = (aten.div.Tensor, aten.div_.Tensor)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_MATMUL = (aten.matmul.default, aten.bmm.default)
_PRODUCTS = _MATMUL + (aten.mm.default,)
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


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


def _topk_parts(n: fx.Node) -> Optional[tuple[fx.Node, int, Optional[fx.Node], Optional[fx.Node]]]:
    """(input, k, values getitem, indices getitem) of a last-dim, largest ``topk`` node."""
    if n.op != "call_function" or n.target != aten.topk.default:
        return None
    args = list(n.args) + [None] * (5 - len(n.args))
    x, k = args[0], args[1]
    dim = args[2] if args[2] is not None else n.kwargs.get("dim", -1)
    largest = args[3] if args[3] is not None else n.kwargs.get("largest", True)
    if not largest or not _last_dim(x, dim):
        return None
    if x.meta["val"].dtype not in _FLOATS or not isinstance(k, int):
        return None
    vals = idxs = None
    for u in n.users:
        if u.target is operator.getitem:
            if u.args[1] == 0:
                vals = u
            elif u.args[1] == 1:
                idxs = u
        else:
            return None
    return x, int(k), vals, idxs


def _through_views(n: Any) -> Any:
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in _VIEWS:
        n = n.args[0]
    return n


def _is_probability_mix(x: fx.Node) -> bool:
    """``softmax(l, -1) · A`` (a matrix product whose left factor is a last-dim softmax; the views a decomposed
    ``matmul`` adds are looked through): mixed probabilities such as SymphonySMoE's gate ``G = softmax(logits) · Aᵀ``,
    whose top-k the dialect takes in probs mode. (Any top-k is that op; the check keeps raising to routing gates.)"""
    prod = _through_views(x)
    if not isinstance(prod, fx.Node) or prod.op != "call_function" or prod.target not in _PRODUCTS:
        return False
    s = _through_views(prod.args[0])
    if not isinstance(s, fx.Node):
        return False
    dim = _softmax_dim(s)
    return dim is not None and _last_dim(s, dim)


def _renorm_div(vals: fx.Node) -> Optional[fx.Node]:
    """The node ``vals / vals.sum(-1, keepdim=True)`` (or the in-place ``/=``) when it is the only use of ``vals``
    (besides the sum)."""
    users = list(vals.users)
    if len(users) != 2:
        return None
    div = next((u for u in users if u.target in _DIV), None)
    s = next((u for u in users if u.target in (aten.sum.dim_IntList,)), None)
    if div is None or s is None or div.args[0] is not vals or div.args[1] is not s:
        return None
    dims = s.args[1] if len(s.args) > 1 else s.kwargs.get("dim")
    keep = s.args[2] if len(s.args) > 2 else s.kwargs.get("keepdim", False)
    if not keep or not isinstance(dims, (list, tuple)) or len(dims) != 1 or not _last_dim(vals, dims[0]):
        return None
    if len(s.users) != 1 or s.kwargs.get("dtype") is not None:
        return None
    return div


def _fake(fn, *args, **kwargs):
    """Runs ``fn`` on the fake values of FX nodes to get the new node's meta['val']."""
    from torch._guards import detect_fake_mode

    vals = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None:
        return fn(*vals, **kwargs)
    with mode:
        return fn(*vals, **kwargs)


def _new(graph: fx.Graph, target, args: tuple, kwargs: Optional[dict] = None, like: Optional[fx.Node] = None) -> fx.Node:
    n = graph.call_function(target, args, kwargs or {})
    n.meta["val"] = _fake(lambda *a: target(*a, **(kwargs or {})), *args)
    if like is not None and "stack_trace" in like.meta:
        n.meta["stack_trace"] = like.meta["stack_trace"]
    return n


def _erase_dead(graph: fx.Graph, nodes: list[Optional[fx.Node]]) -> None:
    """Erases the replaced chain (users first). ``eliminate_dead_code`` keeps in-place ops such as the ``div_`` of
    ``v /= v.sum(...)``, which would keep the old top-k alive."""
    for n in nodes:
        if n is not None and n.graph is graph and not n.users:
            graph.erase_node(n)


def _emit_topk_renorm(
    graph: fx.Graph, anchor: fx.Node, x: fx.Node, k: int, mode: str, renorm: bool,
    weights_user: Optional[fx.Node], idx_user: Optional[fx.Node],
) -> None:
    with graph.inserting_before(anchor):
        tr = _new(graph, moe.topk_renorm.default, (x, k, mode, renorm), like=anchor)
        w = _new(graph, operator.getitem, (tr, 0), like=anchor)
        i = _new(graph, operator.getitem, (tr, 1), like=anchor)
        if weights_user is not None:
            want = weights_user.meta["val"].dtype
            if want != torch.float32:
                w = _new(graph, aten._to_copy.default, (w,), {"dtype": want}, like=anchor)
            weights_user.replace_all_uses_with(w)
        if idx_user is not None:
            i64 = _new(graph, aten._to_copy.default, (i,), {"dtype": idx_user.meta["val"].dtype}, like=anchor)
            idx_user.replace_all_uses_with(i64)


def _raise_topk(graph: fx.Graph) -> int:
    count = 0
    for tk in list(graph.nodes):
        parts = _topk_parts(tk)
        if parts is None:
            continue
        x, k, vals, idxs = parts
        sm_dim = _softmax_dim(x)
        if vals is None:
            continue
        div = _renorm_div(vals)
        s = div.args[1] if div is not None else None
        # softmax -> topk [-> renormalize]
        if sm_dim is not None and _last_dim(x, sm_dim):
            logits = x.args[0]
            if logits.meta["val"].dtype not in _FLOATS:
                continue
            if div is not None:
                _emit_topk_renorm(graph, tk, logits, k, "logits", True, div, idxs)
            else:
                _emit_topk_renorm(graph, tk, logits, k, "logits", False, vals, idxs)
            _erase_dead(graph, [div, s, vals, idxs, tk, x])
            count += 1
            continue
        # topk -> softmax(values)
        users = list(vals.users)
        if len(users) == 1 and _softmax_dim(users[0]) is not None and _last_dim(vals, _softmax_dim(users[0])):
            _emit_topk_renorm(graph, tk, x, k, "logits", True, users[0], idxs)
            _erase_dead(graph, [users[0], vals, idxs, tk])
            count += 1
            continue
        # topk(p) -> renormalize
        if div is not None:
            _emit_topk_renorm(graph, tk, x, k, "probs", True, div, idxs)
            _erase_dead(graph, [div, s, vals, idxs, tk])
            count += 1
            continue
        # topk(softmax(l) · A), the values used raw
        if _is_probability_mix(x):
            _emit_topk_renorm(graph, tk, x, k, "probs", False, vals, idxs)
            _erase_dead(graph, [vals, idxs, tk])
            count += 1
    return count


def _is_transpose_of_last_two(n: fx.Node, u: fx.Node) -> bool:
    if n.op != "call_function" or n.args[0] is not u:
        return False
    r = u.meta["val"].dim()
    if n.target == aten.transpose.int:
        return {n.args[1] % r, n.args[2] % r} == {r - 1, r - 2}
    if n.target == aten.permute.default:
        perm = [p % r for p in n.args[1]]
        return perm == list(range(r - 2)) + [r - 1, r - 2]
    if n.target == aten.t.default:
        return r == 2
    return False


def _similarity_parts(mm: fx.Node) -> Optional[tuple[fx.Node, fx.Node, float]]:
    """(U, E, tau) when ``mm`` is ``softmax(U Uᵀ / tau, -1) @ E``."""
    if mm.op != "call_function" or mm.target not in _MATMUL:
        return None
    s, e = mm.args[0], mm.args[1]
    if not isinstance(s, fx.Node) or _softmax_dim(s) is None or not _last_dim(s, _softmax_dim(s)):
        return None
    if len(s.users) != 1:
        return None
    logits = s.args[0]
    tau = 1.0
    if logits.op == "call_function" and logits.target in (aten.div.Tensor, aten.div.Scalar, aten.mul.Tensor,
                                                         aten.mul.Scalar):
        c = logits.args[1]
        if not isinstance(c, (int, float)) or isinstance(c, bool) or c == 0:
            return None
        tau = float(c) if logits.target in (aten.div.Tensor, aten.div.Scalar) else 1.0 / float(c)
        if len(logits.users) != 1:
            return None
        logits = logits.args[0]
    if logits.op != "call_function" or logits.target not in _MATMUL or len(logits.users) != 1:
        return None
    u, ut = logits.args[0], logits.args[1]
    if not isinstance(ut, fx.Node) or not _is_transpose_of_last_two(ut, u):
        return None
    uv, ev = u.meta["val"], e.meta["val"]
    if not (tau > 0 and tau != float("inf")):
        return None
    if uv.dim() not in (2, 3) or ev.dim() != uv.dim() or uv.shape[:-1] != ev.shape[:-1]:
        return None
    if uv.dtype not in (torch.float32, torch.float16, torch.bfloat16) or ev.dtype not in (
            torch.float32, torch.float16, torch.bfloat16):
        return None
    return u, e, tau


def _raise_similarity(graph: fx.Graph) -> int:
    count = 0
    for mm in list(graph.nodes):
        parts = _similarity_parts(mm)
        if parts is None:
            continue
        u, e, tau = parts
        with graph.inserting_before(mm):
            if u.meta["val"].dim() == 2:  # one sequence: [N, D] -> [1, N, D]
                u3 = _new(graph, aten.unsqueeze.default, (u, 0), like=mm)
                e3 = _new(graph, aten.unsqueeze.default, (e, 0), like=mm)
            else:
                u3, e3 = u, e
            p = _new(graph, moe.similarity_inform.default, (u3, e3, None, None, tau, False), like=mm)
            if u.meta["val"].dim() == 2:
                p = _new(graph, aten.squeeze.dims, (p, [0]), like=mm)
            want = mm.meta["val"].dtype
            if want != torch.float32:
                p = _new(graph, aten._to_copy.default, (p,), {"dtype": want}, like=mm)
        mm.replace_all_uses_with(p)
        count += 1
    return count


def raise_routing_idioms(gm: fx.GraphModule) -> dict[str, int]:
    """Rewrites the idioms in place; returns how many of each were raised."""
    graph = gm.graph
    counts = {"similarity_inform": _raise_similarity(graph)}
    graph.eliminate_dead_code()
    counts["topk_renorm"] = _raise_topk(graph)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    return counts
