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
``s = sigmoid(x)``; ``topk(mask(s + b), k)`` ->           ``moe.route(x, b, k, sigmoid, n_group, topk_group,
``gather(s)`` [``/ (sum + eps)``] [``* f``]               group_score, renormalize, f)`` (DeepSeek-V3/R1, Kimi-K2,
(``mask``: HF's group mask, optional; softmax too;        GLM-4.5, DeepSeek-V2 in HF's form; DeepSeek-V4's
an elementwise ``s = f(x)``: a custom score region;       sqrtsoftplus as ``scoring="custom:<region>"``; Zaya's
``x`` may be ``[..., T, E]``, routed as ``[-1, E]``)      ``[B, T, E + 1]`` with its skip expert)
``sigmoid(full(-inf).scatter(topk(x, k)))``               ``zeros.scatter(moe.route(x, k, sigmoid,
(Llama-4's dense gate)                                    topk_then_score))``
transformers' ``load_balancing_loss_func`` (both forms,   ``moe.load_balancing_loss(cat(logits), k, mask)``
with and without ``attention_mask``)                      (:mod:`.raising_losses`)
``mean(logsumexp(x, -1) ** 2)`` (ST-MoE's z-loss)          ``moe.router_z_loss(x)`` (:mod:`.raising_losses`)
=====================================================  ===========================================================

transformers' grouped GEMM fallback becomes ``moe_mlir::grouped_mm_ends`` (``experts_gemm``) and, in a graph where
it did, the experts' combine ``weighted_out[inv_perm].view(T, k, H).sum(1)`` is unrolled into k adds (not an op:
inductor compiles the gather-and-reduce form ~15x slower than the adds). Both rewrites are transformers'
code, not routing: :mod:`.hf_rewrites`.

The group mask is recognised from the ops it is built of (a view of the choice scores as ``[T, G, E/G]``, its top-2
sum or max, the ``topk_group`` best groups scattered into a mask, expanded back to ``[T, E]``, inverted): it must be a
function of the choice scores alone. The ``eps`` of HF's ``w / (w.sum() + 1e-20)`` is dropped (at most 1e-12: in
f32 it changes no sum above ~1e-13).

Each rewrite is exact for finite inputs (Mutual-Inform App. A.3 proves the first and third equal) with these
differences on degenerate rows, where the dialect's rules apply instead of torch's: ties select the lowest index
(torch leaves it unspecified), a fully ``-inf`` logit row gives zero weights instead of NaN, and in probs mode a
zero sum gives zero weights instead of NaN. Index results are converted back to int64 and weights to the original
dtype, so the rest of the graph is unchanged.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Optional

import torch
import torch.fx as fx

from .. import ops as _ops  # noqa: F401
from .fx_match import FLOATS, VIEWS, is_call, new_node, tensor_val, through_views
from .hf_rewrites import raise_hf_grouped_mm, unroll_gathered_sum
from .raising_losses import raise_load_balancing_loss, raise_router_z_loss
from .routing_region import raise_by_meaning, report_misses

aten = torch.ops.aten
moe = torch.ops.moe

__all__ = ["raise_routing_idioms"]

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
    if x.meta["val"].dtype not in FLOATS or not isinstance(k, int):
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
        tr = new_node(graph, moe.topk_renorm.default, (x, k, mode, renorm), like=anchor)
        w = new_node(graph, operator.getitem, (tr, 0), like=anchor)
        i = new_node(graph, operator.getitem, (tr, 1), like=anchor)
        if weights_user is not None:
            want = weights_user.meta["val"].dtype
            if want != torch.float32:
                w = new_node(graph, aten._to_copy.default, (w,), {"dtype": want}, like=anchor)
            weights_user.replace_all_uses_with(w)
        if idx_user is not None:
            i64 = new_node(graph, aten._to_copy.default, (i,), {"dtype": idx_user.meta["val"].dtype}, like=anchor)
            idx_user.replace_all_uses_with(i64)


def _raise_topk(graph: fx.Graph, tk: fx.Node) -> bool:
    """The ``topk_renorm`` idioms of the table above at the top-k ``tk``."""
    parts = _topk_parts(tk)
    if parts is None:
        return False
    x, k, vals, idxs = parts
    sm_dim = _softmax_dim(x)
    if vals is None:
        return False
    div = _renorm_div(vals)
    s = div.args[1] if div is not None else None
    # softmax -> topk [-> renormalize]
    if sm_dim is not None and _last_dim(x, sm_dim):
        logits = x.args[0]
        if logits.meta["val"].dtype not in FLOATS:
            return False
        if div is not None:
            _emit_topk_renorm(graph, tk, logits, k, "logits", True, div, idxs)
        else:
            _emit_topk_renorm(graph, tk, logits, k, "logits", False, vals, idxs)
        _erase_dead(graph, [div, s, vals, idxs, tk, x])
        return True
    # topk -> softmax(values)
    users = list(vals.users)
    if len(users) == 1 and _softmax_dim(users[0]) is not None and _last_dim(vals, _softmax_dim(users[0])):
        _emit_topk_renorm(graph, tk, x, k, "logits", True, users[0], idxs)
        _erase_dead(graph, [users[0], vals, idxs, tk])
        return True
    # topk(p) -> renormalize
    if div is not None:
        _emit_topk_renorm(graph, tk, x, k, "probs", True, div, idxs)
        _erase_dead(graph, [div, s, vals, idxs, tk])
        return True
    # topk(softmax(l) · A), the values used raw
    if _is_probability_mix(x):
        _emit_topk_renorm(graph, tk, x, k, "probs", False, vals, idxs)
        _erase_dead(graph, [vals, idxs, tk])
        return True
    return False


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


def _raise_similarity(graph: fx.Graph, mm: fx.Node) -> bool:
    """``softmax(U·Uᵀ/τ, -1) · E`` at the product ``mm`` -> ``moe.similarity_inform``."""
    parts = _similarity_parts(mm)
    if parts is None:
        return False
    u, e, tau = parts
    with graph.inserting_before(mm):
        if u.meta["val"].dim() == 2:  # one sequence: [N, D] -> [1, N, D]
            u3 = new_node(graph, aten.unsqueeze.default, (u, 0), like=mm)
            e3 = new_node(graph, aten.unsqueeze.default, (e, 0), like=mm)
        else:
            u3, e3 = u, e
        p = new_node(graph, moe.similarity_inform.default, (u3, e3, None, None, tau, False), like=mm)
        if u.meta["val"].dim() == 2:
            p = new_node(graph, aten.squeeze.dims, (p, [0]), like=mm)
        want = mm.meta["val"].dtype
        if want != torch.float32:
            p = new_node(graph, aten._to_copy.default, (p,), {"dtype": want}, like=mm)
    mm.replace_all_uses_with(p)
    return True


# ----------------------------------------------------------------------------------------------------------------
# Production routers -> moe.route (DeepSeek-V3 / Kimi-K2 / GLM-4.5 style sigmoid + bias + groups; Llama-4)
# ----------------------------------------------------------------------------------------------------------------

_MASKED_FILL = (aten.masked_fill.Scalar, aten.masked_fill_.Scalar)
_TO_COPY = (aten._to_copy.default, aten.to.dtype)
#: Ops a group mask may be built from (DeepseekV3TopkRouter: view -> topk(2) -> sum -> topk(topk_group) ->
#: zeros_like -> scatter_ -> unsqueeze -> expand -> reshape -> bool -> ~; DeepSeek-V2: max instead of topk(2)+sum).
_MASK_OPS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.topk.default, operator.getitem,
             aten.sum.dim_IntList, aten.max.dim, aten.amax.default, aten.zeros_like.default, aten.new_zeros.default,
             aten.scatter.value, aten.scatter_.value, aten.unsqueeze.default, aten.expand.default,
             aten.clone.default, aten._to_copy.default, aten.to.dtype, aten.bitwise_not.default, aten.logical_not.default,
             aten.eq.Scalar, aten.contiguous.default, aten.alias.default}
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


