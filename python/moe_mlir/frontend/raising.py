"""Raising: rewrite the routing idioms of plain PyTorch models into ``torch.ops.moe.*`` on the FX graph.

Runs on aten-level FX graphs: the exported (and decomposed) graph before printing, so a model that never mentions
our custom ops still compiles to the ``moe`` dialect (and so to its fused kernels), and the pre-dispatch aten graph
of each Dynamo graph in ``torch.compile(backend="moe")`` (:mod:`moe_mlir.backends.dynamo`) before inductor. Shapes
may be symbolic (SymInt token counts).

The routers themselves (every top-k that chooses experts: softmax / sigmoid / custom scores, biases, groups,
renormalization, scaling, in any spelling) are raised by meaning, :mod:`.routing_region`: the region around each
top-k is checked equal to a canonical ``moe.topk_renorm`` or ``moe.route`` on random and adversarial inputs before
it is replaced, and a top-k left in the graph says why. This module runs that pass among the rewrites that are
not a top-k's region:

=====================================================  ===========================================================
idiom (FX, after export)                                 becomes
=====================================================  ===========================================================
a routing region at a top-k (:mod:`.routing_region`)     ``moe.topk_renorm`` / ``moe.route``
``softmax(U·Uᵀ/τ, -1) · E`` (``matmul``/``bmm``)           ``moe.similarity_inform(U, E, tau=τ)``
``sigmoid(full(-inf).scatter(topk(x, k)))``               ``zeros.scatter(moe.route(x, k, sigmoid,
(Llama-4's dense gate)                                    topk_then_score))``
a softmax gathered at given experts, renormalized         ``moe.route(..., replay=idx)`` (:mod:`.raising_replay`)
(hash routing: ``tid2eid[input_ids]``)
transformers' ``load_balancing_loss_func`` (both forms,   ``moe.load_balancing_loss(cat(logits), k, mask)``
with and without ``attention_mask``)                      (:mod:`.raising_losses`)
``mean(logsumexp(x, -1) ** 2)`` (ST-MoE's z-loss)          ``moe.router_z_loss(x)`` (:mod:`.raising_losses`)
=====================================================  ===========================================================

transformers' grouped GEMM fallback becomes ``moe_mlir::grouped_mm_ends`` (``experts_gemm``) and, in a graph where
it did, the experts' combine ``weighted_out[inv_perm].view(T, k, H).sum(1)`` is unrolled into k adds (not an op:
inductor compiles the gather-and-reduce form ~15x slower than the adds). Both rewrites are transformers'
code, not routing: :mod:`.hf_rewrites`.

On degenerate rows the dialect's rules apply instead of torch's: ties select the lowest index (torch leaves it
unspecified), a fully ``-inf`` logit row gives zero weights instead of NaN, and in probs mode a zero sum gives zero
weights instead of NaN. Index results are converted back to the graph's integer dtype and weights to its float
dtype, so the rest of the graph is unchanged.
"""

from __future__ import annotations

import operator
from typing import Callable, Optional

import torch
import torch.fx as fx

from .. import ops as _ops  # noqa: F401
from .fx_match import is_call, new_node, tensor_val
from .fx_scores import _MATMUL, _TO_COPY, _erase_unused, _last_dim, _softmax_dim, _topk_parts
from .hf_rewrites import raise_hf_grouped_mm, unroll_gathered_sum
from .raising_losses import raise_load_balancing_loss, raise_router_z_loss
from .raising_replay import raise_replayed_choice
from .routing_region import raise_by_meaning, report_misses

aten = torch.ops.aten
moe = torch.ops.moe

__all__ = ["raise_routing_idioms"]

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

def _raise_topk_sigmoid_dense(graph: fx.Graph, tk: fx.Node) -> bool:
    """Llama-4: ``sigmoid(full_like(x, -inf).scatter(1, topk(x, k).indices, topk(x, k).values))`` (the dense [T, E]
    gate, 0 off the selection) -> ``zeros.scatter(1, idx, moe.route(x, k, sigmoid, topk_then_score).weights)``."""
    parts = _topk_parts(tk)
    if parts is None or parts.values is None or parts.indices is None:
        return False
    if any(u.target is not operator.getitem for u in tk.users):
        return False
    x, k, vals, idxs = parts.x, parts.k, parts.values, parts.indices
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
        _rewrite_each(graph, _raise_topk_sigmoid_dense))
    counts["route"] += _rewrite_each(graph, raise_replayed_choice)
    graph.eliminate_dead_code()
    counts["topk_renorm"] = by_meaning["topk_renorm"]
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
