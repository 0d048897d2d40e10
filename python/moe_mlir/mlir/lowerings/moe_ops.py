"""The moe ops (``torch.ops.moe.*``) in the generic form of DIALECT.md, built from their kernel keys.

A call is turned into the key its kernel would have (``op|attr=value|...|in:name:elem:dims``, the torch extension's,
lib/Runtime/Torch/TorchKernels.h) and the op comes from the compiler (:func:`moe_mlir.runtime.keys.kernel_key_op`:
include/MoE/IR/KernelKeys.td, the op's ODS builder): its name, operand order and attributes are written in ODS only,
never here. The torch ops so lowered are those of :data:`moe_mlir.ops.loading.KEY_OPS` (each op's module names its own);
entries of :data:`moe_mlir.mlir.table.LOWERINGS` (:mod:`moe_mlir.mlir.lowerings`)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ... import ops as _ops  # noqa: F401  (the op modules fill KEY_OPS)
from ...ops.loading import KEY_OPS
from ...reference.routing import CUSTOM_PREFIX
from ...runtime.abi import mlir_elem
from ...runtime.keys import key_input, key_value
from ..builder import TensorType, Value
from ..table import LOWERINGS, lowering

if TYPE_CHECKING:  # pragma: no cover
    from ..importer import FxImporter


def _result_type(text: str) -> TensorType:
    """``tensor<2x3xf32>`` -> TensorType (the importer's shapes are static)."""
    m = re.fullmatch(r"tensor<((?:\d+x)*)(\w+)>", text)
    if m is None:
        raise NotImplementedError(f"the op's inferred result type {text} is not static")
    return TensorType(tuple(int(d) for d in m.group(1).split("x") if d), m.group(2))


def key_op(imp: FxImporter, op: str, args: dict[str, Any], result_types: Optional[Sequence[TensorType]] = None,
           skip: Sequence[str] = ()) -> list[Value]:
    """The op of the kernel key ``op`` on ``args`` (by schema name, in schema order: a Value is an input, None an
    absent optional, anything else an attribute; ``skip``: arguments the op does not take), with ``result_types``
    (the node's, which may be more static than inference) or the inferred ones."""
    from ...runtime.keys import kernel_key_op

    parts, inputs, region = [op], [], ""
    for name, v in args.items():
        if name in skip:
            continue
        if isinstance(v, Value):
            parts.append(key_input(name, v.type.elem, v.type.shape))
            inputs.append(v)
        elif name == "indices_dtype":  # route's / topk_renorm's index results in int64: the key's out:indices:i64
            elem = mlir_elem(v) if v is not None else "i32"
            if elem != "i32":
                parts.append(f"out:indices:{elem}")
        elif v is not None:
            if name == "scoring" and isinstance(v, str) and v.startswith(CUSTOM_PREFIX):
                region = v[len(CUSTOM_PREFIX):]
            parts.append(f"{name}={key_value(v)}")
    built = kernel_key_op("|".join(parts))
    types = list(result_types) if result_types is not None else [_result_type(t) for t in built.result_types]
    return imp.moe_op(built.name, [inputs[i] for i in built.operands], built.attributes, types,
                      [region] * built.num_regions)


def _lower_by_key(key: str):
    def lower(imp: FxImporter, node, a: dict):
        n = len(node.target._schema.returns)
        out = key_op(imp, key, a, [imp.out_type(j) if n > 1 else imp.out_type() for j in range(n)])
        return tuple(out) if n > 1 else out[0]

    return lower


def register_key_ops() -> None:
    """Registers the lowering of every :data:`KEY_OPS` entry not registered yet: those of the package's op modules at
    import, and those of an op module imported later (a user's own router), when the importer next looks."""
    for name, key in KEY_OPS.items():
        if f"moe::{name}.default" not in LOWERINGS:
            lowering(f"moe::{name}.default")(_lower_by_key(key))


register_key_ops()


# The load-balancing losses (MoEBalanceOps.td): the Switch loss is moe.router_stats (one fused pass) and the
# E-long moe.load_balancing_loss on its results; a token mask of another dtype is cast to f32 (it multiplies).


def _balance_float(imp: FxImporter, v: Value) -> Value:
    return v if v.type.elem in ("f32", "f16", "bf16") else imp.cast(v, "f32")


def _router_stats(imp: FxImporter, a: dict) -> list[Value]:
    args = {"logits": _balance_float(imp, a["logits"]), "top_k": a["top_k"], "token_mask": a.get("token_mask")}
    if args["token_mask"] is not None:
        args["token_mask"] = _balance_float(imp, args["token_mask"])
    return key_op(imp, "router_stats_fwd", args)


@lowering("moe::router_stats.default")
def _moe_router_stats(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    counts, probs, _ = _router_stats(imp, a)
    return counts, probs


@lowering("moe::load_balancing_loss.default")
def _moe_load_balancing_loss(imp: FxImporter, node, a: dict) -> Value:
    return imp.moe_op("moe.load_balancing_loss", _router_stats(imp, a), {}, [imp.out_type()])[0]


@lowering("moe::router_z_loss.default")
def _moe_router_z_loss(imp: FxImporter, node, a: dict) -> Value:
    return key_op(imp, "router_z_loss", {"logits": _balance_float(imp, a["logits"])}, [imp.out_type()])[0]


@lowering("moe::sequence_balance_loss.default")
def _moe_sequence_balance_loss(imp: FxImporter, node, a: dict) -> Value:
    # top_k is the torch op's (its reference checks it); the loss is that of the given indices.
    args = dict(a, scores=_balance_float(imp, a["scores"]))
    return key_op(imp, "sequence_balance_loss", args, [imp.out_type()], skip=("top_k",))[0]
