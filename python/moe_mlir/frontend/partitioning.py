"""Partitioning: the moe ops of an FX graph (and the ``getitem`` of their results) fused into maximal connected
submodules, for a target that runs them apart from the rest (the CUDA split of :mod:`moe_mlir.backends.cuda`)."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

__all__ = ["is_gpu_node", "is_moe_op", "moe_op_name", "split_routing"]


def moe_op_name(target: Any) -> str | None:
    """``"topk_renorm"`` for ``torch.ops.moe.topk_renorm.default`` and for the packet ``torch.ops.moe.topk_renorm``
    (Dynamo's graphs hold the packet where user code calls it), None for any other call target."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[1] if target.namespace == "moe" else None
    if isinstance(target, torch._ops.OpOverloadPacket):
        ns, _, name = target._qualified_op_name.partition("::")
        return name if ns == "moe" else None
    return None


def is_moe_op(target: Any) -> bool:
    """A ``torch.ops.moe.*`` op, overload or packet: the one test of "our op" for raising's reports, the backend's
    inductor configuration and the CUDA split."""
    return moe_op_name(target) is not None


def is_gpu_node(node: fx.Node) -> bool:
    """A moe op, or the ``getitem`` of one's tuple result."""
    if node.op != "call_function":
        return False
    if is_moe_op(node.target):
        return True
    if node.target is operator.getitem:
        src = node.args[0]
        return isinstance(src, fx.Node) and src.op == "call_function" and is_moe_op(src.target)
    return False


def split_routing(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[str]]:
    """Fuses the moe nodes of ``gm`` into maximal connected submodules (``call_module`` nodes); returns the split
    module and the names of the GPU submodules in graph order."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class MoESupport(OperatorSupportBase):
        def is_node_supported(self, submodules, node: fx.Node) -> bool:  # noqa: ANN001
            return is_gpu_node(node)

    partitioner = CapabilityBasedPartitioner(gm, MoESupport(), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    # A partition of getitems alone cannot happen (a getitem joins its producer's partition), but be strict.
    partitions = [p for p in partitions if any(is_moe_op(n.target) for n in p.nodes)]
    if not partitions:
        return gm, []
    split = partitioner.fuse_partitions(partitions)
    names = [n.target for n in split.graph.nodes if n.op == "call_module"]
    return split, names
