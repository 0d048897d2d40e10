"""Rewrites of transformers' experts code (not routing idioms), run by :func:`.raising.raise_routing_idioms` after
the routing: its grouped GEMM fallback on the torch extension's kernel, and, where that was raised, its experts'
combine unrolled into k adds."""

from __future__ import annotations

import torch
import torch.fx as fx

from .fx_match import FLOATS, is_call, new_node, tensor_val, through_views

aten = torch.ops.aten

__all__ = ["raise_hf_grouped_mm", "unroll_gathered_sum"]


def raise_hf_grouped_mm(graph: fx.Graph, node: fx.Node) -> bool:
    """transformers' grouped GEMM fallback (``transformers::grouped_mm_fallback``: its ``grouped_mm`` experts
    under torch.compile for weights other than bf16, a Python loop of one ``mm`` per expert) on f32/f64 CPU tensors
    becomes ``moe_mlir::grouped_mm_ends``, the same product on the extension's kernel (the experts' GEMMs spread
    over the threads), with its own backward. Elsewhere (CUDA, other dtypes) the node stays transformers': on CUDA
    the op's padded batched GEMM bought nothing (H200, Qwen3-MoE E=128 prefill, 2026-11-26: 9.39-9.50 ms against
    8.37 with transformers' loop)."""
    from ..experts import gemm as experts

    target = experts.hf_grouped_mm_target()
    if target is None or node.op != "call_function" or node.target is not target:
        return False
    val = tensor_val(node)
    if val is None:
        return False
    if val.device.type != "cpu" or val.dtype not in (torch.float32, torch.float64):
        return False
    node.target = experts._grouped_mm_ends_op._opoverload
    # An nn.Linear weight [E, N, K] viewed transposed (HF's _grouped_linear without is_transposed): the op takes
    # the weight itself, so that its gradient comes in the parameter's layout (a transposed view's gradient costs
    # a transposing copy of every expert's weight gradient when autograd accumulates it).
    x, w, offs = node.args[:3]
    swaps_last_two = ((is_call(w, (aten.transpose.int,)) and sorted(d % 3 for d in w.args[1:3]) == [1, 2])
                      or (is_call(w, (aten.permute.default,)) and [d % 3 for d in w.args[1]] == [0, 2, 1]))
    if swaps_last_two:
        node.args = (x, w.args[0], offs, True)
    return True


#: Largest reduced size :func:`unroll_gathered_sum` unrolls (MoE top-k: k <= 16 in every model we know).
_UNROLL_MAX = 16


def unroll_gathered_sum(graph: fx.Graph, node: fx.Node) -> bool:
    """``Y[idx].view(T, k, H).sum(1)`` on CPU tensors, with ``k`` static and small (transformers' grouped experts
    combine each token's k weighted expert rows so: ``weighted_out[inv_perm].view(T, k, H).sum(dim=1)``), becomes
    ``Σ_j v[:, j]``: k slices of the view added in order (in f32 for f16/bf16, rounded once at the end, as the sum
    accumulates). The sum up to rounding (the order of its adds is ATen's or inductor's choice; in order here).
    Why: inductor fuses the gather into the reduction and vectorizes the
    reduction's k lanes (8 of 16 used, a gather per lane) instead of H, ~2.5 ms against eager's 0.7 ms for T=512,
    k=8, H=256 on a Xeon (two such kernels per 2-layer Qwen3-MoE prefill: 8 of its 26 ms); the unrolled form is
    one pointwise kernel vectorized along H (0.17 ms)."""
    if node.op != "call_function" or node.target is not aten.sum.dim_IntList:
        return False
    src, dims = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if keep or node.kwargs.get("dtype") is not None or not isinstance(dims, (list, tuple)) or len(dims) != 1:
        return False
    val, out = tensor_val(src), tensor_val(node)
    if val is None or out is None or val.dim() != 3 or dims[0] % 3 != 1 or val.device.type != "cpu":
        return False
    k = val.shape[1]
    if not isinstance(k, int) or not 2 <= k <= _UNROLL_MAX or val.dtype not in FLOATS + (torch.float64,):
        return False
    if not is_call(through_views(src), (aten.index.Tensor,)):
        return False
    low = val.dtype in (torch.float16, torch.bfloat16)
    with graph.inserting_before(node):
        total = None
        for j in range(k):
            part = new_node(graph, aten.select.int, (src, 1, j), like=node)
            if low:
                part = new_node(graph, aten._to_copy.default, (part,), {"dtype": torch.float32}, like=node)
            total = part if total is None else new_node(graph, aten.add.Tensor, (total, part), like=node)
        if low:
            total = new_node(graph, aten._to_copy.default, (total,), {"dtype": val.dtype}, like=node)
    node.replace_all_uses_with(total)
    graph.erase_node(node)
    return True
