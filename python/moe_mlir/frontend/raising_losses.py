"""Raising of the routers' auxiliary losses: transformers' load-balancing loss and the router z-loss.

Called by :func:`moe_mlir.frontend.raising.raise_routing_idioms` on the same aten FX graphs (exported, or the
pre-dispatch graph of each Dynamo graph of ``torch.compile(backend="moe")``).

=====================================================  ===========================================================
idiom (FX)                                               becomes
=====================================================  ===========================================================
``E · Σ(f · P.unsqueeze(0))`` with ``f``, ``P`` below      ``moe.load_balancing_loss(cat(logits_l), k, mask)``
``logsumexp(x, -1)²`` then ``mean()`` or ``sum() / n``       ``moe.router_z_loss(x.reshape(-1, E))``
(``n`` the number of rows; ``x ** 2`` or ``x * x``)
=====================================================  ===========================================================

``f`` (the fraction of tokens sent to each expert) and ``P`` (the mean routing probability) of the balancing loss
are recognised in the forms transformers' ``load_balancing_loss_func`` has had (Mixtral, Qwen2/3-MoE, OLMoE,
gpt-oss, Jamba, DBRX, GraniteMoE, PhiMoE, MiniMax... share it), each with and without ``attention_mask``:

* per layer (transformers >= 5): for each layer's logits ``l``: ``p = softmax(l)``, ``sel = topk(p, k).indices``;
  counts accumulated by ``histc(sel.flatten().float(), E, 0, E)`` (by ``scatter_add_(0, sel.flatten(),
  m.repeat_interleave(k))`` with a mask ``m``), probabilities by ``p.float().sum(0)`` (``(p * m[:, None]).sum(0)``),
  both divided by the row count (``Σ_l rows`` or ``Σ_l m.sum()``). The op gets the layers' logits concatenated
  and the mask repeated once per layer;
* concatenated (earlier releases): ``p = softmax(cat(l))``; ``f = one_hot(topk(p, k).indices, E).float().mean(0)``
  and ``P = p.mean(0)``; with a mask, ``f = Σ_t (one_hot · M3) / Σ_t M3`` and ``P = Σ_t (p · M2) / Σ_t M2`` where
  ``M3``, ``M2`` are the attention mask broadcast over ``[layers, batch, seq, k, E]`` / ``[..., E]`` and flattened:
  the op's token mask is ``M3[:, 0, 0]`` (the broadcast is checked: the expanded dims come from size 1).

Every count and divisor is checked against the graph (the same softmax feeds ``f`` and ``P``, histc's bins and
range equal ``E``, the row count equals the layers' rows, symbolically when shapes are dynamic), so a loss written
differently is left alone, never raised to something else. The raised op equals the idiom on finite logits; on
ties it selects the lowest index (torch's topk leaves the order unspecified). Gradients flow into the logits
through ``P`` only, as in the idiom (``f`` is a count). Nothing is raised when the ops are not registered.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.fx as fx

from .fx_match import FLOATS, is_call, new_node

if TYPE_CHECKING:
    import sympy

aten = torch.ops.aten

__all__ = ["raise_load_balancing_loss", "raise_router_z_loss"]

_TO = (aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten._to_copy.default)
_MUL = (aten.mul.Tensor, aten.mul.Scalar)
_DIV = (aten.div.Tensor, aten.div.Scalar)
_ADD = (aten.add.Tensor, aten.add.Scalar, operator.add)
_SOFTMAX = (aten.softmax.int, aten._softmax.default)
_INT_MAX = 2**63 - 1


def _op(name: str) -> Optional[Any]:
    """``torch.ops.moe.<name>.default``, or None while it is not registered."""
    try:
        return getattr(torch.ops.moe, name).default
    except (AttributeError, RuntimeError):
        return None


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, fx.Node) else n


def _tensor(n: Any) -> Optional[torch.Tensor]:
    v = _val(n)
    return v if isinstance(v, torch.Tensor) else None


def _strip_to(n: Any) -> Any:
    """``n`` without the dtype/device conversions around it (``.float()``, ``.to(device)``)."""
    while is_call(n, _TO):
        n = n.args[0]
    return n


def _expr(v: Any) -> Optional[sympy.Expr]:
    """A number or a (symbolic) size as a sympy expression; int/float conversions dropped (a row count is an
    integer whichever type carries it). sympy is imported here, not with the module: `import moe_mlir` imports
    this module and must stay light (sympy alone is ~0.3 s; python/tests/test_import_cost.py)."""
    import sympy
    from torch.utils._sympy.functions import ToFloat

    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return sympy.Integer(int(v)) if float(v).is_integer() else None
    if isinstance(v, (torch.SymInt, torch.SymFloat)):
        return v.node.expr.replace(ToFloat, lambda a: a)
    return None


def _same_number(a: Any, b: Any) -> bool:
    ea, eb = _expr(a), _expr(b)
    if ea is None or eb is None:
        return False
    import sympy

    return sympy.simplify(ea - eb) == 0


def _equal_sizes(a: Any, b: Any) -> bool:
    """Two sizes equal: provably, or (a symbolic relation sympy cannot settle, such as ``(T // (B·S))·B·S == T``)
    equal on this input, under a guard Dynamo adds to the graph's (a later input where they differ recompiles)."""
    if _same_number(a, b):
        return True
    if isinstance(a, (int, torch.SymInt)) and isinstance(b, (int, torch.SymInt)):
        from torch.fx.experimental.symbolic_shapes import guard_or_false

        return bool(guard_or_false(a == b))
    return False


def _int_arg(n: fx.Node, i: int, name: str, default: Any = None) -> Any:
    return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)


def _is_dims(dims: Any, want: int, rank: int) -> bool:
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and isinstance(dims[0], int) and dims[0] % rank == want


def _summands(n: Any) -> list[Any]:
    """The terms of a chain of additions ``((a + b) + c) + ...`` (the accumulators of a per-layer loop)."""
    if is_call(n, _ADD) and len(n.args) == 2 and not n.kwargs:
        return _summands(n.args[0]) + _summands(n.args[1])
    return [n]


def _is_zeros(n: Any) -> bool:
    """A zero accumulator: ``torch.zeros(E)`` (the loop's start value) or a plain 0."""
    if isinstance(n, (int, float)) and not isinstance(n, bool):
        return n == 0
    return is_call(n, (aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default))


def _terms(n: Any) -> list[Any]:
    return [t for t in _summands(n) if not _is_zeros(t)]


# ----------------------------------------------------------------------------------------------------------------
# The routing side: softmax -> topk(k).indices
# ----------------------------------------------------------------------------------------------------------------

def _softmax_input(p: Any) -> Optional[fx.Node]:
    """The logits ``l`` [T, E] when ``p`` is ``softmax(l, -1)`` computed in f32."""
    if not is_call(p, _SOFTMAX):
        return None
    dim = _int_arg(p, 1, "dim")
    if p.target == aten._softmax.default and len(p.args) > 2 and p.args[2]:
        return None
    if p.target == aten.softmax.int and _int_arg(p, 2, "dtype") not in (None, torch.float32):
        return None
    pv, lv = _tensor(p), _tensor(p.args[0])
    if pv is None or lv is None or pv.dim() != 2 or pv.dtype != torch.float32 or lv.dtype not in FLOATS:
        return None
    if not isinstance(dim, int) or dim % 2 != 1:
        return None
    return p.args[0]


def _topk_of(idx: Any) -> Optional[tuple[fx.Node, int]]:
    """(p, k) when ``idx`` is ``topk(p, k, -1).indices`` (largest; its values unused or absent)."""
    if not (is_call(idx, (operator.getitem,)) and idx.args[1] == 1 and is_call(idx.args[0], (aten.topk.default,))):
        return None
    tk = idx.args[0]
    p, k = tk.args[0], tk.args[1]
    dim = _int_arg(tk, 2, "dim", -1)
    largest = _int_arg(tk, 3, "largest", True)
    pv = _tensor(p)
    if pv is None or not isinstance(k, int) or not largest or not isinstance(dim, int) or dim % pv.dim() != 1:
        return None
    return p, k


# ----------------------------------------------------------------------------------------------------------------
# f: the fraction of tokens per expert
# ----------------------------------------------------------------------------------------------------------------

def _flat_indices_topk(n: Any) -> Optional[tuple[fx.Node, int]]:
    """``topk(p, k).indices.reshape(-1)`` -> (p, k)."""
    if not is_call(n, (aten.reshape.default, aten.view.default)) or list(n.args[1]) != [-1]:
        return None
    return _topk_of(n.args[0])


def _layer_count(n: Any, E: int) -> Optional[tuple[fx.Node, int, Optional[fx.Node]]]:
    """One layer's expert counts: ``histc(sel.flatten().to(f), E, 0, E)`` -> (p, k, None), or
    ``zeros(E).scatter_add_(0, sel.flatten(), m.repeat_interleave(k))`` -> (p, k, m)."""
    if is_call(n, (aten.histc.default,)):
        bins, lo, hi = _int_arg(n, 1, "bins", 100), _int_arg(n, 2, "min", 0), _int_arg(n, 3, "max", 0)
        if bins != E or lo != 0 or hi != E:
            return None
        parts = _flat_indices_topk(_strip_to(n.args[0]))
        return None if parts is None else (parts[0], parts[1], None)
    if is_call(n, (aten.scatter_add_.default, aten.scatter_add.default)):
        base, dim, index, src = n.args[:4]
        if not _is_zeros(base) or dim != 0 or list(_tensor(base).shape) != [E]:
            return None
        parts = _flat_indices_topk(index)
        if parts is None or not is_call(src, (aten.repeat_interleave.self_int,)) or src.args[1] != parts[1]:
            return None
        if len(src.args) > 2 or src.kwargs.get("dim") is not None:
            return None
        return parts[0], parts[1], src.args[0]
    return None


def _layer_prob_sum(n: Any) -> Optional[tuple[fx.Node, Optional[fx.Node]]]:
    """One layer's probability sums: ``p.float().sum(0)`` -> (p, None) or ``(p.float() * m.unsqueeze(-1)).sum(0)``
    -> (p, m)."""
    if not is_call(n, (aten.sum.dim_IntList,)) or not _is_dims(_int_arg(n, 1, "dim"), 0, 2):
        return None
    if _int_arg(n, 2, "keepdim", False) or n.kwargs.get("dtype") is not None:
        return None
    x = _strip_to(n.args[0])
    if _softmax_input(x) is not None:
        return x, None
    if is_call(x, (aten.mul.Tensor,)):
        for a, b in ((x.args[0], x.args[1]), (x.args[1], x.args[0])):
            p = _strip_to(a)
            if _softmax_input(p) is not None and is_call(b, (aten.unsqueeze.default,)) and b.args[1] in (-1, 1):
                return p, b.args[0]
    return None


def _divided(n: Any) -> Optional[tuple[Any, Any]]:
    """(numerator, denominator) of ``a / b``."""
    if is_call(n, _DIV) and not n.kwargs.get("rounding_mode"):
        return n.args[0], n.args[1]
    return None


def _rows_of(ps: list[fx.Node]) -> Any:
    return sum((_tensor(p).shape[0] for p in ps[1:]), _tensor(ps[0]).shape[0])


def _per_layer(F: Any, P: Any, E: int) -> Optional[tuple[list[fx.Node], int, Optional[fx.Node]]]:
    """transformers >= 5: (the layers' softmax nodes in P's order, k, the flat mask or None)."""
    fd, pd = _divided(F), _divided(P)
    if fd is None or pd is None:
        return None
    den = pd[1]
    if fd[1] is not den and not _same_number(_val(fd[1]), _val(den)):
        return None  # f and P divided by the same row count
    counts = [_layer_count(t, E) for t in _terms(fd[0])]
    probs = [_layer_prob_sum(t) for t in _terms(pd[0])]
    if not counts or None in counts or None in probs or len(counts) != len(probs):
        return None
    ks = {c[1] for c in counts}
    masks = {c[2] for c in counts} | {p[1] for p in probs}
    if len(ks) != 1 or len(masks) != 1:
        return None
    k, mask = ks.pop(), masks.pop()
    ps = [p[0] for p in probs]
    if len(set(ps)) != len(ps) or set(ps) != {c[0] for c in counts}:
        return None  # every layer counted once, the same softmax on both sides
    if mask is None:
        if not _same_number(_val(den), _rows_of(ps)):
            return None
    else:
        mv = _tensor(mask)
        if mv is None or mv.dim() != 1 or not all(_equal_sizes(mv.shape[0], _tensor(p).shape[0]) for p in ps):
            return None
        # Σ_l m.sum() (after a 0.0 start value)
        sums = _terms(den)
        if len(sums) != len(ps) or not all(is_call(s, (aten.sum.default,)) and s.args[0] is mask
                                           and not s.kwargs for s in sums):
            return None
    return ps, k, mask


def _broadcast_root(m: Any, trailing: int) -> Optional[tuple[fx.Node, list[Any]]]:
    """``m`` = ``R[None, :, :, None...].expand(L, B, S, ...).reshape(-1, ...)`` (dtype conversions allowed) where
    the last ``trailing`` expanded dims come from size 1: (R, the expand's leading sizes [L, B, S])."""
    m = _strip_to(m)
    if not is_call(m, (aten.reshape.default, aten.view.default)):
        return None
    ex = _strip_to(m.args[0])
    if not is_call(ex, (aten.expand.default,)):
        return None
    src = ex.args[0]
    sv = _tensor(src)
    if sv is None or sv.dim() != 3 + trailing or any(sv.shape[d] != 1 for d in range(3, 3 + trailing)):
        return None
    want = list(_tensor(m).shape)
    if len(want) != 1 + trailing or list(m.args[1])[0] != -1:
        return None
    # Back from the expand's input to the mask through unit dims and full slices only.
    r = src
    while True:
        if is_call(r, (aten.unsqueeze.default,)):
            r = r.args[0]
        elif is_call(r, (aten.slice.Tensor,)) and _int_arg(r, 2, "start", 0) in (0, None) and \
                _int_arg(r, 3, "end", None) in (None, _INT_MAX) and _int_arg(r, 4, "step", 1) == 1:
            r = r.args[0]
        else:
            break
    rv = _tensor(r)
    if rv is None or rv.dim() != 2 or not (sv.shape[0] == 1 and list(sv.shape[1:3]) == list(rv.shape)):
        return None
    return r, list(ex.args[1][:3])


def _concatenated(F: Any, P: Any, E: int) -> Optional[tuple[fx.Node, int, Optional[tuple[str, fx.Node]]]]:
    """Earlier transformers: (the softmax of the concatenated logits, k, the mask form or None)."""
    def one_hot_of(x: Any) -> Optional[tuple[fx.Node, int]]:
        x = _strip_to(x)
        if not is_call(x, (aten.one_hot.default,)) or _int_arg(x, 1, "num_classes", -1) != E:
            return None
        return _topk_of(x.args[0])

    if is_call(F, (aten.mean.dim,)) and is_call(P, (aten.mean.dim,)):
        if not (_is_dims(_int_arg(F, 1, "dim"), 0, 3) and _is_dims(_int_arg(P, 1, "dim"), 0, 2)):
            return None
        if _int_arg(F, 2, "keepdim", False) or _int_arg(P, 2, "keepdim", False):
            return None
        sel, p = one_hot_of(F.args[0]), _strip_to(P.args[0])
        if sel is None or sel[0] is not p or _softmax_input(p) is None:
            return None
        return p, sel[1], None
    fd, pd = _divided(F), _divided(P)
    if fd is None or pd is None:
        return None

    def masked_sum(num: Any, den: Any, rank: int) -> Optional[tuple[fx.Node, fx.Node]]:
        """``Σ_0 (x · M) / Σ_0 M`` -> (x, M)."""
        for s in (num, den):
            if not is_call(s, (aten.sum.dim_IntList,)) or not _is_dims(_int_arg(s, 1, "dim"), 0, rank) or \
                    _int_arg(s, 2, "keepdim", False):
                return None
        prod, M = num.args[0], den.args[0]
        if not is_call(prod, (aten.mul.Tensor,)):
            return None
        a, b = prod.args[0], prod.args[1]
        if b is M:
            return a, M
        if a is M:
            return b, M
        return None

    fm, pm = masked_sum(fd[0], fd[1], 3), masked_sum(pd[0], pd[1], 2)
    if fm is None or pm is None:
        return None
    sel, p = one_hot_of(fm[0]), _strip_to(pm[0])
    if sel is None or sel[0] is not p or _softmax_input(p) is None:
        return None
    r3, r2 = _broadcast_root(fm[1], 2), _broadcast_root(pm[1], 1)
    if r3 is None or r2 is None or r3[0] is not r2[0]:
        return None
    if not all(a is b or _same_number(_val(a), _val(b)) for a, b in zip(r3[1], r2[1])):
        return None
    if not _equal_sizes(_tensor(fm[1]).shape[0], _tensor(p).shape[0]):
        return None  # a mask of one row broadcast over every token: not the op's per-token mask
    return p, sel[1], ("broadcast", fm[1])


def _mutates(n: fx.Node) -> bool:
    schema = getattr(n.target, "_schema", None)
    return schema is not None and schema.is_mutable


def _matched_loss(name: str, match: Callable[[fx.Node], Any], n: fx.Node) -> Optional[tuple[Any, Any]]:
    """(``moe.<name>``, what ``match`` finds ending at ``n``), or None while the op is not registered, when an earlier
    raising erased ``n`` or when nothing matches."""
    op = _op(name)
    found = match(n) if op is not None and not getattr(n, "_erased", False) else None
    return None if found is None else (op, found)


def _replace_loss(graph: fx.Graph, n: fx.Node, loss: fx.Node) -> bool:
    """``n``'s uses read ``loss``; ``n`` and what only it used are erased. True (the raising happened)."""
    n.replace_all_uses_with(loss)
    _erase_replaced(graph, n)
    return True


def _erase_replaced(graph: fx.Graph, n: fx.Node) -> None:
    """Erases ``n`` (its uses already replaced) and what only it used. ``eliminate_dead_code`` keeps in-place ops:
    the per-layer loss's ``zeros(E).scatter_add_(...)`` would keep every layer's softmax and top-k alive. Other
    in-place ops are kept (they may update a tensor read elsewhere)."""
    work = [n]
    while work:
        cur = work.pop()
        if cur.op != "call_function" or cur.users or cur.graph is not graph:
            continue
        if _mutates(cur) and not (cur.target == aten.scatter_add_.default and _is_zeros(cur.args[0])
                                  and len(cur.args[0].users) == 1):
            continue
        inputs = cur.all_input_nodes
        graph.erase_node(cur)
        work.extend(inputs)


def _final_loss(n: fx.Node) -> Optional[tuple[Any, Any, int]]:
    """``Σ(f · P.unsqueeze(0)) · E`` -> (f, P, E)."""
    if not is_call(n, _MUL):
        return None
    s, E = n.args[0], n.args[1]
    if isinstance(s, int) and not isinstance(s, bool):
        s, E = E, s
    if not isinstance(E, int) or isinstance(E, bool) or E < 1:
        return None
    if not is_call(s, (aten.sum.default,)) or s.kwargs.get("dtype") is not None or len(s.args) != 1:
        return None
    prod = s.args[0]
    if not is_call(prod, (aten.mul.Tensor,)):
        return None
    for F, u in ((prod.args[0], prod.args[1]), (prod.args[1], prod.args[0])):
        if is_call(u, (aten.unsqueeze.default,)) and u.args[1] == 0:
            return F, u.args[0], E
    return None


def raise_load_balancing_loss(graph: fx.Graph, n: fx.Node) -> bool:
    """The balancing loss ending at ``n`` (see the module doc) -> ``moe.load_balancing_loss``."""
    matched = _matched_loss("load_balancing_loss", _final_loss, n)
    if matched is None:
        return False
    op, (F, P, E) = matched
    found = _per_layer(F, P, E)
    if found is not None:
        ps, k, mask = found
        logits = [_softmax_input(p) for p in ps]
        if any(_tensor(x).shape[1] != E for x in logits) or not 1 <= k <= E:
            return False
        with graph.inserting_before(n):
            x = logits[0] if len(logits) == 1 else new_node(graph, aten.cat.default, (logits, 0), like=n)
            m = None
            if mask is not None:
                m = mask if len(ps) == 1 else new_node(graph, aten.cat.default, ([mask] * len(ps), 0), like=n)
            loss = new_node(graph, op, (x, k, m), like=n)
    else:
        found = _concatenated(F, P, E)
        if found is None:
            return False
        p, k, form = found
        x = _softmax_input(p)
        if _tensor(x).shape[1] != E or not 1 <= k <= E:
            return False
        with graph.inserting_before(n):
            m = None
            if form is not None:  # M3 [T, k, E], constant over its last two dims: M3[:, 0, 0]
                m = new_node(graph, aten.select.int, (new_node(graph, aten.select.int, (form[1], 2, 0), like=n), 1, 0), like=n)
            loss = new_node(graph, op, (x, k, m), like=n)
    want = _tensor(n).dtype
    if want != torch.float32:
        with graph.inserting_before(n):
            loss = new_node(graph, aten._to_copy.default, (loss,), {"dtype": want}, like=n)
    return _replace_loss(graph, n, loss)


# ----------------------------------------------------------------------------------------------------------------
# The router z-loss
# ----------------------------------------------------------------------------------------------------------------

def _same_logsumexp(a: Any, b: Any) -> bool:
    """Two ``logsumexp`` nodes of the same input and dims (``lse(x) * lse(x)`` traces to two: no CSE yet)."""
    return is_call(a, (aten.logsumexp.default,)) and is_call(b, (aten.logsumexp.default,)) and a.args == b.args \
        and a.kwargs == b.kwargs


def _squared(n: Any) -> Optional[fx.Node]:
    """x for ``x ** 2`` / ``x * x`` / ``square(x)``."""
    if is_call(n, (aten.pow.Tensor_Scalar,)) and n.args[1] == 2:
        return n.args[0]
    if is_call(n, (aten.mul.Tensor,)) and (n.args[0] is n.args[1] or _same_logsumexp(n.args[0], n.args[1])):
        return n.args[0]
    if is_call(n, (aten.square.default,)):
        return n.args[0]
    return None


def _z_loss_input(n: fx.Node) -> Optional[fx.Node]:
    """The logits of ``mean(logsumexp(x, -1) ** 2)`` or ``sum(logsumexp(x, -1) ** 2) / rows`` ending at ``n``."""
    if is_call(n, (aten.mean.default,)) and len(n.args) == 1 and not n.kwargs:
        sq = n.args[0]
    elif is_call(n, (aten.mean.dim,)) and _int_arg(n, 1, "dim") in (None, []) and not _int_arg(n, 2, "keepdim"):
        sq = n.args[0]
    else:
        d = _divided(n)
        if d is None or not is_call(d[0], (aten.sum.default,)) or len(d[0].args) != 1 or d[0].kwargs:
            return None
        sq = d[0].args[0]
        sv = _tensor(sq)
        rows = 1
        for s in (sv.shape if sv is not None else ()):
            rows = rows * s
        if sv is None or not _same_number(_val(d[1]), rows):
            return None
    lse = _squared(sq)
    if not is_call(lse, (aten.logsumexp.default,)):
        return None
    dims, keep = _int_arg(lse, 1, "dim"), _int_arg(lse, 2, "keepdim", False)
    x = lse.args[0]
    xv = _tensor(x)
    if xv is None or xv.dtype not in FLOATS or xv.dim() < 1 or keep or not _is_dims(dims, xv.dim() - 1, xv.dim()):
        return None
    if xv.dtype != torch.float32:
        return None  # logsumexp in a narrower type than the op's f32
    return x


def raise_router_z_loss(graph: fx.Graph, n: fx.Node) -> bool:
    """``mean(logsumexp(x, -1)²)`` (ST-MoE's z-loss; transformers' ``router_z_loss_func``) -> ``moe.router_z_loss``."""
    matched = _matched_loss("router_z_loss", _z_loss_input, n)
    if matched is None:
        return False
    op, x = matched
    with graph.inserting_before(n):
        xv = _tensor(x)
        if xv.dim() != 2:  # [G, S, E] -> [G·S, E] (flatten: no size in the graph, E may be symbolic)
            x = new_node(graph, aten.flatten.using_ints, (x, 0, -2), like=n) if xv.dim() > 2 else \
                new_node(graph, aten.unsqueeze.default, (x, 0), like=n)
        loss = new_node(graph, op, (x,), like=n)
    return _replace_loss(graph, n, loss)