def _ancestors_until(n: fx.Node, stop: fx.Node, limit: int = 64) -> Optional[list[fx.Node]]:
    """The nodes ``n`` is computed from, up to ``stop`` (excluded), when every one is a call of ``_MASK_OPS``
    (so the result is a function of ``stop`` alone); None otherwise."""
    seen: dict[fx.Node, None] = {}
    work = [n]
    while work:
        cur = work.pop()
        if cur is stop or cur in seen:
            continue
        if not is_call(cur, _MASK_OPS) or len(seen) >= limit:
            return None
        seen[cur] = None
        work.extend(a for a in cur.all_input_nodes)
        # An in-place update of a node the mask reads (``group_mask.scatter_(...)`` when later uses still name
        # ``group_mask``) is part of its computation.
        work.extend(u for u in cur.users if is_call(u, (aten.scatter_.value, aten.scatter_.src)) and u.args[0] is cur)
    return list(seen)


def _group_spec(mask: fx.Node, c: fx.Node, num_experts: int) -> Optional[tuple[int, int, str]]:
    """(n_group, topk_group, group_score) when ``mask`` (True = excluded) is DeepSeek's group mask of ``c``."""
    nodes = _ancestors_until(mask, c)
    if nodes is None:
        return None
    topks = [n for n in nodes if n.target == aten.topk.default]
    if not any(n.target in (aten.scatter.value, aten.scatter_.value) for n in nodes):
        return None
    # The group scores: topk(c viewed [T, G, E/G], 2) summed, or its max.
    grouped = [n for n in nodes if n.target in (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
               and n.args[0] is c]
    if len(grouped) != 1 or tensor_val(grouped[0]) is None or tensor_val(grouped[0]).dim() != 3:
        return None
    g = grouped[0]
    n_group = int(tensor_val(g).shape[1])
    if n_group < 1 or num_experts % n_group or int(tensor_val(g).shape[2]) != num_experts // n_group:
        return None
    users = list(g.users)
    if len(users) != 1:
        return None
    u = users[0]
    if u.target == aten.topk.default and u.args[1] == 2:
        group_score = "top2_sum"
    elif u.target in (aten.max.dim, aten.amax.default) or (u.target == aten.topk.default and u.args[1] == 1):
        group_score = "max"
    else:
        return None
    select = [t for t in topks if t is not u]
    if len(select) != 1 or not isinstance(select[0].args[1], int):
        return None
    topk_group = int(select[0].args[1])
    if not 1 <= topk_group <= n_group:
        return None
    return n_group, topk_group, group_score


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


def _grad_mode_at(graph: fx.Graph, node: fx.Node) -> Optional[bool]:
    """The grad mode a pre-dispatch graph runs ``node`` in: the last ``_set_grad_enabled`` before it (None: the
    mode the graph is called in)."""
    mode = None
    for n in graph.nodes:
        if n is node:
            return mode
        if n.op == "call_function" and n.target is torch._C._set_grad_enabled:
            mode = bool(n.args[0])
    return mode


def _route_anchor(graph: fx.Graph, gather: fx.Node, idxs: fx.Node) -> Optional[fx.Node]:
    """Where the raised route goes: before the gather of the weights or the first other use of the indices,
    whichever comes first, and only where that runs in the gather's grad mode. The top-k itself may run under
    ``torch.no_grad()`` (LongCat-Flash's ``get_topk_indices``): a route op placed there would return weights
    without a gradient."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    anchor = min([gather] + list(idxs.users), key=lambda n: position[n])
    return anchor if _grad_mode_at(graph, anchor) == _grad_mode_at(graph, gather) else None


def _emit_route(graph: fx.Graph, anchor: fx.Node, args: tuple, weights_user: Optional[fx.Node],
                idx_users: list[fx.Node]) -> tuple[fx.Node, fx.Node]:
    """``moe.route(*args)`` before ``anchor``, its weights and indices taking the place of ``weights_user`` and
    ``idx_users``. Logits ``[..., T, E]`` (``args[0]``, rank > 2) are routed as ``[-1, E]`` rows and the results
    viewed back as ``[..., T, k]``."""
    logits, k = args[0], args[2]
    lv = tensor_val(logits)
    with graph.inserting_before(anchor):
        lead = None
        if lv.dim() > 2:
            lead = [d if isinstance(d, int) else new_node(graph, aten.sym_size.int, (logits, j), like=anchor)
                    for j, d in enumerate(lv.shape[:-1])]
            flat = new_node(graph, aten.reshape.default, (logits, [-1, lv.shape[-1]]), like=anchor)
            args = (flat,) + tuple(args[1:])
        r = new_node(graph, moe.route.default, args, like=anchor)
        w = new_node(graph, operator.getitem, (r, 0), like=anchor)
        i = new_node(graph, operator.getitem, (r, 1), like=anchor)
        if lead is not None:
            w = new_node(graph, aten.view.default, (w, lead + [k]), like=anchor)
            i = new_node(graph, aten.view.default, (i, lead + [k]), like=anchor)
        if weights_user is not None:
            want = weights_user.meta["val"].dtype
            wv = w if want == torch.float32 else new_node(graph, aten._to_copy.default, (w,), {"dtype": want}, like=anchor)
            weights_user.replace_all_uses_with(wv)
        for u in idx_users:
            i64 = new_node(graph, aten._to_copy.default, (i,), {"dtype": u.meta["val"].dtype}, like=anchor)
            u.replace_all_uses_with(i64)
    return w, i


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


def _same_rows(n: Any, s: fx.Node) -> bool:
    """``n`` is ``s`` or a view of it with the same [T, E] shape (LongCat's ``scores.view(-1, E)``), through ops
    that keep its values (:func:`_same_values`)."""
    n = _same_values(n)
    while n is not s and is_call(n, VIEWS):
        vn, vs = tensor_val(n), tensor_val(s)
        if vn is None or vs is None or tuple(vn.shape) != tuple(vs.shape):
            return False
        n = n.args[0]
    return n is s


def _as_vector(b: fx.Node) -> fx.Node:
    """The 1-D tensor behind ``b.unsqueeze(0)`` or ``b.view(1, E)`` (a bias broadcast over the tokens), else
    ``b``."""
    inner = b.args[0] if is_call(b, (aten.unsqueeze.default,) + VIEWS) else None
    if inner is not None and tensor_val(inner) is not None and tensor_val(inner).dim() == 1 and tensor_val(b) is not None \
            and tuple(tensor_val(b).shape) == (1, tensor_val(inner).shape[0]):
        return inner
    return b


def _gathered_topk(tk: fx.Node) -> Optional[tuple[fx.Node, int, fx.Node, fx.Node, fx.Node]]:
    """(choice scores, k, indices, gather, the gathered tensor) of a last-dim top-k whose values are unused and
    whose indices feed one last-dim ``gather``: the weights are gathered from scores other than the ones chosen
    on."""
    parts = _topk_parts(tk)
    if parts is None or parts[3] is None:
        return None
    c, k, vals, idxs = parts
    if vals is not None and vals.users:
        return None
    gathers = [u for u in idxs.users if is_call(u, (aten.gather.default,)) and u.args[2] is idxs]
    if len(gathers) != 1 or not _last_dim(gathers[0], gathers[0].args[1]):
        return None
    return c, k, idxs, gathers[0], gathers[0].args[0]


def _choice_bias(c: fx.Node, x: fx.Node) -> tuple[bool, Optional[fx.Node]]:
    """(matched, bias) for choice scores ``c`` over ``x`` [T, E]: ``x`` itself (no bias), or ``x`` (or a same-shape
    view of it) plus a float ``[E]`` bias (or its ``[1, E]`` view); either through ops that keep the values
    (:func:`_same_values`)."""
    if _same_values(c) is x:
        return True, None
    if not (is_call(c, (aten.add.Tensor,)) and _same_rows(c.args[0], x) and isinstance(c.args[1], fx.Node)
            and not c.kwargs and (len(c.args) < 3 or c.args[2] == 1)):
        return False, None
    bias = _as_vector(c.args[1])
    bv, xv = tensor_val(bias), tensor_val(x)
    if bv is None or xv is None or bv.dim() != 1 or bv.shape[0] != xv.shape[-1] or bv.dtype not in FLOATS:
        return False, None
    return True, bias


def _raise_scored_topk(graph: fx.Graph, tk: fx.Node) -> bool:
    """``gather(score(x), topk([masked_fill](score(x) [+ bias], group mask, -inf), k).indices)`` [renormalized]
    [scaled] -> ``moe.route`` (DeepSeek-V3/R1, Kimi-K2, GLM-4.5, DeepSeek-V2 gates in HF's form; LongCat-Flash's
    choice on a same-shape view of the scores plus a ``[1, E]`` bias; Zaya's ``[B, T, E + 1]`` softmax, chosen on
    its detached copy plus a bias, its skip expert E masked by the code after the top-k, which stays)."""
    if (found := _gathered_topk(tk)) is None:
        return False
    c2, k, idxs, gather, s = found
    scored = _scoring_of(s, batched=True)
    if scored is None:
        return False
    scoring, logits = scored
    score_chain = _score_chain(s)[1] if scoring.startswith("custom:") else []
    num_experts = int(tensor_val(logits).shape[-1])
    c, mask = c2, None
    if is_call(c2, _MASKED_FILL):
        c, mask = c2.args[0], c2.args[1]
        # The excluded groups filled with -inf (the op's rule), or with 0.0 where no bias enters the choice
        # (Mistral-4's softmax groups): scores are then >= 0, so a 0.0 only ties with a kept score of exactly 0,
        # whose weight is 0 whichever expert the tie names. With a bias (AXK2), a kept choice score can be
        # negative and rank after the excluded zeros: not the op's rule, left alone.
        if c2.args[2] != float("-inf") and not (c2.args[2] == 0.0 and c is s):
            return False
    matched, bias = _choice_bias(c, s)
    if not matched:
        return False
    n_group, topk_group, group_score = 1, 1, "top2_sum"
    if mask is not None:
        if tensor_val(logits).dim() != 2:
            return False  # the group masks transformers builds are of [T, E] scores
        spec = _group_spec(mask, c, num_experts)
        if spec is None:
            return False
        n_group, topk_group, group_score = spec
        if n_group == 1:
            topk_group = 1
        if k > topk_group * (num_experts // n_group):
            return False
    anchor = _route_anchor(graph, gather, idxs)
    if anchor is None:
        return False
    out, renorm, scale, chain = _weights_chain(gather)
    dead = chain + [gather, idxs, tk, c2, c, s] + score_chain
    if mask is not None:
        dead += _ancestors_until(mask, c) or []
    _emit_route(graph, anchor, (logits, bias, k, scoring, "score_then_topk", n_group, topk_group, group_score,
                            renorm, scale), out, [idxs])
    _erase_unused(graph, dead)
    return True


def _raise_topk_then_sigmoid(graph: fx.Graph, tk: fx.Node) -> bool:
    """``sigmoid(gather(x, topk(x [+ bias], k).indices))`` [renormalized] [scaled] -> ``moe.route`` with
    ``order(topk_then_score)``: the experts chosen on the raw (biased) logits, each selected logit scored alone
    (Kolibri-1's router; the bias only chooses)."""
    if (found := _gathered_topk(tk)) is None:
        return False
    c, k, idxs, gather, x = found
    xv = tensor_val(x)
    if xv is None or xv.dim() != 2 or xv.dtype != torch.float32:
        return False
    matched, bias = _choice_bias(c, x)
    if not matched:
        return False
    users = list(gather.users)
    if len(users) != 1 or not is_call(users[0], (aten.sigmoid.default,)):
        return False
    sig = users[0]
    anchor = _route_anchor(graph, gather, idxs)
    if anchor is None:
        return False
    out, renorm, scale, chain = _weights_chain(sig)
    _emit_route(graph, anchor, (x, bias, k, "sigmoid", "topk_then_score", 1, 1, "top2_sum", renorm, scale), out,
                [idxs])
    _erase_unused(graph, chain + [sig, gather, idxs, tk, c])
    return True


def _raise_topk_sigmoid_dense(graph: fx.Graph, tk: fx.Node) -> bool:
    """Llama-4: ``sigmoid(full_like(x, -inf).scatter(1, topk(x, k).indices, topk(x, k).values))`` (the dense [T, E]
    gate, 0 off the selection) -> ``zeros.scatter(1, idx, moe.route(x, k, sigmoid, topk_then_score).weights)``."""
    parts = _topk_parts(tk)
    if parts is None or parts[2] is None or parts[3] is None:
        return False
    x, k, vals, idxs = parts
    xv = tensor_val(x)
    if xv is None or xv.dim() != 2:
        return False
    sc = [u for u in vals.users]
    if len(sc) != 1 or not is_call(sc[0], (aten.scatter.src, aten.scatter_.src)):
        return False
    scat = sc[0]
    full, dim, index, src = scat.args[:4]
    if index is not idxs or src is not vals or not _last_dim(scat, dim):
        return False
    if not (is_call(full, (aten.full_like.default,)) and full.args[0] is x and full.args[1] == float("-inf")):
        return False
    # Optional upcast, the sigmoid, optional cast back.
    node = scat
    users = list(node.users)
    if len(users) == 1 and is_call(users[0], _TO_COPY) and tensor_val(users[0]).dtype == torch.float32:
        node = users[0]
        users = list(node.users)
    if len(users) != 1 or not is_call(users[0], (aten.sigmoid.default,)):
        return False
    sig = users[0]
    out = sig
    users = list(sig.users)
    if len(users) == 1 and is_call(users[0], _TO_COPY) and set(users[0].kwargs) <= {"dtype"}:
        out = users[0]
    other_idx_users = [u for u in idxs.users if u is not scat]
    with graph.inserting_before(tk):
        r = new_node(graph, moe.route.default, (x, None, k, "sigmoid", "topk_then_score", 1, 1, "top2_sum", False,
                                            1.0), like=tk)
        w = new_node(graph, operator.getitem, (r, 0), like=tk)
        i = new_node(graph, operator.getitem, (r, 1), like=tk)
        i64 = new_node(graph, aten._to_copy.default, (i,), {"dtype": torch.int64}, like=tk)
        z = new_node(graph, aten.zeros_like.default, (x,), {"dtype": torch.float32}, like=tk)
        dense = new_node(graph, aten.scatter.src, (z, dim, i64, w), like=tk)
        want = tensor_val(out).dtype
        if want != torch.float32:
            dense = new_node(graph, aten._to_copy.default, (dense,), {"dtype": want}, like=tk)
    out.replace_all_uses_with(dense)
    for u in other_idx_users:
        u.replace_input_with(idxs, i64)
    _erase_unused(graph, [out, sig, node, scat, full, vals, idxs, tk])
    return True


def _rewrite_each(graph: fx.Graph, rewrite: Callable[[fx.Graph, fx.Node], bool]) -> int:
    """Tries ``rewrite(graph, node)`` (True when it matched and rewrote) at every node the graph had before it
    started, in order; returns how many it rewrote. Each ``_raise_*`` above is one such pattern."""
    return sum(1 for node in list(graph.nodes) if rewrite(graph, node))


def raise_routing_idioms(gm: fx.GraphModule, misses: Optional[list[str]] = None) -> dict[str, int]:
    """Rewrites the idioms in place; returns how many of each were raised. ``misses`` receives one line for each
    top-k left in the graph, saying why it was not raised (also logged: :mod:`.routing_region`)."""
    graph = gm.graph
    # The losses first: their softmax -> top-k chains must not be taken for routers.
    counts = {"load_balancing_loss": _rewrite_each(graph, raise_load_balancing_loss),
              "router_z_loss": _rewrite_each(graph, raise_router_z_loss)}
    graph.eliminate_dead_code()
    counts["similarity_inform"] = _rewrite_each(graph, _raise_similarity)
    graph.eliminate_dead_code()
    by_meaning, why = raise_by_meaning(gm)
    graph.eliminate_dead_code()
    counts["route"] = by_meaning["route"] + (
        _rewrite_each(graph, _raise_scored_topk) + _rewrite_each(graph, _raise_topk_sigmoid_dense)
        + _rewrite_each(graph, _raise_topk_then_sigmoid))
    graph.eliminate_dead_code()
    counts["topk_renorm"] = by_meaning["topk_renorm"] + _rewrite_each(graph, _raise_topk)
    graph.eliminate_dead_code()
    counts["experts_gemm"] = _rewrite_each(graph, raise_hf_grouped_mm)
    if counts["experts_gemm"]:  # the experts' combine, where their GEMMs were raised (not an idiom of its own)
        _rewrite_each(graph, unroll_gathered_sum)
    lines = report_misses(graph, why)
    if misses is not None:
        misses.extend(lines)
    graph.lint()
    gm.recompile()
    return counts
