"""Raising a choice made elsewhere: the weights of given experts -> ``moe.route(..., replay=idx)``.

A hash router (DeepSeek-V4's hash layers: ``idx = tid2eid[input_ids]``, a frozen token-to-experts table) and routing
replay (the experts an inference engine recorded) weigh experts that no top-k over the logits chose::

    scores = logits.softmax(-1)            # or F.softmax(logits, -1, dtype=torch.float), sigmoid, sqrt(softplus(.))
    idx = table[input_ids]                 # [T, k] integers, any spelling, not computed from the logits
    w = scores.gather(1, idx)              # [T, k]
    w = w / w.sum(-1, keepdim=True)        # (+ eps <= 1e-12), in place or not
    w = w * routed_scaling_factor          # optional, > 0

becomes ``moe.route(logits, None, k, scoring, "score_then_topk", 1, 1, "top2_sum", True, scale, replay=idx)``, whose
weights take the place of ``w`` (cast back to its dtype). The renormalised softmax is what makes this pay: its
normaliser cancels, so the kernel reads the row's max and weighs the k given logits (k exponentials a token, where the
softmax takes E: RouteSpec::weighsPickedTerms); an elementwise score (sigmoid, a custom region) is computed at the k
given experts only.

The match is exact, one op at a time (:func:`raise_replayed_choice`): the scores are a last-dim softmax or an
elementwise function of ``[T, E]`` logits (``fx_scores._scoring_of``: f32 logits; a softmax with ``dtype=torch.float``
of f16/bf16 logits is the op's own upcast); the gather is on the last dim of the scores, with ``sparse_grad`` off,
of ``[T, k]`` integer indices whose computation does not read the logits (a choice made from them is a top-k region,
:mod:`.routing_region`'s); the weights are renormalised over the same last dim and at most scaled by a positive
number (``fx_scores._weights_chain``). The raised form equals the eager one wherever eager is finite: the op's rules
(MoERoutingOps.td) hold on degenerate rows, where eager divides 0 by 0 (every given expert's score 0, a row of
``-inf``: zero weights instead of NaN); an index outside ``[0, E)`` is an error in both (ValueError here,
RuntimeError from the gather). Gathers of scores that are not renormalised stay inductor's (not measured: a
softmax's weights would then need its normaliser, the whole row's exponentials).
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import torch
import torch.fx as fx

from .fx_match import FLOATS, is_call, new_node, tensor_val
from .fx_scores import _erase_unused, _last_dim, _score_chain, _scoring_of, _weights_chain

aten = torch.ops.aten
moe = torch.ops.moe

__all__ = ["raise_replayed_choice"]

_INTS = (torch.int64, torch.int32)


def _static_int(d: Any) -> Optional[int]:
    """``d`` as an int: a SymInt with a hint is specialized (a guard Dynamo installs with the graph: the kernels are
    built per k); None when it has none."""
    if isinstance(d, torch.SymInt):
        v = d.node.maybe_as_int()
        if v is not None:
            return int(v)
        if not d.node.has_hint():
            return None
        from torch.fx.experimental.symbolic_shapes import guard_int

        return guard_int(d)
    return int(d)


def _softmax_upcast(s: fx.Node) -> Optional[tuple[str, fx.Node]]:
    """("softmax", logits) for ``F.softmax(logits, -1, dtype=torch.float)`` of f16/bf16 logits ``[T, E]``: the op
    reads them in f32 as that softmax does."""
    if not is_call(s, (aten.softmax.int,)) or len(s.args) < 3 or s.args[2] is not torch.float32:
        return None
    x = s.args[0]
    xv = tensor_val(x)
    if xv is None or xv.dim() != 2 or xv.dtype not in FLOATS or not _last_dim(s, s.args[1]):
        return None
    return "softmax", x


def _reads(n: fx.Node, target: fx.Node) -> bool:
    """Whether computing ``n`` reads ``target`` (an ancestor in the graph)."""
    seen: set[fx.Node] = set()
    work = [n]
    while work:
        cur = work.pop()
        if cur is target:
            return True
        if cur in seen:
            continue
        seen.add(cur)
        work.extend(cur.all_input_nodes)
    return False


def _given_choice(gather: fx.Node, logits: fx.Node) -> Optional[tuple[fx.Node, int]]:
    """(indices, k) when ``gather`` reads ``[T, k]`` integer indices, ``k`` <= E, on the last dim of ``[T, E]`` scores,
    computed without reading the logits."""
    if len(gather.args) > 3 and gather.args[3] or gather.kwargs.get("sparse_grad", False):
        return None
    s, dim, idx = gather.args[:3]
    sv, iv = tensor_val(s), tensor_val(idx)
    if sv is None or iv is None or sv.dim() != 2 or iv.dim() != 2 or iv.dtype not in _INTS:
        return None
    if not isinstance(dim, int) or not _last_dim(s, dim) or _reads(idx, logits):
        return None
    k, num_experts = _static_int(iv.shape[1]), _static_int(sv.shape[1])
    if k is None or num_experts is None or not 1 <= k <= num_experts:
        return None
    return idx, k


def raise_replayed_choice(graph: fx.Graph, node: fx.Node) -> bool:
    """At ``node``, the renormalised gather of scores at given experts (the module doc) -> ``moe.route`` with
    ``replay``; True when it rewrote."""
    if not is_call(node, (aten.gather.default,)):
        return False
    s = node.args[0]
    scored = _softmax_upcast(s) or _scoring_of(s)
    if scored is None:
        return False
    scoring, logits = scored
    found = _given_choice(node, logits)
    if found is None:
        return False
    idx, k = found
    out, renorm, scale, chain = _weights_chain(node)
    if not renorm:
        return False
    score_chain = _score_chain(s)[1] if scoring.startswith("custom:") else [s]
    with graph.inserting_before(node):
        r = new_node(graph, moe.route.default, (logits, None, k, scoring, "score_then_topk", 1, 1, "top2_sum", True,
                                                scale, idx), like=node)
        w = new_node(graph, operator.getitem, (r, 0), like=node)
        want = tensor_val(out).dtype
        if want != torch.float32:
            w = new_node(graph, aten._to_copy.default, (w,), {"dtype": want}, like=node)
    out.replace_all_uses_with(w)
    _erase_unused(graph, chain + [node] + score_chain)
    return True
