"""The moe ops (``torch.ops.moe.*``), printed in the generic form of DIALECT.md, and the load-balancing losses.

Entries of :data:`moe_mlir.mlir.table.LOWERINGS` (:mod:`moe_mlir.mlir.lowerings`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..builder import TensorType, Value, format_float
from ..table import lowering

if TYPE_CHECKING:  # pragma: no cover
    from ..importer import FxImporter


# ----------------------------------------------------------------------------------------------------------------
# The moe ops (torch.ops.moe.*): printed in the generic form of DIALECT.md
# ----------------------------------------------------------------------------------------------------------------


def _f32(x: float) -> str:
    return f"{format_float(x, 'f32')} : f32"


def _bool(x: bool) -> str:
    return "true" if x else "false"


@lowering("moe::topk_renorm.default")
def _moe_topk_renorm(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    attrs = {"k": f"{int(a['k'])} : i64", "mode": f"#moe<topk_mode {a['mode']}>", "renormalize": _bool(a["renormalize"])}
    return tuple(imp.moe_op("moe.topk_renorm", [a["scores"]], attrs, [imp.out_type(0), imp.out_type(1)]))


@lowering("moe::route.default")
def _moe_route(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    """``moe.route`` (MoERoutingOps.td), raised from DeepSeek-V3 / Llama-4 style routers."""
    # The op has one region, empty for a preset score, in the generic form too.
    scoring, regions = a["scoring"], [""]
    if scoring.startswith("custom:"):  # a custom score (ops/score_region.py): its region
        scoring, regions = "custom", [scoring[len("custom:"):]]
    attrs = {"k": f"{int(a['k'])} : i64", "scoring": f"#moe<scoring {scoring}>",
             "order": f"#moe<order {a['order']}>", "n_group": f"{int(a['n_group'])} : i64",
             "topk_group": f"{int(a['topk_group'])} : i64", "group_score": f"#moe<group_score {a['group_score']}>",
             "renormalize": _bool(a["renormalize"]), "routed_scaling_factor": _f32(a["routed_scaling_factor"])}
    bias, replay = a.get("bias"), a.get("replay")
    operands = [a["logits"]] + [v for v in (bias, replay) if v is not None]
    attrs["operandSegmentSizes"] = f"array<i32: 1, {int(bias is not None)}, {int(replay is not None)}>"
    return tuple(imp.moe_op("moe.route", operands, attrs, [imp.out_type(0), imp.out_type(1)], regions))


@lowering("moe::dispatch_plan.default")
def _moe_dispatch_plan(imp: FxImporter, node, a: dict) -> tuple[Value, ...]:
    attrs = {"num_experts": f"{int(a['num_experts'])} : i64", "block_size": f"{int(a['block_size'])} : i64"}
    return tuple(imp.moe_op("moe.dispatch_plan", [a["indices"]], attrs, [imp.out_type(j) for j in range(7)]))


@lowering("moe::bias_update.default")
def _moe_bias_update(imp: FxImporter, node, a: dict) -> Value:
    """``moe.bias_update`` (DeepSeek-V3's balancing step): the rate is the op's f32 attribute."""
    return imp.moe_op("moe.bias_update", [a["bias"], a["counts"]], {"rate": _f32(a["rate"])}, [imp.out_type(0)])[0]


# The load-balancing losses (MoEBalanceOps.td): the Switch loss is moe.router_stats (one fused pass) and the
# E-long moe.load_balancing_loss on its results; a token mask of another dtype is cast to f32 (it multiplies).


def _balance_float(imp: FxImporter, v: Value) -> Value:
    return v if v.type.elem in ("f32", "f16", "bf16") else imp.cast(v, "f32")


def _router_stats(imp: FxImporter, a: dict) -> list[Value]:
    x = _balance_float(imp, a["logits"])
    operands = [x]
    if a.get("token_mask") is not None:
        operands.append(_balance_float(imp, a["token_mask"]))
    e = TensorType((x.type.shape[1],), "f32")
    return imp.moe_op("moe.router_stats", operands, {"k": f"{int(a['top_k'])} : i64"}, [e, e, TensorType((), "f32")])


@lowering("moe::router_stats.default")
def _moe_router_stats(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    counts, probs, _ = _router_stats(imp, a)
    return counts, probs


@lowering("moe::load_balancing_loss.default")
def _moe_load_balancing_loss(imp: FxImporter, node, a: dict) -> Value:
    return imp.moe_op("moe.load_balancing_loss", _router_stats(imp, a), {}, [imp.out_type()])[0]


@lowering("moe::router_z_loss.default")
def _moe_router_z_loss(imp: FxImporter, node, a: dict) -> Value:
    return imp.moe_op("moe.router_z_loss", [_balance_float(imp, a["logits"])], {}, [imp.out_type()])[0]


@lowering("moe::sequence_balance_loss.default")
def _moe_sequence_balance_loss(imp: FxImporter, node, a: dict) -> Value:
    return imp.moe_op("moe.sequence_balance_loss", [_balance_float(imp, a["scores"]), a["indices"]], {},
                      [imp.out_type()])[0]


@lowering("moe::similarity_inform.default")
def _moe_similarity_inform(imp: FxImporter, node, a: dict) -> Value:
    operands = [a["u"], a["e"]]
    ws, km = a.get("ws"), a.get("key_mask")
    if ws is not None:
        operands.append(ws)
    if km is not None:
        operands.append(km)
    attrs = {
        "tau": _f32(a["tau"]),
        "causal": _bool(a["causal"]),
        "operandSegmentSizes": f"array<i32: 1, 1, {int(ws is not None)}, {int(km is not None)}>",
    }
    return imp.moe_op("moe.similarity_inform", operands, attrs, [imp.out_type()])[0]


@lowering("moe::attention_posterior.default")
def _moe_attention_posterior(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    attrs = {"sigma": _f32(a["sigma"]), "head_select": f"#moe<head_select {a['head_select']}>"}
    if a.get("head_scale") is not None:
        attrs["head_scale"] = _f32(a["head_scale"])
    operands = [a["scores"], a["u"], a["v"], a["wo"], a["e"]]
    return tuple(imp.moe_op("moe.attention_posterior", operands, attrs, [imp.out_type(0), imp.out_type(1)]))


@lowering("moe::mad_dispersion.default")
def _moe_mad_dispersion(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    attrs = {
        "num_experts": f"{int(a['num_experts'])} : i64",
        "eps": _f32(a["eps"]),
        "clip": _f32(a["clip"]),
        "normalize": f"#moe<normalize {a['normalize']}>",
        "measure": f"#moe<measure {a['measure']}>",
        "empty": f"#moe<empty {a['empty']}>",
    }
    return tuple(imp.moe_op("moe.mad_dispersion", [a["tokens"], a["assign"]], attrs,
                            [imp.out_type(0), imp.out_type(1)]))


@lowering("moe::adjacency_update.default")
def _moe_adjacency_update(imp: FxImporter, node, a: dict) -> Value:
    attrs = {"beta": _f32(a["beta"]), "norm": f"#moe<norm {a['norm']}>", "include_self": _bool(a["include_self"])}
    return imp.moe_op("moe.adjacency_update", [a["a"], a["idx"]], attrs, [imp.out_type()])[0]


@lowering("moe::hyper_router.default")
def _moe_hyper_router(imp: FxImporter, node, a: dict) -> tuple[Value, Value]:
    attrs = {"num_experts": f"{int(a['num_experts'])} : i64"}
    operands = [a["emb"], a["w1"], a["b1"], a["w2"], a["b2"]]
    return tuple(imp.moe_op("moe.hyper_router", operands, attrs, [imp.out_type(0), imp.out_type(1)]))
